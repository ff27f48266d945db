"""One problem's kernels under Nsight Compute, ckfmha's beside SDPA's cuDNN backend.

Runs itself under ``ncu``: the inner run warms both up, then profiles one call of each (the
backward: ckfmha's three-stage plan against cuDNN's forward and backward kernels; the forward:
one forward each). The report lines the kernels up with their duration, the instructions they
executed (elapsed cycles x executed IPC x SMs), issue rate, busiest pipe, cache hit rates and
launch shape, and ends with ckfmha's largest kernel against the peer's: where two kernels
issue at the same rate, the one that executes more instructions is slower by that much.
ncu locks the clocks to base, so durations read longer than in a timed run; compare ratios.

    python benchmarks/profile_vs_cudnn.py --kind bwd --batch 8 --heads 24 --seqlen 2900 \\
        --hdim 192 --hdim-v 128 --causal --save ncu_d192.csv
    python benchmarks/profile_vs_cudnn.py --report ncu_d192.csv     # a saved run, no GPU

``--heads 24/8`` gives GQA (query heads / KV heads); ``--seqlen 1024/4096`` unequal lengths
(a causal mask then aligned bottom-right).

Grouped convolution: ``--kind conv_fwd`` / ``conv_bwd_data`` / ``conv_bwd_weight`` profiles
one layer of ``bench_conv.py``'s suite (``--layer model/name``) at ``--batch``, ckfmha's plan
(every launch of it) against cuDNN's through torch on the same channels_last operands:

    python benchmarks/profile_vs_cudnn.py --kind conv_bwd_weight --layer "resnet18/3x3 128" \
        --batch 32 --metrics smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio

``--metrics`` adds ncu metrics by name; the report lists them under the table.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ncu sections whose metrics the report reads (names as ``ncu --list-sections`` gives them).
SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats", "SchedulerStats",
            "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis")  # fmt: skip
# (column, ncu metric name, format): what the report prints for each kernel.
COLUMNS = (
    ("us", "Duration", "{:.0f}"),
    ("IPC", "Executed Ipc Elapsed", "{:.2f}"),
    ("issue%", "Issue Slots Busy", "{:.0f}"),
    ("pipe%", "SM Busy", "{:.0f}"),
    ("L1hit%", "L1/TEX Hit Rate", "{:.0f}"),
    ("L2hit%", "L2 Hit Rate", "{:.0f}"),
    ("dram%", "DRAM Throughput", "{:.0f}"),
    ("grid", "Grid Size", "{:.0f}"),
    ("regs", "Registers Per Thread", "{:.0f}"),
)
# ckfmha's kernels are in namespace ckfmha (ncu sometimes names them from the inner namespace
# on: kernel::, runtime::); every other kernel is the peer's.
OURS = re.compile(r"(^|[\s<(])(ckfmha|kernel|runtime)::")
CONV_KINDS = ("conv_fwd", "conv_bwd_data", "conv_bwd_weight")


@dataclass
class Kernel:
    """One profiled launch: its name and its metrics by ncu's metric name."""

    name: str
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def ours(self) -> bool:
        return OURS.search(self.name) is not None

    @property
    def instructions(self) -> float:
        """Warp instructions executed: elapsed cycles (per SM) x executed IPC x SMs."""
        m = self.metrics
        return m["Elapsed Cycles"] * m["Executed Ipc Elapsed"] * m["# SMs"]

    @property
    def duration_us(self) -> float:
        return self.metrics["Duration"] / 1e3

    def short_name(self, width: int = 48) -> str:
        name = self.name.removeprefix("void ").split("(")[0]
        return name if len(name) <= width else name[: width - 3] + "..."


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[Kernel]:
    """Kernels in launch order from ``ncu --csv --page details`` output. Lines that are not
    CSV rows (ncu's own ==PROF== lines, the program's output) are skipped."""
    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    if not rows:
        raise ValueError("no ncu CSV rows in the input (was it run with --csv --page details?)")
    header = {name: i for i, name in enumerate(rows[0])}
    missing = {"ID", "Kernel Name", "Metric Name", "Metric Value"} - header.keys()
    if missing:
        raise ValueError(f"not an ncu details CSV: no column {sorted(missing)}")
    kernels: dict[str, Kernel] = {}
    for row in rows[1:]:
        kernel = kernels.setdefault(row[header["ID"]], Kernel(row[header["Kernel Name"]]))
        value = _number(row[header["Metric Value"]])
        if row[header["Metric Name"]] and value is not None:
            kernel.metrics[row[header["Metric Name"]]] = value
    return list(kernels.values())


def _cell(kernel: Kernel, metric: str, spec: str) -> str:
    value = kernel.metrics.get(metric)
    if value is None:
        return "-"
    return spec.format(value / 1e3 if metric == "Duration" else value)


