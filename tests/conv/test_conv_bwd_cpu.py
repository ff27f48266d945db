"""Grouped convolution backward without a GPU: the Python layer's argument checks for
conv_bwd_data and conv_bwd_weight (on stand-in device arrays, so every check runs before the
device is touched), and selection and explanation of both backward plans for an explicit arch
against the kernels the library was built with (the core set holds bf16 2D conv_bwd_weight
kernels with 16-byte vectors and the conv_fwd kernels backward-data runs on).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from support.device_kernels import runs_on

import ckfmha
from ckfmha import errors
from ckfmha.conv_problem import ConvProblem, direction_code

no_gpu = pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")
FAKE = 1 << 20

X = (2, 9, 11, 4, 8)  # N, H, W, G, C
W = (4, 16, 3, 3, 8)  # G, K, Y, X, C
DY = (2, 7, 9, 4, 16)  # N, OH, OW, G, K (no padding, stride 1)


def _device(shape: tuple[int, ...], dtype: str = "bf16", offset: int = 0,
            strides: tuple[int, ...] | None = None) -> ckfmha.DeviceArray:  # fmt: skip
    return ckfmha.device_ptr(FAKE + (offset << 24), shape, dtype, strides)


def _data(**changes: Any) -> Any:
    arrays: dict[str, Any] = {"dy": _device(DY, offset=1), "w": _device(W, offset=2),
                              "input_size": (9, 11)}  # fmt: skip
    arrays.update(changes)
    return ckfmha.conv_bwd_data(arrays.pop("dy"), arrays.pop("w"), **arrays)


def _weight(**changes: Any) -> Any:
    arrays: dict[str, Any] = {"x": _device(X, offset=1), "dy": _device(DY, offset=2),
                              "filter_size": (3, 3)}  # fmt: skip
    arrays.update(changes)
    return ckfmha.conv_bwd_weight(arrays.pop("x"), arrays.pop("dy"), **arrays)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dy": _device((2, 7, 4, 16), offset=1)}, "dy has shape (2, 7, 4, 16); supported"),
        ({"input_size": None}, "input_size is required (the 2 spatial sizes of x)"),
        ({"input_size": (9,)}, "input_size is (9,); accepted: 2 integers >= 1"),
        ({"input_size": (9, 12)}, r"dy must be [N, *output, G, K] = (2, 7, 10, 4, 16)"),
        ({"w": _device((4, 8, 3, 3, 8), offset=2)}, "with dy's G=4 and K=16"),
        ({"w": _device(W, "fp16", offset=2)}, "dy, w share one dtype (fp16 or bf16)"),
        ({"dy": _device(DY, "fp32", offset=1)}, "dy must be fp16 or bf16, got fp32"),
        ({"dy": _device(DY, offset=1, strides=(7 * 9 * 80, 9 * 80, 80, 20, 1))},
         "dy has strides"),
        ({"out": _device((2, 9, 11, 4, 8), offset=1)}, "out overlaps the input dy"),
        ({"out": _device((2, 9, 11, 4, 4), offset=3)}, "out must be [N, *input_size, G, C]"),
        ({"stride": 0}, "stride is 0; accepted: an integer >= 1"),
    ],
)
def test_conv_bwd_data_argument_errors(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError) as caught:
        _data(**changes)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"x": _device((2, 9, 4, 8), offset=1)}, "x has shape (2, 9, 4, 8); supported"),
        ({"filter_size": None}, "filter_size is required (the 2 spatial sizes of w)"),
        ({"filter_size": (3, 0)}, "filter_size is (3, 0); accepted: 2 integers >= 1"),
        ({"filter_size": (5, 3)}, "dy must be [N, *output, G, K] = (2, 5, 9, 4, 16)"),
        ({"dy": _device((2, 7, 9, 2, 16), offset=2)}, "have different groups (2 and 4)"),
        ({"dy": _device(DY, "fp16", offset=2)}, "x, dy share one dtype (fp16 or bf16)"),
        ({"out": _device((4, 16, 3, 3, 8), offset=2)}, "out overlaps the input dy"),
        ({"out": _device((4, 16, 3, 3, 8), offset=3, strides=(16 * 9 * 16, 9 * 16, 48, 16, 1))},
         "out must be dense"),
        ({"padding": (1, 1, 1)}, "padding is (1, 1, 1); accepted"),
        ({"splits": 0}, "splits is 0; None (the plan's count) or an int from 1 to 65535"),
        ({"splits": 65536}, "splits is 65536; None"),
        ({"splits": True}, "splits is True; None"),
    ],
)
def test_conv_bwd_weight_argument_errors(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError) as caught:
        _weight(**changes)
    assert message in str(caught.value)


def test_sizes_come_from_out() -> None:
    # out gives input_size / filter_size; a disagreeing one is named.
    with pytest.raises(errors.InvalidArgumentError, match="disagrees with out's spatial sizes"):
        _data(out=_device((2, 9, 12, 4, 8), offset=3))


@no_gpu
def test_backward_passes_reach_the_device_check() -> None:
    with pytest.raises(errors.NoDeviceError):
        _data()
    with pytest.raises(errors.NoDeviceError):
        _weight()


def test_empty_batch_data_writes_nothing() -> None:
    out = _device((0, 9, 11, 4, 8), offset=3)
    assert _data(dy=_device((0, *DY[1:]), offset=1), out=out) is out


def test_direction_names() -> None:
    assert [direction_code(d) for d in ("fwd", "bwd_data", "bwd_weight")] == [0, 1, 2]
    with pytest.raises(errors.InvalidArgumentError, match="supported: 'fwd', 'bwd_data'"):
        direction_code("backward")
    with pytest.raises(errors.InvalidArgumentError, match="direction is 'dgrad'"):
        ckfmha.conv_select(ConvProblem(1, (9, 9), 1, 8, 8, (3, 3)), arch=90, direction="dgrad")


def _have(family: str, arch: str = "sm_90a", dtype: str = "bf16") -> bool:
    """Whether the build holds a 2D kernel of `family` that runs on `arch`."""
    number = int(arch.removeprefix("sm_").rstrip("a"))
    return any(k["family"] == family and k["dtype"] == dtype and k["conv_spatial_dims"] == 2
               and runs_on(k, number) for k in ckfmha.Registry().kernels())  # fmt: skip


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_bwd_weight_selects_and_explains(arch: str) -> None:
    if not _have("conv_bwd_weight", arch):
        pytest.skip(f"no bf16 2D conv_bwd_weight kernel for {arch} in this build")
    # Few output tiles over many positions: the plan splits the reduction.
    problem = ConvProblem(32, (56, 56), 1, 64, 64, (3, 3), 1, 1, dtype="bf16")
    name = ckfmha.conv_select(problem, arch=arch, direction="bwd_weight")
    assert name.startswith("conv_bwd_weight_bf16_2d_v8_"), name
    text = ckfmha.conv_explain(problem, arch=arch, direction="bwd_weight")
    assert f"selected  {name}" in text
    assert "zero the fp32 partial sums" in text and "splits adding into them" in text
    # Odd channel counts narrow the vector both operands share.
    odd = ConvProblem(2, (9, 9), 1, 12, 6, (3, 3), dtype="bf16")
    text = ckfmha.conv_explain(odd, arch=arch, direction="bwd_weight")
    assert "allow 2" in text


# Batch-1 layers of a few splits a tile: ResNeXt's groups of 16 and 8 and ResNet-18's 28x28x128.
FEW_SPLITS = [
    ConvProblem(1, (14, 14), 32, 16, 16, (3, 3), 1, 1, dtype="bf16"),
    ConvProblem(1, (28, 28), 32, 8, 8, (3, 3), 1, 1, dtype="bf16"),
    ConvProblem(1, (28, 28), 1, 128, 128, (3, 3), 1, 1, dtype="bf16"),
]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_bwd_weight_splits_sum_in_a_cluster_on_sm90(arch: str) -> None:
    """On sm_90a the gathering wgmma kernel's 2-8 splits of a tile add their partial tiles
    within one cluster and store dw (no workspace, so neither the zeroing nor the conversion
    launch); every other plan of several splits (the TMA kernel's, whose clusters cost more
    than the workspace since its epilogue stores pairs, NOTES 128, and sm_80's) adds them
    into the fp32 workspace. The core build runs at least one of these layers on an sm_90
    kernel."""
    if not _have("conv_bwd_weight", arch):
        pytest.skip(f"no bf16 2D conv_bwd_weight kernel for {arch} in this build")
    clustered = 0
    for problem in FEW_SPLITS:
        name = ckfmha.conv_select(problem, arch=arch, direction="bwd_weight")
        plan = ckfmha.conv_explain(problem, arch=arch, direction="bwd_weight").split("plan: ")[1]
        splits = re.search(r"over (\d+) splits", plan)
        in_cluster = (arch == "sm_90a" and "_sm90_cpasync_wgmma_" in name and splits is not None
                      and 2 <= int(splits[1]) <= 8)  # fmt: skip
        assert ("a tile's in one cluster (up to" in plan) == in_cluster, plan
        assert ("no workspace" in plan) == in_cluster, plan
        assert ("zero the fp32 partial sums" in plan) == (splits is not None and not in_cluster)
        clustered += in_cluster
    assert clustered > 0 or arch == "sm_80"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_bwd_weight_packs_groups_of_few_channels(arch: str) -> None:
    """Groups of 8 channels are multiplied 8 at a time (64 channels, the kernels'
    conv_weight_pack, mirrored by weight_pack); 4 groups of 24 pair up; groups of 64 and an odd
    group count run alone; so does every group below 4096 positions on the gathering kernels,
    and below 1024 on the TMA kernel (sm_90a), which takes packs of 64 channels."""
    from ckfmha.conv_selection import weight_pack

    if not _have("conv_bwd_weight", arch):
        pytest.skip(f"no bf16 2D conv_bwd_weight kernel for {arch} in this build")
    cases = [((32, 8, 8), 8), ((4, 24, 16), 2), ((2, 64, 64), 1), ((7, 4, 4), 1),
             ((12, 5, 3), 4)]  # fmt: skip
    for (groups, c, k), pack in cases:
        assert weight_pack(groups, c, k, 9 * c, 8 * 28 * 28) == pack
        assert weight_pack(groups, c, k, 9 * c, 4095) == 1
        if c <= 2 and k <= 2:
            continue  # direct kernels take these
        for batch, packs in ((8, pack), (5, 1)):  # 6272 and 3920 positions
            problem = ConvProblem(batch, (28, 28), groups, c, k, (3, 3), 1, 1, dtype="bf16")
            text = ckfmha.conv_explain(problem, arch=arch, direction="bwd_weight")
            selected = ckfmha.conv_select(problem, arch=arch, direction="bwd_weight")
            if "_conv_direct_" in selected:
                continue
            if "_sm90_tma_wgmma_" in selected:
                packs = pack  # from 1024 positions
                assert pack * c % 64 == 0, selected
            packed = f"groups multiplied {packs} at a time as one of {packs * k}x{packs * c}"
            assert (packed in text) == (packs > 1), text
            assert ("at a time" in text) == (packs > 1), text
    # The packed reduction stays a 32-bit index.
    assert weight_pack(64, 1, 1, 2**30, 2**20) == 1


def test_bwd_data_plans_phases() -> None:
    if not _have("conv_fwd"):
        pytest.skip("no bf16 2D conv_fwd kernel in this build")
    # Stride 2 and a 1x1 filter: only phase (0, 0) is reached; three phases are zeros.
    problem = ConvProblem(2, (9, 8), 4, 8, 16, (1, 1), 2, 0, dtype="bf16")
    text = ckfmha.conv_explain(problem, arch="sm_90a", direction="bwd_data")
    assert "plan: 4 stride phases" in text
    assert text.count("no filter tap reaches these positions: zeros") == 3
    # One convolution: nothing to run beside it.
    assert "concurrently" not in text
    assert ckfmha.conv_select(problem, arch="sm_90a", direction="bwd_data").startswith(
        "conv_fwd_bf16_2d_v8_")
    # Stride 1: one phase, the flipped filter at padding dilation * (filter - 1) - padding.
    problem = ConvProblem(2, (9, 9), 1, 8, 16, (3, 3), 1, 1, dtype="bf16")
    text = ckfmha.conv_explain(problem, arch="sm_90a", direction="bwd_data")
    assert "plan: 1 stride phase of dx" in text
    assert "C=16 K=8 filter=3x3 stride=1x1 padding=1x1" in text
    # A 1x1 filter with padding: the phase's padding is negative (it reads inside dy).
    problem = ConvProblem(1, (5, 5), 1, 8, 8, (1, 1), 1, 2, dtype="bf16")
    text = ckfmha.conv_explain(problem, arch="sm_90a", direction="bwd_data")
    assert "padding=-2x-2" in text
    # Stride 2 and a 3x3 filter: every phase is reached, four convolutions side by side.
    problem = ConvProblem(1, (9, 9), 4, 8, 8, (3, 3), 2, 1, dtype="bf16")
    text = ckfmha.conv_explain(problem, arch="sm_90a", direction="bwd_data")
    assert "plan: 4 stride phases" in text
    assert "their convolutions run concurrently on side streams" in text
    assert "zeros" not in text


IN_PLACE = "its filter is read from w in place"


def _phase_kernels(text: str) -> list[tuple[str, bool]]:
    """Each planned phase's kernel, and whether explain says it reads w in place."""
    lines = text.splitlines()
    return [(line.strip().split(":")[0], IN_PLACE in (lines[i + 1] if i + 1 < len(lines) else ""))
            for i, line in enumerate(lines) if line.startswith("    conv_fwd_")]  # fmt: skip


def test_bwd_data_phases_read_the_filter_in_place_on_direct_tma_and_wgmma_kernels() -> None:
    """Phases on the direct and TMA kernels, and on the 8-channel gathering wgmma kernels where
    C is a multiple of 8, read w through a transposed, flipped view (no copy into the
    workspace); phases on the other gathering GEMMs name no such view (they read the rearranged
    copy)."""
    if not _have("conv_fwd"):
        pytest.skip("no bf16 2D conv_fwd kernel in this build")
    problems = [
        ConvProblem(1, (28, 28), 96, 1, 1, (3, 3), 2, 1, dtype="bf16"),  # depthwise, 4 phases
        ConvProblem(2, (14, 14), 1, 64, 64, (3, 3), 1, 1, dtype="bf16"),
        ConvProblem(4, (28, 28), 1, 128, 64, (3, 3), 2, 1, dtype="bf16"),
        ConvProblem(8, (28, 28), 8, 24, 24, (3, 3), 1, 1, dtype="bf16"),  # a gathering GEMM
        ConvProblem(8, (28, 28), 8, 12, 24, (3, 3), 1, 1, dtype="bf16"),  # C in no 16-byte runs
        ConvProblem(1, (14, 14), 32, 16, 16, (3, 3), 1, 1, dtype="bf16"),  # ResNeXt, batch 1
        ConvProblem(8, (28, 28), 32, 8, 8, (3, 3), 1, 1, dtype="bf16"),  # packed groups
    ]
    kinds = set()
    for problem in problems:
        text = ckfmha.conv_explain(problem, arch="sm_90a", direction="bwd_data")
        phases = _phase_kernels(text)
        assert phases, text
        packed = "block-diagonal filters" in text
        for name, in_place in phases:
            gathering_wgmma = ("_v8__" in name and "_sm90_cpasync_wgmma_" in name
                               and problem.in_channels % 8 == 0)  # fmt: skip
            viewed = not packed and ("_conv_direct_" in name or "_sm90_tma_wgmma_" in name
                                     or gathering_wgmma)  # fmt: skip
            assert in_place == viewed, text
            kinds.add("packed" if packed else "view" if viewed else "copy")
    # Every kind of plan was checked.
    assert kinds == {"view", "copy", "packed"}, kinds


@pytest.mark.parametrize(
    ("groups", "c", "k", "pack"),
    [(32, 8, 8, 8), (32, 16, 16, 4), (32, 32, 32, 2), (16, 24, 8, 8), (8, 8, 16, 4),
     (12, 8, 8, 1), (32, 24, 24, 1), (32, 64, 64, 1), (64, 4, 4, 1)],
)  # fmt: skip
def test_bwd_data_packs_groups_of_8_to_32_channels(groups: int, c: int, k: int, pack: int) -> None:
    """Groups whose output channels (the phases' reduction) are 8, 16 or 32 run `pack` at a time
    as one of 64 reduction channels on the TMA template, through block-diagonal filters, unless
    their unpacked phases already run on it (a build with a 32-channel TMA tile takes groups of
    32 so, reading w in place); groups the pack does not divide, wider or narrower groups, and
    other counts do not."""
    if not _have("conv_fwd"):
        pytest.skip("no bf16 2D conv_fwd kernel in this build")
    phrase = f"groups multiplied {pack} at a time as one of {pack * k} input and {pack * c} output"
    problem = ConvProblem(8, (28, 28), groups, c, k, (3, 3), 2, 1, dtype="bf16")
    text = ckfmha.conv_explain(problem, arch="sm_90a", direction="bwd_data")
    phases = _phase_kernels(text)
    assert all("_sm90_tma_wgmma_" in name for name, _ in phases) or phrase not in text, text
    if pack == 1:
        assert phrase not in text, text
    elif phrase in text:
        assert f"groups={groups // pack} C={pack * k} K={pack * c}" in text, text
    else:
        # Unpacked on the TMA template, in place.
        assert all("_sm90_tma_wgmma_" in name and in_place for name, in_place in phases), text
    if pack in (4, 8):  # no TMA tile takes 8 or 16 reduction channels unpacked
        assert phrase in text, text
    # Below 1024 dx positions the groups run unpacked.
    small = ConvProblem(1, (28, 28), groups, c, k, (3, 3), 2, 1, dtype="bf16")
    small_text = ckfmha.conv_explain(small, arch="sm_90a", direction="bwd_data")
    assert "at a time as one of" not in small_text, small_text
