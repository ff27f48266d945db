"""Which path the direct kernels take: for a depthwise forward or backward-weight problem,
eight groups a 16-byte load where conv_depthwise_limit allows the geometry (backward-weight
filters wider than 3 along w: four groups an 8-byte load, conv_vector_weight_channels); for a forward problem
of 2 or 4 channels a group, eight channels a 16-byte load where conv_vector_fwd_limit does; for
a backward-weight problem of 2 or 4 channels a group, four channels an 8-byte load where
conv_vector_weight_limit does (8 channels: 16 bytes); else one group a lane, with the limit
named. No device needed: the plan and its explanation run on the host."""

from __future__ import annotations

import dataclasses
import re

import pytest

import ckfmha
from ckfmha import ConvProblem

VECTOR_PATH = "8 groups a 16-byte load (the depthwise path) where"
# The tensors each direction's path reads as 16-byte vectors besides x.
VECTORS = {"fwd": "x and y are 16-byte aligned", "bwd_weight": "x and dy are 16-byte aligned"}
# Backward-weight sums whole rows wider than 3 from four channels a load.
WIDE_ROW_WEIGHT_PATH = (
    "4 groups an 8-byte load (the depthwise path) where x and dy are 8-byte aligned"
)
DIRECTIONS = pytest.mark.parametrize("direction", ["fwd", "bwd_weight"])


BASE = ConvProblem(2, (28, 28), 32, 1, 1, (3, 3), 1, 1, dtype="bf16")


def _depthwise(**changes: object) -> ConvProblem:
    return dataclasses.replace(BASE, **changes)  # type: ignore[arg-type]


def _explain(problem: ConvProblem, direction: str, buckets: tuple[str, ...] = ("c1",)) -> str:
    """The plan's explanation, where the build has a direct kernel of one of `buckets` (channels
    a group) for it."""
    try:
        name = ckfmha.conv_select(problem, direction=direction, arch="sm_90a")
    except (ckfmha.errors.NotFoundError, ckfmha.errors.UnsupportedError):
        name = "none"
    if not any(f"_v1_{b}__" in name for b in buckets) or "_conv_direct_" not in name:
        pytest.skip(f"build has no {buckets} direct kernel for {problem} (selected {name})")
    return ckfmha.conv_explain(problem, direction=direction, arch="sm_90a")


@pytest.mark.parametrize(
    "changes",
    [{}, {"filter": (7, 7), "padding": 3}, {"stride": 2}, {"filter": (5, 1), "padding": (2, 0)},
     {"groups": 136}, {"dilation": (2, 1)}, {"input": (4, 9, 9), "filter": (3, 3, 3)}],
)  # fmt: skip
@DIRECTIONS
def test_vector_path_where_the_geometry_allows(changes: dict[str, object], direction: str) -> None:
    problem = _depthwise(**changes)
    text = _explain(problem, direction)
    if direction == "bwd_weight" and problem.filter[-1] > 3:
        assert WIDE_ROW_WEIGHT_PATH in text, text
    else:
        assert f"{VECTOR_PATH} {VECTORS[direction]}" in text, text


@pytest.mark.parametrize(
    ("changes", "limit"),
    [
        ({"groups": 12}, "groups a multiple of 8"),
        ({"filter": (3, 9), "padding": (1, 4)}, "filters at most 7 wide along w"),
        ({"stride": (1, 3)}, "stride 1 or 2 along w"),
        ({"dilation": (1, 2)}, "no dilation along w"),
        ({"filter": (29, 7), "padding": (14, 3)}, "at most 192 filter taps"),
    ],
)
@DIRECTIONS
def test_lane_path_names_the_limit(changes: dict[str, object], limit: str, direction: str) -> None:
    text = _explain(_depthwise(**changes), direction)
    assert VECTOR_PATH not in text
    assert f"one a lane (the depthwise path's vectors need {limit})" in text, text


# Backward-weight problems of 2, 4 and 8 channels a group (the core build's 4-channel bucket
# runs the first two, its 8-channel one the last).
NARROW = dataclasses.replace(BASE, in_channels=4, out_channels=4)
NARROW_BUCKETS = ("c2", "c4", "c8")
NARROW_LOADS = {
    2: "2 groups of 2 channels an 8-byte load (the vector path) where x and dy are 8-byte aligned",
    4: "a group of 4 channels an 8-byte load (the vector path) where x and dy are 8-byte aligned",
    8: "a group of 8 channels a 16-byte load (the vector path) where x and dy are 16-byte aligned",
}


