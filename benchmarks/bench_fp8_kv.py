"""Decode over fp8 (e4m3) K/V against the same decode over bf16 K/V, in the same run.

For each shape (batch, keys, GQA group, head dim) one bf16 q attends once over bf16 K/V and
once over the same values quantised to e4m3 with per-tensor amax / 448 scales; queries and
outputs stay bf16, the mask is causal bottom-right (a decode step sees every cached key). Each
implementation is timed as a CUDA graph of ``--iters`` calls replayed ``--repeats`` times
(``--no-graphs``: plain calls), so that host launch work does not hide a memory-bound kernel.

Reported per row: time, the decode tokens per second of fp8 over bf16 (bf16 time / fp8 time),
K/V bytes per second (the bytes a kernel must read at least once: K and V, plus q and o) and
that rate as a fraction of the device-to-device copy bandwidth measured in the same run (read
plus write bytes of a ``torch.Tensor.copy_`` of 1 GiB), and the fp8 output's relative L2
distance to the bf16 one (the quantisation error, a sanity check; the GPU tests bound the
kernels' own error). ``--paged 16`` runs the same shapes from paged caches (vLLM layout,
pages in a random order, a block table) instead.

    python benchmarks/bench_fp8_kv.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/fp8_kv [--limit 4] [--paged 16]
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import platform
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from bench_decode import paged_cache
from bench_fwd import warm_up_device

import ckfmha

HEADS_Q = 32
FP8_MAX = 448.0
COPY_BYTES = 1 << 30


def copy_gbps(args: argparse.Namespace) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second, in GB/s)."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(partial(dst.copy_, src), args)
    del src, dst
    return 2 * COPY_BYTES / ms / 1e6


def time_ms(fn: Callable[[], Any], args: argparse.Namespace) -> float:
    """Median ms per call of ``fn``: a CUDA graph of ``args.iters`` calls replayed
    ``args.repeats`` times, or with ``--no-graphs`` the calls themselves."""
    for _ in range(args.warmup):
        fn()
    torch.cuda.synchronize()
    run: Callable[[], Any]
    if args.no_graphs:

        def run() -> None:
            for _ in range(args.iters):
                fn()
    else:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(args.iters):
                fn()
        run = graph.replay
        run()
    times = []
    for _ in range(args.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / args.iters)
    return statistics.median(times)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """x as e4m3 codes with a per-tensor amax / 448 scale, a slab of the first axis at a time
    (a float32 temporary of a whole cache would not fit beside it)."""
    step = max(1, (1 << 26) // max(x[0].numel(), 1))
    slabs = [slice(i, i + step) for i in range(0, x.shape[0], step)]
    amax = max((float(x[s].abs().amax()) for s in slabs), default=0.0)
    scale = amax / FP8_MAX if amax > 0 else 1.0
    codes = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    for s in slabs:
        codes[s] = (x[s].float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def kv_bytes(b: int, hk: int, sk: int, d: int, itemsize: int) -> int:
    return itemsize * 2 * b * hk * sk * d


def run_shape(b: int, sk: int, group: int, d: int, args: argparse.Namespace,
              copy: float) -> dict[str, Any] | None:  # fmt: skip
    hk = HEADS_Q // group
    sq = args.seqlen_q
    need = kv_bytes(b, hk, sk, d, 2) * (2.5 if args.paged else 1.5)
    free, _ = torch.cuda.mem_get_info()
    if need > free - (2 << 30):
        print(f"  skipped b{b} sk{sk} g{group} d{d}: needs {need / 2**30:.0f} GiB")
        return None
    q = torch.randn(b, HEADS_Q, sq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hk, sk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, hk, sk, d, device="cuda", dtype=torch.bfloat16)
    mask = {"causal": True, "causal_alignment": "bottom_right"}
    if args.paged:
        k, v, table = paged_cache(k, v, args.paged)
        seqlens = torch.full((b,), sk, device="cuda", dtype=torch.int32)
        pages = {"block_table": table, "seqlens_k": seqlens, "max_seqlen_k": sk}
        attend: Callable[..., Any] = ckfmha.fwd_paged
    else:
        pages = {}
        attend = ckfmha.fwd
    k8, k_scale = quantize(k)
    v8, v_scale = quantize(v)
    out_bf16, out_fp8 = torch.empty_like(q), torch.empty_like(q)
    impls: dict[str, Callable[[], Any]] = {
        "bf16": partial(attend, q, k, v, out=out_bf16, **pages, **mask),
        "fp8": partial(
            attend, q, k8, v8, out=out_fp8, k_scale=k_scale, v_scale=v_scale, **pages, **mask
        ),
    }
    io_bytes = 2 * 2 * b * HEADS_Q * sq * d  # q read, o written
    row: dict[str, Any] = {"batch": b, "nhead_q": HEADS_Q, "nhead_k": hk, "group": group,
                           "seqlen_q": sq, "seqlen_k": sk, "hdim": d, "page_size": args.paged,
                           "k_scale": k_scale, "v_scale": v_scale}  # fmt: skip
    for name, fn in impls.items():
        itemsize = 1 if name == "fp8" else 2
        row[f"{name}_bytes"] = kv_bytes(b, hk, sk, d, itemsize) + io_bytes
        row[f"{name}_plan"] = plan_line(b, hk, sk, d, name == "fp8", args)
        try:
            ms = time_ms(fn, args)
        except ckfmha.CkfmhaError as exc:  # no kernel for this shape here
            print(f"  {name} unavailable: {str(exc).splitlines()[0][:200]}")
            row[f"{name}_ms"] = row[f"{name}_gbps"] = row[f"{name}_of_copy"] = None
            continue
        gbps = row[f"{name}_bytes"] / ms / 1e6
        row.update({f"{name}_ms": ms, f"{name}_gbps": gbps, f"{name}_of_copy": gbps / copy})
    if row["bf16_ms"] and row["fp8_ms"]:
        row["fp8_tokens_per_s_over_bf16"] = row["bf16_ms"] / row["fp8_ms"]
        diff = (out_fp8.float() - out_bf16.float()).norm() / out_bf16.float().norm()
        row["fp8_rel_l2_vs_bf16"] = float(diff)
    del q, k, v, k8, v8, out_bf16, out_fp8
    torch.cuda.empty_cache()
    return row


def plan_line(b: int, hk: int, sk: int, d: int, fp8: bool, args: argparse.Namespace) -> str:
    fields: dict[str, Any] = {
        "batch": b, "nhead_q": HEADS_Q, "nhead_k": hk, "seqlen_q": args.seqlen_q,
        "seqlen_k": sk, "hdim": d, "dtype": "bf16", "causal": True,
        "causal_alignment": "bottom_right", "kv_dtype": "fp8_e4m3" if fp8 else None,
    }  # fmt: skip
    if args.paged:
        fields.update(paged_kv="block_table", page_size=args.paged)
    try:
        text = ckfmha.Dispatcher().explain(**fields)
    except ckfmha.CkfmhaError as exc:
        return f"no plan: {exc}"
    plans = [line for line in text.splitlines() if line.startswith("plan:")]
    return plans[-1] if plans else text.rstrip().splitlines()[-1]


def fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, float) else "-"


def print_rows(rows: list[dict[str, Any]], copy: float) -> None:
    print(f"copy bandwidth (read + write): {copy:.0f} GB/s")
    print(
        f"{'b':>3} {'hk':>3} {'sk':>6} {'d':>4} | {'bf16 ms':>8} {'GB/s':>6} {'copy':>5} | "
        f"{'fp8 ms':>8} {'GB/s':>6} {'copy':>5} | {'fp8/bf16 tok/s':>14} {'rel L2':>7}"
    )
    for r in rows:
        cells = []
        for name in ("bf16", "fp8"):
            cells.append(
                f"{fmt(r[f'{name}_ms'], '.4f'):>8} {fmt(r[f'{name}_gbps'], '.0f'):>6} "
                f"{fmt(r[f'{name}_of_copy'], '.0%'):>5}"
            )
        print(f"{r['batch']:>3} {r['nhead_k']:>3} {r['seqlen_k']:>6} {r['hdim']:>4} | "
              + " | ".join(cells)
              + f" | {fmt(r.get('fp8_tokens_per_s_over_bf16'), '.2f'):>14} "
              f"{fmt(r.get('fp8_rel_l2_vs_bf16'), '.1e'):>7}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--seqlen-k", type=int, nargs="+", default=[4096, 8192, 32768])
    parser.add_argument(
        "--groups",
        type=int,
        nargs="+",
        default=[1, 4, 8],
        help=f"query heads per K/V head ({HEADS_Q} query heads)",
    )
    parser.add_argument("--hdim", type=int, nargs="+", default=[128, 64])
    parser.add_argument("--seqlen-q", type=int, default=1)
    parser.add_argument(
        "--paged", type=int, default=0, help="page size: run from paged caches (0: contiguous K/V)"
    )
    parser.add_argument("--limit", type=int, default=None, help="run the first N shapes only")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20, help="calls per timed graph")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-graphs", action="store_true", help="time plain calls")
    parser.add_argument("--commit", default="unknown", help="commit the library was built from")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON")
    args = parser.parse_args()

    device = torch.cuda.get_device_name()
    warm_up_device()
    copy = copy_gbps(args)
    shapes = list(itertools.product(args.hdim, args.groups, args.seqlen_k, args.batch))
    rows = []
    for d, group, sk, b in shapes[: args.limit]:
        row = run_shape(b, sk, group, d, args, copy)
        if row is not None:
            rows.append(row)
    print(
        f"device: {device}  q/o bf16, K/V bf16 vs fp8 e4m3  hq {HEADS_Q}  sq {args.seqlen_q}"
        f"  {'paged ' + str(args.paged) if args.paged else 'contiguous'}  "
        f"commit: {args.commit}"
    )
    print_rows(rows, copy)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        date = dt.date.today().isoformat()
        record = {
            "benchmark": "fp8_kv", "device": device, "date": date, "commit": args.commit,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "graphs": not args.no_graphs,
            "iters": args.iters, "repeats": args.repeats, "copy_gbps": copy,
            "bytes_convention": "K and V (2 bytes an element in bf16, 1 in fp8) read once, "
                                "plus q read and o written in bf16",
            "rows": rows,
        }  # fmt: skip
        suffix = f"_paged{args.paged}" if args.paged else ""
        path = args.out / f"fp8_kv{suffix}_{device.replace(' ', '_')}_{date}_{args.commit}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
