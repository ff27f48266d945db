"""Where the hand rules run the weight gradient fed by the copy engine (sm90_tma_wgmma): groups
whose input channels, packed, are a multiple of 64 and whose walk the descriptor can hold,
ahead of the 8-channel direct kernel and the gathering implicit GEMMs; the reasons explain gives
for the problems it cannot take; and the learned selection leaving its plans to the rules. No
device needed: selection runs on the host."""

from __future__ import annotations

import re

import pytest

import ckfmha
from ckfmha import ConvProblem

TMA = "_sm90_tma_wgmma_"


def _tma_kernels() -> list[str]:
    return [k["name"] for k in ckfmha.Registry().kernels()
            if k["family"] == "conv_bwd_weight" and TMA in k["name"]
            and k["name"].startswith("conv_bwd_weight_bf16_2d_v8__")]  # fmt: skip


@pytest.fixture(autouse=True)
def _needs_tma_kernels() -> None:
    if not _tma_kernels():
        pytest.skip("build has no bf16 2D TMA weight-gradient kernel")


def _layer(**changes: object) -> ConvProblem:
    fields: dict[str, object] = {"batch": 8, "input": (28, 28), "groups": 1, "in_channels": 128,
                                 "out_channels": 128, "filter": (3, 3), "padding": 1,
                                 "dtype": "bf16"}  # fmt: skip
    fields.update(changes)
    return ConvProblem(**fields)  # type: ignore[arg-type]


def _weight(problem: ConvProblem, explain: bool = False) -> str:
    if explain:
        return ckfmha.conv_explain(problem, arch="sm_90a", direction="bwd_weight")
    return ckfmha.conv_select(problem, arch="sm_90a", direction="bwd_weight")


def test_dense_layers_run_on_the_copy_engine() -> None:
    problem = _layer()
    assert TMA in _weight(problem)
    assert "tensor copies of 64-channel runs" in _weight(problem, explain=True)


@pytest.mark.parametrize(
    ("changes", "pack"),
    [
        # ResNeXt's second stage at batch 32: groups of 8 channels, 8 at a time, ahead of the
        # 8-channel direct kernel.
        ({"batch": 32, "groups": 32, "in_channels": 8, "out_channels": 8}, 8),
        # Its last stage at batch 32: groups of 32 over 1568 positions, which the gathering
        # kernels multiply one by one (fewer than 4096 positions).
        ({"batch": 32, "input": (7, 7), "groups": 32, "in_channels": 32, "out_channels": 32}, 2),
        ({"batch": 8, "input": (14, 14), "groups": 32, "in_channels": 16, "out_channels": 16}, 4),
    ],
)
def test_narrow_groups_run_packed_on_the_copy_engine(changes: dict[str, object], pack: int) -> None:
    problem = _layer(**changes)
    assert TMA in _weight(problem)
    text = _weight(problem, explain=True)
    c = int(changes["in_channels"])  # type: ignore[call-overload]
    assert f"groups multiplied {pack} at a time as one of {pack * c}x{pack * c} channels" in text


def test_few_positions_leave_narrow_groups_to_the_gathering_kernels() -> None:
    """Below 1024 positions groups are not packed for the copy engine (ResNeXt's batch-1
    layers ran slower packed on it than one group at a time on the gathering kernels)."""
    problem = _layer(batch=1, input=(7, 7), groups=32, in_channels=32, out_channels=32)
    assert TMA not in _weight(problem)


def test_split_plans_add_into_the_workspace() -> None:
    """Since the workspace's epilogue stores pairs, a tile's splits summed in a cluster cost
    more than adding into the workspace (NOTES 128), so no automatic plan takes a cluster: a
    batch-1 layer of few tiles and a short reduction runs unsplit, a batch-1 layer with a long
    reduction and a long reduction over one tile add their splits into the workspace."""
    few = _weight(_layer(batch=1), explain=True).split("plan: ")[1]
    assert TMA in few and "one cluster" not in few and "positions in 1 split" in few, few
    for long in (_layer(batch=1, input=(56, 56), in_channels=64, out_channels=64),
                 _layer(batch=32, input=(56, 56), in_channels=64, out_channels=64,
                        filter=(1, 1), padding=0)):  # fmt: skip
        text = _weight(long, explain=True).split("plan: ")[1]
        assert TMA in text and "zero the fp32 partial sums" in text, text
        assert "one cluster" not in text and int(re.search(r"over (\d+) splits", text)[1]) > 8


def test_groups_of_four_stay_on_the_direct_kernel() -> None:
    """Its vector path keeps a group's sums in registers (1.3-1.5x cuDNN on ResNeXt's first
    stage); packed 16 at a time a TMA tile would keep a sixteenth of its products."""
    problem = _layer(batch=32, input=(56, 56), groups=32, in_channels=4, out_channels=4)
    assert "_conv_direct_" in _weight(problem)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"in_channels": 48}, "must be a multiple of 64"),
        ({"stride": 9, "filter": (9, 9), "padding": 0}, "stride <= 8"),
        ({"padding": 130, "input": (8, 8)}, "must lie in [-128, 127] in 2D"),
        ({"y_strides": (1 << 40, 28 * 128, 128)}, "dy's strides must be below 2^40 bytes"),
    ],
)  # fmt: skip
def test_problems_it_cannot_take_say_why(changes: dict[str, object], reason: str) -> None:
    problem = _layer(**changes)
    assert TMA not in _weight(problem)
    text = _weight(problem, explain=True)
    rejected = [line for line in text.splitlines()
                if "rejected  conv_bwd_weight_bf16_2d_v8__" in line and TMA in line]  # fmt: skip
    assert rejected and all(reason in line for line in rejected), text


def test_the_learned_selection_leaves_tma_plans_to_the_rules() -> None:
    problem = _layer()
    with ckfmha.selection("heuristic"):
        rules = _weight(problem)
    with ckfmha.selection("learned"):
        learned = _weight(problem)
        text = _weight(problem, explain=True)
    assert learned == rules
    if "learned selection not used: the conv cost model is for" in text:
        pytest.skip("the loaded conv cost model is for another arch")
    assert "no timings of the TMA template" in text, text
