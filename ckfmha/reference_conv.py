"""Float64 NumPy reference for grouped convolution: forward, backward-data and backward-weight,
in 2D and 3D, the ground truth convolution kernels are checked against.

Layouts are channels-last with the group explicit:

- input x: [N, *spatial, G, C] (NHWGC in 2D, NDHWGC in 3D), C channels per group;
- weight w: [G, K, *filter, C] (GKYXC in 2D, GKZYXC in 3D), K output channels per group;
- output y: [N, *out_spatial, G, K] (NHWGK / NDHWGK).

Group g's outputs see group g's input channels only: G = 1 is an ordinary convolution, C = K = 1
with G channels a depthwise one. Each spatial dim has its own stride, padding (zeros, the same
on both sides) and dilation; ``output_size`` gives the output's extent. The arithmetic is a
loop over filter taps: each tap gathers the input positions it reads (zeros where they fall in
the padding) and adds a [.., G, C] x [G, K, C] product, so sizes that fit in memory run in
seconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]


def output_size(size: int, filter_size: int, stride: int, padding: int, dilation: int) -> int:
    """Output extent of one spatial dim: the filter's positions that fit in the padded input."""
    span = dilation * (filter_size - 1) + 1
    return (size + 2 * padding - span) // stride + 1


def _per_dim(name: str, value: int | Sequence[int], dims: int, least: int) -> tuple[int, ...]:
    values = (value,) * dims if isinstance(value, int) else tuple(value)
    if len(values) != dims or any(not isinstance(v, int) or v < least for v in values):
        raise ValueError(f"{name} is {value!r}; accepted: an integer >= {least}, or {dims} of "
                         "them (one per spatial dim)")  # fmt: skip
    return values


class _Geometry:
    """Sizes, strides, paddings and dilations of one problem, and the input rows each filter
    tap reads."""

    def __init__(self, spatial: Sequence[int], filter_size: Sequence[int],
                 stride: int | Sequence[int], padding: int | Sequence[int],
                 dilation: int | Sequence[int]) -> None:  # fmt: skip
        dims = len(spatial)
        if dims not in (2, 3) or len(filter_size) != dims:
            raise ValueError(f"input spatial dims {tuple(spatial)} and filter "
                             f"{tuple(filter_size)}: 2D or 3D, the same count")  # fmt: skip
        self.spatial, self.filter = tuple(spatial), tuple(filter_size)
        self.stride = _per_dim("stride", stride, dims, 1)
        self.padding = _per_dim("padding", padding, dims, 0)
        self.dilation = _per_dim("dilation", dilation, dims, 1)
        self.out = tuple(output_size(*a) for a in zip(self.spatial, self.filter, self.stride,
                                                      self.padding, self.dilation))  # fmt: skip
        if any(o < 1 for o in self.out):
            raise ValueError(f"the dilated filter {self.filter} does not fit the padded input "
                             f"{self.spatial} (output size {self.out})")  # fmt: skip

    def taps(self) -> Iterator[tuple[tuple[int, ...], tuple[Array, ...], tuple[Array, ...]]]:
        """Per filter tap: its index, and per dim the input position each output position
        reads and whether it lies inside the input (not in the padding)."""
        for tap in itertools.product(*(range(f) for f in self.filter)):
            rows, valid = [], []
            for d, t in enumerate(tap):
                pos = (np.arange(self.out[d]) * self.stride[d] - self.padding[d]
                       + t * self.dilation[d])  # fmt: skip
                inside = (pos >= 0) & (pos < self.spatial[d])
                rows.append(np.where(inside, pos, 0))
                valid.append(inside)
            yield tap, tuple(rows), tuple(valid)


def _mask(valid: tuple[Array, ...]) -> Array:
    """[*out_spatial] 1.0 where every dim's position is inside the input."""
    grids = np.meshgrid(*valid, indexing="ij")
    return np.logical_and.reduce(grids).astype(np.float64)


def _gather(x: Array, rows: tuple[Array, ...]) -> Array:
    """x [N, *spatial, G, C] at the positions `rows` gives per dim: [N, *out_spatial, G, C]."""
    index = np.ix_(*rows)
    return x[(slice(None), *index)]


