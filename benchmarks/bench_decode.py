"""Decode attention (one or a few new query rows against a long KV cache), memory-bound.

Times ckfmha (automatic plan, and the one-stage forward for comparison) beside torch SDPA's
flash and cuDNN backends on the same inputs in the same run, GQA through ``enable_gqa``.
Bandwidth counts the bytes a kernel must move at least once: Q, K, V read and O written.

With ``--paged 1 16 64`` each shape also runs from a paged cache (vLLM flash layout, pages in
a random order, a block table) with those page sizes: torch has no paged attention, so the
peers are ckfmha and torch SDPA on the same keys stored contiguously (the bound a paged
kernel aims for), and the table reports GB/s. ``--page-layout vectorized`` (or both) adds the
same caches re-laid out in vLLM's older vectorized layout.

    python benchmarks/bench_decode.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/decode [--paged 16]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_fwd import median_ms, warm_up_device
from torch.nn.attention import SDPBackend, sdpa_kernel

import ckfmha

# (batch, seqlen_k): the target shapes (batch 64 at 4k and 32k keys), and smaller batches,
# where a split-KV plan has to find its parallelism in the keys alone.
SHAPES = [(64, 4096), (64, 32768), (16, 4096), (8, 32768), (1, 32768)]
HEADS_Q, HEADS_K, HDIM = 32, 8, 128


def sdpa(backend: SDPBackend, q: Any, k: Any, v: Any) -> Any:
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def moved_bytes(b: int, sq: int, sk: int) -> int:
    elem = 2
    return elem * HDIM * (2 * b * HEADS_Q * sq + 2 * b * HEADS_K * sk)


def plan_line(b: int, sq: int, sk: int, num_splits: int) -> str:
    text = ckfmha.Dispatcher().explain(batch=b, nhead_q=HEADS_Q, nhead_k=HEADS_K, seqlen_q=sq,
                                       seqlen_k=sk, hdim=HDIM, dtype="bf16",
                                       num_splits=num_splits)
    return text.rstrip().splitlines()[-1]


def time_impls(row: dict[str, Any], impls: dict[str, Callable[[], Any]],
               args: argparse.Namespace, *, subject: str, ratio_prefix: str,
               peers: tuple[str, ...], diff_peer: str, diff_key: str) -> None:
    """Times each implementation into row (ms and GB/s of row["bytes"]; None for a backend that
    refuses the shape), then adds row[f"{ratio_prefix}_{peer}"], the peer's time over the
    subject's, and row[diff_key], the largest |subject - diff_peer| of their outputs."""
    outputs = {}
    for name, fn in impls.items():
        try:
            outputs[name] = fn()
            ms = median_ms(fn, args.warmup, args.iters, args.repeats)
            row[f"{name}_ms"], row[f"{name}_gbps"] = ms, row["bytes"] / ms / 1e6
        except (RuntimeError, ckfmha.CkfmhaError) as exc:  # a backend refusing this shape
            row[f"{name}_ms"] = row[f"{name}_gbps"] = None
            print(f"  {name} unavailable: {str(exc).splitlines()[0]}")
    for peer in peers:
        if row.get(f"{peer}_ms") and row.get(f"{subject}_ms"):
            row[f"{ratio_prefix}_{peer}"] = row[f"{peer}_ms"] / row[f"{subject}_ms"]
    if subject in outputs and diff_peer in outputs:
        diff = (outputs[subject].float() - outputs[diff_peer].float()).abs().max()
        row[diff_key] = float(diff)


