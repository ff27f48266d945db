"""Split-KV decode sweep: every registered bf16 d128 no-mask split kernel x split counts.

Checks the dispatcher's wave model against measurement on the bench_decode shapes, and
measures the host-side cost of one ckfmha.fwd call (planning, workspace, launches) on a
problem too small for the GPU time to matter.

    python benchmarks/sweep_splitkv.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/sweep_splitkv
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from bench_decode import HDIM, HEADS_K, HEADS_Q, SHAPES, moved_bytes
from bench_fwd import median_ms

import ckfmha

SPLITS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]


def host_overhead_us(calls: int = 200) -> float:
    """Wall time per call of back-to-back decode calls on one token of keys: host-bound."""
    q = torch.randn(1, HEADS_Q, 1, HDIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, HEADS_K, 64, HDIM, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        ckfmha.fwd(q, k, k)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        ckfmha.fwd(q, k, k)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    kernels = [k["name"] for k in ckfmha.Registry().kernels()
               if k["name"].startswith("fwd_splitkv_bf16_batch_d128x128_none_")]
    device = torch.cuda.get_device_name()
    rows: list[dict[str, Any]] = []
    for b, sk in SHAPES:
        q = torch.randn(b, HEADS_Q, 1, HDIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, HEADS_K, sk, HDIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, HEADS_K, sk, HDIM, device="cuda", dtype=torch.bfloat16)
        auto_ms = median_ms(partial(ckfmha.fwd, q, k, v), args.warmup, args.iters, args.repeats)
        print(f"b{b} sk{sk}: automatic plan {auto_ms:.3f} ms")
        for name in kernels:
            tile = name.split("_mma_")[1]
            timings = {}
            for splits in (s for s in SPLITS if s <= max(1, sk // 128)):
                call = partial(ckfmha.fwd, q, k, v, kernel=name, num_splits=splits)
                timings[splits] = median_ms(call, args.warmup, args.iters, args.repeats)
            best = min(timings, key=timings.__getitem__)
            print(f"  {tile}: " + " ".join(f"{s}:{t:.3f}" for s, t in timings.items())
                  + f"  best {best} ({moved_bytes(b, 1, sk) / timings[best] / 1e6:.0f} GB/s)")
            rows.append({"batch": b, "seqlen_k": sk, "kernel": name, "ms_by_splits": timings,
                         "automatic_ms": auto_ms})
        del q, k, v
        torch.cuda.empty_cache()
    overhead = host_overhead_us()
    print(f"host time per ckfmha.fwd call (tiny decode problem): {overhead:.1f} us")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        date = dt.date.today().isoformat()
        record = {"benchmark": "sweep_splitkv", "device": device, "date": date,
                  "commit": args.commit, "host_us_per_call": overhead, "rows": rows}
        path = args.out / f"sweep_splitkv_{device.replace(' ', '_')}_{date}_{args.commit}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
