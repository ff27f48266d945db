"""Grouped-convolution cases for the GPU tests of every pass: hand-picked layers and a seeded
random draw of shapes, the layouts arrays come in, fresh inputs, and the float64 check.

Shapes come from a hand-picked list (the layers of ResNeXt, ConvNeXt, MobileNet and video
models, first layers with 3 input channels, reductions of several thousand products) and a
seeded random draw over groups (1, 2, 4, 32, depthwise), channels per group (1 to 256, output
channels not multiples of 8 among them), strides 1 to 3, paddings 0 to 3 and dilations 1 and
2 per dim, filters 1x1 to 7x7, 1x7 and 3x3x3, odd spatial sizes and batches 1 to 8. The shapes
are the same every run; the values are fresh (the seed is in every failure message).

Error bound, per output element: |got - ref| <= u * |ref| + 2^-14 * S, S = the same pass
applied to the inputs' absolute values (the sum of |a| * |b| over the element's reduction).
The fp16/bf16 products are exact in fp32; the fp32 sum of n of them is off by at most
n * 2^-24 * S, and by about sqrt(n) * 2^-24 * S for products of random sign, which 2^-14 * S
covers with a wide margin at the largest n here; the result is rounded once to the output
type, which adds at most u * |ref| (u = 2^-8 for bf16, 2^-11 for fp16), or half the spacing of
subnormals where the result is one (2^-25 in fp16). Where S = 0 (every tap reads padding) the
result must be 0 up to that spacing.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckfmha.conv_problem import ConvProblem

UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
# Half the spacing of the dtype's subnormals: below the smallest normal (2^-14 in fp16) the
# rounding error is absolute, not relative (bf16's subnormals lie far below any value here).
SUBNORMAL_HALF_SPACING = {"fp16": 2.0**-25, "bf16": 2.0**-134}
ACCUMULATION = 2.0**-14
# Reference work per case, in multiply-adds: keeps the float64 reference to a fraction of a
# second.
MAX_REFERENCE_MACS = 4e7


@dataclass(frozen=True)
class Case:
    dtype: str
    batch: int
    input: tuple[int, ...]
    groups: int
    c: int
    k: int
    filter: tuple[int, ...]
    stride: tuple[int, ...] | int = 1
    padding: tuple[int, ...] | int = 0
    dilation: tuple[int, ...] | int = 1
    # "dense", "slice" (x and out cut from larger tensors), "offset" (x at a channel offset
    # that misaligns the pointer and the position stride) or "channels_last" (a torch
    # channels_last tensor viewed as [N, *spatial, G, C]).
    layout: str = "dense"

    @property
    def problem(self) -> ConvProblem:
        return ConvProblem(self.batch, self.input, self.groups, self.c, self.k, self.filter,
                           self.stride, self.padding, self.dilation, self.dtype)  # fmt: skip

    @property
    def macs(self) -> float:
        return self.problem.flops() / 2

    @property
    def label(self) -> str:
        dims = "x".join(map(str, self.input))
        taps = "x".join(map(str, self.filter))
        return (f"{self.dtype}-n{self.batch}-{dims}-g{self.groups}c{self.c}k{self.k}-f{taps}"
                f"-s{self.stride}-p{self.padding}-d{self.dilation}-{self.layout}")  # fmt: skip


CASES = [
    # ResNeXt-50 32x4d grouped 3x3 layers, stage by stage.
    Case("bf16", 2, (56, 56), 32, 4, 4, (3, 3), 1, 1),
    Case("bf16", 2, (28, 28), 32, 8, 8, (3, 3), 2, 1),
    Case("bf16", 2, (14, 14), 32, 16, 16, (3, 3), 1, 1, layout="channels_last"),
    Case("bf16", 2, (7, 7), 32, 32, 32, (3, 3), 1, 1),
    # ConvNeXt and MobileNet depthwise layers.
    Case("bf16", 2, (14, 14), 96, 1, 1, (7, 7), 1, 3),
    Case("bf16", 1, (33, 17), 24, 1, 1, (3, 3), 2, 1, layout="channels_last"),
    Case("fp16", 2, (13, 13), 32, 1, 1, (5, 5), 1, 2),
    # First layers: three input channels, strided 7x7.
    Case("bf16", 2, (33, 17), 1, 3, 16, (7, 7), 2, 3),
    Case("fp16", 1, (56, 56), 1, 3, 24, (7, 7), 2, 3),
    # Dense layers: pointwise, 3x3, separable 1x7 / 7x1, output channels not multiples of 8.
    Case("fp16", 4, (7, 7), 1, 256, 40, (1, 1)),
    Case("bf16", 1, (14, 14), 1, 64, 64, (3, 3), 1, 1, layout="slice"),
    Case("bf16", 3, (13, 13), 4, 8, 12, (1, 7), 1, (0, 3)),
    Case("bf16", 2, (17, 9), 2, 24, 72, (7, 1), (2, 1), (3, 0)),
    Case("fp16", 2, (12, 11), 2, 128, 24, (3, 3), (1, 2), (2, 1), (2, 1)),
    # Per-dim strides, paddings and dilations, and a filter that reads only padding somewhere.
    Case("bf16", 5, (13, 7), 2, 16, 16, (3, 5), (3, 2), (3, 0), (2, 1)),
    Case("bf16", 1, (2, 2), 1, 8, 8, (1, 1), 1, 3),
    # Reductions of several thousand products (taps * C = 4608, 6272, 6912).
    Case("bf16", 1, (14, 14), 1, 512, 72, (3, 3), 1, 1),
    Case("fp16", 1, (9, 9), 1, 128, 40, (7, 7), 1, 3),
    # 3D: video models' grouped 3x3x3, a temporal-only filter, depthwise, a long reduction.
    Case("bf16", 2, (5, 7, 9), 2, 16, 24, (3, 3, 3), (1, 2, 2), 1),
    Case("bf16", 1, (4, 13, 13), 8, 8, 8, (3, 3, 3), 1, 1, layout="channels_last"),
    Case("bf16", 2, (7, 5, 5), 1, 32, 12, (3, 1, 1), (2, 1, 1), (1, 0, 0), (2, 1, 1)),
    Case("bf16", 1, (6, 6, 6), 1, 256, 16, (3, 3, 3), 1, 1),
    Case("bf16", 2, (5, 6, 7), 16, 1, 1, (3, 3, 3), 1, 1, layout="slice"),
    # Pointers and position strides that 16 bytes do not divide.
    Case("bf16", 2, (9, 9), 2, 64, 64, (3, 3), 1, 1, layout="offset"),
    Case("fp16", 1, (7, 7), 4, 8, 16, (3, 3), 1, 1, layout="offset"),
    Case("bf16", 1, (4, 5, 6), 1, 16, 8, (3, 3, 3), 1, 1, layout="offset"),
    Case("bf16", 2, (9, 11), 4, 24, 24, (3, 3), 1, 1, layout="slice"),
]


def _draw_cases(count: int, seed: int = 2026_11_27) -> list[Case]:
    """Seeded random shapes: the same list every run, kept to what the reference checks fast."""
    rng = np.random.default_rng(seed)
    channels = (1, 3, 4, 8, 16, 24, 64, 72, 128, 256)
    outputs = (1, 3, 4, 8, 12, 16, 24, 40, 64, 72, 128, 256)
    filters = {2: ((1, 1), (3, 3), (5, 5), (7, 7), (1, 7), (7, 1), (3, 5)),
               3: ((1, 1, 1), (3, 3, 3), (1, 3, 3), (3, 1, 1))}  # fmt: skip
    sizes = {2: (1, 2, 5, 7, 13, 17, 33, 56), 3: (1, 3, 5, 8, 9)}
    cases: list[Case] = []
    while len(cases) < count:
        dims = 3 if rng.random() < 0.25 else 2
        depthwise = rng.random() < 0.15
        groups = int(rng.choice((8, 24, 96))) if depthwise else int(rng.choice((1, 2, 4, 32)))
        c = 1 if depthwise else int(rng.choice(channels))
        k = 1 if depthwise else int(rng.choice(outputs))
        taps = filters[dims][rng.integers(len(filters[dims]))]
        case = Case(
            dtype="fp16" if rng.random() < 0.3 else "bf16",
            batch=int(rng.integers(1, 9)),
            input=tuple(int(rng.choice(sizes[dims])) for _ in range(dims)),
            groups=groups, c=c, k=k, filter=taps,
            stride=tuple(int(rng.choice((1, 1, 2, 3))) for _ in range(dims)),
            padding=tuple(int(rng.integers(0, 4)) for _ in range(dims)),
            dilation=tuple(int(rng.choice((1, 1, 2))) for _ in range(dims)),
            layout=str(rng.choice(("dense", "dense", "slice", "offset", "channels_last"))),
        )  # fmt: skip
        if min(case.problem.output) >= 1 and case.macs <= MAX_REFERENCE_MACS:
            cases.append(case)
    return cases


DRAWN = _draw_cases(40)


# Depthwise problems the one-channel direct kernels run on their depthwise paths (eight groups
# a 16-byte load; the forward and backward-weight paths share their limits): partial runs of 4
# outputs along w, CTAs of 1 to 8 group vectors (8, 24, 96 and 136 groups), stride 1 and 2
# along w with 1- to 7-wide filters, strides and dilations along the other dims, outputs that
# read only padding, 3D, every layout that keeps 16-byte vectors.
DEPTHWISE_VECTOR_CASES = [
    Case("bf16", 2, (13, 19), 32, 1, 1, (3, 3), 1, 1),
    Case("fp16", 1, (17, 23), 96, 1, 1, (7, 7), 1, 3),
    Case("bf16", 3, (11, 21), 24, 1, 1, (3, 3), 2, 1, layout="channels_last"),
    Case("bf16", 2, (9, 30), 136, 1, 1, (5, 5), (1, 2), 2, (2, 1)),
    Case("fp16", 1, (6, 40), 64, 1, 1, (1, 7), (2, 1), (0, 3)),
    Case("bf16", 2, (8, 9), 8, 1, 1, (7, 1), 1, (3, 0), layout="slice"),
    Case("bf16", 1, (3, 5), 8, 1, 1, (3, 3), 1, 3),
    Case("bf16", 1, (56, 57), 96, 1, 1, (7, 7), 1, 3),
    Case("bf16", 1, (4, 7, 9), 16, 1, 1, (3, 3, 3), 1, 1),
    Case("fp16", 2, (5, 6, 11), 40, 1, 1, (3, 1, 5), (2, 1, 2), (1, 0, 2)),
    # Enough runs to fill the SMs: 3-wide ones of 4 outputs a thread (smaller problems run 2),
    # and a 7-wide one whose filter rows no thread shares (smaller problems of filters wider than
    # 3 split them).
    Case("bf16", 16, (56, 57), 64, 1, 1, (3, 3), 1, 1),
    Case("fp16", 32, (56, 57), 128, 1, 1, (3, 3), 2, 1, layout="channels_last"),
    Case("bf16", 32, (28, 30), 96, 1, 1, (7, 7), 1, 3),
]
# ... and ones it leaves to the one-lane-a-group path: misaligned pointers and strides, a
# filter 9 wide, stride 3 or dilation along w, a group count 8 does not divide.
DEPTHWISE_LANE_CASES = [
    Case("bf16", 2, (9, 9), 32, 1, 1, (3, 3), 1, 1, layout="offset"),
    Case("bf16", 1, (10, 20), 32, 1, 1, (3, 9), 1, (1, 4)),
    Case("fp16", 1, (12, 14), 16, 1, 1, (3, 3), (1, 3), 1),
    Case("bf16", 1, (12, 14), 16, 1, 1, (3, 3), 1, 2, (1, 2)),
    Case("bf16", 2, (9, 9), 12, 1, 1, (3, 3), 1, 1),
]


# Groups of 2 and 4 channels (as many in as out) that the direct forward kernels run on their
# vector path (8 channels a 16-byte load: four groups of 2 or two of 4): partial runs along w,
# CTAs of 1 to 8 vectors (2, 3, 5, 9, 16 and 17 vectors), stride 1 and 2 along w with 1- to
# 7-wide filters, dilation along h, outputs that read only padding, 3D (27 taps of 4-channel
# groups), every layout that keeps 16-byte vectors.
VECTOR_FWD_CASES = [
    Case("bf16", 2, (13, 19), 32, 4, 4, (3, 3), 1, 1),
    Case("fp16", 1, (17, 23), 6, 4, 4, (7, 7), 1, 3),
    Case("bf16", 3, (11, 21), 12, 2, 2, (3, 3), 2, 1, layout="channels_last"),
    Case("bf16", 2, (9, 30), 36, 2, 2, (5, 5), (1, 2), 2, (2, 1)),
    Case("fp16", 1, (6, 40), 4, 4, 4, (1, 7), (2, 1), (0, 3)),
    Case("bf16", 2, (8, 9), 16, 4, 4, (7, 1), 1, (3, 0), layout="slice"),
    Case("bf16", 1, (3, 5), 32, 4, 4, (3, 3), 1, 3),
    Case("bf16", 2, (56, 56), 32, 4, 4, (3, 3), 1, 1, layout="channels_last"),
    Case("bf16", 1, (4, 7, 9), 16, 4, 4, (3, 3, 3), 1, 1),
    Case("fp16", 2, (5, 6, 11), 20, 2, 2, (3, 1, 5), (2, 1, 2), (1, 0, 2)),
    Case("bf16", 1, (5, 13, 13), 34, 4, 4, (3, 3, 3), 1, 1, layout="slice"),
    # Larger maps: many CTAs of full runs, filter rows not split between threads.
    Case("bf16", 8, (56, 56), 32, 4, 4, (3, 3), 1, 1),
    Case("bf16", 24, (56, 57), 64, 2, 2, (3, 3), 2, 1),
]
# ... and ones they leave to the lane path: misaligned pointers and strides, an odd number of
# four-channel groups, two-channel groups in a number 4 does not divide, more input than output
# channels, a filter 9 wide, stride 3 or dilation along w.
VECTOR_FWD_LANE_CASES = [
    Case("bf16", 2, (9, 9), 32, 4, 4, (3, 3), 1, 1, layout="offset"),
    Case("bf16", 1, (10, 20), 5, 4, 4, (3, 3), 1, 1),
    Case("fp16", 1, (10, 20), 6, 2, 2, (3, 3), 1, 1),
    Case("bf16", 1, (10, 20), 8, 4, 2, (3, 3), 1, 1),
    Case("fp16", 1, (10, 20), 8, 4, 4, (3, 9), 1, (1, 4)),
    Case("bf16", 1, (12, 14), 8, 2, 2, (3, 3), (1, 3), 1),
    Case("bf16", 1, (12, 14), 8, 4, 4, (3, 3), 1, 2, (1, 2)),
]
# Few output tiles of long reductions: the TMA forward shares each tile's k-tiles between the
# CTAs of a cluster (2 to 8; unequal runs where the count does not divide them), in the forward
# and in backward-data's phases: partial channel tiles, rows past the batch, stride, dilation,
# 3D, sliced and channels_last inputs.
SPLIT_TMA_CASES = [
    Case("bf16", 1, (7, 7), 1, 512, 512, (3, 3), 1, 1),
    Case("fp16", 1, (9, 11), 1, 192, 200, (3, 3), 1, 1),
    Case("bf16", 2, (12, 10), 1, 256, 136, (3, 3), 2, 1, layout="channels_last"),
    Case("bf16", 1, (13, 9), 2, 128, 64, (3, 5), 1, (2, 4), (2, 2), layout="slice"),
    Case("bf16", 1, (3, 5, 6), 2, 128, 72, (3, 3, 3), 1, 1),
    Case("fp16", 1, (4, 6, 5), 1, 64, 96, (3, 3, 3), (1, 2, 1), 1),
]

# Backward-weight layers of few tiles whose TMA kernel (sm_90a), forced to 2-8 splits, sums each
# tile's splits in one cluster: the ranks push their partial tiles into bands of rows held by each
# rank's operand stages (the rules' own plans take the workspace, NOTES 128). A batch-1 dense
# layer, 200 output channels (the last 64-row tile holds 8), groups of 16 channels multiplied 4 at
# a time (the packed store), 3D, a channels_last and a sliced input (dy and x then in im2col
# mode), stride 2.
TMA_WEIGHT_CLUSTER_CASES = [
    Case("bf16", 1, (28, 28), 1, 128, 128, (3, 3), 1, 1),
    Case("fp16", 1, (20, 18), 1, 64, 200, (3, 3), 1, 1, layout="channels_last"),
    Case("bf16", 4, (16, 16), 8, 16, 16, (3, 3), 1, 1),
    Case("bf16", 1, (6, 10, 9), 1, 64, 64, (3, 3, 3), 1, 1),
    Case("bf16", 4, (41, 39), 1, 64, 128, (3, 3), 2, 1, layout="slice"),
]

# Groups of 2, 4 and 8 channels (as many in as out) that the direct backward-weight kernels run
# on their vector path (a thread loads 4 channels, 8 bytes: two groups of 2 or one of 4; or a
# group of 8, 16 bytes): partial runs along w, CTAs of 1 to 8 vectors (3, 6, 18, 32 vectors),
# stride 1 and 2 along w with 1- to 7-wide filters (up to three column blocks of 4-channel
# groups, seven one-column tasks of 8-channel ones), dilation along h, outputs that read only
# padding, long reductions, 3D, every layout that keeps whole vectors.
VECTOR_WEIGHT_CASES = [
    Case("bf16", 2, (13, 19), 32, 4, 4, (3, 3), 1, 1),
    Case("fp16", 1, (17, 23), 3, 4, 4, (7, 7), 1, 3),
    Case("bf16", 3, (11, 21), 12, 2, 2, (3, 3), 2, 1, layout="channels_last"),
    Case("bf16", 2, (9, 30), 36, 2, 2, (5, 5), (1, 2), 2, (2, 1)),
    Case("fp16", 1, (6, 40), 8, 4, 4, (1, 7), (2, 1), (0, 3)),
    Case("bf16", 2, (8, 9), 16, 4, 4, (7, 1), 1, (3, 0), layout="slice"),
    Case("bf16", 1, (3, 5), 32, 4, 4, (3, 3), 1, 3),
    Case("bf16", 8, (28, 28), 32, 4, 4, (3, 3), 1, 1),
    Case("bf16", 1, (4, 7, 9), 16, 4, 4, (3, 3, 3), 1, 1),
    Case("fp16", 2, (5, 6, 11), 10, 2, 2, (3, 1, 5), (2, 1, 2), (1, 0, 2)),
    # Groups of 8 over at least 4096 output positions (fewer run on the implicit GEMM).
    Case("bf16", 20, (13, 19), 16, 8, 8, (3, 3), 1, 1),
    Case("bf16", 24, (28, 28), 32, 8, 8, (3, 3), 2, 1, layout="channels_last"),
    Case("fp16", 64, (9, 30), 3, 8, 8, (5, 7), (1, 2), (2, 3), (2, 1)),
    Case("bf16", 20, (4, 7, 9), 8, 8, 8, (3, 3, 3), 1, 1, layout="slice"),
]
# ... and ones they leave to the lane path: misaligned pointers and strides, an odd number of
# two-channel groups, more input than output channels, three channels a group, a filter 9
# wide, stride 3 or dilation along w.
VECTOR_WEIGHT_LANE_CASES = [
    Case("bf16", 2, (9, 9), 32, 4, 4, (3, 3), 1, 1, layout="offset"),
    Case("bf16", 1, (10, 20), 5, 2, 2, (3, 3), 1, 1),
    Case("bf16", 1, (10, 20), 8, 4, 2, (3, 3), 1, 1),
    Case("bf16", 1, (9, 9), 8, 3, 3, (3, 3), 1, 1),
    Case("fp16", 1, (10, 20), 8, 4, 4, (3, 9), 1, (1, 4)),
    Case("bf16", 1, (12, 14), 8, 2, 2, (3, 3), (1, 3), 1),
    Case("bf16", 1, (12, 14), 8, 4, 4, (3, 3), 1, 2, (1, 2)),
]

# ---- inputs and the check ----


# Shapes whose automatic plans the learned selection decides (bf16; channel counts the
# oracle's kernels cover: multiples of 8, or 1 to 4 for the direct kernels): dense, grouped
# and depthwise, stride 2 (four backward-data phases), 3D, held-out channel counts (40) and
# group counts (48), and long reductions over positions (split counts).
LEARNED = [
    Case("bf16", 4, (28, 28), 1, 64, 40, (3, 3), 1, 1),
    Case("bf16", 2, (17, 23), 4, 32, 32, (3, 3), 2, 1),
    Case("bf16", 16, (14, 14), 1, 40, 16, (1, 1)),
    Case("bf16", 8, (45, 45), 48, 1, 1, (3, 3), 1, 1),
    Case("bf16", 2, (31, 31), 64, 4, 4, (3, 3), 2, 1),
    Case("bf16", 32, (7, 7), 1, 24, 24, (3, 3), 1, 2, 2),
    Case("bf16", 2, (4, 13, 13), 2, 16, 24, (3, 3, 3), 1, 1),
    Case("bf16", 1, (63, 63), 1, 8, 192, (5, 5), 2, 2),
]


def torch_dtype(name: str) -> Any:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def f64(t: Any) -> np.ndarray:
    import torch

    return t.detach().to("cpu", torch.float64).numpy()


class Inputs:
    """Fresh random tensors; the seed names the draw in failure messages."""

    def __init__(self) -> None:
        import torch

        self.seed = secrets.randbits(62)
        self.generator = torch.Generator().manual_seed(self.seed)

    def normal(self, shape: tuple[int, ...], dtype: str) -> Any:
        import torch

        t = torch.randn(shape, generator=self.generator, dtype=torch.float32)
        return t.to("cuda", torch_dtype(dtype))


def make_positions(layout: str, shape: tuple[int, ...], dtype: str, inputs: Inputs) -> Any:
    """An array of positions, groups and channels ([N, *spatial, G, C]) in `layout`, filled
    with fresh values: "dense"; "slice" (cut from a larger tensor: batch and spatial strides
    free); "offset" (at a channel offset that misaligns the pointer and the position stride);
    "channels_last" (a torch channels_last tensor viewed as [N, *spatial, G, C])."""
    import torch

    n, *spatial, g, c = shape
    if layout == "channels_last":
        nchw = inputs.normal((n, g * c, *spatial), dtype)
        fmt = torch.channels_last if len(spatial) == 2 else torch.channels_last_3d
        nchw = nchw.contiguous(memory_format=fmt)
        order = (0, *range(2, 2 + len(spatial)), 1)
        x = nchw.permute(order).unflatten(-1, (g, c))
        assert x.data_ptr() == nchw.data_ptr()  # a view, no copy
        return x
    if layout == "slice":
        big = inputs.normal((n + 1, *(s + 3 for s in spatial), g * c), dtype)
        index = (slice(1, None), *(slice(2, 2 + s) for s in spatial))
        return big[index].unflatten(-1, (g, c))
    if layout == "offset":
        big = inputs.normal((n, *spatial, g * c + 5), dtype)
        return big[..., 3 : 3 + g * c].unflatten(-1, (g, c))
    return inputs.normal(tuple(shape), dtype)


def make_x(case: Case, inputs: Inputs) -> Any:
    """x [N, *spatial, G, C] in the case's layout, filled with fresh values."""
    return make_positions(case.layout, case.problem.x_shape, case.dtype, inputs)


