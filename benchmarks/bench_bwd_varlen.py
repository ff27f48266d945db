"""Group-mode (varlen) backward: ckfmha beside torch's varlen flash attention.

Each case packs sequences of random lengths (seeded; short documents, mixed and long ones),
runs ckfmha's forward once for O and LSE, and times the whole backward plan as the dispatcher
picks it (the sm90 main stage on Hopper) and with the sm80 main stage forced (what group mode,
windows and d96/d192x128 ran on before the Hopper template took them), beside
``torch.nn.attention.varlen.varlen_attn``'s backward (FlashAttention 2 inside PyTorch). FLOPs
count the visible (query, key) pairs exactly: 2.5 * 4 * pairs * heads * d. Torch gets GQA
problems only where its varlen_attn takes ``enable_gqa``. Writes JSON.

    python benchmarks/bench_bwd_varlen.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/bwd_varlen
"""

from __future__ import annotations

import argparse
import inspect
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from bench_feature_cost import registered_kernel
from bench_fwd import (
    add_run_arguments,
    fmt,
    geomean,
    median_ms,
    ratio,
    results_stem,
    run_record,
    warm_up_device,
)

import ckfmha

BWD_FLOPS_FACTOR = 2.5
# Length mixes: (shortest, longest) sequence, drawn uniformly, until the batch holds about
# TOTAL_TOKENS tokens.
LENGTH_MIXES = {"short": (64, 1024), "mixed": (100, 4000), "long": (2000, 9000)}
TOTAL_TOKENS = 16384
# Sliding window as (left, right): a causal window of 512 keys (Mistral-style layers).
WINDOW = (511, 0)


@dataclass
class Case:
    mix: str
    heads_q: int
    heads_k: int
    hdim: int
    mask: str  # none, causal, window
    lengths: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        heads = f"h{self.heads_q}" + (f"/{self.heads_k}" if self.heads_k != self.heads_q else "")
        return f"{self.mix} n{len(self.lengths)} {heads} d{self.hdim} {self.mask}"

    def visible_pairs(self) -> int:
        total = 0
        for n in self.lengths:
            if self.mask == "none":
                total += n * n
            elif self.mask == "causal":
                total += n * (n + 1) // 2
            else:
                left = WINDOW[0]
                rows = np.arange(n)
                total += int(np.minimum(rows, left).sum()) + n
        return total

    @property
    def flops(self) -> float:
        return BWD_FLOPS_FACTOR * 4.0 * self.visible_pairs() * self.heads_q * self.hdim


@dataclass
class Row:
    case: Case
    tflops: dict[str, float | None] = field(default_factory=dict)
    kernel: str = ""
    max_abs_diff_vs_sm80: float | None = None


def draw_lengths(mix: str, seed: int) -> list[int]:
    low, high = LENGTH_MIXES[mix]
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < TOTAL_TOKENS:
        lengths.append(int(rng.integers(low, high + 1)))
    return lengths


def suite(hdims: list[int]) -> list[Case]:
    cases = []
    seed = 0
    for hdim in hdims:
        heads = {64: [(12, 12), (24, 6)], 96: [(24, 24)], 128: [(40, 8), (16, 16)],
                 256: [(12, 12)]}.get(hdim, [(16, 16)])  # fmt: skip
        for (hq, hk), mix, mask in (
            (h, m, k) for h in heads for m in LENGTH_MIXES for k in ("none", "causal", "window")
        ):
            if mask == "window" and mix == "short":
                continue  # short documents lie inside the window: the same as causal
            seed += 1
            cases.append(Case(mix, hq, hk, hdim, mask, draw_lengths(mix, seed)))
    return cases


def _mask_options(case: Case) -> dict[str, Any]:
    if case.mask == "causal":
        return {"causal": True}
    if case.mask == "window":
        return {"window": WINDOW}
    return {}


def _torch_varlen() -> tuple[Callable[..., Any] | None, set[str]]:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, set()
    return varlen_attn, set(inspect.signature(varlen_attn).parameters)


def torch_backward(case: Case, q: Any, k: Any, v: Any, do: Any, cu: Any,
                   max_len: int) -> Callable[[], Any] | None:  # fmt: skip
    varlen_attn, params = _torch_varlen()
    if varlen_attn is None:
        return None
    kwargs: dict[str, Any] = {}
    if case.heads_k != case.heads_q:
        if "enable_gqa" not in params:
            return None
        kwargs["enable_gqa"] = True
    if case.mask == "window":
        if "window_size" not in params:
            return None
        kwargs["window_size"] = WINDOW
    elif case.mask == "causal":
        if "is_causal" in params:
            kwargs["is_causal"] = True
        elif "window_size" in params:
            kwargs["window_size"] = (-1, 0)
        else:
            return None
    qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
    out = varlen_attn(qr, kr, vr, cu, cu, max_len, max_len, **kwargs)

    def call() -> Any:
        return torch.autograd.grad(out, (qr, kr, vr), do, retain_graph=True)

    return call


def sm80_main_stage(case: Case, dtype: str) -> str | None:
    """The sm80 template's group-mode main stage for the case, if the build has it."""
    return registered_kernel({
        "family": "bwd_dq_dk_dv", "pipeline": "sm80_cpasync_mma", "mode": "group",
        "dtype": dtype, "hdim_q": case.hdim, "hdim_v": case.hdim, "mask": case.mask,
        "bias": "none", "dropout": False, "softcap": False, "dbias": False,
    })  # fmt: skip


