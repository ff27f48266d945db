"""Appending new K/V tokens to a KV cache with rotary embeddings, memory-bound.

Times ckfmha.append_kv beside a torch implementation of the same operation (rotary in fp32,
then index_copy_ of the rows into the flattened cache) on the same inputs in the same run,
for contiguous and paged caches, decode (one token per sequence) to prefill chunks. Both
results are checked against each other. Bandwidth counts the bytes the operation must move
at least once: k_new and v_new read, the same bytes written into the cache, the cos/sin rows
of the rotated tokens and the lengths (and block-table entries) read. ``--vectorized`` adds
paged rows in vLLM's vectorized page layout (torch's rows stay linear; the results are
compared after re-laying ckfmha's out).

    python benchmarks/bench_appendkv.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/appendkv
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
from pathlib import Path
from typing import Any

import torch
from bench_fwd import median_ms, warm_up_device

import ckfmha

HEADS_K, HDIM, PAGE_SIZE = 8, 128, 16
# (batch, seqlen_new, cache capacity per sequence): decode, speculative chunks, prefill.
SHAPES = [(64, 1, 4096), (256, 1, 2048), (64, 4, 4096), (16, 512, 4096), (4, 4096, 8192),
          (1, 16384, 32768)]


def rotary_torch(x: Any, cos: Any, sin: Any, interleaved: bool) -> Any:
    """x [b, s, h, d]; cos/sin [b, s, rotary_dim / 2] (fp32): the rotated x in x's dtype."""
    half = cos.shape[-1]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    xf = x.float()
    if interleaved:
        pairs = xf[..., : 2 * half].unflatten(-1, (half, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
    else:
        a, b = xf[..., :half], xf[..., half : 2 * half]
        rotated = torch.cat((a * c - b * s, a * s + b * c), dim=-1)
    return torch.cat((rotated, xf[..., 2 * half :]), dim=-1).to(x.dtype)


def torch_append(k_cache: Any, v_cache: Any, k_new: Any, v_new: Any, lengths: Any, cos: Any,
                 sin: Any, interleaved: bool, block_table: Any) -> None:
    b, s, h, d = k_new.shape
    positions = lengths[:, None].long() + torch.arange(s, device=k_new.device)
    if block_table is None:
        rows = torch.arange(b, device=k_new.device)[:, None] * k_cache.shape[1] + positions
    else:
        page_size = k_cache.shape[1]
        pages = block_table.gather(1, (positions // page_size).int()).long()
        rows = pages * page_size + positions % page_size
    k = rotary_torch(k_new, cos[positions], sin[positions], interleaved) if cos is not None \
        else k_new
    k_cache.view(-1, h, d).index_copy_(0, rows.flatten(), k.reshape(-1, h, d))
    v_cache.view(-1, h, v_new.shape[-1]).index_copy_(0, rows.flatten(), v_new.reshape(-1, h, d))


def moved_bytes(b: int, s: int, rotary_dim: int, paged: bool) -> int:
    elem = 2
    rows = b * s
    data = 2 * rows * HEADS_K * 2 * HDIM * elem  # read new K and V, write them
    angles = 2 * rows * (rotary_dim // 2) * 4 if rotary_dim else 0
    index = b * 4 + (rows * 4 if paged else 0)
    return data + angles + index


def run_shape(b: int, s: int, capacity: int, rope: str, paged: bool,
              args: argparse.Namespace, vectorized: bool = False) -> dict[str, Any]:
    dtype = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)
    k_new = torch.randn(b, s, HEADS_K, HDIM, device="cuda", dtype=dtype, generator=gen)
    v_new = torch.randn(b, s, HEADS_K, HDIM, device="cuda", dtype=dtype, generator=gen)
    lengths = torch.randint(0, capacity - s + 1, (b,), device="cuda", generator=gen,
                            dtype=torch.int32)
    block_table = None
    if paged:
        pages_per_seq = capacity // PAGE_SIZE
        block_table = torch.randperm(b * pages_per_seq, device="cuda", generator=gen).int()
        block_table = block_table.reshape(b, pages_per_seq)
        shape = (b * pages_per_seq, PAGE_SIZE, HEADS_K, HDIM)
    else:
        shape = (b, capacity, HEADS_K, HDIM)
    caches = {name: (torch.zeros(shape, device="cuda", dtype=dtype),
                     torch.zeros(shape, device="cuda", dtype=dtype))
              for name in ("ckfmha", "torch")}
    if vectorized:
        pages = shape[0]
        caches["ckfmha"] = (
            torch.zeros(pages, HEADS_K, HDIM // 8, PAGE_SIZE, 8, device="cuda", dtype=dtype),
            torch.zeros(pages, HEADS_K, HDIM, PAGE_SIZE, device="cuda", dtype=dtype))
    cos = sin = None
    rotary_dim = HDIM if rope != "none" else 0
    if rotary_dim:
        inv_freq = 10000.0 ** (-torch.arange(0, rotary_dim, 2, device="cuda") / rotary_dim)
        angles = torch.outer(torch.arange(capacity, device="cuda").float(), inv_freq)
        cos, sin = angles.cos(), angles.sin()
    interleaved = rope == "interleaved"
    options: dict[str, Any] = {"block_table": block_table}
    if vectorized:
        options["page_layout"] = "vectorized"
    if cos is not None:
        options.update(cos=cos, sin=sin, rotary_interleaved=interleaved)

    impls = {
        "ckfmha": lambda: ckfmha.append_kv(*caches["ckfmha"], k_new, v_new, lengths, **options),
        "torch": lambda: torch_append(*caches["torch"], k_new, v_new, lengths, cos, sin,
                                      interleaved, block_table),
    }
    nbytes = moved_bytes(b, s, rotary_dim, paged)
    row: dict[str, Any] = {"batch": b, "seqlen_new": s, "capacity": capacity, "rope": rope,
                           "paged": paged, "page_layout": "vectorized" if vectorized else
                           "linear", "nhead_k": HEADS_K, "hdim": HDIM, "bytes": nbytes}
    for name, fn in impls.items():
        fn()
        ms = median_ms(fn, args.warmup, args.iters, args.repeats)
        row[f"{name}_ms"], row[f"{name}_gbps"] = ms, nbytes / ms / 1e6
    row["speedup_vs_torch"] = row["torch_ms"] / row["ckfmha_ms"]
    ours = ckfmha.to_linear_pages(*caches["ckfmha"]) if vectorized else caches["ckfmha"]
    diff = max(float((a.float() - t.float()).abs().max()) for a, t in zip(ours, caches["torch"]))
    row["max_abs_diff_vs_torch"] = diff
    fields: dict[str, Any] = {
        "dtype": "bf16", "batch": b, "nhead_k": HEADS_K, "seqlen_new": s, "hdim": HDIM,
        "max_seqlen_cache": capacity, "rope": rope, "rotary_dim": rotary_dim or None,
    }
    if paged:
        fields.update(page_size=PAGE_SIZE, num_pages=shape[0],
                      max_pages_per_seq=capacity // PAGE_SIZE,
                      page_layout="vectorized" if vectorized else "linear")
    row["kernel"] = ckfmha.select_append_kv(**fields)
    caches.clear()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rope", nargs="+", default=["half_rotated", "none"],
                        choices=["none", "interleaved", "half_rotated"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vectorized", action="store_true",
                        help="add paged rows in vLLM's vectorized page layout")
    parser.add_argument("--commit", default="unknown", help="commit the library was built from")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON")
    args = parser.parse_args()

    device = torch.cuda.get_device_name()
    warm_up_device()
    kinds = [(False, False), (True, False)] + ([(True, True)] if args.vectorized else [])
    rows = [run_shape(b, s, capacity, rope, paged, args, vectorized)
            for rope in args.rope for paged, vectorized in kinds for b, s, capacity in SHAPES]
    print(f"device: {device}  bf16  hk {HEADS_K} d {HDIM}  page {PAGE_SIZE}  "
          f"commit: {args.commit}")
    print(f"{'rope':>12} {'pages':>10} {'b':>4} {'s_new':>6} | {'ckfmha ms':>9} {'GB/s':>6} | "
          f"{'torch ms':>9} {'GB/s':>6} | {'x torch':>7} {'max diff':>8}")
    for r in rows:
        pages = r["page_layout"] if r["paged"] else "-"
        print(f"{r['rope']:>12} {pages:>10} {r['batch']:>4} {r['seqlen_new']:>6} | "
              f"{r['ckfmha_ms']:>9.4f} {r['ckfmha_gbps']:>6.0f} | {r['torch_ms']:>9.4f} "
              f"{r['torch_gbps']:>6.0f} | {r['speedup_vs_torch']:>7.2f} "
              f"{r['max_abs_diff_vs_torch']:>8.1e}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        date = dt.date.today().isoformat()
        record = {
            "benchmark": "appendkv", "device": device, "date": date, "commit": args.commit,
            "dtype": "bf16", "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "bytes_convention": "k_new/v_new read and written once, cos/sin rows (fp32) and "
                                "lengths/block-table entries read once",
            "rows": rows,
        }
        path = args.out / f"appendkv_{device.replace(' ', '_')}_{date}_{args.commit}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
