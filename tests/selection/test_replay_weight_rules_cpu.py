"""benchmarks/replay_weight_rules.py without a GPU: the rules' cost model it mirrors, the split
count it reads a pick's time at, and the tile a throughput table moves the pick to."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest
from support.paths import REPO_ROOT

pd = pytest.importorskip("pandas")

WGMMA = ("sm90_cpasync_wgmma", 128, 128, 64, 3)
WIDE = ("sm90_cpasync_wgmma", 64, 256, 64, 3)


@pytest.fixture(scope="module")
def tool() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO_ROOT / "benchmarks"))
        yield importlib.import_module("replay_weight_rules")


def _layer(batch: int = 32, c: int = 64, k: int = 64, output: str = "56x56") -> pd.Series:
    return pd.Series({"batch": batch, "groups": 1, "in_channels": c, "out_channels": k,
                      "filter": "3x3", "output": output})  # fmt: skip


def _rows(label: str, tile: tuple, times: dict[int, float]) -> list[dict]:
    layer = _layer()
    return [{"label": label, **layer.to_dict(), "pipeline": tile[0], "tile_m": tile[1],
             "tile_n": tile[2], "tile_k": tile[3], "stages": tile[4], "vector": 8,
             "splits": splits, "ms": ms} for splits, ms in times.items()]  # fmt: skip


def test_split_count_fills_one_wave_down_to_two_k_tiles(tool: ModuleType) -> None:
    # dw of 64 x 576 on 128x128 tiles: 5 tiles; two CTAs an SM give 264 slots, so 53 splits
    # of 100,352 positions (1,568 k-tiles), 30 k-tiles each.
    cost, splits = tool.rules_cost(WGMMA, _layer())
    assert splits == 53
    # 7x7 positions at batch 1 leave one k-tile: nothing to split.
    assert tool.rules_cost(WGMMA, _layer(batch=1, output="7x7"))[1] == 1
    assert cost > 0


def test_time_at_an_untimed_split_count_takes_the_nearest_ratio(tool: ModuleType) -> None:
    rows = pd.DataFrame(_rows("a", WGMMA, {16: 1.0, 32: 2.0, 64: 4.0}))
    assert tool.time_at(rows, 32) == 2.0
    assert tool.time_at(rows, 40) == 2.0  # 40/32 is nearer than 64/40
    assert tool.time_at(rows, 50) == 4.0


def test_throughputs_move_the_pick_to_the_tile_that_runs_faster(tool: ModuleType) -> None:
    # The model alone prefers 64x256 on this layer (fewer tiles over the 64 output channels);
    # the timings say 128x128 runs 3x faster, which its throughput carries.
    assert tool.rules_cost(WIDE, _layer())[0] < tool.rules_cost(WGMMA, _layer())[0]
    timings = {s: 1.0 for s in (1, 2, 4, 8, 16, 32, 64, 128)}
    gemm = pd.DataFrame(_rows("a", WGMMA, timings)
                        + _rows("a", WIDE, {s: 3.0 for s in timings}))  # fmt: skip
    best = gemm.groupby("label").ms.min()
    weights = tool.throughputs(gemm, best)
    assert weights[WGMMA] == 1.0 and weights[WIDE] == pytest.approx(1 / 3)
    assert tool.replay(gemm, best, None, {"a"}).tolist() == pytest.approx([1 / 3])
    assert tool.replay(gemm, best, weights, {"a"}).tolist() == [1.0]
