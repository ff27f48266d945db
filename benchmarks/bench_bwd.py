"""Backward attention: ckfmha beside torch SDPA's flash and cuDNN backends.

One run times every implementation's backward on the same inputs and reports TFLOPS by the
FlashAttention convention (2.5x the forward's 4*b*h*sq*sk*d, halved for causal) and ratios
against the peers measured in the same run. ckfmha's time is its whole three-stage plan
(D = rowsum(dO O), the dq_dk_dv stage, the dQ conversion); torch's is
``torch.autograd.grad`` through SDPA after a forward outside the timed region. Writes JSON
(and a PNG plot when matplotlib is present).

    python benchmarks/bench_bwd.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/bwd
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from bench_fwd import (
    HIDDEN,
    STANDARD_HDIMS,
    STANDARD_SEQLENS,
    TOTAL_TOKENS,
    add_run_arguments,
    fmt,
    geomean,
    matmul_tflops,
    median_ms,
    plot,
    print_table,
    ratio,
    results_stem,
    run_record,
    warm_up_device,
)
from torch.nn.attention import SDPBackend, sdpa_kernel

import ckfmha

BWD_FLOPS_FACTOR = 2.5


@dataclass
class Case:
    batch: int
    heads: int
    seqlen: int
    hdim: int
    causal: bool

    @property
    def flops(self) -> float:
        full = 4.0 * self.batch * self.heads * self.seqlen * self.seqlen * self.hdim
        return BWD_FLOPS_FACTOR * (full / 2 if self.causal else full)

    @property
    def label(self) -> str:
        return (
            f"b{self.batch} h{self.heads} s{self.seqlen} d{self.hdim}"
            f"{' causal' if self.causal else ''}"
        )


@dataclass
class Row:
    case: Case
    tflops: dict[str, float | None] = field(default_factory=dict)
    kernel: str = ""
    deterministic_tflops: float | None = None
    max_abs_diff_vs_flash: float | None = None


def standard_suite(hdims: list[int], seqlens: list[int]) -> list[Case]:
    return [
        Case(TOTAL_TOKENS // s, HIDDEN // d, s, d, causal)
        for d in hdims
        for s in seqlens
        for causal in (False, True)
    ]


def sdpa_backward(backend: SDPBackend, q: Any, k: Any, v: Any, do: Any,
                  causal: bool, **sdpa_kwargs: Any) -> Callable[[], Any]:  # fmt: skip
    """A backward through SDPA: the forward runs once here, each call replays the backward;
    sdpa_kwargs (enable_gqa, attn_mask) pass on to the forward."""
    qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal, **sdpa_kwargs)

    def call() -> Any:
        return torch.autograd.grad(out, (qr, kr, vr), do, retain_graph=True)

    return call


def run_case(case: Case, dtype: torch.dtype, args: argparse.Namespace) -> Row:
    shape = (case.batch, case.heads, case.seqlen, case.hdim)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
    row = Row(case)
    o, lse = ckfmha.fwd(q, k, v, causal=case.causal, return_lse=True)

    def ours(deterministic: bool = False) -> Callable[[], Any]:
        return lambda: ckfmha.bwd(do, q, k, v, o, lse, causal=case.causal,
                                  deterministic=deterministic)  # fmt: skip

    impls: dict[str, Callable[[], Any]] = {"ckfmha": ours()}
    for name, backend in (("torch_flash", SDPBackend.FLASH_ATTENTION),
                          ("torch_cudnn", SDPBackend.CUDNN_ATTENTION)):  # fmt: skip
        try:
            impls[name] = sdpa_backward(backend, q, k, v, do, case.causal)
        except RuntimeError as exc:
            row.tflops[name] = None
            print(f"  {name} unavailable for {case.label}: {str(exc).splitlines()[0]}")
    dtype_name = "bf16" if dtype == torch.bfloat16 else "fp16"
    row.kernel = ckfmha.Dispatcher().select_bwd(
        dtype=dtype_name, batch=case.batch, nhead_q=case.heads, seqlen_q=case.seqlen,
        hdim=case.hdim, causal=case.causal,
    )[1]  # fmt: skip
    outputs = {}
    for name, fn in impls.items():
        try:
            outputs[name] = fn()
            ms = median_ms(fn, args.warmup, args.iters, args.repeats)
            row.tflops[name] = case.flops / ms / 1e9
        except RuntimeError as exc:  # a backend that refuses this shape
            row.tflops[name] = None
            print(f"  {name} unavailable for {case.label}: {str(exc).splitlines()[0]}")
    if args.deterministic:
        ms = median_ms(ours(True), args.warmup, args.iters, args.repeats)
        row.deterministic_tflops = case.flops / ms / 1e9
    if "ckfmha" in outputs and "torch_flash" in outputs:
        diff = max(
            float((a.float() - b.float()).abs().max())
            for a, b in zip(outputs["ckfmha"], outputs["torch_flash"])
        )
        row.max_abs_diff_vs_flash = diff
    return row


def summary(rows: list[Row]) -> dict[str, float | None]:
    return {
        "geomean_vs_flash": geomean(
            [ratio(r.tflops.get("ckfmha"), r.tflops.get("torch_flash")) for r in rows]
        ),
        "geomean_vs_cudnn": geomean(
            [ratio(r.tflops.get("ckfmha"), r.tflops.get("torch_cudnn")) for r in rows]
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hdims", type=int, nargs="+", default=list(STANDARD_HDIMS))
    parser.add_argument("--seqlens", type=int, nargs="+", default=list(STANDARD_SEQLENS))
    parser.add_argument("--deterministic", action="store_true",
                        help="also time ckfmha's deterministic mode")  # fmt: skip
    add_run_arguments(parser, warmup=3, iters=10, repeats=5)
    args = parser.parse_args()

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    device = torch.cuda.get_device_name()
    warm_up_device()
    rows = [run_case(case, dtype, args) for case in standard_suite(args.hdims, args.seqlens)]
    print(f"device: {device}  dtype: {args.dtype}  commit: {args.commit}  (backward)")
    print_table(rows)  # type: ignore[arg-type]
    if args.deterministic:
        for r in rows:
            print(f"  deterministic {r.case.label:34s} {fmt(r.deterministic_tflops, '8.1f')}")
    result_summary = summary(rows)
    result_summary["matmul_tflops"] = matmul_tflops(dtype)
    print({k: fmt(v, ".3f") for k, v in result_summary.items()})

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {
            **run_record("bwd", device, args.commit, args.dtype),
            "flops_convention": "2.5 * 4*b*h*sq*sk*d, halved for causal",
            "summary": result_summary,
            "rows": [{**asdict(r.case), "flops": r.case.flops, **asdict(r)} for r in rows],
        }  # fmt: skip
        for entry in record["rows"]:
            del entry["case"]
        stem = results_stem(record)
        (args.out / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
        plot(rows, args.out / f"{stem}.png")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
