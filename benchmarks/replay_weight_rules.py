"""Replays the hand rules' backward-weight plan on the conv oracle's timings, with and without
each tile's measured throughput (`weight_tile_throughput` in cpp/src/conv_plan.cpp).

The oracle (benchmarks/conv_oracle.py) times every backward-weight candidate of each layer: every
tile at split counts 1, 2, 4, .. 128 and the rules' plan of its commit. This script mirrors the
rules' implicit-GEMM cost model (`weight_tile_cost`: waves of CTAs times the larger of a tile's
products and loads per k-tile, the split count that fills one wave), picks the tile the rules
would pick, and reads its time at the rules' split count from the oracle, or at the nearest
timed count where that one was not timed. Layers where a direct kernel fits are left out (the
rules run those directly whatever the costs). It prints the efficiency (the fastest
candidate's time / the pick's) of the held-out and of all layers, for the model without
throughputs and with the throughputs measured on the layers not held out (the table the C++
rules hold, rounded):

    python benchmarks/replay_weight_rules.py \\
        benchmarks/results/oracle/oracle-conv-weight_H100_8b0d0fe.csv.gz
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ckfmha.conv_selection import weight_pack

SMS = 132  # the oracle's H100
TILE = ["pipeline", "tile_m", "tile_n", "tile_k", "stages"]
WGMMA = "sm90_cpasync_wgmma"


def _sizes(text: Any) -> list[int]:
    return [int(v) for v in str(text).split("x")]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _gemm_shape(layer: pd.Series) -> tuple[int, int, int]:
    """A layer's positions (the reduction of its GEMM), its dw columns per group (taps x C) and
    the groups its kernels multiply as one (conv_weight_pack)."""
    reduction = math.prod(_sizes(layer["filter"])) * int(layer.in_channels)
    positions = int(layer.batch) * math.prod(_sizes(layer["output"]))
    pack = weight_pack(int(layer.groups), int(layer.in_channels), int(layer.out_channels),
                       reduction, positions)  # fmt: skip
    return positions, reduction, pack


def rules_cost(tile: tuple[Any, ...], layer: pd.Series) -> tuple[float, int]:
    """The rules' modelled time of a tile on a layer and its split count (conv_plan.cpp's
    weight_tile_cost, without the throughput)."""
    pipeline, tile_m, tile_n, tile_k, stages = tile
    tile_m, tile_n, tile_k, stages = int(tile_m), int(tile_n), int(tile_k), int(stages)
    positions, reduction, pack = _gemm_shape(layer)
    groups, k = int(layer.groups), int(layer.out_channels)
    tiles = _ceil_div(k * pack, tile_m) * _ceil_div(reduction * pack, tile_n) * (groups // pack)
    k_tiles = max(1, _ceil_div(positions, tile_k))
    if pipeline == WGMMA:
        smem = stages * (tile_m + tile_n) * tile_k * 2 + 2 * tile_k * 32
        resident = 2 if 2 * smem <= 220 * 1024 else 1
    else:
        resident = min(max((2 * 128 * 128) // (tile_m * tile_n), 1), 4)
    slots = SMS * resident
    splits = 1
    if tiles < slots:
        splits = min(max(_ceil_div(slots, tiles), 1), min(65535, max(1, k_tiles // 2)))
    per_split = _ceil_div(k_tiles, splits)
    splits = _ceil_div(k_tiles, per_split)
    waves = _ceil_div(tiles * splits, slots)
    step = max(tile_m * tile_n, 64.0 * (tile_m + tile_n)) * (tile_k / 32.0)
    return waves * resident * step * (per_split + (2.0 if splits > 1 else 0.0)), splits


def time_at(rows: pd.DataFrame, splits: int) -> float:
    """A tile's time at `splits`, or at the nearest timed split count (in ratio)."""
    by_splits = rows.groupby("splits").ms.min()
    if splits in by_splits.index:
        return float(by_splits[splits])
    counts = np.asarray(by_splits.index, dtype=float).clip(1)
    return float(by_splits.iloc[int(np.argmin(abs(np.log(counts) - math.log(splits))))])


def throughputs(gemm: pd.DataFrame, best: pd.Series) -> dict[tuple[Any, ...], float]:
    """Each tile's mean efficiency at its best split count over the layers given."""
    per_tile = gemm.groupby(["label", *TILE]).ms.min().unstack(TILE)
    return per_tile.rdiv(best.reindex(per_tile.index), axis=0).mean().to_dict()


def replay(gemm: pd.DataFrame, best: pd.Series, weights: dict[tuple[Any, ...], float] | None,
           labels: set[str]) -> np.ndarray:  # fmt: skip
    """The efficiency of the rules' pick on each layer of `labels`. Without weights the rules
    rank the templates as before the throughputs: wgmma first, mma.sync first for packed
    groups."""
    efficiencies = []
    for label, rows in gemm[gemm.label.isin(labels)].groupby("label"):
        layer = rows.iloc[0]
        packed = _gemm_shape(layer)[2] > 1
        widest = rows[rows.vector == rows.vector.max()]
        best_score, pick = None, None
        for tile, tile_rows in widest.groupby(TILE):
            cost, splits = rules_cost(tile, layer)
            if weights is None:
                score = ((tile[0] == WGMMA) != packed, -cost)
            else:
                score = (True, -cost / weights.get(tile, 0.7))
            if best_score is None or score > best_score:
                best_score, pick = score, (tile_rows, splits)
        assert pick is not None
        efficiencies.append(best[label] / time_at(*pick))
    return np.array(efficiencies)


def summary(values: np.ndarray) -> str:
    return (f"{len(values)} layers, mean {values.mean():.3f}, P10 "
            f"{np.percentile(values, 10):.3f}, median {np.median(values):.3f}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("oracle", type=Path, help="a backward-weight conv oracle CSV")
    args = parser.parse_args(argv)
    timed = pd.read_csv(args.oracle, low_memory=False)
    timed = timed[(timed.direction == "bwd_weight") & timed.ms.notna()]
    best = timed.groupby("label").ms.min()
    direct = set(timed[timed.pipeline == "conv_direct"].label)
    gemm = timed[~timed.rules.astype(bool) & (timed.pipeline != "conv_direct")]
    gemm = gemm[~gemm.label.isin(direct)]
    held_out = set(gemm[gemm.held_out.astype(bool)].label)
    everyone = set(gemm.label)
    weights = throughputs(gemm[~gemm.label.isin(held_out)], best)
    for tile, value in sorted(weights.items(), key=lambda item: -item[1]):
        print(f"  {tile[0]:20s} {int(tile[1])}x{int(tile[2])}x{int(tile[3])} "
              f"{int(tile[4])} stages: {value:.3f}")  # fmt: skip
    for name, table in (("rules", None), ("rules with throughputs", weights)):
        print(f"{name}: held out {summary(replay(gemm, best, table, held_out))}; "
              f"all {summary(replay(gemm, best, table, everyone))}")  # fmt: skip


if __name__ == "__main__":
    main()
