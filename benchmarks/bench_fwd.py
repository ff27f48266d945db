"""Forward attention: ckfmha beside torch SDPA's flash and cuDNN backends.

One run times every implementation on the same inputs and reports TFLOPS by
the FlashAttention convention (4*b*h*sq*sk*d, halved for causal) and ratios
against the peers measured in the same run. Writes JSON (and a PNG plot when
matplotlib is present).

    python benchmarks/bench_fwd.py --commit $(git rev-parse --short HEAD) \
        --out benchmarks/results/fwd
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import ckfmha

TOTAL_TOKENS = 16384
HIDDEN = 2048
# The standard suite's head dims and lengths (bench_bwd.py and bench_broad.py take them too).
STANDARD_HDIMS = (64, 128, 256)
STANDARD_SEQLENS = (512, 2048, 8192)


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
        return full / 2 if self.causal else full

    @property
    def label(self) -> str:
        return (f"b{self.batch} h{self.heads} s{self.seqlen} d{self.hdim}"
                f"{' causal' if self.causal else ''}")


@dataclass
class Row:
    case: Case
    tflops: dict[str, float | None] = field(default_factory=dict)
    kernel: str = ""
    max_abs_diff_vs_flash: float | None = None


def standard_suite(hdims: list[int], seqlens: list[int]) -> list[Case]:
    return [Case(TOTAL_TOKENS // s, HIDDEN // d, s, d, causal)
            for d in hdims for s in seqlens for causal in (False, True)]


def median_ms(fn: Callable[[], Any], warmup: int, iters: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def sdpa(backend: SDPBackend, q: Any, k: Any, v: Any, causal: bool,
         **sdpa_kwargs: Any) -> Callable[[], Any]:  # fmt: skip
    """A forward through SDPA on one backend; sdpa_kwargs (enable_gqa, attn_mask) pass on."""
    def call() -> Any:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **sdpa_kwargs)
    return call


def warm_up_device(seconds: float = 2.0) -> None:
    """Keep the GPU busy with matrix products for ``seconds`` before anything is timed: its
    clocks ramp up under load, and the first row timed on a machine that had been idle read
    up to 25% slow (NOTES 105)."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def matmul_tflops(dtype: torch.dtype) -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    b = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    ms = median_ms(lambda: a @ b, warmup=3, iters=10, repeats=5)
    return 2 * 8192**3 / ms / 1e9


def run_case(case: Case, dtype: torch.dtype, args: argparse.Namespace) -> Row:
    shape = (case.batch, case.heads, case.seqlen, case.hdim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
    row = Row(case)
    impls: dict[str, Callable[[], Any]] = {
        "ckfmha": lambda: ckfmha.fwd(q, k, v, causal=case.causal),
        "torch_flash": sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, case.causal),
        "torch_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, case.causal),
    }
    row.kernel = ckfmha.Dispatcher().select(
        dtype="bf16" if dtype == torch.bfloat16 else "fp16", batch=case.batch,
        nhead_q=case.heads, seqlen_q=case.seqlen, hdim=case.hdim, causal=case.causal)
    outputs = {}
    for name, fn in impls.items():
        try:
            outputs[name] = fn()
            ms = median_ms(fn, args.warmup, args.iters, args.repeats)
            row.tflops[name] = case.flops / ms / 1e9
        except RuntimeError as exc:  # a backend that refuses this shape
            row.tflops[name] = None
            print(f"  {name} unavailable for {case.label}: {str(exc).splitlines()[0]}")
    if "ckfmha" in outputs and "torch_flash" in outputs:
        diff = (outputs["ckfmha"].float() - outputs["torch_flash"].float()).abs().max()
        row.max_abs_diff_vs_flash = float(diff)
    return row


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def add_run_arguments(parser: argparse.ArgumentParser, *, warmup: int, iters: int, repeats: int,
                      out_help: str = "directory for JSON and plot") -> None:  # fmt: skip
    """The arguments every suite takes: the dtype, the timing rounds, the commit the library
    was built from and where the results go."""
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--iters", type=int, default=iters)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--commit", default="unknown", help="commit the library was built from")
    parser.add_argument("--out", type=Path, default=None, help=out_help)


