"""The learned selection's cost model on the Python side: the candidate features (the same list,
in the same order, as cpp/src/selection_features.cpp computes), the model file the C++
dispatcher reads (ckfmha-selection-model 1), and a reader and evaluator of that file.

train_selection.py trains LightGBM on the oracle's timings with these features and writes the
file; the tests evaluate the file here and through the dispatcher and compare.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckfmha.conv_selection import FEATURES as CONV_FEATURE_NAMES

FEATURES = ("log_batch", "nhead_q", "group", "log_seqlen_q", "log_seqlen_k", "hdim_q", "hdim_v",
            "causal", "sm90", "split", "num_splits", "tile_m", "tile_n", "warps", "stages",
            "log_ctas", "waves", "log_key_tiles", "pad", "log_work", "fill")  # fmt: skip
HEADER = "ckfmha-selection-model 1"
CONV_FEATURES = CONV_FEATURE_NAMES


def candidate_features(problem: Mapping[str, Any], kernel: Mapping[str, Any], num_splits: int,
                       num_sms: int) -> list[float]:  # fmt: skip
    """One candidate's features. `problem`: batch, nhead_q, nhead_k, seqlen_q, seqlen_k, hdim,
    hdim_v, causal (any mask), and in group mode (mode "group") total_q and total_k, the
    packed token counts, with seqlen_q/k the longest sequence; `kernel`: family, pipeline,
    tile_m, tile_n, warps, stages (a registry record or an oracle CSV row)."""
    b, hq, hk = int(problem["batch"]), int(problem["nhead_q"]), int(problem["nhead_k"])
    sq, sk = int(problem["seqlen_q"]), int(problem["seqlen_k"])
    mean_q, mean_k = _mean_length(problem, "total_q", sq), _mean_length(problem, "total_k", sk)
    dq, dv = int(problem["hdim"]), int(problem["hdim_v"])
    masked = str(problem["causal"]) in ("True", "true", "1")
    split = kernel["family"] == "fwd_splitkv"
    splits = float(max(int(num_splits), 1)) if split else 0.0
    group = hq / max(hk, 1)
    rows = sq * group if split else float(sq)
    heads = float(hk if split else hq)
    tile_m, tile_n = float(max(int(kernel["tile_m"]), 1)), float(max(int(kernel["tile_n"]), 1))
    query_tiles = math.ceil(rows / tile_m)
    ctas = query_tiles * heads * b * max(splits, 1.0)
    key_tiles = math.ceil(math.ceil(sk / tile_n) / max(splits, 1.0))
    work = b * hq * mean_q * mean_k * (dq + dv) * (0.5 if masked else 1.0)
    return [math.log2(b), float(hq), group, math.log2(sq), math.log2(sk), float(dq), float(dv),
            1.0 if masked else 0.0, 1.0 if kernel["pipeline"] == "sm90_tma_wgmma" else 0.0,
            1.0 if split else 0.0, splits, tile_m, tile_n, float(kernel["warps"]),
            float(kernel["stages"]), math.log2(ctas), ctas / max(num_sms, 1),
            math.log2(key_tiles), (query_tiles * tile_m - rows) / (query_tiles * tile_m),
            math.log2(work), mean_q / max(sq, 1)]  # fmt: skip


def _mean_length(problem: Mapping[str, Any], total_key: str, longest: int) -> float:
    """Group mode: the mean sequence length (tokens / batch, at most the longest); batch mode,
    or no token count recorded (empty or NaN): the length itself."""
    total = problem.get(total_key)
    if problem.get("mode") != "group" or total in (None, "") or math.isnan(float(total)):
        return float(longest)
    if int(total) <= 0:
        return float(longest)
    return min(int(total) / int(problem["batch"]), float(longest))


@dataclass
class Node:
    feature: int  # < 0: a leaf
    threshold: float
    left: int
    right: int
    value: float


@dataclass
class CostModel:
    device: str
    arch: int
    num_sms: int
    # Attention: "fwd", "decode", "varlen", "bwd"; convolution: "conv_fwd", "conv_bwd_data",
    # "conv_bwd_weight".
    trees: dict[str, list[list[Node]]] = field(default_factory=dict)
    # Per family: how much faster another plan must be predicted than the hand rules' plan
    # before it replaces it.
    margins: dict[str, float] = field(default_factory=dict)
    # "log_ratio_to_rules": the trees predict log(time / the hand rules' plan's time) for the
    # same problem; "log_ms": log(milliseconds).
    target: str = "log_ratio_to_rules"
    # The feature list the trees index: FEATURES (attention plans) or
    # ckfmha.conv_selection.FEATURES (convolution plans).
    features: tuple[str, ...] = FEATURES

    def predict_log(self, family: str, x: list[float]) -> float:
        total = 0.0
        for tree in self.trees.get(family, []):
            node = tree[0]
            while node.feature >= 0:
                node = tree[node.left if x[node.feature] <= node.threshold else node.right]
            total += node.value
        return total


def write_model(model: CostModel, path: Path) -> None:
    lines = [HEADER, (f"# gradient-boosted trees predicting {model.target} of a candidate plan; "
                      "benchmarks/train_selection.py, train_conv_selection.py"), f"device {model.device}", f"arch {model.arch}",
             f"num_sms {model.num_sms}", f"target {model.target}",
             "features " + " ".join(model.features)]  # fmt: skip
    for family, trees in model.trees.items():
        lines.append(f"model {family} {len(trees)} {model.margins.get(family, 0.0)!r}")
        for tree in trees:
            lines.append(f"tree {len(tree)}")
            lines += [f"{n.feature} {n.threshold!r} {n.left} {n.right} {n.value!r}" for n in tree]
    lines.append("end")
    path.write_text("\n".join(lines) + "\n")


def read_model(path: Path) -> CostModel:
    """Reads a model file (the C++ reader checks it fully; this one is for tests and reports)."""
    lines = iter(l for l in path.read_text().splitlines() if l and not l.startswith("#"))
    if next(lines) != HEADER:
        raise ValueError(f"{path}: not a ckfmha cost model")
    model = CostModel("", 0, 0, target="log_ms")  # files without a target line
    default_margin = 0.0
    for line in lines:
        key, _, rest = line.partition(" ")
        if key == "device":
            model.device = rest
        elif key in ("arch", "num_sms"):
            setattr(model, key, int(rest))
        elif key == "target":
            model.target = rest
        elif key == "margin":  # older files: one margin for every family
            default_margin = float(rest)
        elif key == "features":
            if tuple(rest.split()) not in (FEATURES, CONV_FEATURES):
                raise ValueError(f"{path}: features differ from this library's")
            model.features = tuple(rest.split())
        elif key == "model":
            family, count, *margin = rest.split()
            model.margins[family] = float(margin[0]) if margin else default_margin
            model.trees[family] = [_read_tree(lines) for _ in range(int(count))]
        elif key == "end":
            return model
    raise ValueError(f"{path}: no 'end' line")


def _read_tree(lines: Iterable[str]) -> list[Node]:
    it = iter(lines)
    count = int(next(it).split()[1])
    tree = []
    for _ in range(count):
        f, t, left, right, v = next(it).split()
        tree.append(Node(int(f), float(t), int(left), int(right), float(v)))
    return tree


def from_lightgbm(dump: Mapping[str, Any]) -> list[list[Node]]:
    """The trees of a LightGBM Booster.dump_model(), numbered so that children follow parents."""
    return [_flatten(info["tree_structure"]) for info in dump["tree_info"]]


def _flatten(root: Mapping[str, Any]) -> list[Node]:
    nodes: list[Node] = []

    def add(entry: Mapping[str, Any]) -> int:
        index = len(nodes)
        if "leaf_value" in entry or "split_feature" not in entry:
            nodes.append(Node(-1, 0.0, -1, -1, float(entry.get("leaf_value", 0.0))))
            return index
        if entry.get("decision_type", "<=") != "<=":
            raise ValueError(f"decision type {entry['decision_type']!r}: only '<=' splits")
        nodes.append(Node(int(entry["split_feature"]), float(entry["threshold"]), -1, -1, 0.0))
        nodes[index].left = add(entry["left_child"])
        nodes[index].right = add(entry["right_child"])
        return index

    add(root)
    return nodes