def forward_by_sequence(q: Any, k: Any, v: Any, lengths: list[int],
                        options: dict[str, Any]) -> tuple[Any, Any]:  # fmt: skip
    """O [total, heads, d] and LSE [heads, total] of the packed batch, one batch-mode forward
    per sequence (the benchmark needs them once; batch-mode kernels exist at every head dim
    where group-mode forwards may still be compiled on first use)."""
    o = torch.empty_like(q)
    lse = torch.empty((q.shape[1], q.shape[0]), device=q.device, dtype=torch.float32)
    start = 0
    for n in lengths:
        rows = slice(start, start + n)
        out, seq_lse = ckfmha.fwd(q[rows].unsqueeze(0), k[rows].unsqueeze(0),
                                  v[rows].unsqueeze(0), layout="bshd", return_lse=True,
                                  **options)  # fmt: skip
        o[rows] = out[0]
        lse[:, rows] = seq_lse[0]
        start += n
    return o, lse


def run_case(case: Case, dtype: torch.dtype, args: argparse.Namespace) -> Row:
    dtype_name = "bf16" if dtype == torch.bfloat16 else "fp16"
    total = sum(case.lengths)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(case.lengths)]), dtype=torch.int32,
                      device="cuda")  # fmt: skip
    max_len = max(case.lengths)
    q = torch.randn((total, case.heads_q, case.hdim), device="cuda", dtype=dtype)
    k, v = (torch.randn((total, case.heads_k, case.hdim), device="cuda", dtype=dtype)
            for _ in range(2))  # fmt: skip
    do = torch.randn_like(q)
    options = _mask_options(case)
    o, lse = forward_by_sequence(q, k, v, case.lengths, options)

    def ours(kernel: str | None = None) -> Callable[[], Any]:
        forced = {"kernel": kernel} if kernel else {}
        return lambda: ckfmha.bwd_varlen(do, q, k, v, o, lse, cu, cu, max_seqlen_q=max_len,
                                         max_seqlen_k=max_len, **options, **forced)

    row = Row(case)
    impls: dict[str, Callable[[], Any]] = {"ckfmha": ours()}
    sm80 = sm80_main_stage(case, dtype_name)
    if sm80 is not None:
        impls["ckfmha_sm80"] = ours(sm80)
    peer = torch_backward(case, q, k, v, do, cu, max_len)
    if peer is not None:
        impls["torch_flash_varlen"] = peer
    outputs = {}
    for name, fn in impls.items():
        try:
            outputs[name] = fn()
            ms = median_ms(fn, args.warmup, args.iters, args.repeats)
            row.tflops[name] = case.flops / ms / 1e9
        except RuntimeError as exc:
            row.tflops[name] = None
            print(f"  {name} unavailable for {case.label}: {str(exc).splitlines()[0]}")
    if "ckfmha" in outputs and "ckfmha_sm80" in outputs:
        row.max_abs_diff_vs_sm80 = max(
            float((a.float() - b.float()).abs().max())
            for a, b in zip(outputs["ckfmha"][:3], outputs["ckfmha_sm80"][:3])
        )
    row.kernel = ckfmha.Dispatcher().select_bwd(
        dtype=dtype_name, mode="group", batch=len(case.lengths), nhead_q=case.heads_q,
        nhead_k=case.heads_k, seqlen_q=max_len, hdim=case.hdim, total_q=total, total_k=total,
        **options,
    )[1]  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hdims", type=int, nargs="+", default=[64, 96, 128, 256])
    add_run_arguments(parser, warmup=3, iters=10, repeats=3, out_help="directory for the JSON")
    args = parser.parse_args()

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    device = torch.cuda.get_device_name()
    warm_up_device()
    rows = [run_case(case, dtype, args) for case in suite(args.hdims)]
    print(f"device: {device}  dtype: {args.dtype}  commit: {args.commit}  (varlen backward)")
    names = ("ckfmha", "ckfmha_sm80", "torch_flash_varlen")
    print(f"{'case':40s} " + " ".join(f"{n:>18s}" for n in names) + "  vs_sm80  vs_torch")
    for r in rows:
        cells = " ".join(fmt(r.tflops.get(n), "18.1f") for n in names)
        print(f"{r.case.label:40s} {cells}  "
              f"{fmt(ratio(r.tflops.get('ckfmha'), r.tflops.get('ckfmha_sm80')), '7.2f')}  "
              f"{fmt(ratio(r.tflops.get('ckfmha'), r.tflops.get('torch_flash_varlen')), '8.2f')}")
    summary = {
        "geomean_vs_sm80": geomean(
            [ratio(r.tflops.get("ckfmha"), r.tflops.get("ckfmha_sm80")) for r in rows]),
        "geomean_vs_torch_flash_varlen": geomean(
            [ratio(r.tflops.get("ckfmha"), r.tflops.get("torch_flash_varlen")) for r in rows]),
    }  # fmt: skip
    print({k: fmt(v, ".3f") for k, v in summary.items()})
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        rows_out = [
            {**asdict(r.case), "label": r.case.label, "flops": r.case.flops,
             **{k: v for k, v in asdict(r).items() if k != "case"}}
            for r in rows
        ]  # fmt: skip
        record = {
            **run_record("bwd_varlen", device, args.commit, args.dtype),
            "flops_convention": "2.5 * 4 * visible (query, key) pairs * heads * d",
            "window": list(WINDOW),
            "summary": summary,
            "rows": rows_out,
        }
        (args.out / f"{results_stem(record)}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
