"""Selection oracle: time every kernel and plan that can run a problem and say how far the
hand-written rules are from the fastest candidate.

For each problem of oracle_shapes.py the dispatcher's explain output names the candidates: the
one-stage forward kernels and split-KV kernels that fit (each split kernel at several split
counts), or the backward main stages that fit, and the plan the hand rules choose. Each
candidate is forced by name (and split count); the ones near the fastest are timed on the GPU
alone (CUDA graphs, in rounds). Candidates are the kernels the library holds: build the
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
import re
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broad_cases import BroadCase
from oracle_shapes import KINDS, draw, held_out, mask_options, problem_fields, problem_record

RESULTS = Path(__file__).resolve().parent / "results" / "oracle"
# Split counts tried for each split-KV candidate, beside the dispatcher's own.
SPLIT_COUNTS = (1, 2, 4, 8, 16, 32, 64)
CSV_FIELDS = ("device", "commit", "num_sms", "problem", "label", "kind", "held_out", "dtype",
              "batch", "nhead_q", "nhead_k", "group", "seqlen_q", "seqlen_k", "hdim", "hdim_v",
              "causal", "candidate", "num_splits", "family", "pipeline", "tile_m", "tile_n",
              "warps", "stages", "chosen", "chosen_splits", "repeats", "ms",
              "error")  # fmt: skip
# A candidate whose single timed call takes more than this many times the fastest single call
# of its problem cannot be the fastest: it keeps that one measurement (repeats=1) and is not
# timed again, which keeps a run of a thousand problems within minutes.
PRUNE_RATIO = 1.3
_LISTED = re.compile(r"^  (selected|fits)\s+(\S+)$")
_PLAN = re.compile(r"^plan: (one-stage|split-KV), ([^\s:,]+)")
_SPLITS = re.compile(r"num_splits=(\d+)")


@dataclass(frozen=True)
class Candidate:
    kernel: str
    num_splits: int = 0  # split-KV candidates: the count forced; 0 otherwise


@dataclass(frozen=True)
class Choice:
    """What the dispatcher's plan line says it runs."""

    kernel: str
    num_splits: int


def fwd_candidates(explain: str) -> tuple[list[Candidate], Choice]:
    """The forward candidates an explain text lists (one-stage kernels once each, split-KV
    kernels at every count of SPLIT_COUNTS and the plan's own), and the plan's choice."""
    plan = next((line for line in explain.splitlines() if line.startswith("plan: ")), "")
    match = _PLAN.match(plan)
    if match is None:
        raise ValueError(f"no plan in the explain text: {plan or explain[-200:]!r}")
    splits = _SPLITS.search(plan)
    choice = Choice(match.group(2), int(splits.group(1)) if splits else 0)
    found: dict[Candidate, None] = {}
    for line in explain.splitlines():
        listed = _LISTED.match(line)
        if listed is None:
            continue
        name = listed.group(2)
        if name.startswith("fwd_splitkv_combine_"):
            continue  # a stage of split plans, not a candidate of its own
        if name.startswith("fwd_splitkv_"):
            for count in sorted({*SPLIT_COUNTS, max(choice.num_splits, 1)}):
                found[Candidate(name, count)] = None
        else:
            found[Candidate(name)] = None
    return list(found), choice


def bwd_candidates(explain: str) -> tuple[list[Candidate], Choice]:
    """The backward main stages (bwd_dq_dk_dv) an explain_bwd text lists, and the selected one."""
    found, selected = [], ""
    in_main_stage = False
    for line in explain.splitlines():
        if line.startswith("stage "):
            in_main_stage = line.startswith("stage bwd_dq_dk_dv")
            continue
        listed = _LISTED.match(line)
        if in_main_stage and listed is not None:
            found.append(Candidate(listed.group(2)))
            if listed.group(1) == "selected":
                selected = listed.group(2)
    if not selected:
        raise ValueError("explain_bwd selects no main stage")
    return found, Choice(selected, 0)


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
            ordered = sorted(ratio.values())
            worst = min(ratio, key=ratio.get)
            summary.setdefault(kind, {})[scope] = {
                "problems": len(scoped),
                "mean": statistics.fmean(ordered),
                "median": statistics.median(ordered),
                "p10": ordered[int(0.1 * (len(ordered) - 1))],
                "worst": ratio[worst],
                "worst_problem": labels[worst],
            }
    return summary


def _inputs(problem: BroadCase) -> dict[str, Any]:
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[problem.dtype]
    b, hq, hk = problem.batch, problem.nhead_q, problem.nhead_k

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", dtype=dtype)

    tensors = {"q": randn(b, hq, problem.seqlen_q, problem.hdim),
               "k": randn(b, hk, problem.seqlen_k, problem.hdim),
               "v": randn(b, hk, problem.seqlen_k, problem.hdim_v)}  # fmt: skip
    if problem.kind == "bwd":
        import ckfmha

        tensors["do"] = randn(b, hq, problem.seqlen_q, problem.hdim_v)
        tensors["o"], tensors["lse"] = ckfmha.fwd(tensors["q"], tensors["k"], tensors["v"],
                                                  return_lse=True, **mask_options(problem))
    return tensors