def run_shape(b: int, sk: int, sq: int, args: argparse.Namespace) -> dict[str, Any]:
    q = torch.randn(b, HEADS_Q, sq, HDIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, HEADS_K, sk, HDIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, HEADS_K, sk, HDIM, device="cuda", dtype=torch.bfloat16)
    impls: dict[str, Callable[[], Any]] = {
        "ckfmha": partial(ckfmha.fwd, q, k, v),
        "ckfmha_one_stage": partial(ckfmha.fwd, q, k, v, num_splits=1),
        "torch_flash": partial(sdpa, SDPBackend.FLASH_ATTENTION, q, k, v),
        "torch_cudnn": partial(sdpa, SDPBackend.CUDNN_ATTENTION, q, k, v),
    }
    nbytes = moved_bytes(b, sq, sk)
    row: dict[str, Any] = {"batch": b, "nhead_q": HEADS_Q, "nhead_k": HEADS_K, "seqlen_q": sq,
                           "seqlen_k": sk, "hdim": HDIM, "bytes": nbytes,
                           "plan": plan_line(b, sq, sk, 0)}
    time_impls(row, impls, args, subject="ckfmha", ratio_prefix="speedup_vs",
               peers=("torch_cudnn", "torch_flash"), diff_peer="torch_flash",
               diff_key="max_abs_diff_vs_flash")
    del q, k, v
    torch.cuda.empty_cache()
    return row