def run_record(benchmark: str, device: str, commit: str, dtype: str) -> dict[str, Any]:
    """The fields a results file opens with: which suite ran, where, when, on what versions."""
    return {
        "benchmark": benchmark, "device": device, "date": dt.date.today().isoformat(),
        "commit": commit, "dtype": dtype, "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
    }  # fmt: skip


def results_stem(record: dict[str, Any]) -> str:
    """<suite>_<device>_<date>_<commit>: the name of a run's JSON and plot."""
    device = record["device"].replace(" ", "_")
    return f"{record['benchmark']}_{device}_{record['date']}_{record['commit']}"


def fmt(x: float | None, spec: str) -> str:
    return format(x, spec) if x is not None else "-"


def print_table(rows: list[Row]) -> None:
    print(f"{'case':34s} {'ckfmha':>8s} {'flash':>8s} {'cudnn':>8s} {'/flash':>7s} "
          f"{'/cudnn':>7s} {'maxdiff':>8s}")
    for r in rows:
        t = r.tflops
        print(f"{r.case.label:34s} {fmt(t.get('ckfmha'), '8.1f')} "
              f"{fmt(t.get('torch_flash'), '8.1f')} {fmt(t.get('torch_cudnn'), '8.1f')} "
              f"{fmt(ratio(t.get('ckfmha'), t.get('torch_flash')), '7.2f')} "
              f"{fmt(ratio(t.get('ckfmha'), t.get('torch_cudnn')), '7.2f')} "
              f"{fmt(r.max_abs_diff_vs_flash, '8.1e')}")


def summary(rows: list[Row]) -> dict[str, float | None]:
    return {
        "geomean_vs_flash": geomean([ratio(r.tflops.get("ckfmha"), r.tflops.get("torch_flash"))
                                     for r in rows]),
        "geomean_vs_cudnn": geomean([ratio(r.tflops.get("ckfmha"), r.tflops.get("torch_cudnn"))
                                     for r in rows]),
    }


def plot(rows: list[Row], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = ["ckfmha", "torch_flash", "torch_cudnn"]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.7), 4.5))
    width = 0.27
    for i, name in enumerate(names):
        ax.bar([x + (i - 1) * width for x in range(len(rows))],
               [r.tflops.get(name) or 0 for r in rows], width, label=name)
    ax.set_xticks(range(len(rows)), [r.case.label for r in rows], rotation=60, ha="right",
                  fontsize=7)
    ax.set_ylabel("TFLOPS")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hdims", type=int, nargs="+", default=list(STANDARD_HDIMS))
    parser.add_argument("--seqlens", type=int, nargs="+", default=list(STANDARD_SEQLENS))
    add_run_arguments(parser, warmup=5, iters=20, repeats=5)
    args = parser.parse_args()

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    device = torch.cuda.get_device_name()
    warm_up_device()
    rows = [run_case(case, dtype, args) for case in standard_suite(args.hdims, args.seqlens)]
    print(f"device: {device}  dtype: {args.dtype}  commit: {args.commit}")
    print_table(rows)
    result_summary = summary(rows)
    result_summary["matmul_tflops"] = matmul_tflops(dtype)
    print({k: fmt(v, ".3f") for k, v in result_summary.items()})

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {
            **run_record("fwd", device, args.commit, args.dtype),
            "flops_convention": "4*b*h*sq*sk*d, halved for causal",
            "summary": result_summary,
            "rows": [{**asdict(r.case), "flops": r.case.flops, **asdict(r)} | {"case": None}
                     for r in rows],
        }
        for entry in record["rows"]:
            del entry["case"]
        stem = results_stem(record)
        (args.out / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
        plot(rows, args.out / f"{stem}.png")


if __name__ == "__main__":
    main()