def make_poisoned(layout: str, shape: tuple[int, ...], dtype: str) -> tuple[Any, Any]:
    """(an output of positions, groups and channels filled with NaN, the tensor it lives in):
    cut from a larger one for the "slice" layout. `inside(whole)` marks where it lies."""
    import torch

    torch_type = torch_dtype(dtype)
    if layout != "slice":
        out = torch.full(shape, float("nan"), dtype=torch_type, device="cuda")
        return out, out
    n, *spatial, g, k = shape
    big = torch.full((n + 1, *(s + 2 for s in spatial), g * k + 8), float("nan"),
                     dtype=torch_type, device="cuda")  # fmt: skip
    return big[slice_of(shape)].unflatten(-1, (g, k)), big


def slice_of(shape: tuple[int, ...]) -> tuple[slice, ...]:
    """Where make_poisoned's "slice" output lies in the tensor it is cut from."""
    n, *spatial, g, k = shape
    return (slice(0, n), *(slice(1, 1 + s) for s in spatial), slice(8, 8 + g * k))


def make_out(case: Case) -> tuple[Any, Any]:
    """(y poisoned with NaN, the tensor it lives in): cut from a larger one for "slice"."""
    return make_poisoned(case.layout, case.problem.y_shape, case.dtype)


def assert_outside_untouched(whole: Any, out: Any, shape: tuple[int, ...], what: str) -> None:
    """Around a cut-out output every other element of its tensor is still NaN."""
    import torch

    if whole is out:
        return
    outside = torch.ones_like(whole, dtype=torch.bool)
    outside[slice_of(shape)] = False
    assert whole[outside].isnan().all(), f"{what}: wrote outside out"


def assert_within(got: np.ndarray, ref: np.ndarray, magnitude: np.ndarray, dtype: str,
                  what: str) -> None:  # fmt: skip
    """|got - ref| <= u |ref| + 2^-14 magnitude everywhere (the module's bound), no NaN."""
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, reference {ref.shape}"
    assert not np.isnan(got).any(), f"{what}: NaN left in the output (unwritten positions)"
    bound = (UNIT_ROUNDOFF[dtype] * np.abs(ref) + ACCUMULATION * magnitude
             + SUBNORMAL_HALF_SPACING[dtype])  # fmt: skip
    error = np.abs(got - ref)
    excess = error - bound
    worst = np.unravel_index(int(np.argmax(excess)), excess.shape)
    assert excess[worst] <= 0, (
        f"{what}: |got - ref| = {error[worst]:.4g} at {tuple(map(int, worst))} (got "
        f"{got[worst]:.6g}, ref {ref[worst]:.6g}, bound {bound[worst]:.4g}); max error "
        f"{error.max():.4g}"
    )
