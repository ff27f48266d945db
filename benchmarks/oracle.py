"""Selection oracle: time every kernel and plan that can run a problem and say how far the
hand-written rules are from the fastest candidate.

For each problem of oracle_shapes.py the dispatcher's explain output names the candidates: the
one-stage forward kernels and split-KV kernels that fit (each split kernel at several split
counts), or the backward main stages that fit, and the plan the hand rules choose. Each
candidate is forced by name (and split count); the ones near the fastest are timed on the GPU
alone (CUDA graphs, in rounds), by ckfmha.tuning.time_candidates, the timing behind
``python -m ckfmha tune``. Candidates are the kernels the library holds: build the
alternatives first (``python -m ckfmha build --kernels full --arch sm_90a -j 16``) for a wider
search.

The run writes one CSV row per (problem, candidate) with the device and commit, the candidate's
algorithm (tile, warps, stages, pipeline) and the hand rules' choice, and a JSON summary: per
kind, the hand rules' efficiency (fastest time / the chosen plan's time) over all problems and
over the held-out ones (oracle_shapes.held_out): mean, median, P10 and worst. The CSV is the
training set of the learned selection (train_selection.py).

    python benchmarks/oracle.py --commit $(git rev-parse --short HEAD) --count 50
    python benchmarks/oracle.py --list --kinds decode        # the problems, no GPU needed
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from oracle_shapes import KINDS, Problem, draw, held_out, problem_fields, problem_record

from ckfmha.tuning import time_candidates

RESULTS = Path(__file__).resolve().parent / "results" / "oracle"
CSV_FIELDS = ("device", "commit", "num_sms", "problem", "label", "kind", "held_out", "dtype",
              "mode", "batch", "nhead_q", "nhead_k", "group", "seqlen_q", "seqlen_k", "total_q",
              "total_k", "hdim", "hdim_v", "causal", "candidate", "num_splits", "family", "pipeline", "tile_m", "tile_n",
              "warps", "stages", "chosen", "chosen_splits", "repeats", "ms",
              "error")  # fmt: skip
# The registry fields a candidate row carries: its algorithm.
ALGORITHM_COLUMNS = ("family", "pipeline", "tile_m", "tile_n", "warps", "stages")


def is_choice(row: dict[str, Any]) -> bool:
    """Whether a candidate row is the plan the hand-written rules choose for its problem."""
    return (row["candidate"] == row["chosen"]
            and int(row["num_splits"] or 0) == int(row["chosen_splits"] or 0))  # fmt: skip


def efficiency_summary(rows: Iterable[dict[str, Any]],
                       chosen: Callable[[dict[str, Any]], bool] = is_choice) -> dict[str, Any]:  # fmt: skip
    """Per kind, the chosen candidate's time against the fastest candidate's, over all problems
    and over the held-out ones. `chosen` marks the row of each problem a selection picks (the
    hand rules' by default). Rows are CSV rows (an error row has no time)."""
    best: dict[tuple[str, int], float] = {}
    picked: dict[tuple[str, int], float] = {}
    held: dict[tuple[str, int], bool] = {}
    labels: dict[tuple[str, int], str] = {}
    for row in rows:
        if row["ms"] in ("", None):
            continue
        key = (row["kind"], int(row["problem"]))
        ms = float(row["ms"])
        held[key], labels[key] = str(row["held_out"]) == "True", row["label"]
        best[key] = min(ms, best.get(key, ms))
        if chosen(row):
            picked[key] = ms
    summary: dict[str, Any] = {}
    for kind in KINDS:
        keys = [k for k in picked if k[0] == kind]
        for scope, scoped in (("all", keys), ("held_out", [k for k in keys if held[k]])):
            if not scoped:
                continue
            ratio = {k: best[k] / picked[k] for k in scoped}
            summary.setdefault(kind, {})[scope] = {
                **efficiency_stats(ratio.values()),
                "worst_problem": labels[min(ratio, key=ratio.get)],
            }
    return summary


def efficiency_stats(ratios: Iterable[float]) -> dict[str, float]:
    """Problems, mean, median, P10 and worst of per-problem efficiencies (fastest / chosen)."""
    ordered = sorted(ratios)
    return {"problems": len(ordered), "mean": statistics.fmean(ordered),
            "median": statistics.median(ordered), "p10": ordered[int(0.1 * (len(ordered) - 1))],
            "worst": ordered[0]}  # fmt: skip


def kernel_features(registry: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kernel name, the algorithm columns a candidate row carries."""
    return {k["name"]: {key: k[key] for key in ALGORITHM_COLUMNS} for k in registry}


def time_problem(problem: Problem, index: int, args: argparse.Namespace,
                 device: str, features: dict[str, dict[str, Any]] | None = None,
                 num_sms: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """One CSV row per candidate of `problem`, timed by ckfmha.tuning.time_candidates (every
    candidate captured in a CUDA graph and estimated by single replays; those within
    PRUNE_RATIO of the fastest, and the hand rules' plan, by the median of `repeats` rounds of
    `iters` replays). The row of the hand rules' own plan is marked by its `chosen` columns
    (is_choice)."""
    import ckfmha

    features = features if features is not None else kernel_features(ckfmha.Registry().kernels())
    kind = "bwd" if problem.kind == "bwd" else "fwd"  # decode and varlen are forward problems
    timing = time_candidates(kind, problem_fields(problem), warmup=args.warmup,
                             iters=args.iters, repeats=args.repeats)  # fmt: skip
    choice = timing.choice
    rows = []
    for result in timing.results:
        algorithm = features.get(result.candidate.kernel, {})
        rows.append({"device": device, "commit": args.commit, "num_sms": num_sms,
                     "problem": index, "label": f"{problem.label} {problem.dtype}",
                     **problem_record(problem), "candidate": result.candidate.kernel,
                     "num_splits": result.candidate.num_splits,
                     **{key: algorithm.get(key, "") for key in ALGORITHM_COLUMNS},
                     "chosen": choice.kernel, "chosen_splits": choice.num_splits,
                     "repeats": result.repeats, "ms": result.ms,
                     "error": result.error})  # fmt: skip
    return rows


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an oracle CSV written so far (none when it does not exist yet)."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def timing_device(parser: argparse.ArgumentParser) -> tuple[str, int]:
    """The CUDA device an oracle times on: its name and SM count (a usage error without one)."""
    import torch

    if not torch.cuda.is_available():
        parser.error("timing needs a CUDA device (--list works without one)")
    return (torch.cuda.get_device_name(),
            torch.cuda.get_device_properties(0).multi_processor_count)  # fmt: skip


def add_oracle_arguments(parser: argparse.ArgumentParser, count: int, count_help: str,
                         out: Path) -> None:  # fmt: skip
    """The options every oracle takes: what to draw, how to time, where to write, and a time
    budget a later run with the same --stem resumes from."""
    parser.add_argument("--count", type=int, default=count, help=count_help)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--list", action="store_true", help="print the problems and exit")
    parser.add_argument("--commit", default="unknown", help="commit the library was built from")
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--stem", help="file name without suffix (default: device and commit)")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="stop after this many seconds; a later run with the same --stem "
                             "goes on from the problems already in its CSV")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    add_oracle_arguments(parser, 20, "problems per kind", RESULTS)
    args = parser.parse_args()

    problems = [(kind, p) for kind in args.kinds for p in draw(kind, args.count, args.seed)]
    if args.list:
        for i, (_, p) in enumerate(problems):
            print(f"{i:4d} {p.kind} {p.label} {p.dtype}{'  (held out)' if held_out(p) else ''}")
        return
    import torch

    import ckfmha

    device, num_sms = timing_device(parser)
    stem = args.stem or f"oracle_{device.replace(' ', '_')}_{dt.date.today().isoformat()}_{args.commit}"
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / f"{stem}.csv"
    rows = read_rows(csv_path)
    done = {int(row["problem"]) for row in rows}
    features = kernel_features(ckfmha.Registry().kernels())
    started = time.monotonic()
    with csv_path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        if not rows:
            writer.writeheader()
        for i, (_, problem) in enumerate(problems):
            if i in done:
                continue
            if args.budget_s and time.monotonic() - started > args.budget_s:
                print(f"stopped at problem {i} of {len(problems)} (--budget-s)")
                break
            print(f"[{i + 1}/{len(problems)}] {problem.kind} {problem.label}", flush=True)
            new = time_problem(problem, i, args, device, features, num_sms)
            writer.writerows(new)
            f.flush()
            rows += new
            torch.cuda.empty_cache()
    summary = efficiency_summary(rows)
    print(json.dumps(summary, indent=2))
    settings = {k: getattr(args, k) for k in ("kinds", "count", "seed", "warmup", "iters",
                                              "repeats")}  # fmt: skip
    (args.out / f"{stem}.json").write_text(json.dumps(
        {"device": device, "commit": args.commit, "settings": settings,
         "problems": len({int(row["problem"]) for row in rows}), "summary": summary},
        indent=2) + "\n")  # fmt: skip
    print(f"wrote {args.out / stem}.csv and .json")


if __name__ == "__main__":
    main()
