"""The convolution problems the selection oracle times (conv_oracle.py): layers drawn at random
around the shapes of real models, and which of them training keeps out.

A draw picks a layer kind (dense, grouped, narrow groups of 2-4 channels, depthwise), 2D or
3D, the filter, stride, dilation and padding, the spatial size (model sizes and odd ones) and a
batch, so that the problem's tensors stay under MAX_ELEMENTS and its work over MIN_FLOP. Channel
counts per group are multiples of 8 (the kernels' widest vector) or 1, 2, 4 (the direct
kernels' groups): the oracle's build holds those kernels only.

Held out (held_out): every problem with a per-group channel count of 40, 48 groups, or a spatial
size of 45 (about a third of the draws). The learned selection trains on the
rest and is rated on these shapes it never saw.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any

DIRECTIONS = ("fwd", "bwd_data", "bwd_weight")
HELD_CHANNELS = frozenset({40})
HELD_GROUPS = frozenset({48})
HELD_SIZES = frozenset({45})
# Tensors of at most this many elements (bf16: 256 MB) and at least this much work.
MAX_ELEMENTS = 1 << 27
MIN_FLOP = 1e7

_WIDE = (8, 16, 24, 32, 40, 48, 64, 96, 128, 160, 192, 256, 384, 512)
_GROUPED = (8, 16, 24, 32, 40, 64, 96, 128)
_SIZES_2D = (7, 13, 14, 17, 27, 28, 31, 45, 56, 63, 100, 112, 41, 48)
_SIZES_3D = (7, 14, 16, 28, 31, 45)
_BATCHES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class ConvCase:
    spatial_dims: int
    batch: int
    groups: int
    in_channels: int  # per group
    out_channels: int  # per group
    input: tuple[int, ...]
    filter: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    layer: str  # the kind drawn: dense, grouped, narrow, depthwise

    @property
    def output(self) -> tuple[int, ...]:
        return tuple((i + 2 * p - d * (f - 1) - 1) // s + 1 for i, f, s, p, d in
                     zip(self.input, self.filter, self.stride, self.padding, self.dilation))  # fmt: skip

    @property
    def flop(self) -> float:
        """2 x output positions x G x K x C x taps: each pass's work."""
        return (2.0 * self.batch * math.prod(self.output) * self.groups * self.out_channels
                * self.in_channels * math.prod(self.filter))  # fmt: skip

    @property
    def label(self) -> str:
        dims = lambda v: "x".join(map(str, v))
        return (f"{self.layer} {self.spatial_dims}d n{self.batch} {dims(self.input)} "
                f"g{self.groups} c{self.in_channels} k{self.out_channels} f{dims(self.filter)} "
                f"s{dims(self.stride)} p{dims(self.padding)} d{dims(self.dilation)}")  # fmt: skip

    def record(self) -> dict[str, Any]:
        """The CSV columns of the problem (tuples joined by 'x')."""
        return {k: "x".join(map(str, v)) if isinstance(v, tuple) else v
                for k, v in asdict(self).items()} | {"output": "x".join(map(str, self.output))}  # fmt: skip


def held_out(case: ConvCase) -> bool:
    return (case.in_channels in HELD_CHANNELS or case.out_channels in HELD_CHANNELS
            or case.groups in HELD_GROUPS or any(s in HELD_SIZES for s in case.input))  # fmt: skip


def _channels(rng: random.Random, layer: str) -> tuple[int, int, int]:
    """(groups, C, K) of a layer kind."""
    if layer == "dense":
        return 1, rng.choice(_WIDE), rng.choice(_WIDE)
    if layer == "grouped":
        c = rng.choice(_GROUPED)
        k = c if rng.random() < 0.7 else rng.choice(_GROUPED)
        return rng.choice((2, 4, 8, 16, 32, 48, 64)), c, k
    if layer == "narrow":
        c = rng.choice((2, 4))
        return rng.choice((16, 32, 48, 64, 96, 128, 192, 256)), c, c
    return rng.choice((32, 48, 64, 96, 128, 144, 192, 256, 384, 576, 768, 960)), 1, 1


def _draw_one(rng: random.Random) -> ConvCase:
    layer = rng.choices(("dense", "grouped", "narrow", "depthwise"), (3, 3, 1, 3))[0]
    dims = 3 if rng.random() < 0.2 else 2
    groups, c, k = _channels(rng, layer)
    if dims == 2:
        f = rng.choice((3, 3, 5, 7) if layer == "depthwise" else (1, 1, 3, 3, 3, 5))
        filt = (f, f)
        size = rng.choice(_SIZES_2D)
        spatial = (size, size if rng.random() < 0.8 else rng.choice(_SIZES_2D))
    else:
        filt = rng.choice(((3, 3, 3), (1, 1, 1), (1, 3, 3), (3, 1, 1)))
        size = rng.choice(_SIZES_3D)
        spatial = (rng.choice((4, 8, 16)), size, size)
    stride = 2 if rng.random() < 0.25 and max(filt) > 1 or rng.random() < 0.05 else 1
    dilation = 2 if rng.random() < 0.1 and max(filt) > 1 else 1
    strides = tuple(stride if f > 1 or dims == 2 else 1 for f in filt)
    dilations = tuple(dilation if f > 1 else 1 for f in filt)
    same = rng.random() < 0.85
    padding = tuple(d * (f - 1) // 2 if same else 0 for f, d in zip(filt, dilations))
    spatial = tuple(max(s, d * (f - 1) + 1) for s, f, d in zip(spatial, filt, dilations))
    case = ConvCase(dims, 1, groups, c, k, spatial, filt, strides, padding, dilations, layer)
    elements = max(math.prod(spatial) * groups * c, math.prod(case.output) * groups * k)
    batches = [b for b in _BATCHES if b * elements <= MAX_ELEMENTS]
    batch = rng.choice(batches or [1])
    return ConvCase(dims, batch, groups, c, k, spatial, filt, strides, padding, dilations, layer)


def draw(count: int, seed: int = 0) -> list[ConvCase]:
    """`count` problems, the same for the same seed (too little work: drawn again)."""
    rng = random.Random(seed)
    cases: list[ConvCase] = []
    while len(cases) < count:
        case = _draw_one(rng)
        if case.flop >= MIN_FLOP and all(o >= 1 for o in case.output):
            cases.append(case)
    return cases
