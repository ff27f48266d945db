"""Where the hand rules run the conv forward fed by the copy engine (sm90_tma_wgmma): channel
counts its tile_k divides, im2col walks the descriptor can hold, tiles at least half useful or
all in one wave;
the reasons explain gives for the problems it cannot take; and the learned selection leaving
its plans to the rules. No device needed: selection runs on the host."""

from __future__ import annotations

import re

import pytest

import ckfmha
from ckfmha import ConvProblem

TMA = "_sm90_tma_wgmma_"


def _tma_kernels() -> list[str]:
    return [k["name"] for k in ckfmha.Registry().kernels()
            if k["family"] == "conv_fwd" and TMA in k["name"]
            and k["name"].startswith("conv_fwd_bf16_2d_v8__")]  # fmt: skip


@pytest.fixture(autouse=True)
def _needs_tma_kernels() -> None:
    if not _tma_kernels():
        pytest.skip("build has no bf16 2D TMA conv kernel")


def _dense(**changes: object) -> ConvProblem:
    fields: dict[str, object] = {"batch": 8, "input": (28, 28), "groups": 1, "in_channels": 64,
                                 "out_channels": 64, "filter": (3, 3), "padding": 1,
                                 "dtype": "bf16"}  # fmt: skip
    fields.update(changes)
    return ConvProblem(**fields)  # type: ignore[arg-type]


def test_dense_layers_run_on_the_copy_engine() -> None:
    problem = _dense()
    name = ckfmha.conv_select(problem, arch="sm_90a")
    assert TMA in name, name
    assert "im2col tensor copies" in ckfmha.conv_explain(problem, arch="sm_90a")


def test_a_mostly_padded_tile_leaves_it_to_the_gathering_kernels() -> None:
    """16 output channels a group fill a quarter of the narrowest TMA tile's columns."""
    name = ckfmha.conv_select(_dense(groups=4, out_channels=16), arch="sm_90a")
    assert TMA not in name and "_sm90_cpasync_wgmma_" in name, name


def test_one_wave_of_mostly_padded_tiles_runs_on_the_copy_engine() -> None:
    """At batch 1 a 7x7 map of 4 groups of 64 channels needs 4 tiles of 128 positions, under
    two fifths useful, fewer than the SMs: the copy engine's tile ranks first again, in the
    forward and in backward-data's phase."""
    problem = _dense(batch=1, input=(7, 7), groups=4)
    assert TMA in ckfmha.conv_select(problem, arch="sm_90a")
    assert TMA in ckfmha.conv_select(problem, direction="bwd_data", arch="sm_90a")


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"in_channels": 24}, "in_channels must be a multiple of its tile_k"),
        ({"stride": 9, "filter": (9, 9), "padding": 0}, "stride <= 8"),
        ({"padding": 130, "input": (8, 8)}, "must lie in [-128, 127] in 2D"),
        ({"x_strides": (1 << 40, 28 * 64, 64)}, "below 2^40 bytes"),
    ],
)
def test_problems_the_walk_cannot_take_say_why(changes: dict[str, object], reason: str) -> None:
    problem = _dense(**changes)
    assert TMA not in ckfmha.conv_select(problem, arch="sm_90a")
    text = ckfmha.conv_explain(problem, arch="sm_90a")
    rejected = [line for line in text.splitlines()
                if "rejected  conv_fwd_bf16_2d_v8__" in line and TMA in line]  # fmt: skip
    assert rejected and all(reason in line for line in rejected), text


def test_the_learned_selection_leaves_tma_plans_to_the_rules() -> None:
    problem = _dense()
    with ckfmha.selection("heuristic"):
        rules = ckfmha.conv_select(problem, arch="sm_90a")
    with ckfmha.selection("learned"):
        learned = ckfmha.conv_select(problem, arch="sm_90a")
        text = ckfmha.conv_explain(problem, arch="sm_90a")
    assert learned == rules
    if "learned selection not used: the conv cost model is for" in text:
        pytest.skip("the loaded conv cost model is for another arch")
    assert "no timings of the TMA template" in text, text


@pytest.mark.parametrize(
    ("groups", "c", "k", "pack"),
    [(32, 8, 8, 8), (32, 16, 16, 4), (32, 32, 32, 2), (8, 16, 24, 4), (16, 8, 64, 8),
     (12, 8, 8, 1), (32, 24, 24, 1), (16, 64, 8, 1), (64, 4, 4, 1)],
)  # fmt: skip
def test_groups_of_8_to_32_input_channels_run_packed(
    groups: int, c: int, k: int, pack: int
) -> None:
    """Groups whose input channels (the forward's reduction) are 8, 16 or 32 run `pack` at a time
    as one of 64 on the TMA template, through block-diagonal filters in the workspace, from
    1024 output positions, unless the unpacked groups already run on it; groups the pack does
    not divide, and other channel counts, do not. Without a workspace explain names the
    unpacked kernel."""
    problem = _dense(groups=groups, in_channels=c, out_channels=k, stride=2)  # 8 x 14 x 14
    text = ckfmha.conv_explain(problem, arch="sm_90a")
    name = ckfmha.conv_select(problem, arch="sm_90a")
    phrase = f"groups multiplied {pack} at a time as one of {pack * c} input and {pack * k} output"
    if pack == 1:
        assert "at a time as one of" not in text, text
    elif phrase in text:
        assert f"groups={groups // pack} C={pack * c} K={pack * k}" in text, text
        assert TMA in name, text
        assert f"plan: the packed filters written into the workspace, then {name}" in text, text
        assert "without a workspace they run unpacked, on conv_fwd_" in text, text
        assert f"1 in {pack} of its products are the groups' own" in text, text
    else:
        assert TMA in name, text  # a 32-channel TMA tile took the groups unpacked
    if pack in (4, 8):  # no TMA tile takes 8 or 16 reduction channels unpacked
        assert phrase in text, text
    # Below 1024 output positions the groups run unpacked.
    small = _dense(batch=4, groups=groups, in_channels=c, out_channels=k, stride=2)  # 784
    assert "at a time as one of" not in ckfmha.conv_explain(small, arch="sm_90a")


def test_few_tiles_split_their_reduction_over_a_cluster() -> None:
    """ResNet-18's last 3x3 layer at batch 1 has a handful of tiles of 4608-long reductions:
    each tile's k-tiles are shared by the CTAs of a cluster (a power of two, at most 8), in the
    forward and in backward-data's phase. Where the tiles fill more than half the SMs (batch 32
    at 14x14), and where the reduction is short, they take one CTA each."""
    few = _dense(batch=1, input=(7, 7), in_channels=512, out_channels=512)
    for direction in ("fwd", "bwd_data"):
        text = ckfmha.conv_explain(few, direction=direction, arch="sm_90a")
        assert TMA in ckfmha.conv_select(few, direction=direction, arch="sm_90a"), text
        match = re.search(r"each tile's reduction split over the (\d+) CTAs of a cluster", text)
        assert match and int(match[1]) in (2, 4, 8), text
    for problem in (_dense(batch=32, input=(14, 14), in_channels=256, out_channels=256),
                    _dense(batch=1, input=(7, 7), in_channels=64, out_channels=64,
                           filter=(1, 1), padding=0)):  # fmt: skip
        text = ckfmha.conv_explain(problem, arch="sm_90a")
        assert TMA in ckfmha.conv_select(problem, arch="sm_90a"), text
        assert "reduction split over" not in text, text