def report(kernels: list[Kernel], extra: tuple[str, ...] = ()) -> str:
    """The kernel table, each library's totals, the largest kernels against each other, and
    the `extra` metrics of each kernel that has them."""
    widths = [max(len(title), 8) for title, _, _ in COLUMNS]
    lines = ["  ".join([f"{'kernel':48s}", f"{'instr':>9s}",
                        *(f"{t:>{w}s}" for (t, _, _), w in zip(COLUMNS, widths))])]  # fmt: skip
    for k in kernels:
        cells = (f"{_cell(k, metric, spec):>{w}s}" for (_, metric, spec), w in zip(COLUMNS, widths))
        lines.append("  ".join([f"{k.short_name():48s}", f"{k.instructions:9.3g}", *cells]))
    ours = [k for k in kernels if k.ours]
    peer = [k for k in kernels if not k.ours]
    for label, group in (("ckfmha", ours), ("peer", peer)):
        if group:
            lines.append(f"{label}: {len(group)} kernels, "
                         f"{sum(k.duration_us for k in group):.0f} us, "
                         f"{sum(k.instructions for k in group):.3g} instructions")  # fmt: skip
    if ours and peer:
        a, b = (max(group, key=lambda k: k.duration_us) for group in (ours, peer))
        lines.append(f"largest kernels, ckfmha / peer: time {a.duration_us / b.duration_us:.2f}x, "
                     f"instructions {a.instructions / b.instructions:.2f}x, IPC "
                     f"{a.metrics['Executed Ipc Elapsed']:.2f} / "
                     f"{b.metrics['Executed Ipc Elapsed']:.2f}")  # fmt: skip
    for metric in extra:
        values = [f"{k.metrics[metric]:.3g}" for k in kernels if metric in k.metrics]
        if values:
            lines.append(f"{metric}: {' / '.join(values)}")
    return "\n".join(lines)


def _one_or_two(text: str) -> tuple[int, int]:
    """"24" -> (24, 24); "24/8" -> (24, 8)."""
    first, _, second = text.partition("/")
    return int(first), int(second or first)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, help="print the table of a saved ncu CSV and exit")
    parser.add_argument("--kind", choices=["fwd", "bwd", *CONV_KINDS], default="bwd")
    parser.add_argument("--layer", default="resnet18/3x3 128",
                        help="conv kinds: a layer of bench_conv.py's suite, model/name")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=_one_or_two, default=(16, 16), help="query[/KV] heads")
    parser.add_argument("--seqlen", type=_one_or_two, default=(2048, 2048), help="query[/key] length")
    parser.add_argument("--hdim", type=int, default=128)
    parser.add_argument("--hdim-v", type=int, help="V's head dim (default: --hdim)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--metrics", default="", help="extra ncu metrics, comma-separated")
    parser.add_argument("--ncu", default=os.environ.get("NCU", "ncu"), help="ncu executable")
    parser.add_argument("--save", type=Path, help="also write ncu's CSV here")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    heads_q, heads_k = args.heads
    if heads_q % heads_k:
        parser.error(f"--heads {heads_q}/{heads_k}: query heads must be a multiple of KV heads")
    return args


def extra_metrics(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(name.strip() for name in args.metrics.split(",") if name.strip())


def case_of(args: argparse.Namespace) -> Any:
    """The broad suite's case for the arguments, so that both libraries are called as there."""
    from broad_cases import BroadCase

    (heads_q, heads_k), (seqlen_q, seqlen_k) = args.heads, args.seqlen
    return BroadCase(args.kind, args.batch, heads_q, heads_k, seqlen_q, seqlen_k, args.hdim,
                     args.hdim_v or args.hdim, args.causal, args.dtype)  # fmt: skip


def ncu_command(args: argparse.Namespace, argv: list[str]) -> list[str]:
    """ncu over this script's inner run: sections, CSV details, profiling between the
    profiler start and stop calls only."""
    sections = [flag for name in SECTIONS for flag in ("--section", name)]
    if args.metrics:
        sections += ["--metrics", args.metrics]
    return [args.ncu, "--profile-from-start", "off", *sections, "--csv", "--page", "details",
            sys.executable, str(Path(__file__).resolve()), *argv, "--inner"]  # fmt: skip


def conv_calls(args: argparse.Namespace) -> list[Any]:
    """ckfmha's and cuDNN's call of the conv layer's pass, on the same operands."""
    import torch
    from bench_conv import find_layer, make_operands, passes

    torch.backends.cudnn.benchmark = True
    layer = find_layer(args.layer)
    operands = make_operands(layer, args.batch, args.dtype)
    return list(passes(args.kind.removeprefix("conv_"), operands, layer).values())


def attention_calls(args: argparse.Namespace) -> list[Any]:
    """ckfmha's and SDPA's cuDNN call of the attention case (those that accept it)."""
    from bench_broad import make_inputs, prepare_ckfmha, prepare_peer

    case = case_of(args)
    q, k, v, do = make_inputs(case)
    ours, measurement, _ = prepare_ckfmha(case, q, k, v, do)
    peer, peer_measurement, _ = prepare_peer(case, "torch_cudnn", q, k, v, do)
    for label, fn, m in (("ckfmha", ours, measurement), ("cudnn", peer, peer_measurement)):
        if fn is None:
            print(f"{label} refused the case: {m.error}", file=sys.stderr)
    return [fn for fn in (ours, peer) if fn is not None]


def inner_run(args: argparse.Namespace) -> None:
    """Runs under ncu: warm-up (cuDNN's algorithm search included), then one profiled call of
    each library."""
    import torch

    calls = conv_calls(args) if args.kind in CONV_KINDS else attention_calls(args)
    for fn in calls:
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.report:
        print(report(parse_ncu_csv(args.report.read_text()), extra_metrics(args)))
        return
    if args.inner:
        inner_run(args)
        return
    if shutil.which(args.ncu) is None:
        sys.exit(f"{args.ncu} not found: give its path with --ncu or NCU")
    result = subprocess.run(ncu_command(args, argv), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"ncu failed ({result.returncode}):\n{result.stderr[-4000:]}")
    if args.save:
        args.save.write_text(result.stdout)
    print(report(parse_ncu_csv(result.stdout), extra_metrics(args)))


if __name__ == "__main__":
    main()