def kernel_features(registry: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kernel name, the algorithm columns a candidate row carries."""
    keys = ("family", "pipeline", "tile_m", "tile_n", "warps", "stages")
    return {k["name"]: {key: k[key] for key in keys} for k in registry}


def _graph(fn: Callable[[], Any], pool: Any) -> Any:
    """One call of fn captured in a CUDA graph: replaying it times the GPU work alone,
    without the host path (which differs between forced and automatic calls, not between
    kernels). The graphs of a problem share one memory pool: they replay one at a time on one
    stream, and nothing reads their outputs."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        fn()
    return graph


def _replay_ms(graph: Any, calls: int) -> float:
    """Milliseconds per replay over `calls` back-to-back replays."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def time_problem(problem: BroadCase, index: int, args: argparse.Namespace,
                 device: str, features: dict[str, dict[str, Any]] | None = None,
                 num_sms: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """One CSV row per candidate of `problem`. Every candidate is captured in a CUDA graph and
    gets one timed replay; those within PRUNE_RATIO of the fastest are timed in rounds that
    visit each in turn (so clock and temperature drift spread over all of them): the median of
    `repeats` rounds of `iters` replays. The row of the hand rules' own plan is marked by its
    `chosen` columns (is_choice)."""
    import torch

    import ckfmha

    dispatcher, arch = ckfmha.Dispatcher(), ckfmha.device_arch()
    features = features if features is not None else kernel_features(ckfmha.Registry().kernels())
    fields = problem_fields(problem)
    if problem.kind == "bwd":
        candidates, choice = bwd_candidates(dispatcher.explain_bwd(**fields, arch=arch))
    else:
        candidates, choice = fwd_candidates(dispatcher.explain(**fields, arch=arch))
    t = _inputs(problem)
    mask = mask_options(problem)

    def call(candidate: Candidate) -> Callable[[], Any]:
        forced = {"kernel": candidate.kernel}
        if problem.kind == "bwd":
            return lambda: ckfmha.bwd(t["do"], t["q"], t["k"], t["v"], t["o"], t["lse"],
                                      **mask, **forced)  # fmt: skip
        return lambda: ckfmha.fwd(t["q"], t["k"], t["v"], num_splits=candidate.num_splits,
                                  **mask, **forced)  # fmt: skip

    # Every candidate is captured and timed once (after one warm replay); the ones within
    # PRUNE_RATIO of the fastest are then timed in rounds.
    pool, graphs = torch.cuda.graph_pool_handle(), {}
    coarse: dict[Candidate, float] = {}
    errors: dict[Candidate, str] = {}
    for candidate in candidates:
        try:
            graphs[candidate] = _graph(call(candidate), pool)
            _replay_ms(graphs[candidate], 1)
            coarse[candidate] = _replay_ms(graphs[candidate], 1)
        except ckfmha.CkfmhaError as exc:  # a candidate the plan refuses (e.g. a split count)
            errors[candidate] = str(exc).splitlines()[0][:200]
        except torch.OutOfMemoryError:  # e.g. a split count whose workspace does not fit
            errors[candidate] = "out of device memory"
            torch.cuda.empty_cache()
        except RuntimeError as exc:  # a call the graph could not capture
            errors[candidate] = f"graph capture: {str(exc).splitlines()[0][:180]}"
    fastest = min(coarse.values(), default=0.0)
    near = [c for c in candidates if c in coarse and coarse[c] <= PRUNE_RATIO * fastest]
    rounds: dict[Candidate, list[float]] = {c: [] for c in near}
    for r in range(args.warmup + args.repeats):
        for c in near[r % len(near):] + near[: r % len(near)]:
            ms = _replay_ms(graphs[c], args.iters)
            if r >= args.warmup:
                rounds[c].append(ms)
    del graphs, pool
    rows = []
    for candidate in candidates:
        ms, repeats = coarse.get(candidate), 1
        if candidate in rounds:
            ms, repeats = statistics.median(rounds[candidate]), args.repeats
        algorithm = features.get(candidate.kernel, {})
        rows.append({"device": device, "commit": args.commit, "num_sms": num_sms,
                     "problem": index, "label": f"{problem.label} {problem.dtype}",
                     **problem_record(problem), "candidate": candidate.kernel,
                     "num_splits": candidate.num_splits,
                     **{key: algorithm.get(key, "") for key in
                        ("family", "pipeline", "tile_m", "tile_n", "warps", "stages")},
                     "chosen": choice.kernel, "chosen_splits": choice.num_splits,
                     "repeats": repeats if ms is not None else 0, "ms": ms,
                     "error": errors.get(candidate, "")})  # fmt: skip
    return rows


def _read_rows(path: Path) -> list[dict[str, Any]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--count", type=int, default=20, help="problems per kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--list", action="store_true", help="print the problems and exit")
    parser.add_argument("--commit", default="unknown", help="commit the library was built from")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--stem", help="file name without suffix (default: device, date, commit)")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="stop after this many seconds; a later run with the same --stem "
                             "goes on from the problems already in its CSV")  # fmt: skip
    args = parser.parse_args()

    problems = [(kind, p) for kind in args.kinds for p in draw(kind, args.count, args.seed)]
    if args.list:
        for i, (_, p) in enumerate(problems):
            print(f"{i:4d} {p.kind} {p.label} {p.dtype}{'  (held out)' if held_out(p) else ''}")
        return
    import torch

    import ckfmha

    if not torch.cuda.is_available():
        parser.error("timing needs a CUDA device (--list works without one)")
    device = torch.cuda.get_device_name()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    stem = args.stem or f"oracle_{device.replace(' ', '_')}_{dt.date.today().isoformat()}_{args.commit}"
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / f"{stem}.csv"
    rows = _read_rows(csv_path) if csv_path.exists() else []
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
