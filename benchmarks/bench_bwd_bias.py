"""Backward with an elementwise bias and its gradient (dbias): ckfmha beside torch SDPA.

Each case runs attention with a full-size bias [b, h, s, s] and times the backward that also
returns the bias gradient. ckfmha's time is its whole plan (``ckfmha.bwd(...,
return_dbias=True)`` into a preallocated dbias); torch's is ``torch.autograd.grad`` through
SDPA with the bias as ``attn_mask`` requiring grad, for every backend that accepts it (a causal
case folds the causal mask into torch's bias, since SDPA takes one or the other). Reports
TFLOPS by the FlashAttention convention (2.5x the forward, halved for causal), the bias bytes
per second (bias read, dbias written), and ckfmha's plain backward (no bias) on the same inputs
for the cost of the bias. Writes JSON.

    python benchmarks/bench_bwd_bias.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/bwd_bias
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_bwd import Case, standard_suite
from bench_fwd import fmt, geomean, median_ms, ratio, warm_up_device
from torch.nn.attention import SDPBackend, sdpa_kernel

import ckfmha

BACKENDS = (("torch_efficient", SDPBackend.EFFICIENT_ATTENTION),
            ("torch_cudnn", SDPBackend.CUDNN_ATTENTION))  # fmt: skip


def torch_backward(backend: SDPBackend, q: Any, k: Any, v: Any, mask: Any,
                   do: Any) -> Callable[[], Any]:  # fmt: skip
    """SDPA's backward with the bias (causal mask folded in) as a leaf requiring grad; the
    forward runs once here."""
    qr, kr, vr, br = (t.detach().requires_grad_() for t in (q, k, v, mask))
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=br)

    def call() -> Any:
        return torch.autograd.grad(out, (qr, kr, vr, br), do, retain_graph=True)

    return call


def run_case(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    shape = (case.batch, case.heads, case.seqlen, case.hdim)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    bias_shape = (case.batch, case.heads, case.seqlen, case.seqlen)
    bias = torch.randn(bias_shape, device="cuda", dtype=torch.bfloat16)
    dbias = torch.empty_like(bias)
    # The bias with the causal mask folded in: torch's attn_mask, and the forward's bias (the
    # kernel sets here build causal masks with a bias only beside other features).
    masked = bias
    if case.causal:
        hidden = torch.ones(case.seqlen, case.seqlen, device="cuda", dtype=torch.bool).triu(1)
        masked = bias.masked_fill(hidden, float("-inf"))
    o, lse = ckfmha.fwd(q, k, v, bias=masked, return_lse=True)
    o_plain, lse_plain = ckfmha.fwd(q, k, v, causal=case.causal, return_lse=True)
    impls: dict[str, Callable[[], Any]] = {
        "ckfmha": lambda: ckfmha.bwd(do, q, k, v, o, lse, causal=case.causal, bias=bias,
                                     return_dbias=True, dbias_out=dbias),
        "ckfmha_no_bias": lambda: ckfmha.bwd(do, q, k, v, o_plain, lse_plain,
                                             causal=case.causal),
    }  # fmt: skip
    row: dict[str, Any] = {"batch": case.batch, "heads": case.heads, "seqlen": case.seqlen,
                           "hdim": case.hdim, "causal": case.causal, "flops": case.flops,
                           "bias_bytes": 2 * bias.numel() * bias.element_size()}  # fmt: skip
    for name, backend in BACKENDS:
        try:
            impls[name] = torch_backward(backend, q, k, v, masked, do)
        except RuntimeError as exc:
            row[f"{name}_tflops"] = None
            print(f"  {name} unavailable for {case.label}: {str(exc).splitlines()[0]}")
    for name, fn in impls.items():
        try:
            fn()
            ms = median_ms(fn, args.warmup, args.iters, args.repeats)
            row[f"{name}_ms"] = ms
            row[f"{name}_tflops"] = case.flops / ms / 1e9
        except RuntimeError as exc:  # a backend that refuses this shape
            row[f"{name}_tflops"] = None
            print(f"  {name} unavailable for {case.label}: {str(exc).splitlines()[0]}")
    ms = row.get("ckfmha_ms")
    row["ckfmha_bias_gbps"] = row["bias_bytes"] / ms / 1e6 if ms else None
    for name, _ in BACKENDS:
        row[f"speedup_vs_{name}"] = ratio(row.get("ckfmha_tflops"), row.get(f"{name}_tflops"))
    row["vs_no_bias"] = ratio(row.get("ckfmha_tflops"), row.get("ckfmha_no_bias_tflops"))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--commit", default="unknown", help="commit the library was built from")
    parser.add_argument("--out", type=Path, default=None, help="directory for the JSON")
    args = parser.parse_args()

    device = torch.cuda.get_device_name()
    warm_up_device()
    rows = []
    for case in standard_suite(args.hdims, args.seqlens):
        rows.append(run_case(case, args))
        torch.cuda.empty_cache()
        r = rows[-1]
        print(f"{case.label:28s} ckfmha {fmt(r.get('ckfmha_tflops'), '6.1f')} TF "
              f"({fmt(r.get('ckfmha_bias_gbps'), '5.0f')} GB/s of bias)  "
              f"no bias {fmt(r.get('ckfmha_no_bias_tflops'), '6.1f')}  "
              + "  ".join(f"{n} {fmt(r.get(f'{n}_tflops'), '6.1f')}" for n, _ in BACKENDS)
              + "  x " + "  ".join(fmt(r.get(f"speedup_vs_{n}"), ".2f") for n, _ in BACKENDS))
    summary = {f"geomean_vs_{n}": geomean([r.get(f"speedup_vs_{n}") for r in rows])
               for n, _ in BACKENDS}  # fmt: skip
    summary["geomean_vs_no_bias"] = geomean([r.get("vs_no_bias") for r in rows])
    print(f"device: {device}  bf16  commit: {args.commit}  (backward with dbias)")
    print({k: fmt(v, ".3f") for k, v in summary.items()})
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        date = dt.date.today().isoformat()
        record = {
            "benchmark": "bwd_bias", "device": device, "date": date, "commit": args.commit,
            "dtype": "bf16", "torch": torch.__version__, "cuda": torch.version.cuda,
            "flops_convention": "2.5 * 4*b*h*sq*sk*d, halved for causal",
            "summary": summary, "rows": rows,
        }  # fmt: skip
        stem = f"bwd_bias_{device.replace(' ', '_')}_{date}_{args.commit}"
        (args.out / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