@pytest.mark.parametrize("channels", [2, 4, 8])
@pytest.mark.parametrize(
    "changes",
    [{}, {"filter": (7, 7), "padding": 3}, {"stride": 2}, {"filter": (5, 1), "padding": (2, 0)},
     {"groups": 6}, {"dilation": (2, 1)}, {"input": (4, 9, 9), "filter": (3, 3, 3)}],
)  # fmt: skip
def test_narrow_groups_take_the_vector_path(changes: dict[str, object], channels: int) -> None:
    # The 8-channel kernel takes reductions over 4096 output positions or more: 32 images.
    batch = 32 if channels == 8 else NARROW.batch
    problem = dataclasses.replace(NARROW, in_channels=channels, out_channels=channels,
                                  batch=batch, **changes)  # type: ignore[arg-type]  # fmt: skip
    text = _explain(problem, "bwd_weight", NARROW_BUCKETS)
    assert NARROW_LOADS[channels] in text, text
    # The 8-channel kernel runs nothing else, so its plan counts no lane-path CTAs; the others
    # count them where the plan adds into the workspace (on these small problems the vector
    # path's CTAs may store dw themselves instead, and then the plan says so).
    lane = "CTAs a block of groups on the lane path"
    plan = text.split("plan: ")[1]
    stores = "each block of dw and store it" in plan
    assert (lane in text) == (channels < 8 and not stores), text
    # Either way the plan gives the vector path's shape: its runs, a CTA's channels and the
    # CTAs a block of dw.
    assert re.search(
        r"on its vector path \(runs of \d positions along w, \d+ channels a CTA, "
        r"\d+ CTAs? a block of dw\)",
        plan,
    ), plan


FORWARD_LOADS = {
    2: "4 groups of 2 channels a 16-byte load (the vector path) where x and y are 16-byte aligned",
    4: "2 groups of 4 channels a 16-byte load (the vector path) where x and y are 16-byte aligned",
}


@pytest.mark.parametrize("channels", [2, 4])
@pytest.mark.parametrize(
    "changes",
    [{}, {"filter": (7, 7), "padding": 3}, {"stride": 2}, {"filter": (5, 1), "padding": (2, 0)},
     {"groups": 12}, {"dilation": (2, 1)}, {"input": (4, 9, 9), "filter": (3, 3, 3)}],
)  # fmt: skip
def test_narrow_forward_groups_take_the_vector_path(
    changes: dict[str, object], channels: int
) -> None:
    problem = dataclasses.replace(NARROW, in_channels=channels, out_channels=channels,
                                  **changes)  # type: ignore[arg-type]  # fmt: skip
    text = _explain(problem, "fwd", ("c2", "c4"))
    assert FORWARD_LOADS[channels] in text, text


@pytest.mark.parametrize(
    ("changes", "limit"),
    [
        ({"in_channels": 2, "out_channels": 2, "groups": 6}, "groups of two channels a multiple of 4"),
        ({"groups": 5}, "an even number of groups of four channels"),
        ({"out_channels": 2}, "groups of 1, 2 or 4 channels, as many in as out"),
        ({"in_channels": 3, "out_channels": 3}, "groups of 1, 2 or 4 channels, as many in as out"),
        ({"filter": (3, 9), "padding": (1, 4)}, "filters at most 7 wide along w"),
        ({"stride": (1, 3)}, "stride 1 or 2 along w"),
        ({"dilation": (1, 2)}, "no dilation along w"),
    ],
)  # fmt: skip
def test_narrow_forward_lane_path_names_the_limit(changes: dict[str, object], limit: str) -> None:
    problem = dataclasses.replace(NARROW, **changes)  # type: ignore[arg-type]
    text = _explain(problem, "fwd", ("c2", "c4"))
    assert "(the vector path) where" not in text
    assert f"one a lane (the vector path's vectors need {limit})" in text, text


@pytest.mark.parametrize(
    ("changes", "limit"),
    [
        ({"in_channels": 2, "out_channels": 2, "groups": 5},
         "an even number of groups of two channels"),
        ({"out_channels": 2}, "groups of 1, 2, 4 or 8 channels, as many in as out"),
        ({"in_channels": 3, "out_channels": 3}, "groups of 1, 2, 4 or 8 channels, as many in as out"),
        ({"filter": (3, 9), "padding": (1, 4)}, "filters at most 7 wide along w"),
        ({"stride": (1, 3)}, "stride 1 or 2 along w"),
        ({"dilation": (1, 2)}, "no dilation along w"),
    ],
)  # fmt: skip
def test_narrow_lane_path_names_the_limit(changes: dict[str, object], limit: str) -> None:
    problem = dataclasses.replace(NARROW, **changes)  # type: ignore[arg-type]
    text = _explain(problem, "bwd_weight", NARROW_BUCKETS)
    assert "(the vector path) where" not in text
    assert f"one a lane (the vector path's vectors need {limit})" in text, text


