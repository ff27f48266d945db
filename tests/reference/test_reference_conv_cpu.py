"""The grouped-convolution reference (ckfmha.reference_conv) against torch's float64
convolution and its autograd on the CPU: forward, backward-data and backward-weight, 2D and 3D,
groups from 1 to depthwise, strides, paddings and dilations, channels-last layouts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ckfmha import reference_conv as conv

torch = pytest.importorskip("torch")

# (N, spatial, G, C, K, filter, stride, padding, dilation)
CASES = [
    (2, (9, 11), 1, 5, 7, (3, 3), 1, 1, 1),        # plain
    (2, (14, 14), 4, 3, 2, (3, 3), 2, 1, 1),       # ResNeXt-like grouped, strided
    (1, (13, 10), 6, 1, 1, (7, 7), 1, 3, 1),       # depthwise 7x7
    (3, (8, 9), 3, 4, 5, (3, 2), (2, 1), (0, 1), (2, 1)),  # per-dim stride, pad, dilation
    (2, (6, 7), 2, 8, 4, (1, 1), 1, 0, 1),         # pointwise
    (1, (5, 6, 7), 2, 3, 4, (3, 3, 3), 1, 1, 1),   # 3D grouped
    (2, (7, 6, 5), 4, 1, 1, (3, 1, 3), (1, 2, 2), (1, 0, 1), (1, 1, 2)),  # 3D depthwise mixed
]  # fmt: skip


def _torch_layouts(x: np.ndarray, w: np.ndarray) -> tuple:
    """NCHW-style tensors (channel index g*C + c) from channels-last grouped ones."""
    dims = x.ndim - 3
    n, groups, channels = x.shape[0], x.shape[-2], x.shape[-1]
    xt = torch.from_numpy(np.moveaxis(x.reshape(n, *x.shape[1:1 + dims], groups * channels),
                                      -1, 1).copy())  # fmt: skip
    k = w.shape[1]
    wt = torch.from_numpy(np.moveaxis(w, -1, 2).reshape(groups * k, channels,
                                                        *w.shape[2:2 + dims]).copy())  # fmt: skip
    return xt, wt


def _channels_last(t: Any, groups: int) -> np.ndarray:
    """[N, G*K, *spatial] -> [N, *spatial, G, K]."""
    a = np.moveaxis(t.detach().numpy(), 1, -1)
    return a.reshape(*a.shape[:-1], groups, a.shape[-1] // groups)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{len(c[1])}d-g{c[2]}c{c[3]}k{c[4]}")
def test_all_three_directions_match_torch(case: tuple) -> None:
    n, spatial, groups, channels, k, filt, stride, padding, dilation = case
    rng = np.random.default_rng(sum(spatial) + groups)
    x = rng.standard_normal((n, *spatial, groups, channels))
    w = rng.standard_normal((groups, k, *filt, channels))
    xt, wt = _torch_layouts(x, w)
    xt.requires_grad_(True)
    wt.requires_grad_(True)
    fn = torch.nn.functional.conv2d if len(spatial) == 2 else torch.nn.functional.conv3d
    yt = fn(xt, wt, stride=stride, padding=padding, dilation=dilation, groups=groups)
    y = conv.conv_fwd(x, w, stride, padding, dilation)
    np.testing.assert_allclose(y, _channels_last(yt, groups), rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    dyt = torch.from_numpy(np.moveaxis(dy.reshape(*dy.shape[:-2], groups * k), -1, 1).copy())
    yt.backward(dyt)
    dx = conv.conv_bwd_data(dy, w, spatial, stride, padding, dilation)
    np.testing.assert_allclose(dx, _channels_last(xt.grad, groups), rtol=1e-12, atol=1e-12)
    dw = conv.conv_bwd_weight(x, dy, filt, stride, padding, dilation)
    dwt = np.moveaxis(wt.grad.numpy().reshape(groups, k, channels, *filt), 2, -1)
    np.testing.assert_allclose(dw, dwt, rtol=1e-12, atol=1e-12)


def test_output_size_follows_the_dilated_filter() -> None:
    assert conv.output_size(56, 3, 1, 1, 1) == 56
    assert conv.output_size(56, 3, 2, 1, 1) == 28
    assert conv.output_size(10, 3, 1, 0, 2) == 6  # span 5


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"stride": 0}, r"stride is 0; accepted: an integer >= 1"),
    ({"padding": (1, 1, 1)}, r"padding is \(1, 1, 1\); accepted: .* 2 of them"),
    ({"dilation": 9}, r"does not fit the padded input"),
])  # fmt: skip
def test_bad_geometry_is_named(kwargs: dict, message: str) -> None:
    x, w = np.ones((1, 6, 6, 1, 2)), np.ones((1, 3, 3, 3, 2))
    with pytest.raises(ValueError, match=message):
        conv.conv_fwd(x, w, **kwargs)


def test_mismatched_groups_or_channels_are_named() -> None:
    with pytest.raises(ValueError, match=r"w \(2, 3, 3, 3, 2\) is \[G, K, \*filter, C\] with G=1"):
        conv.conv_fwd(np.ones((1, 6, 6, 1, 2)), np.ones((2, 3, 3, 3, 2)))
