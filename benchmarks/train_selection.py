"""Train the learned selection's cost model on the oracle's timings, and report how it and the
hand rules do against the oracle on held-out problems.

Reads the oracle CSVs (oracle.py: one row per problem and candidate plan, with the hand rules'
choice marked), fits one LightGBM regressor per family (prefill forward plans, decode steps, the
backward main stage) of log(time / the hand rules' plan's time) on the problems
oracle_shapes.held_out keeps out, picks each family's margin (how much faster the model must
predict another plan before it overrides the hand rules) on those training problems, and writes:

- the model file the dispatcher reads (ckfmha/data/selection_sm90.model);
- a check file of sampled candidates with LightGBM's own predictions, which the tests compare
  with this module's evaluator and the dispatcher's;
- a JSON report: per kind, the efficiency (oracle time / chosen plan's time) of the hand rules
  and of the model, over all problems and over the held-out ones; once over every candidate the
  oracle timed and once over those the default kernel set builds (what an installed library
  chooses from).

LightGBM is needed here only (pip install lightgbm pandas); the library evaluates the trees in
C++.

    python benchmarks/train_selection.py --data benchmarks/results/oracle
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from oracle import efficiency_stats
from selection_model import FEATURES, CostModel, candidate_features, from_lightgbm, write_model

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("fwd", "decode", "varlen", "bwd")
MARGINS = (0.0, 0.01, 0.02, 0.03, 0.05, 0.08)
PARAMS = {"objective": "regression", "num_leaves": 31, "learning_rate": 0.1,
          "min_data_in_leaf": 5, "verbose": -1, "seed": 0, "deterministic": True}  # fmt: skip
ROUNDS = 200


def load(data: Path) -> Any:
    import pandas as pd

    frames = []
    for kind in KINDS:
        paths = sorted(data.glob(f"oracle-{kind}*.csv"))
        if not paths:  # the library ranks that family's plans by the hand rules
            print(f"no oracle-{kind}*.csv in {data}: no {kind} trees", file=sys.stderr)
            continue
        frame = pd.read_csv(paths[-1])
        frame["source"] = paths[-1].name
        if "mode" not in frame:  # written before the CSVs had group-mode columns: batch mode
            frame["mode"] = "batch"
        frames.append(frame)
    rows = pd.concat(frames, ignore_index=True)
    rows = rows[rows.ms.notna()].copy()
    rows["key"] = rows.kind + ":" + rows.problem.astype(str)
    rows["held"] = rows.held_out.astype(str).eq("True")
    rows["rules"] = (rows.candidate == rows.chosen) & (rows.num_splits == rows.chosen_splits)
    rows["best"] = rows.groupby("key").ms.transform("min")
    # The target is relative to the hand rules' plan, so a problem without its time is left out.
    rules_ms = rows[rows.rules].groupby("key").ms.first()
    rows = rows[rows.key.isin(rules_ms.index)].copy()
    rows["rules_ms"] = rules_ms[rows.key].to_numpy()
    rows["x"] = [candidate_features(r, r, r["num_splits"], r["num_sms"])
                 for r in rows.to_dict("records")]  # fmt: skip
    return rows.reset_index(drop=True)


def kernel_set(name: str, arch: str = "sm_90a") -> set[str]:
    """The kernel names a kernel set builds for `arch` (the generator's --list)."""
    listing = subprocess.run([sys.executable, "-m", "generator", "--kernels", name, "--arch", arch,
                              "--list"], cwd=ROOT, check=True, capture_output=True, text=True)  # fmt: skip
    return set(listing.stdout.split())


def fit(rows: Any) -> Any:
    import lightgbm as lgb
    import numpy as np

    # Only the ranking within a problem matters: predicting log(time / the rules' plan's time)
    # keeps the trees off the problems' scale (times span five decades). With log(ms) as the
    # target, the trees ranked 64-split decode plans first at batch 64, 9% slower than the rules.
    x = np.array(rows.x.tolist())
    target = np.log(rows.ms.to_numpy() / rows.rules_ms.to_numpy())
    return lgb.train(PARAMS, lgb.Dataset(x, target, feature_name=list(FEATURES)), ROUNDS)


def picks(rows: Any, margin: float) -> Any:
    """Per problem, the row the model picks: its fastest prediction, unless the hand rules'
    plan is predicted within `margin` of it."""
    chosen = {}
    for key, group in rows.groupby("key"):
        best = group.loc[group.pred.idxmin()]
        rules = group[group.rules]
        if len(rules) and math.exp(best.pred) >= math.exp(rules.pred.iloc[0]) * (1 - margin):
            best = rules.iloc[0]
        chosen[key] = best.ms
    return chosen


def report(rows: Any, margins: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    best = rows.groupby("key").best.first()
    held = rows.groupby("key").held.first()
    rules = rows[rows.rules].groupby("key").ms.first()
    for kind, margin in margins.items():
        subset = rows[rows.kind == kind]
        model = picks(subset, margin)
        for scope in ("all", "held_out"):
            keys = [k for k in model if k in rules.index and (scope == "all" or held[k])]
            out.setdefault(kind, {})[scope] = {
                "hand_rules": efficiency_stats([best[k] / rules[k] for k in keys]),
                "model": efficiency_stats([best[k] / model[k] for k in keys]),
                "model_slower_than_rules_by_2pct": int(sum(model[k] > 1.02 * rules[k]
                                                           for k in keys)),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "benchmarks/results/oracle")
    parser.add_argument("--model", type=Path, default=ROOT / "ckfmha/data/selection_sm90.model")
    parser.add_argument("--check", type=Path, default=ROOT / "tests/data/selection_check.json")
    parser.add_argument("--report", type=Path, default=None,
                        help="default: selection_report.json beside the data")  # fmt: skip
    args = parser.parse_args()
    import numpy as np

    rows = load(args.data)
    # Decode steps get trees of their own: with one set for both, the forward problems'
    # rows outnumber them and the decode picks got worse than the hand rules'.
    families = {kind: rows[rows.kind == kind] for kind in KINDS if (rows.kind == kind).any()}
    trees, margins = {}, {}
    for family, subset in families.items():
        booster = fit(subset[~subset.held])
        rows.loc[subset.index, "pred"] = booster.predict(np.array(subset.x.tolist()))
        trees[family] = from_lightgbm(booster.dump_model())
        train = rows.loc[subset.index][~subset.held]
        best = train.groupby("key").best.first()
        # The margin with the best mean efficiency on the training problems (ties: the larger).
        scores = {m: statistics.fmean(best[k] / ms for k, ms in picks(train, m).items())
                  for m in MARGINS}  # fmt: skip
        margins[family] = max(MARGINS, key=lambda m: (round(scores[m], 4), m))
    device = str(rows.device.iloc[0])
    model = CostModel(device, 90, int(rows.num_sms.iloc[0]), trees, margins)
    args.model.parent.mkdir(parents=True, exist_ok=True)
    write_model(model, args.model)
    sample = rows.groupby("kind").sample(n=20, random_state=0)  # every family checked
    args.check.parent.mkdir(parents=True, exist_ok=True)
    args.check.write_text(json.dumps([
        {"family": r["kind"], "x": r["x"], "prediction": r["pred"]}
        for r in sample.to_dict("records")], indent=1) + "\n")  # fmt: skip
    # The library's default build holds fewer tiles than the oracle's: the same model, choosing
    # among (and rated against) the default set's candidates only.
    shipped = rows[rows.candidate.isin(kernel_set("default"))].copy()
    shipped["best"] = shipped.groupby("key").ms.transform("min")
    result = {"device": device, "sources": sorted(set(rows.source)), "margins": margins,
              "rounds": ROUNDS, "params": PARAMS,
              "report": report(rows, margins),
              "report_default_set": report(shipped, margins)}  # fmt: skip
    out = args.report or args.data / "selection_report.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["report"], indent=1))
    print(f"wrote {args.model}, {args.check} and {out}")


if __name__ == "__main__":
    main()