def _check(x: Array, w: Array) -> tuple[int, int, int]:
    if x.ndim not in (5, 6) or w.ndim != x.ndim:
        raise ValueError(f"x {x.shape} and w {w.shape}: [N, *spatial, G, C] and [G, K, *filter, "
                         "C], 2 or 3 spatial dims")  # fmt: skip
    groups, channels = x.shape[-2], x.shape[-1]
    if w.shape[0] != groups or w.shape[-1] != channels:
        raise ValueError(f"w {w.shape} is [G, K, *filter, C] with G={groups} and C={channels} "
                         f"of x {x.shape}")  # fmt: skip
    return groups, channels, w.shape[1]


def conv_fwd(x: npt.ArrayLike, w: npt.ArrayLike, stride: int | Sequence[int] = 1,
             padding: int | Sequence[int] = 0,
             dilation: int | Sequence[int] = 1) -> Array:  # fmt: skip
    """y [N, *out_spatial, G, K] = grouped convolution of x [N, *spatial, G, C] with
    w [G, K, *filter, C]."""
    x64, w64 = np.asarray(x, dtype=np.float64), np.asarray(w, dtype=np.float64)
    groups, _, out_channels = _check(x64, w64)
    dims = x64.ndim - 3
    geometry = _Geometry(x64.shape[1:1 + dims], w64.shape[2:2 + dims], stride, padding, dilation)
    y = np.zeros((x64.shape[0], *geometry.out, groups, out_channels))
    for tap, rows, valid in geometry.taps():
        patch = _gather(x64, rows) * _mask(valid)[..., None, None]
        y += np.einsum("...gc,gkc->...gk", patch, w64[(slice(None), slice(None), *tap)])
    return y


def conv_bwd_data(dy: npt.ArrayLike, w: npt.ArrayLike, input_spatial: Sequence[int],
                  stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                  dilation: int | Sequence[int] = 1) -> Array:  # fmt: skip
    """dx [N, *input_spatial, G, C]: the gradient of conv_fwd's input, from dy
    [N, *out_spatial, G, K] and w [G, K, *filter, C]."""
    dy64, w64 = np.asarray(dy, dtype=np.float64), np.asarray(w, dtype=np.float64)
    dims = dy64.ndim - 3
    geometry = _Geometry(input_spatial, w64.shape[2:2 + dims], stride, padding, dilation)
    if dy64.shape[1:1 + dims] != geometry.out or dy64.shape[-2:] != w64.shape[:2]:
        raise ValueError(f"dy {dy64.shape} is [N, *{geometry.out}, G, K] for w {w64.shape}")
    dx = np.zeros((dy64.shape[0], *geometry.spatial, w64.shape[0], w64.shape[-1]))
    for tap, rows, valid in geometry.taps():
        contribution = np.einsum("...gk,gkc->...gc", dy64, w64[(slice(None), slice(None), *tap)])
        contribution *= _mask(valid)[..., None, None]
        # Several output positions can read one input position (stride < span): accumulate.
        np.add.at(dx, (slice(None), *np.ix_(*rows)), contribution)
    return dx


def conv_bwd_weight(x: npt.ArrayLike, dy: npt.ArrayLike, filter_size: Sequence[int],
                    stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                    dilation: int | Sequence[int] = 1) -> Array:  # fmt: skip
    """dw [G, K, *filter_size, C]: the gradient of conv_fwd's weight, from x
    [N, *spatial, G, C] and dy [N, *out_spatial, G, K]."""
    x64, dy64 = np.asarray(x, dtype=np.float64), np.asarray(dy, dtype=np.float64)
    dims = x64.ndim - 3
    geometry = _Geometry(x64.shape[1:1 + dims], filter_size, stride, padding, dilation)
    groups, channels = x64.shape[-2:]
    if dy64.shape[1:1 + dims] != geometry.out or dy64.shape[-2] != groups:
        raise ValueError(f"dy {dy64.shape} is [N, *{geometry.out}, {groups}, K] for x "
                         f"{x64.shape}")  # fmt: skip
    dw = np.zeros((groups, dy64.shape[-1], *geometry.filter, channels))
    axes = "pqr"[:dims]  # spatial subscripts, apart from n, g, k and c
    for tap, rows, valid in geometry.taps():
        patch = _gather(x64, rows) * _mask(valid)[..., None, None]
        dw[(slice(None), slice(None), *tap)] = np.einsum(
            f"n{axes}gk,n{axes}gc->gkc", dy64, patch)
    return dw