@pytest.mark.parametrize(
    ("changes", "limit"),
    [
        ({"filter": (3, 9), "padding": (1, 4)}, "filters at most 7 wide along w"),
        ({"stride": (1, 3)}, "stride 1 or 2 along w"),
        ({"out_channels": 4}, "groups of 1, 2, 4 or 8 channels, as many in as out"),
        # Positions 260 elements apart: 8-byte vectors at most.
        ({"x_strides": (28 * 28 * 260, 28 * 260, 260)},
         "x and dy as 16-byte vectors of a group, where the strides or the pointers allow 4"),
        ({"batch": 5}, "at least 4096 output positions (fewer leave its threads a run"),
        ({"batch": 5}, "problem has 3920"),
    ],
)  # fmt: skip
def test_eight_channel_kernel_takes_only_its_vector_path(
    changes: dict[str, object], limit: str
) -> None:
    """Off the vector path, or on too few output positions, the 8-channel kernel is rejected
    with the reason (its lane path is slower than the implicit GEMM)."""
    name = "conv_bwd_weight_bf16_2d_v1_c8__sm_90a_conv_direct_"
    if not any(k["name"].startswith(name) for k in ckfmha.Registry().kernels()):
        pytest.skip("build has no 8-channel direct backward-weight kernel for sm_90a")
    eight = {"in_channels": 8, "out_channels": 8, "batch": 32, **changes}
    problem = dataclasses.replace(NARROW, **eight)  # type: ignore[arg-type]
    text = ckfmha.conv_explain(problem, direction="bwd_weight", arch="sm_90a")
    rejected = f"rejected  {name}"
    line = next(line for line in text.splitlines() if line.startswith(f"  {rejected}"))
    assert limit in line, line
    assert ("runs only what its vector path takes" in line) != ("takes reductions" in line), line


def _depthwise_problem(batch: int, size: tuple[int, ...], groups: int, taps: int) -> ConvProblem:
    filter_size = (taps,) * len(size)
    return ConvProblem(batch, size, groups, 1, 1, filter_size, 1, taps // 2, dtype="bf16")


def _problem_id(problem: ConvProblem) -> str:
    size = "x".join(map(str, problem.input))
    return f"n{problem.batch}-{size}-g{problem.groups}-f{problem.filter[0]}"


WORKSPACE_PLAN = "zero the fp32 partial sums"


# The CTAs that sum a block of dw and store it (conv_vector_weight_layout) at the reference SM
# counts (132 on sm_90a, 108 on sm_80): one where a CTA takes every strip of its block; on
# sm_90a a cluster of the strip CTAs rounded up to a power of two, where they are at most 8 or
# the strips at most 16 (two a CTA) and the clusters fit one wave; else each adds into the
# zeroed fp32 workspace. ConvNeXt's 7x7 maps of 768 groups: every strip of a block in one CTA
# at batch 1; at 32, 24 clusters of 8 would not fit 132 SMs.
@pytest.mark.parametrize(
    ("problem", "sm90", "sm80"),
    [
        (_depthwise_problem(1, (7, 7), 960, 3), "one CTA sums", "one CTA sums"),
        (_depthwise_problem(1, (9, 9), 64, 3), "2 CTAs in a cluster sum", WORKSPACE_PLAN),
        (_depthwise_problem(1, (14, 14), 576, 3), "4 CTAs in a cluster sum", WORKSPACE_PLAN),
        (_depthwise_problem(1, (7, 7), 768, 7), "one CTA sums", "one CTA sums"),
        (_depthwise_problem(32, (7, 7), 768, 7), WORKSPACE_PLAN, WORKSPACE_PLAN),
        (_depthwise_problem(1, (14, 14), 384, 7), "4 CTAs in a cluster sum", WORKSPACE_PLAN),
        (_depthwise_problem(32, (7, 7), 960, 3), "8 CTAs in a cluster sum", WORKSPACE_PLAN),
        (_depthwise_problem(1, (4, 9, 9), 32, 3), WORKSPACE_PLAN, WORKSPACE_PLAN),
        (_depthwise_problem(32, (14, 14), 576, 3), WORKSPACE_PLAN, WORKSPACE_PLAN),
    ],
    ids=lambda v: _problem_id(v) if isinstance(v, ConvProblem) else "",
)  # fmt: skip
def test_small_weight_gradients_store_dw(problem: ConvProblem, sm90: str, sm80: str) -> None:
    for arch, expected in (("sm_90a", sm90), ("sm_80", sm80)):
        try:
            name = ckfmha.conv_select(problem, direction="bwd_weight", arch=arch)
        except (ckfmha.errors.NotFoundError, ckfmha.errors.UnsupportedError):
            continue
        if "_v1_c1__" not in name:
            continue
        plan = ckfmha.conv_explain(problem, direction="bwd_weight", arch=arch).split("plan: ")[1]
        assert expected in plan, (arch, plan)
        if expected != WORKSPACE_PLAN:
            assert plan.startswith(f"one stage, {name} on its vector path (runs of "), plan
            assert "no workspace (where x and dy are aligned to its vectors" in plan, plan
