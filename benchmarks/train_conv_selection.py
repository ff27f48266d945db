"""Train the learned conv selection on the conv oracle's timings, and rate it and the hand rules
against the oracle on held-out problems.

Reads the conv oracle CSV (conv_oracle.py: per problem and pass, every candidate plan's time and
the hand rules' automatic plan's), fits one LightGBM regressor per pass of log(time / the hand
rules' plan's time) from ckfmha.conv_selection's features on the problems conv_oracle_shapes
keeps in, picks each pass's margin on them (the dispatcher keeps the hand rules' plan unless a
candidate is predicted at least that fraction faster), and writes:

- the model file the dispatcher reads (ckfmha/data/selection_conv_sm90.model);
- a check file of sampled candidates with their features and LightGBM's predictions, which the
  tests compare with the dispatcher's own features and predictions;
- a JSON report per pass: efficiency (oracle time / the chosen plan's time) of the hand rules
  and of the model, over the training problems and over the held-out ones.

LightGBM is needed here only (pip install lightgbm pandas); the library walks the trees in C++.

    python benchmarks/train_conv_selection.py --data \
        benchmarks/results/oracle/oracle-conv_H100_2c26205.csv.gz \
        benchmarks/results/oracle/oracle-conv-weight_H100_52f2463.csv.gz
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from oracle import efficiency_stats
from selection_model import CostModel, from_lightgbm, write_model

from ckfmha.conv_selection import DIRECTIONS, FEATURES, conv_features

ROOT = Path(__file__).resolve().parents[1]
MARGINS = (0.0, 0.01, 0.02, 0.03, 0.05, 0.08)
PARAMS = {"objective": "regression", "num_leaves": 63, "learning_rate": 0.1,
          "min_data_in_leaf": 5, "verbose": -1, "seed": 0, "deterministic": True}  # fmt: skip
ROUNDS = 200


def read_oracle(paths: list[Path]) -> Any:
    """The oracle CSVs' rows; a pass timed in a later file replaces the earlier files' rows of
    that pass (a re-timed pass after a kernel change keeps the other passes' data)."""
    import pandas as pd

    rows = None
    for path in paths:
        more = pd.read_csv(path, keep_default_na=False, na_values={"ms": [""]})
        if rows is not None:
            rows = pd.concat([rows[~rows.direction.isin(set(more.direction))], more])
        else:
            rows = more
    # Files from before the pack column: their plans' packing is the current rule's.
    rows["pack"] = rows["pack"].fillna("") if "pack" in rows else ""
    return rows


def load(paths: list[Path]) -> Any:
    """The candidate rows with a time, each with its problem key, the hand rules' time of its
    problem, its features (x) and the problem's fastest time (best)."""
    rows = read_oracle(paths)
    rows = rows[rows.ms.notna()].copy()
    rows["key"] = rows.direction + ":" + rows.problem.astype(str)
    rows["held"] = rows.held_out.astype(str).eq("True")
    rows["is_rules"] = rows.rules.astype(str).eq("True")
    rules_ms = rows[rows.is_rules].groupby("key").ms.first()
    rows = rows[rows.key.isin(rules_ms.index)].copy()
    rows["rules_ms"] = rules_ms[rows.key].to_numpy()
    rows["best"] = rows.groupby("key").ms.transform("min")
    candidates = rows[~rows.is_rules].copy()
    # Each row is described with the groups its plan packed when it was timed.
    candidates["x"] = [
        conv_features(r, r["direction"], {**r, "conv_max_channels": r["max_channels"]},
                      int(r["splits"]), int(r["num_sms"]),
                      int(r["pack"]) if str(r.get("pack", "")).strip() else None)
        for r in candidates.to_dict("records")]  # fmt: skip
    return candidates.reset_index(drop=True), rules_ms, rows.groupby("key").best.first()


def fit(rows: Any) -> Any:
    import lightgbm as lgb
    import numpy as np

    x = np.array(rows.x.tolist())
    target = np.log(rows.ms.to_numpy() / rows.rules_ms.to_numpy())
    return lgb.train(PARAMS, lgb.Dataset(x, target, feature_name=list(FEATURES)), ROUNDS)


def picks(rows: Any, rules_ms: Any, margin: float) -> dict[str, float]:
    """Per problem, the time of the plan the model picks: the candidate with the least
    predicted ratio to the hand rules' plan when it is below 1 - margin, else the rules'."""
    chosen = {}
    for key, group in rows.groupby("key"):
        best = group.loc[group.pred.idxmin()]
        chosen[key] = best.ms if math.exp(best.pred) < 1 - margin else rules_ms[key]
    return chosen


def report(rows: Any, rules_ms: Any, best: Any, margin: float) -> dict[str, Any]:
    model = picks(rows, rules_ms, margin)
    held = rows.groupby("key").held.first()
    out: dict[str, Any] = {}
    for scope in ("train", "held_out"):
        keys = [k for k in model if held[k] == (scope == "held_out")]
        out[scope] = {
            "hand_rules": efficiency_stats([best[k] / rules_ms[k] for k in keys]),
            "model": efficiency_stats([best[k] / model[k] for k in keys]),
            "model_slower_than_rules_by_2pct": int(sum(model[k] > 1.02 * rules_ms[k]
                                                       for k in keys)),
        }  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, nargs="+", required=True,
                        help="the conv oracle's CSVs; a pass in a later one replaces the earlier "
                             "ones' rows of that pass")  # fmt: skip
    parser.add_argument("--model", type=Path, default=ROOT / "ckfmha/data/selection_conv_sm90.model")
    parser.add_argument("--check", type=Path, default=ROOT / "tests/data/conv_selection_check.json")
    parser.add_argument("--report", type=Path, default=None,
                        help="default: conv_selection_report.json beside the data")  # fmt: skip
    args = parser.parse_args()
    import numpy as np

    rows, rules_ms, best = load(args.data)
    trees, margins, reports, samples = {}, {}, {}, []
    for direction in DIRECTIONS:
        subset = rows[rows.direction == direction].copy()
        booster = fit(subset[~subset.held])
        subset["pred"] = booster.predict(np.array(subset.x.tolist()))
        train = subset[~subset.held]
        # The margin with the best mean efficiency on the training problems (ties: the larger).
        scores = {m: statistics.fmean(best[k] / ms for k, ms in picks(train, rules_ms, m).items())
                  for m in MARGINS}  # fmt: skip
        margin = max(MARGINS, key=lambda m: (round(scores[m], 4), m))
        family = f"conv_{direction}"
        trees[family], margins[family] = from_lightgbm(booster.dump_model()), margin
        reports[direction] = {"margin": margin, **report(subset, rules_ms, best, margin)}
        for r in subset.sample(n=20, random_state=0).to_dict("records"):
            samples.append({"family": family, "problem": {k: r[k] for k in (
                "spatial_dims", "batch", "groups", "in_channels", "out_channels", "input",
                "filter", "stride", "dilation", "output")}, "kernel": r["candidate"],
                "splits": int(r["splits"]), "num_sms": int(r["num_sms"]),
                "pack": int(r["pack"]) if str(r["pack"]).strip() else None, "x": r["x"],
                "prediction": float(r["pred"])})  # fmt: skip
    device = str(rows.device.iloc[0])
    model = CostModel(device, 90, int(rows.num_sms.iloc[0]), trees, margins, features=FEATURES)
    args.model.parent.mkdir(parents=True, exist_ok=True)
    write_model(model, args.model)
    args.check.parent.mkdir(parents=True, exist_ok=True)
    args.check.write_text(json.dumps(samples, indent=1) + "\n")
    sources = {d: next(p.name for p in reversed(args.data)
                        if d in set(read_oracle([p]).direction)) for d in DIRECTIONS}  # fmt: skip
    result = {"device": device, "sources": sources, "rounds": ROUNDS, "params": PARAMS,
              "problems": {d: int(rows[rows.direction == d].key.nunique()) for d in DIRECTIONS},
              "report": reports}  # fmt: skip
    out = args.report or args.data[-1].parent / "conv_selection_report.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(reports, indent=1))
    print(f"wrote {args.model}, {args.check} and {out}")


if __name__ == "__main__":
    main()
