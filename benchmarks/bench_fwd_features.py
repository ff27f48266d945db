"""Forward attention with sliding windows and variable-length batches.

Peers in the same run: torch SDPA flash on the dense equivalent (full causal
for windows: what a caller without window support runs; a padded batch for
varlen). TFLOPS count only the visible (query, key) pairs, 4 * d FLOPs each.

    python benchmarks/bench_fwd_features.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/fwd_features
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from bench_fwd import median_ms, warm_up_device
from torch.nn.attention import SDPBackend, sdpa_kernel

import ckfmha


def visible_pairs(sq: int, sk: int, left: int, right: int) -> int:
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    ok = np.ones((sq, sk), dtype=bool)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return int(ok.sum())


def flash(q: Any, k: Any, v: Any, causal: bool) -> Any:
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def window_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    b, h, s, d = 2, 16, 8192, 128
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for left, right in [(256, 0), (1024, 0), (4096, 0), (512, 512)]:
        flops = 4.0 * b * h * d * visible_pairs(s, s, left, right)
        ms = median_ms(partial(ckfmha.fwd, q, k, v, window=(left, right)), args.warmup,
                       args.iters, args.repeats)
        causal_ms = median_ms(partial(flash, q, k, v, True), args.warmup, args.iters,
                              args.repeats)
        rows.append({"case": f"b{b} h{h} s{s} d{d} window({left},{right})",
                     "ckfmha_ms": ms, "ckfmha_tflops": flops / ms / 1e9,
                     "torch_flash_causal_ms": causal_ms,
                     "speedup_vs_dense_causal": causal_ms / ms})
    return rows


def varlen_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(0)
    h, d = 16, 128
    for max_len in (2048, 8192):
        lens = rng.integers(max_len // 8, max_len + 1, size=16384 * 2 // max_len)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        total = int(cu[-1])
        q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        cu_dev = torch.from_numpy(cu).cuda()
        flops = float(sum(4.0 * h * d * n * n / 2 for n in lens))
        ms = median_ms(partial(ckfmha.fwd_varlen, q, k, v, cu_dev, cu_dev, max_seqlen_q=max_len,
                               max_seqlen_k=max_len, causal=True),
                       args.warmup, args.iters, args.repeats)
        padded = torch.randn(len(lens), h, max_len, d, device="cuda", dtype=torch.bfloat16)
        padded_ms = median_ms(partial(flash, padded, padded, padded, True), args.warmup,
                              args.iters, args.repeats)
        rows.append({"case": f"varlen {len(lens)} seqs max {max_len} h{h} d{d} causal",
                     "ckfmha_ms": ms, "ckfmha_tflops": flops / ms / 1e9,
                     "torch_flash_padded_ms": padded_ms, "speedup_vs_padded": padded_ms / ms})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    device = torch.cuda.get_device_name()
    warm_up_device()
    rows = window_rows(args) + varlen_rows(args)
    print(f"device: {device}  commit: {args.commit}")
    for row in rows:
        print(f"{row['case']:44s} {row['ckfmha_ms']:8.3f} ms {row['ckfmha_tflops']:7.1f} TFLOPS  "
              + "  ".join(f"{k}={v:.2f}" for k, v in row.items() if k.startswith("speedup")))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        date = dt.date.today().isoformat()
        record = {"benchmark": "fwd_features", "device": device, "date": date,
                  "commit": args.commit, "torch": torch.__version__, "rows": rows}
        path = args.out / f"fwd_features_{device.replace(' ', '_')}_{date}_{args.commit}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
