"""Convolution selection oracle: time every kernel (and, for the weight gradient, every split
count) that can run a problem's pass, beside the hand rules' automatic plan.

For each problem of conv_oracle_shapes.py and each pass (forward, backward-data,
backward-weight), the candidates are the registered kernels of the pass's family for the
problem's dtype and dims at the widest channel vector its channels allow, plus the direct
kernels whose groups hold its channels (conv_candidates); backward-weight's implicit-GEMM kernels
at split counts 1, 2, 4, .. 128 (conv_split_counts) and its direct kernels at 1, 2, 4, 8 and 16
CTAs per SM and block of groups. Each is forced by name (``kernel=``, ``splits=``), captured
in a CUDA graph and timed by ckfmha.tuning.time_calls; the automatic plan under the hand rules
is timed the same way (the row with ``rules`` True). A candidate that cannot run the problem
(shared memory, a phase it does not fit) keeps its error and no time.

The CSV (one row per problem, pass and candidate, with the device and commit) is the training
set of the learned conv selection (train_conv_selection.py).

    python benchmarks/conv_oracle.py --commit $(git rev-parse --short HEAD) --count 300
    python benchmarks/conv_oracle.py --list                 # the problems, no GPU needed
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conv_oracle_shapes import DIRECTIONS, ConvCase, draw, held_out
from oracle import add_oracle_arguments, read_rows, timing_device

from ckfmha.conv_selection import conv_candidate_plans, weight_pack

RESULTS = Path(__file__).resolve().parent / "results" / "oracle"
CSV_FIELDS = ("device", "commit", "num_sms", "problem", "label", "held_out", "direction",
              "spatial_dims", "batch", "groups", "in_channels", "out_channels", "input",
              "filter", "stride", "padding", "dilation", "output", "layer", "rules",
              "candidate", "splits", "pipeline", "tile_m", "tile_n", "tile_k", "warps", "stages",
              "vector", "max_channels", "pack", "repeats", "ms", "error")  # fmt: skip
ALGORITHM = ("pipeline", "tile_m", "tile_n", "tile_k", "warps", "stages")


def _tensors(case: ConvCase) -> dict[str, Any]:
    import torch

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    g, c, k = case.groups, case.in_channels, case.out_channels
    return {"x": randn(case.batch, *case.input, g, c), "w": randn(g, k, *case.filter, c),
            "dy": randn(case.batch, *case.output, g, k),
            "y": randn(case.batch, *case.output, g, k), "dx": randn(case.batch, *case.input, g, c),
            "dw": randn(g, k, *case.filter, c)}  # fmt: skip


def _call(case: ConvCase, direction: str, t: dict[str, Any], kernel: str,
          splits: int) -> Callable[[], Any]:  # fmt: skip
    """One launch of the pass: forced to `kernel` (and `splits`), or automatic ("")."""
    import ckfmha

    geometry = {"stride": case.stride, "padding": case.padding, "dilation": case.dilation,
                "kernel": kernel or None}  # fmt: skip
    if direction == "fwd":
        return lambda: ckfmha.conv_fwd(t["x"], t["w"], out=t["y"], **geometry)
    if direction == "bwd_data":
        return lambda: ckfmha.conv_bwd_data(t["dy"], t["w"], input_size=case.input, out=t["dx"],
                                            **geometry)  # fmt: skip
    return lambda: ckfmha.conv_bwd_weight(t["x"], t["dy"], filter_size=case.filter, out=t["dw"],
                                          splits=splits or None, **geometry)  # fmt: skip


def _pack(case: ConvCase, direction: str, kernel: dict[str, Any]) -> int | str:
    """The groups a backward-weight implicit-GEMM plan multiplies as one (the kernels'
    conv_weight_pack), so that training describes each row as it ran; "" for other plans."""
    if direction != "bwd_weight" or not kernel or int(kernel["conv_max_channels"]):
        return ""
    taps = math.prod(case.filter)
    positions = case.batch * math.prod(case.output)
    return weight_pack(case.groups, case.in_channels, case.out_channels,
                       taps * case.in_channels, positions)  # fmt: skip


def time_problem(case: ConvCase, index: int, direction: str, args: argparse.Namespace,
                 registry: list[dict[str, Any]], device: str, num_sms: int) -> list[dict[str, Any]]:  # fmt: skip
    from ckfmha.tuning import Candidate, time_calls

    kernels = {k["name"]: k for k in registry}
    plans = conv_candidate_plans(case.record(), direction, registry, num_sms)
    tensors = _tensors(case)
    rules = Candidate("", 0)
    calls = {Candidate(name, splits): _call(case, direction, tensors, name, splits)
             for name, splits in plans}  # fmt: skip
    calls[rules] = _call(case, direction, tensors, "", 0)
    results = time_calls(calls, warmup=args.warmup, iters=args.iters, repeats=args.repeats,
                         keep=[rules])  # fmt: skip
    base = {"device": device, "commit": args.commit, "num_sms": num_sms, "problem": index,
            "label": case.label, "held_out": held_out(case), "direction": direction,
            **case.record()}  # fmt: skip
    rows = []
    for r in results:
        k = kernels.get(r.candidate.kernel, {})
        rows.append({**base, "rules": r.candidate == rules, "candidate": r.candidate.kernel,
                     "splits": r.candidate.num_splits, **{a: k.get(a, "") for a in ALGORITHM},
                     "vector": k.get("conv_vector", ""),
                     "max_channels": k.get("conv_max_channels", ""),
                     "pack": _pack(case, direction, k), "repeats": r.repeats,
                     "ms": "" if r.ms is None else r.ms, "error": r.error})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--directions", nargs="+", choices=DIRECTIONS, default=list(DIRECTIONS))
    add_oracle_arguments(parser, 300, "layers (each timed in every pass asked)", RESULTS)
    args = parser.parse_args()
    cases = draw(args.count, args.seed)
    if args.list:
        for i, case in enumerate(cases):
            print(f"{i:4d} {case.label}{'  (held out)' if held_out(case) else ''}")
        return
    import torch

    import ckfmha

    device, num_sms = timing_device(parser)
    ckfmha.set_selection("heuristic")
    stem = args.stem or f"oracle-conv_{device.split()[1] if ' ' in device else device}_{args.commit}"
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.csv"
    done = {(int(r["problem"]), r["direction"]) for r in read_rows(path)}
    registry = ckfmha.Registry().kernels()
    started = time.monotonic()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        if not done:
            writer.writeheader()
        for i, case in enumerate(cases):
            if args.budget_s and time.monotonic() - started > args.budget_s:
                print(f"stopped at problem {i} of {len(cases)} (--budget-s)")
                break
            for direction in args.directions:
                if (i, direction) in done:
                    continue
                print(f"[{i + 1}/{len(cases)}] {direction} {case.label}", flush=True)
                writer.writerows(time_problem(case, i, direction, args, registry, device,
                                              num_sms))  # fmt: skip
                f.flush()
            torch.cuda.empty_cache()
    print(f"wrote {path} ({math.ceil(time.monotonic() - started)} s)")


if __name__ == "__main__":
    main()
