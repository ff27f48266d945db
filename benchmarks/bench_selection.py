"""The learned selection against the hand rules on the benchmark suites' own cases.

For every case of the broad suite (which holds the 18 standard forward and backward cases) and
of bench_decode.py's decode suite, the dispatcher's plan is read under the "heuristic" and the
"learned" selection modes. Where the two agree, the case runs the same kernels either way and
its ratio is 1 by construction. Where they differ, both plans are forced by name, captured in
CUDA graphs and timed in alternating rounds (ckfmha.tuning.time_plans), so only GPU time
counts and clock drift spreads over both. The JSON holds each case's two plans and times and,
per kind, how many cases changed plan, the geomean speedup of the learned plan and the worst
case.

    python benchmarks/bench_selection.py --commit $(git rev-parse --short HEAD)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import torch
from bench_broad import STANDARD_HDIMS, STANDARD_SEQLENS
from bench_bwd import standard_suite as bwd_standard_suite
from bench_decode import HDIM as DECODE_STANDARD_HDIM
from bench_decode import HEADS_K as DECODE_STANDARD_HEADS_K
from bench_decode import HEADS_Q as DECODE_STANDARD_HEADS_Q
from bench_decode import SHAPES as DECODE_STANDARD_SHAPES
from bench_fwd import standard_suite as fwd_standard_suite
from broad_cases import KINDS, BroadCase, select, suite
from oracle_shapes import problem_fields

import ckfmha
from ckfmha.tuning import Candidate, dispatcher_candidates, time_plans

RESULTS = Path(__file__).resolve().parent / "results" / "selection"
MODES = ("heuristic", "learned")
# A learned plan more than this much slower than the rules' counts as a loss in the summary;
# two timings of one small kernel differ by about 1%.
LOSS_MARGIN = 0.02


def cases() -> list[BroadCase]:
    fwd = fwd_standard_suite(list(STANDARD_HDIMS), list(STANDARD_SEQLENS))
    bwd = bwd_standard_suite(list(STANDARD_HDIMS), list(STANDARD_SEQLENS))
    decode = [BroadCase("decode", b, DECODE_STANDARD_HEADS_Q, DECODE_STANDARD_HEADS_K, 1, sk,
                        DECODE_STANDARD_HDIM, DECODE_STANDARD_HDIM, False, standard=True)
              for b, sk in DECODE_STANDARD_SHAPES]  # fmt: skip
    return [*suite(fwd, bwd), *decode]


def plan_text(plan: Candidate) -> str:
    return plan.kernel + (f" ({plan.num_splits} splits)" if plan.num_splits else "")


def compare_case(case: BroadCase, args: argparse.Namespace) -> dict[str, Any]:
    """The case's plan under each mode, and both plans' times when they differ."""
    kind = "bwd" if case.kind == "bwd" else "fwd"
    fields = problem_fields(case)
    plans = {}
    for mode in MODES:
        with ckfmha.selection(mode):
            _, choice = dispatcher_candidates(kind, fields)
        plans[mode] = Candidate(choice.kernel, choice.num_splits)
    row: dict[str, Any] = {"kind": case.kind, "label": case.label, "standard": case.standard,
                           **{f"{m}_plan": plan_text(p) for m, p in plans.items()},
                           "same_plan": plans["heuristic"] == plans["learned"]}  # fmt: skip
    if row["same_plan"]:
        return row
    # No pruning: both plans get every round, whatever their first replay says.
    timed = time_plans(kind, fields, [plans[m] for m in MODES], warmup=args.warmup,
                       iters=args.iters, repeats=args.repeats, prune=math.inf)  # fmt: skip
    for mode, result in zip(MODES, timed):
        row[f"{mode}_ms"] = result.ms
        if result.error:
            row[f"{mode}_error"] = result.error
    if row["heuristic_ms"] and row["learned_ms"]:
        row["speedup"] = row["heuristic_ms"] / row["learned_ms"]
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind: cases, how many changed plan, the geomean speedup of the learned plan over
    the changed cases and over all (unchanged ones at 1), losses beyond LOSS_MARGIN, the worst."""
    summary: dict[str, Any] = {}
    for kind in KINDS:
        scoped = [r for r in rows if r["kind"] == kind]
        changed = [r for r in scoped if not r["same_plan"] and "speedup" in r]
        logs = [math.log(r["speedup"]) for r in changed]
        worst = min(changed, key=lambda r: r["speedup"], default=None)
        summary[kind] = {
            "cases": len(scoped),
            "changed_plan": len(changed),
            "geomean_speedup_changed": math.exp(sum(logs) / len(logs)) if logs else 1.0,
            "geomean_speedup_all": math.exp(sum(logs) / len(scoped)) if scoped else 1.0,
            "slower_than_rules": sum(r["speedup"] < 1 - LOSS_MARGIN for r in changed),
            "worst_speedup": worst["speedup"] if worst else 1.0,
            "worst_case": worst["label"] if worst else "",
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="unknown", help="commit the library was built from")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("timing needs a CUDA device")
    device = torch.cuda.get_device_name()
    rows = []
    for i, case in enumerate(select(cases(), args.kinds), start=1):
        row = compare_case(case, args)
        rows.append(row)
        note = "same plan" if row["same_plan"] else f"speedup {row.get('speedup', 0):.3f}"
        print(f"[{i}] {case.kind} {case.label}: {note}", flush=True)
        torch.cuda.empty_cache()
    summary = summarize(rows)
    print(json.dumps(summary, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"selection_{device.replace(' ', '_')}_{dt.date.today().isoformat()}_{args.commit}"
    (args.out / f"{stem}.json").write_text(json.dumps(
        {"device": device, "commit": args.commit, "model": ckfmha.selection_model_info(),
         "settings": {k: getattr(args, k) for k in ("warmup", "iters", "repeats", "kinds")},
         "summary": summary, "cases": rows}, indent=2) + "\n")  # fmt: skip
    print(f"wrote {args.out / stem}.json")


if __name__ == "__main__":
    main()
