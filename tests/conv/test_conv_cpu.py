"""Grouped convolution without a GPU: the Python layer's argument checks (on stand-in device
arrays, so every check runs before the device is touched), ConvProblem, and kernel selection
and explanation for an explicit arch against the conv_fwd kernels the library was built with.

Selection tests skip when the build holds no conv_fwd kernel of the kind they ask about (the
core set holds bf16 2D and 3D and fp16 2D kernels with 16-byte vectors, and a bf16 2D one
that loads one channel at a time).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from support.device_kernels import runs_on

import ckfmha
from ckfmha import errors
from ckfmha.conv_problem import ConvProblem, check_dense, per_dim, split_shapes

no_gpu = pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")
# Stand-in device addresses: 256-byte aligned, never dereferenced (checks fail first).
FAKE = 1 << 20
NAME = re.compile(r"^conv_fwd_(?P<dtype>fp16|bf16)_(?P<dims>[23])d_v(?P<vector>\d+)__")


def _device(shape: tuple[int, ...], dtype: str = "bf16", offset: int = 0,
            strides: tuple[int, ...] | None = None) -> ckfmha.DeviceArray:  # fmt: skip
    return ckfmha.device_ptr(FAKE + (offset << 24), shape, dtype, strides)


X = (2, 9, 11, 4, 8)  # N, H, W, G, C
W = (4, 16, 3, 3, 8)  # G, K, Y, X, C


def _call(**changes: Any) -> Any:
    arrays: dict[str, Any] = {"x": _device(X, offset=1), "w": _device(W, offset=2)}
    arrays.update(changes)
    x, w = arrays.pop("x"), arrays.pop("w")
    return ckfmha.conv_fwd(x, w, **arrays)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"x": _device((2, 9, 4, 8), offset=1)},
         ("x has shape (2, 9, 4, 8); supported: [N, H, W, G, C] (2D, 5 dims) or "
         "[N, D, H, W, G, C] (3D, 6 dims)")),
        ({"w": _device((4, 16, 3, 3, 3, 8), offset=2)},
         "w is [G, K, *filter, C] with 2 filter dims"),
        ({"w": _device((2, 16, 3, 3, 8), offset=2)},
         "with x's groups G=4 and channels per group C=8, got G=2 and C=8"),
        ({"w": _device((4, 16, 3, 3, 16), offset=2)}, "got G=4 and C=16"),
        ({"x": _device(X, "fp32", offset=1)}, "x must be fp16 or bf16, got fp32"),
        ({"w": _device(W, "fp16", offset=2)},
         "x, w and out share one dtype (fp16 or bf16); got x bf16, w fp16"),
        ({"out": _device((2, 9, 11, 4, 16), "fp16", offset=3)},
         "got x bf16, w bf16, out fp16"),
        ({"x": _device(X, offset=1, strides=(9 * 11 * 40, 11 * 40, 40, 10, 1))},
         ("the groups and channels of a position must be dense (group stride 8, channel stride "
         "1)")),
        ({"w": _device(W, offset=2, strides=(16 * 9 * 16, 9 * 16, 3 * 16, 16, 1))},
         "w must be dense (contiguous [G, K, *filter, C])"),
        ({"padding": -1}, "padding is -1; accepted: an integer >= 0, or 2 of them"),
        ({"padding": (1, 1, 1)}, "padding is (1, 1, 1); accepted: an integer >= 0, or 2 of"),
        ({"stride": 0}, "stride is 0; accepted: an integer >= 1"),
        ({"stride": True}, "stride is True; accepted"),
        ({"dilation": (1, 0)}, "dilation is (1, 0); accepted: an integer >= 1"),
        ({"stride": 1.5}, "stride is 1.5; accepted"),
        ({"w": _device((4, 16, 13, 3, 8), offset=2)},
         ("dim h: the filter spans 13 positions (filter 13, dilation 1) but the padded input has "
         "9 (input 9 + 2 x padding 0): the output would be empty")),
        ({"dilation": 5}, "dim h: the filter spans 11 positions (filter 3, dilation 5)"),
        ({"x": _device((2, 9, 11, 4, 0), offset=1), "w": _device((4, 16, 3, 3, 0), offset=2)},
         "groups, in_channels and out_channels (per group) must be >= 1"),
        ({"out": _device((2, 9, 9, 4, 16), offset=3)},
         ("out must be [N, *output, G, K] = (2, 7, 9, 4, 16) for these x, w, stride, padding "
         "and dilation, got (2, 9, 9, 4, 16)")),
        ({"out": _device((2, 7, 9, 4, 16), offset=3, strides=(7 * 9 * 80, 9 * 80, 80, 20, 1))},
         "out has strides"),
        ({"out": _device((2, 7, 9, 4, 16), offset=1)}, "out overlaps the input x"),
        ({"out": np.zeros((2, 7, 9, 4, 16), np.float16)},
         "x is on cuda:0, w is on cuda:0, out is on cpu"),
        ({"x": np.zeros(X, np.float16)}, "arrays are on different devices"),
    ],
)
def test_conv_fwd_argument_errors(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError) as caught:
        _call(**changes)
    assert message in str(caught.value)


def test_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match=r"supported: \[N, H, W, G, C\] \(2D, 5 dims\)"):
        ckfmha.conv_fwd(np.zeros((1, 4, 4, 4), np.float16), np.zeros((1, 1, 1, 4), np.float16))


def test_numpy_shapes_are_checked_before_staging() -> None:
    # A host array would be copied to the device: a wrong shape must not get that far.
    x = np.zeros((1, 5, 5, 2, 3), np.float16)
    with pytest.raises(errors.InvalidArgumentError, match="got G=1 and C=3"):
        ckfmha.conv_fwd(x, np.zeros((1, 4, 3, 3, 3), np.float16))
    with pytest.raises(errors.InvalidArgumentError, match="the output would be empty"):
        ckfmha.conv_fwd(x, np.zeros((2, 4, 7, 7, 3), np.float16))


def test_empty_batch_writes_nothing() -> None:
    # The C library returns before it needs a device: nothing is launched.
    out = _device((0, 7, 9, 4, 16), offset=3)
    assert _call(x=_device((0, *X[1:]), offset=1), out=out) is out


@no_gpu
def test_conv_fwd_reaches_the_device_check() -> None:
    with pytest.raises(errors.NoDeviceError):
        _call()
    with pytest.raises(errors.NoDeviceError):
        _call(out=_device((2, 9, 11, 4, 16), offset=3), padding=1)


# ---- ConvProblem and the layout rules ----


def test_problem_shapes_and_flops() -> None:
    p = ConvProblem(batch=2, input=(33, 17), groups=4, in_channels=8, out_channels=12,
                    filter=(3, 5), stride=(2, 1), padding=(1, 2), dilation=(1, 2))
    assert p.output == (17, 13)
    assert p.x_shape == (2, 33, 17, 4, 8)
    assert p.w_shape == (4, 12, 3, 5, 8)
    assert p.y_shape == (2, 17, 13, 4, 12)
    assert p.x_outer_strides == (33 * 17 * 32, 17 * 32, 32)
    assert p.y_outer_strides == (17 * 13 * 48, 13 * 48, 48)
    assert p.flops() == 2 * 2 * 17 * 13 * 4 * 12 * 8 * 15
    q = ConvProblem.from_shapes((2, 33, 17, 4, 8), (4, 12, 3, 5, 8), stride=(2, 1),
                                padding=(1, 2), dilation=(1, 2))
    assert q == p
    three = ConvProblem.from_shapes((1, 4, 6, 8, 2, 16), (2, 8, 3, 3, 3, 16), padding=1)
    assert three.spatial_dims == 3 and three.output == (4, 6, 8)


def test_layout_rules() -> None:
    assert per_dim("stride", 2, 3, 1) == (2, 2, 2)
    assert per_dim("padding", [0, 3], 2, 0) == (0, 3)
    shapes = split_shapes((1, 5, 5, 1, 1), (1, 1, 7, 7, 1))
    assert (shapes.groups, shapes.in_channels, shapes.out_channels) == (1, 1, 1)
    # Strides of axes of extent 1 do not matter.
    check_dense("w", (4, 1, 3, 3, 8), (72, 999, 24, 8, 1))
    with pytest.raises(errors.InvalidArgumentError, match="must be dense"):
        check_dense("w", (4, 2, 3, 3, 8), (144, 72, 24, 8, 2))


# ---- selection and explanation ----


def _conv_kernels() -> list[dict[str, Any]]:
    return [k for k in ckfmha.Registry().kernels() if k["family"] == "conv_fwd"]


def _kernel_names(dtype: str, dims: int, vector: int, arch: int | None = None) -> list[str]:
    """Registered conv_fwd kernels of this kind (that run on ``arch``, when given)."""
    names = []
    for kernel in _conv_kernels():
        match = NAME.match(kernel["name"])
        if match and (match["dtype"], int(match["dims"]), int(match["vector"])) == (
                dtype, dims, vector) and (arch is None or runs_on(kernel, arch)):
            names.append(kernel["name"])
    return names


def _arch_number(arch: str | int) -> int:
    return arch if isinstance(arch, int) else int(re.sub(r"\D", "", arch))


def _need(dtype: str, dims: int, vector: int, arch: str | int) -> None:
    if not _kernel_names(dtype, dims, vector, _arch_number(arch)):
        pytest.skip(f"build has no conv_fwd {dtype} {dims}d v{vector} kernel for {arch}")


ARCHES = ("sm_90a", 90, "sm_80")


@pytest.mark.parametrize("arch", ARCHES)
def test_wide_channels_select_16_byte_vectors(arch: str | int) -> None:
    _need("bf16", 2, 8, arch)
    x = _device((8, 56, 56, 1, 64), offset=1)
    w = _device((1, 64, 3, 3, 64), offset=2)
    name = ckfmha.conv_select(x, w, padding=1, arch=arch)
    assert name.startswith("conv_fwd_bf16_2d_v8__"), name
    text = ckfmha.conv_explain(x, w, padding=1, arch=arch)
    assert f"  selected  {name}" in text
    assert "problem: forward conv 2d bf16 batch=8 input=56x56 groups=1 C=64 K=64" in text
    assert "channel vector 8" in text
    assert f"plan: one stage, {name}:" in text


@pytest.mark.parametrize("arch", ARCHES)
def test_three_channels_select_one_channel_loads(arch: str | int) -> None:
    _need("bf16", 2, 1, arch)
    problem = ConvProblem(batch=8, input=(224, 224), groups=1, in_channels=3, out_channels=64,
                          filter=(7, 7), stride=2, padding=3, dtype="bf16")
    name = ckfmha.conv_select(problem, arch=arch)
    assert name.startswith("conv_fwd_bf16_2d_v1__"), name
    text = ckfmha.conv_explain(problem, arch=arch)
    assert f"  selected  {name}" in text
    wide = _kernel_names("bf16", 2, 8, _arch_number(arch))
    if not wide:
        pytest.skip(f"build has no bf16 2d v8 kernel for {arch}")
    for rejected in wide:
        assert (f"  rejected  {rejected}: loads 8 channels at once, but in_channels 3, the x "
                "strides or the pointers allow 1") in text


def test_strides_narrow_the_vector() -> None:
    _need("bf16", 2, 1, "sm_90a")
    # C = 64 but a position stride of 129 channels (a slice of a wider tensor): 1-channel loads.
    x = _device((2, 14, 14, 2, 64), offset=1, strides=(14 * 14 * 129, 14 * 129, 129, 64, 1))
    w = _device((2, 64, 3, 3, 64), offset=2)
    assert NAME.match(ckfmha.conv_select(x, w, padding=1, arch="sm_90a"))["vector"] == "1"
    strided = ConvProblem(batch=2, input=(14, 14), groups=2, in_channels=64, out_channels=64,
                          filter=(3, 3), padding=1, dtype="bf16",
                          x_strides=(14 * 14 * 129, 14 * 129, 129))
    assert ckfmha.conv_select(strided, arch="sm_90a") == ckfmha.conv_select(
        x, w, padding=1, arch="sm_90a")


def test_select_reads_host_arrays_without_a_device() -> None:
    _need("fp16", 2, 8, "sm_80")
    x = np.zeros((1, 14, 14, 2, 16), np.float16)
    w = np.zeros((2, 24, 3, 3, 16), np.float16)
    name = ckfmha.conv_select(x, w, padding=1, arch="sm_80")
    assert name.startswith("conv_fwd_fp16_2d_v8__"), name


def test_three_d_selects_a_three_d_kernel() -> None:
    _need("bf16", 3, 8, "sm_90a")
    problem = ConvProblem(batch=8, input=(16, 56, 56), groups=8, in_channels=16,
                          out_channels=16, filter=(3, 3, 3), padding=1, dtype="bf16")
    name = ckfmha.conv_select(problem, arch="sm_90a")
    assert name.startswith("conv_fwd_bf16_3d_v8__"), name
    text = ckfmha.conv_explain(problem, arch="sm_90a")
    for other in _kernel_names("bf16", 2, 8, 90):
        assert f"  rejected  {other}: 2 spatial dims, problem has 3" in text


def test_missing_kernels_are_unsupported() -> None:
    if not _conv_kernels():
        pytest.skip("build has no conv_fwd kernels")
    if _kernel_names("fp16", 3, 1):
        pytest.skip("build has an fp16 3d v1 kernel")
    problem = ConvProblem(batch=1, input=(5, 5, 5), groups=3, in_channels=3, out_channels=5,
                          filter=(3, 3, 3), dtype="fp16")
    with pytest.raises(errors.UnsupportedError) as caught:
        ckfmha.conv_select(problem, arch="sm_90a")
    assert "no compiled conv_fwd kernel fits conv 3d fp16" in str(caught.value)
    assert "Available on sm_90" in str(caught.value)


def test_empty_batch_selects_nothing() -> None:
    problem = ConvProblem(batch=0, input=(7, 7), groups=1, in_channels=8, out_channels=8,
                          filter=(3, 3), dtype="bf16")
    assert ckfmha.conv_select(problem, arch="sm_80") == ""
    assert "no kernel runs: the batch is empty" in ckfmha.conv_explain(problem, arch="sm_80")


def test_select_checks_like_conv_fwd() -> None:
    problem = ConvProblem(batch=1, input=(4, 4), groups=1, in_channels=8, out_channels=8,
                          filter=(5, 5), dtype="bf16")
    with pytest.raises(errors.InvalidArgumentError, match="the output would be empty"):
        ckfmha.conv_select(problem, arch=90)
    with pytest.raises(errors.InvalidArgumentError, match="fp16, bf16"):
        ckfmha.conv_select(ConvProblem(1, (8, 8), 1, 8, 8, (3, 3), dtype="fp32"), arch=90)
    with pytest.raises(TypeError, match="pass a ConvProblem alone"):
        ckfmha.conv_select(problem, padding=2, arch=90)
    with pytest.raises(TypeError, match="pass arrays x and w"):
        ckfmha.conv_select(_device(X), arch=90)
    with pytest.raises(errors.InvalidArgumentError, match="got G=2 and C=8"):
        ckfmha.conv_select(_device(X), _device((2, 16, 3, 3, 8)), arch=90)
