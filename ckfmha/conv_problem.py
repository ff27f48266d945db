"""Grouped convolution problems described by shapes, and the layout rules ``ckfmha.conv_fwd``
checks its arrays against before anything reaches the device.

Layouts (as in ``ckfmha.reference_conv``): x [N, *spatial, G, C], w [G, K, *filter, C],
y [N, *out_spatial, G, K], 2 or 3 spatial dims; C and K count the channels of one group. Within
a position the groups and channels of x and y are dense (channel stride 1, group stride C
resp. K), which a torch channels_last tensor viewed as [N, H, W, G, C] satisfies; batch and
spatial strides are free. w is dense.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ckfmha import _dtypes
from ckfmha.errors import InvalidArgumentError
from ckfmha.reference_conv import output_size

PerDim = int | Sequence[int]
SPATIAL_DIMS = (2, 3)
# The C API's per-direction codes (ckfmha_conv_direction), by the names Python calls take.
CONV_FWD = 0
CONV_BWD_DATA = 1
CONV_BWD_WEIGHT = 2
DIRECTIONS = {"fwd": CONV_FWD, "bwd_data": CONV_BWD_DATA, "bwd_weight": CONV_BWD_WEIGHT}


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)


def direction_code(direction: str) -> int:
    """The C code of a pass named "fwd", "bwd_data" or "bwd_weight"."""
    code = DIRECTIONS.get(direction) if isinstance(direction, str) else None
    if code is None:
        raise _invalid(
            f"direction is {direction!r}; supported: {', '.join(map(repr, DIRECTIONS))}"
        )
    return code


def per_dim(name: str, value: PerDim, dims: int, least: int) -> tuple[int, ...]:
    """``value`` (an int, or one int per spatial dim) as a tuple of ``dims`` ints >= least."""
    values: tuple[object, ...]
    if isinstance(value, Sequence) and not isinstance(value, str):
        values = tuple(value)
    else:
        values = (value,) * dims
    valid = len(values) == dims and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= least for v in values
    )
    if not valid:
        raise _invalid(
            f"{name} is {value!r}; accepted: an integer >= {least}, or {dims} of them (one per "
            f"spatial dim, outermost first)"
        )
    return values  # type: ignore[return-value]


@dataclass(frozen=True)
class ConvShapes:
    """What an x shape and a w shape say: sizes per dim and channels per group."""

    spatial_dims: int
    batch: int
    input: tuple[int, ...]
    groups: int
    in_channels: int
    out_channels: int
    filter: tuple[int, ...]


def split_shapes(x_shape: Sequence[int], w_shape: Sequence[int]) -> ConvShapes:
    """Reads x [N, *spatial, G, C] and w [G, K, *filter, C]; raises InvalidArgumentError when
    their ranks or their groups and channels disagree."""
    x_shape, w_shape = tuple(int(n) for n in x_shape), tuple(int(n) for n in w_shape)
    if len(x_shape) - 3 not in SPATIAL_DIMS:
        raise _invalid(
            f"x has shape {x_shape}; supported: [N, H, W, G, C] (2D, 5 dims) or "
            "[N, D, H, W, G, C] (3D, 6 dims)"
        )
    dims = len(x_shape) - 3
    if len(w_shape) != len(x_shape):
        raise _invalid(
            f"w has shape {w_shape} but x {x_shape} is {dims}D: w is [G, K, *filter, C] with "
            f"{dims} filter dims ({len(x_shape)} dims)"
        )
    groups, channels = x_shape[-2], x_shape[-1]
    if w_shape[0] != groups or w_shape[-1] != channels:
        raise _invalid(
            f"w {w_shape} does not match x {x_shape}: w is [G, K, *filter, C] with x's groups "
            f"G={groups} and channels per group C={channels}, got G={w_shape[0]} and "
            f"C={w_shape[-1]}"
        )
    return ConvShapes(dims, x_shape[0], x_shape[1:1 + dims], groups, channels, w_shape[1],
                      w_shape[2:2 + dims])  # fmt: skip


def check_channels_dense(name: str, shape: Sequence[int], strides: Sequence[int]) -> None:
    """The last two axes ([.., G, C] or [.., G, K]) of a strided array are dense: channel stride
    1 and group stride the channel count (a stride of an axis of extent 1 does not matter)."""
    groups, channels = shape[-2], shape[-1]
    group_stride, channel_stride = strides[-2], strides[-1]
    if (channels > 1 and channel_stride != 1) or (groups > 1 and group_stride != channels):
        raise _invalid(
            f"{name} has strides {tuple(strides)} (elements) for shape {tuple(shape)}: the "
            f"groups and channels of a position must be dense (group stride {channels}, channel "
            "stride 1), as in a channels_last tensor viewed as [N, *spatial, G, C]; batch and "
            "spatial strides may be anything"
        )


def check_dense(name: str, shape: Sequence[int], strides: Sequence[int]) -> None:
    """A contiguous (row-major) array, ignoring the strides of axes of extent 1."""
    expected = 1
    for extent, stride in zip(reversed(tuple(shape)), reversed(tuple(strides))):
        if extent > 1 and stride != expected:
            raise _invalid(
                f"{name} has strides {tuple(strides)} (elements) for shape {tuple(shape)}; "
                f"{name} must be dense (contiguous [G, K, *filter, C]): pass a contiguous copy"
            )
        expected *= extent


def outer_strides(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """The batch and spatial strides of x or y (everything before [G, C])."""
    return tuple(int(s) for s in strides[: len(shape) - 2])


def _dense_outer(extents: Sequence[int], channels: int) -> tuple[int, ...]:
    """(batch, *spatial) strides of a dense [N, *spatial, channels] array."""
    strides = []
    step = channels
    for extent in reversed(tuple(extents)[1:]):
        strides.append(step)
        step *= extent
    strides.append(step)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class ConvProblem:
    """A grouped convolution described by shapes, so that selection and explanation work
    without arrays or a GPU (``ckfmha.conv_select(problem, arch="sm_90a")``).

    x is [batch, *input, groups, in_channels], w [groups, out_channels, *filter, in_channels],
    y [batch, *output, groups, out_channels]; in_channels and out_channels are per group.
    ``stride``, ``padding`` (zeros, both sides) and ``dilation`` are an int or one per spatial
    dim. ``x_strides`` and ``y_strides`` are the (batch, *spatial) strides in elements (None:
    dense); they decide the channel vector the kernels may load, as an array's strides do.
    """

    batch: int
    input: tuple[int, ...]
    groups: int
    in_channels: int
    out_channels: int
    filter: tuple[int, ...]
    stride: PerDim = 1
    padding: PerDim = 0
    dilation: PerDim = 1
    dtype: str = "fp16"
    x_strides: tuple[int, ...] | None = None
    y_strides: tuple[int, ...] | None = None

    @classmethod
    def from_shapes(cls, x_shape: Sequence[int], w_shape: Sequence[int], *,
                    stride: PerDim = 1, padding: PerDim = 0, dilation: PerDim = 1,
                    dtype: str = "fp16") -> ConvProblem:  # fmt: skip
        """The problem of x and w of these shapes (dense strides)."""
        s = split_shapes(x_shape, w_shape)
        return cls(s.batch, s.input, s.groups, s.in_channels, s.out_channels, s.filter,
                   stride, padding, dilation, dtype)  # fmt: skip

    @property
    def spatial_dims(self) -> int:
        return len(self.input)

    @property
    def dtype_code(self) -> int:
        return _dtypes.dtype_code(self.dtype)

    @property
    def strides(self) -> tuple[int, ...]:
        return per_dim("stride", self.stride, self.spatial_dims, 1)

    @property
    def paddings(self) -> tuple[int, ...]:
        return per_dim("padding", self.padding, self.spatial_dims, 0)

    @property
    def dilations(self) -> tuple[int, ...]:
        return per_dim("dilation", self.dilation, self.spatial_dims, 1)

    @property
    def output(self) -> tuple[int, ...]:
        """Output extent per spatial dim (< 1 where the filter does not fit)."""
        return tuple(output_size(*a) for a in zip(self.input, self.filter, self.strides,
                                                  self.paddings, self.dilations))  # fmt: skip

    @property
    def x_shape(self) -> tuple[int, ...]:
        return (self.batch, *self.input, self.groups, self.in_channels)

    @property
    def w_shape(self) -> tuple[int, ...]:
        return (self.groups, self.out_channels, *self.filter, self.in_channels)

    @property
    def y_shape(self) -> tuple[int, ...]:
        return (self.batch, *self.output, self.groups, self.out_channels)

    @property
    def x_outer_strides(self) -> tuple[int, ...]:
        if self.x_strides is not None:
            return tuple(self.x_strides)
        return _dense_outer(self.x_shape[:-2], self.groups * self.in_channels)

    @property
    def y_outer_strides(self) -> tuple[int, ...]:
        if self.y_strides is not None:
            return tuple(self.y_strides)
        return _dense_outer(self.y_shape[:-2], self.groups * self.out_channels)

    def flops(self) -> float:
        """2 * N * output positions * G * K * C * filter taps: each product a multiply-add."""
        positions = math.prod(self.output)
        taps = math.prod(self.filter)
        return (2.0 * self.batch * positions * self.groups * self.out_channels
                * self.in_channels * taps)  # fmt: skip