def paged_cache(k: Any, v: Any, page_size: int) -> tuple[Any, Any, Any]:
    """The keys of k, v [b, hk, sk, d] in caches [num_pages, page_size, hk, d] whose pages are
    handed out in a random order, and the block table [b, pages per sequence]."""
    b, hk, sk, d = k.shape
    per_seq = -(-sk // page_size)
    order = torch.randperm(b * per_seq, device="cuda")
    table = order.view(b, per_seq).to(torch.int32)
    caches = []
    for t in (k, v):
        padded = torch.zeros(b, per_seq * page_size, hk, d, device="cuda", dtype=t.dtype)
        padded[:, :sk] = t.transpose(1, 2)
        cache = torch.empty(b * per_seq, page_size, hk, d, device="cuda", dtype=t.dtype)
        cache[order] = padded.view(b * per_seq, page_size, hk, d)
        caches.append(cache)
    return caches[0], caches[1], table


def run_paged_shape(b: int, sk: int, sq: int, page_size: int, page_layout: str,
                    args: argparse.Namespace) -> dict[str, Any]:
    q = torch.randn(b, HEADS_Q, sq, HDIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, HEADS_K, sk, HDIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, HEADS_K, sk, HDIM, device="cuda", dtype=torch.bfloat16)
    k_cache, v_cache, table = paged_cache(k, v, page_size)
    if page_layout == "vectorized":
        k_cache, v_cache = ckfmha.to_vectorized_pages(k_cache, v_cache)
    seqlens = torch.full((b,), sk, device="cuda", dtype=torch.int32)
    impls: dict[str, Callable[[], Any]] = {
        "ckfmha_paged": partial(ckfmha.fwd_paged, q, k_cache, v_cache, block_table=table,
                                seqlens_k=seqlens, max_seqlen_k=sk, page_layout=page_layout),
        "ckfmha": partial(ckfmha.fwd, q, k, v),
        "torch_cudnn": partial(sdpa, SDPBackend.CUDNN_ATTENTION, q, k, v),
    }
    nbytes = moved_bytes(b, sq, sk)
    plan = ckfmha.Dispatcher().explain(
        batch=b, nhead_q=HEADS_Q, nhead_k=HEADS_K, seqlen_q=sq, seqlen_k=sk, hdim=HDIM,
        dtype="bf16", paged_kv="block_table", page_size=page_size, page_layout=page_layout)
    row: dict[str, Any] = {"batch": b, "nhead_q": HEADS_Q, "nhead_k": HEADS_K, "seqlen_q": sq,
                           "seqlen_k": sk, "hdim": HDIM, "page_size": page_size,
                           "page_layout": page_layout, "bytes": nbytes,
                           "plan": plan.rstrip().splitlines()[-1]}
    time_impls(row, impls, args, subject="ckfmha_paged", ratio_prefix="paged_speed_vs",
               peers=("ckfmha", "torch_cudnn"), diff_peer="torch_cudnn",
               diff_key="max_abs_diff_vs_cudnn")
    del q, k, v, k_cache, v_cache
    torch.cuda.empty_cache()
    return row


def print_paged(rows: list[dict[str, Any]]) -> None:
    print(f"{'b':>3} {'sq':>2} {'sk':>6} {'page':>5} {'layout':>10} | {'paged':>14} {'contiguous':>14} "
          f"{'cudnn':>14} | {'x contig':>8} {'x cudnn':>7}   (ms / GB/s)")
    for r in rows:
        cells = [f"{fmt(r[f'{n}_ms'], '.3f'):>6}/{fmt(r[f'{n}_gbps'], '.0f'):>6}"
                 for n in ("ckfmha_paged", "ckfmha", "torch_cudnn")]
        print(f"{r['batch']:>3} {r['seqlen_q']:>2} {r['seqlen_k']:>6} {r['page_size']:>5} "
              f"{r['page_layout']:>10} | "
              + " ".join(f"{c:>14}" for c in cells)
              + f" | {fmt(r.get('paged_speed_vs_ckfmha'), '.2f'):>8} "
              f"{fmt(r.get('paged_speed_vs_torch_cudnn'), '.2f'):>7}")
        print(f"      {r['plan']}")


def fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, float) else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen-q", type=int, nargs="+", default=[1])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--paged", type=int, nargs="*", default=[],
                        help="page sizes for the paged-cache rows (none: contiguous rows only)")
    parser.add_argument("--page-layout", nargs="+", default=["linear"],
                        choices=["linear", "vectorized"], help="page layouts of the paged rows")
    parser.add_argument("--paged-only", action="store_true",
                        help="skip the contiguous rows (with --paged)")
    parser.add_argument("--commit", default="unknown", help="commit the library was built from")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON")
    args = parser.parse_args()

    device = torch.cuda.get_device_name()
    warm_up_device()
    rows = [] if args.paged_only else [
        run_shape(b, sk, sq, args) for sq in args.seqlen_q for b, sk in SHAPES]
    paged_rows = [run_paged_shape(b, sk, sq, page, layout, args) for page in args.paged
                  for layout in args.page_layout for sq in args.seqlen_q for b, sk in SHAPES]
    print(f"device: {device}  bf16  hq {HEADS_Q} hk {HEADS_K} d {HDIM}  commit: {args.commit}")
    print(f"{'b':>3} {'sq':>2} {'sk':>6} | {'ckfmha':>14} {'one-stage':>14} {'flash':>14} "
          f"{'cudnn':>14} | {'x cudnn':>7} {'x flash':>7}   (ms / GB/s)")
    for r in rows:
        cells = [f"{fmt(r[f'{n}_ms'], '.3f'):>6}/{fmt(r[f'{n}_gbps'], '.0f'):>6}"
                 for n in ("ckfmha", "ckfmha_one_stage", "torch_flash", "torch_cudnn")]
        print(f"{r['batch']:>3} {r['seqlen_q']:>2} {r['seqlen_k']:>6} | " + " ".join(
            f"{c:>14}" for c in cells) + f" | {fmt(r.get('speedup_vs_torch_cudnn'), '.2f'):>7} "
            f"{fmt(r.get('speedup_vs_torch_flash'), '.2f'):>7}")
        print(f"      {r['plan']}")
    if paged_rows:
        print_paged(paged_rows)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        date = dt.date.today().isoformat()
        record = {
            "benchmark": "decode", "device": device, "date": date, "commit": args.commit,
            "dtype": "bf16", "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
            "bytes_convention": "2 bytes x hdim x (q + o rows + k + v rows), each moved once",
            "rows": rows,
            "paged_rows": paged_rows,
        }
        path = args.out / f"decode_{device.replace(' ', '_')}_{date}_{args.commit}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
