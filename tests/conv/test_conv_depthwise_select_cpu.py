"""Which path the one-channel direct kernels take for a depthwise forward or backward-weight
problem: eight groups a 16-byte load where conv_depthwise_limit allows the geometry, else one
group a lane, with the limit named. No device needed: the plan and its explanation run on the
host."""

from __future__ import annotations

import dataclasses

import pytest

import ckfmha
from ckfmha import ConvProblem

VECTOR_PATH = "8 groups a 16-byte load (the depthwise path) where"
# The tensors each direction's path reads as 16-byte vectors besides x.
VECTORS = {"fwd": "x and y are 16-byte aligned", "bwd_weight": "x and dy are 16-byte aligned"}
DIRECTIONS = pytest.mark.parametrize("direction", ["fwd", "bwd_weight"])


BASE = ConvProblem(2, (28, 28), 32, 1, 1, (3, 3), 1, 1, dtype="bf16")


def _depthwise(**changes: object) -> ConvProblem:
    return dataclasses.replace(BASE, **changes)  # type: ignore[arg-type]


def _explain(problem: ConvProblem, direction: str) -> str:
    """The plan's explanation, where the build has a one-channel direct kernel for it."""
    try:
        name = ckfmha.conv_select(problem, direction=direction, arch="sm_90a")
    except (ckfmha.errors.NotFoundError, ckfmha.errors.UnsupportedError):
        name = "none"
    if "_v1_c1__" not in name or "_conv_direct_" not in name:
        pytest.skip(f"build has no one-channel direct kernel for {problem} (selected {name})")
    return ckfmha.conv_explain(problem, direction=direction, arch="sm_90a")


@pytest.mark.parametrize(
    "changes",
    [{}, {"filter": (7, 7), "padding": 3}, {"stride": 2}, {"filter": (5, 1), "padding": (2, 0)},
     {"groups": 136}, {"dilation": (2, 1)}, {"input": (4, 9, 9), "filter": (3, 3, 3)}],
)  # fmt: skip
@DIRECTIONS
def test_vector_path_where_the_geometry_allows(changes: dict[str, object], direction: str) -> None:
    text = _explain(_depthwise(**changes), direction)
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
