"""Named kernel sets ("receipts"): which signatures to build and which tiles to use."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .pairwise import all_pairs
from .signature import (
    BATCH_PREFILL,
    BWD_CONVERT_DQ,
    BWD_DOT_DO_O,
    BWD_DQ_DK_DV,
    CONV_BWD_WEIGHT,
    CONV_FWD,
    CONV_SPATIAL_DIMS,
    CONV_VECTORS,
    FWD_PAGEDKV,
    PAGE_LAYOUTS,
    PAGED_FAMILIES,
    ROPE_MODES,
    AppendKvSignature,
    BwdSignature,
    ConvSignature,
    FwdSignature,
    Signature,
)

DTYPES = ("fp16", "bf16")
# (hdim_q, hdim_v) pairs every default set builds.
HDIMS = ((32, 32), (64, 64), (96, 96), (128, 128), (192, 128), (256, 256))
MASKS = ("none", "causal", "window")
# Feature combinations are covered pairwise for these head dims.
FEATURE_HDIMS = ((64, 64), (128, 128))
FEATURE_FACTORS = {
    "mode": ("batch", "group"),
    "mask": MASKS,
    "bias": ("none", "elementwise", "alibi"),
    "dropout": (False, True),
    "softcap": (False, True),
    "sink": (False, True),
}


@dataclass(frozen=True)
class ConvTile:
    """A tile of a grouped-convolution template. Forward implicit GEMM (sm80_cpasync_mma,
    sm90_cpasync_wgmma): tile_m output positions x tile_n output channels per CTA, tile_k
    reduction elements (filter taps x input channels) per shared-memory stage. Direct
    (conv_direct, either family): tile_m output positions a thread takes along w (Run),
    tile_n = 32 groups per CTA, tile_k = the group's channel bucket, one output row per warp,
    stages = 1. Weight gradient (conv_bwd_weight, sm80_cpasync_mma and sm90_cpasync_wgmma):
    tile_m output channels x tile_n filter taps x input channels of dw per CTA, tile_k batch x
    output positions per stage. The forward fed by the copy engine (sm90_tma_wgmma) has the
    gathering forward's tile meanings, with a producer warpgroup beside the consumers (12 warps:
    two consumer warpgroups) and tile_k channels of one filter tap per stage.
    Convolutions have no head dim to key a tile table in arch_specs.json by, so the kernel sets
    list their tiles here.

    A tile applies to the signatures of its `family` only (the two families share a pipeline
    but not a template), of its channel bucket only (`max_channels`: 0 for the implicit-GEMM
    tiles, which take any channel count; 1, 2, 4 or 8 for a forward direct tile, 1 or 2 for a
    weight-gradient one) and, when `spatial_dims` is set, of those dims only, so that
    enumeration pairs each direct signature with exactly its own tile and never a direct tile
    with an implicit-GEMM signature."""

    tile_m: int
    tile_n: int
    tile_k: int
    warps: int
    stages: int
    pipeline: str = "sm80_cpasync_mma"
    max_channels: int = 0
    spatial_dims: int = 0  # 0: 2D and 3D
    family: str = CONV_FWD

    def applies_to(self, signature: Signature) -> bool:
        dims = getattr(signature, "spatial_dims", 0)
        bucket = getattr(signature, "max_channels", 0)
        return (
            signature.family == self.family
            and bucket == self.max_channels
            and self.spatial_dims in (0, dims)
        )


# The dispatcher picks a conv kernel's tile per problem (conv_plan.cpp models each tile's
# waves and padding), so every tile of a set is built, not a default and alternatives: the
# square tile for wide layers, narrower ones for few output channels per group (down to 16
# for depthwise-like groups) and a small one for few output positions.
# On sm_90a (wgmma) the square tile comes twice: three stages with two CTAs an SM for grids
# of many CTAs, six stages and one CTA for long reductions over few CTAs.
SM90_CONV = "sm90_cpasync_wgmma"
DIRECT_CONV = "conv_direct"
TMA_CONV = "sm90_tma_wgmma"


def _tma_tile(tile_m: int, tile_n: int, tile_k: int, stages: int, warps: int = 12) -> ConvTile:
    """A tile of the forward fed by the copy engine: a producer warpgroup and two consumer
    warpgroups (warps=12) or one (warps=8); 8-channel signatures only meet its template
    (rules.pipelines_for_signature)."""
    return ConvTile(tile_m, tile_n, tile_k, warps, stages, TMA_CONV)


# The TMA forward's tiles: 128 x 128 and 128 x 64 of 64 channels a tap with near 192 KiB of
# stages (one persistent CTA an SM), the two that won most of the suite's dense layers when
# every tile was forced (H100, NOTES 112); default adds 64 x 128 on one consumer warpgroup (two
# CTAs an SM), which won the layers of fewer tiles than SMs, 32 channels a tap for groups of 32
# (ResNeXt's last stage) and 256 x 128; full adds 128 x 256, which won none. (128 x 64 with
# three stages, two CTAs an SM, lost to eight stages on all but one layer.)
CONV_TMA_CORE_TILES = (_tma_tile(128, 128, 64, 6), _tma_tile(128, 64, 64, 8))
CONV_TMA_DEFAULT_TILES = (
    _tma_tile(64, 128, 64, 4, warps=8),
    _tma_tile(128, 128, 32, 8),
    _tma_tile(256, 128, 64, 4),
)
CONV_TMA_FULL_TILES = (_tma_tile(128, 256, 64, 4),)


def _weight_tma_tile(tile_m: int, tile_n: int, stages: int, warps: int) -> ConvTile:
    """A tile of the weight gradient fed by the copy engine: 64-position copies, a producer
    warpgroup and a consumer warpgroup for each 64 output channels (warps=8 or 12)."""
    return ConvTile(tile_m, tile_n, 64, warps, stages, TMA_CONV, family=CONV_BWD_WEIGHT)


# The weight gradient's TMA tiles: 64 x 128 with two CTAs an SM, the fastest on most of the
# suite's layers when every tile was forced (H200, NOTES 119), from core on (where a gathering
# kernel fits, first use compiles nothing, so an installed library would never run a TMA tile
# core lacks); default adds 128 x 128 with six stages, 64 x 192 (three filter taps of 64
# channels, two CTAs an SM: ResNet-18's 512-channel layer in one wave) and 128 x 256; full adds
# 64 x 256. Tiles of two consumer warpgroups hold an SM alone.
CONV_WEIGHT_TMA_CORE_TILES = (_weight_tma_tile(64, 128, 4, 8),)
CONV_WEIGHT_TMA_DEFAULT_TILES = (
    _weight_tma_tile(128, 128, 6, 12),
    _weight_tma_tile(64, 192, 3, 8),
    _weight_tma_tile(128, 256, 4, 12),
)
CONV_WEIGHT_TMA_FULL_TILES = (_weight_tma_tile(64, 256, 4, 8),)
# The direct kernel's one tile per (dims, channel bucket): 32 groups a CTA (a lane each), 2D
# with 8 warps (rows) and a run of 16 positions a thread (8 for 8 channels, keeping Run x
# channels at 64 fp32 accumulators), 3D with 4 warps and a run of 8: its input tile holds a
# plane per filter tap along d, and half the rows and half the run keep it near a 2D tile's
# shared memory (a 3x3x3 filter at stride 1: 3 x 6 x 10 input positions, as 10 x 18 in 2D).
# The sets build buckets 1, 2 and 4: groups of 8 channels ran faster on the implicit GEMM
# (H100: 16 against 6.5 TFLOP/s at ResNeXt's 28x28 layer, NOTES 107), so the dispatcher, which
# prefers a direct kernel that fits, must not find one for them.
DIRECT_BUCKETS = (1, 2, 4)
DIRECT_2D_RUNS = {1: 16, 2: 16, 4: 16, 8: 8}
DIRECT_3D_RUNS = {1: 8, 2: 8, 4: 8, 8: 8}
CONV_DIRECT_TILES = tuple(
    ConvTile(runs[c], 32, c, warps, 1, DIRECT_CONV, max_channels=c, spatial_dims=dims)
    for dims, runs, warps in ((2, DIRECT_2D_RUNS, 8), (3, DIRECT_3D_RUNS, 4))
    for c in DIRECT_BUCKETS
)
# The weight gradient's direct kernel, for groups of up to 8 channels (its implicit GEMM pads
# them to 64 x 64 tiles: ResNeXt's 4-channel groups ran at 0.15x cuDNN there, 0.41x direct on
# the lane path, 1.3x on the vector path): the forward's tile shapes, the run shortened where
# its dy (Run x channels) would not fit 32 registers a thread. Groups of 8 ran slower on the
# lane path than on the implicit GEMM (ResNeXt 28x28: 2.2 against 6.4 TFLOP/s, NOTES 108), so
# the dispatcher gives the 8-channel kernel only problems its vector path runs (NOTES 116).
BWD_WEIGHT_DIRECT_BUCKETS = (1, 2, 4, 8)
BWD_WEIGHT_DIRECT_2D_RUNS = {1: 16, 2: 16, 4: 8, 8: 4}
BWD_WEIGHT_DIRECT_3D_RUNS = {1: 8, 2: 8, 4: 8, 8: 4}
CONV_BWD_WEIGHT_DIRECT_TILES = tuple(
    ConvTile(runs[c], 32, c, warps, 1, DIRECT_CONV, c, spatial_dims=dims, family=CONV_BWD_WEIGHT)
    for dims, runs, warps in ((2, BWD_WEIGHT_DIRECT_2D_RUNS, 8), (3, BWD_WEIGHT_DIRECT_3D_RUNS, 4))
    for c in BWD_WEIGHT_DIRECT_BUCKETS
)


def _bwd_weight_tile(
    tile_m: int, tile_n: int, tile_k: int, warps: int, stages: int,
    pipeline: str = "sm80_cpasync_mma",
) -> ConvTile:  # fmt: skip
    """A tile of the weight gradient's implicit GEMM: mma.sync on every arch, or wgmma
    (SM90_CONV) on sm_90a."""
    return ConvTile(tile_m, tile_n, tile_k, warps, stages, pipeline, family=CONV_BWD_WEIGHT)


# The weight gradient's tiles, all built too (the dispatcher picks by shape): the square tile
# for wide groups, 64 output channels (tile_m) or 64 taps x input channels (tile_n) for narrow
# ones, 64 x 64 with a fourth stage for the narrowest; full adds a 64-position reduction step on
# 8 warps, whose 96 KiB of stages and 4 KiB of position table exceed the 99 KiB per block of
# sm_86 and sm_89. On sm_90a the wgmma template takes 64-position steps: 128 x 128 on two
# warpgroups with three stages (two CTAs an SM), 64 output channels on one warpgroup for
# narrow groups, and 128 x 256 (one CTA an SM, half the x gathers per product of the square
# tile) for dense layers.
CONV_CORE_TILES = (
    ConvTile(128, 128, 32, 4, 3),
    ConvTile(128, 128, 64, 8, 3, SM90_CONV),
    *CONV_TMA_CORE_TILES,
    *CONV_DIRECT_TILES,
    _bwd_weight_tile(128, 128, 32, 4, 3),
    _bwd_weight_tile(128, 128, 64, 8, 3, SM90_CONV),
    *CONV_WEIGHT_TMA_CORE_TILES,
    *CONV_BWD_WEIGHT_DIRECT_TILES,
)
CONV_DEFAULT_TILES = CONV_CORE_TILES + (
    *CONV_TMA_DEFAULT_TILES,
    ConvTile(128, 64, 32, 4, 3),
    ConvTile(64, 32, 32, 4, 4),
    ConvTile(128, 16, 32, 4, 4),
    ConvTile(128, 128, 64, 8, 6, SM90_CONV),
    ConvTile(128, 64, 64, 4, 4, SM90_CONV),
    ConvTile(128, 32, 64, 4, 4, SM90_CONV),
    ConvTile(128, 16, 32, 4, 4, SM90_CONV),
    _bwd_weight_tile(64, 64, 32, 4, 4),
    _bwd_weight_tile(128, 64, 32, 4, 3),
    _bwd_weight_tile(64, 128, 32, 4, 3),
    _bwd_weight_tile(64, 128, 64, 4, 4, SM90_CONV),
    _bwd_weight_tile(64, 64, 64, 4, 4, SM90_CONV),
    _bwd_weight_tile(128, 256, 64, 8, 3, SM90_CONV),
    *CONV_WEIGHT_TMA_DEFAULT_TILES,
)
CONV_FULL_TILES = CONV_DEFAULT_TILES + (
    *CONV_TMA_FULL_TILES,
    ConvTile(256, 128, 32, 8, 3),
    ConvTile(128, 128, 64, 4, 3),
    ConvTile(128, 256, 64, 8, 4, SM90_CONV),
    ConvTile(256, 128, 64, 8, 4, SM90_CONV),
    _bwd_weight_tile(128, 128, 64, 8, 3),
    _bwd_weight_tile(64, 256, 64, 4, 3, SM90_CONV),
    _bwd_weight_tile(128, 128, 32, 8, 6, SM90_CONV),
    *CONV_WEIGHT_TMA_FULL_TILES,
)


@dataclass(frozen=True)
class Receipt:
    name: str
    description: str
    signatures: tuple[Signature, ...]
    # False: only each table's default (first) tile; True: every tile listed for the hdim.
    all_tiles: bool
    # True: a signature gets only its preferred template's kernels (enumerate.PIPELINE_PREFERENCE),
    # not also the slower templates the dispatcher would never pick for it.
    preferred_only: bool = False
    # The tiles each conv signature is built with (all of those that apply to it: the
    # dispatcher picks by shape); sets that list none of their own, as first use's, build the
    # default set's.
    conv_tiles: tuple[ConvTile, ...] = CONV_DEFAULT_TILES


def _fwd(
    dtype: str, hdims: tuple[int, int] | int, mask: str, lse: bool = True, **features: Any
) -> FwdSignature:
    hdim_q, hdim_v = (hdims, hdims) if isinstance(hdims, int) else hdims
    features.setdefault("mode", "batch")
    return FwdSignature(dtype=dtype, hdim_q=hdim_q, hdim_v=hdim_v, mask=mask, lse=lse, **features)


def _mask_signatures(lse_options: Iterable[bool]) -> tuple[FwdSignature, ...]:
    return tuple(
        _fwd(dtype, hdims, mask, lse)
        for dtype, hdims, mask, lse in itertools.product(DTYPES, HDIMS, MASKS, lse_options)
    )


def _group_signatures() -> tuple[FwdSignature, ...]:
    """Plain varlen kernels: the common serving case needs no feature beyond the mask."""
    return tuple(
        _fwd(dtype, hdims, mask, True, mode="group")
        for dtype, hdims, mask in itertools.product(DTYPES, FEATURE_HDIMS, MASKS)
    )


def _v_col_major_signatures() -> tuple[FwdSignature, ...]:
    """V stored keys-contiguous (a transposed KV cache), with and without a causal mask, for
    padded batches and packed varlen ones."""
    return tuple(
        _fwd(dtype, hdims, mask, True, mode=mode, v_col_major=True)
        for mode, dtype, hdims, mask in itertools.product(
            ("batch", "group"), DTYPES, FEATURE_HDIMS, ("none", "causal")
        )
    )


def _feature_signatures() -> tuple[FwdSignature, ...]:
    combos = [
        c
        for c in all_pairs(FEATURE_FACTORS)
        if c["mode"] != "batch" or c["bias"] != "none" or c["dropout"] or c["softcap"] or c["sink"]
    ]
    return tuple(
        _fwd(
            dtype,
            hdims,
            combo["mask"],
            True,
            mode=combo["mode"],
            bias=combo["bias"],
            dropout=combo["dropout"],
            softcap=combo["softcap"],
            sink=combo["sink"],
        )
        for dtype, hdims in itertools.product(DTYPES, FEATURE_HDIMS)
        for combo in combos
    )


# Split-KV (and its decode path) covers the serving head dims.
SPLITKV_HDIMS = (64, 128)


def _splitkv(dtype: str, hdim: int, mask: str, mode: str = "batch") -> FwdSignature:
    return _fwd(dtype, hdim, mask, True, mode=mode, family="fwd_splitkv")


def _combine(dtype: str, hdim: int, mode: str = "batch") -> FwdSignature:
    """Combine kernels merge partials only: keyed by dtype, mode and hdim_v."""
    return _fwd(dtype, hdim, "none", True, mode=mode, family="fwd_splitkv_combine")


def _splitkv_signatures() -> tuple[FwdSignature, ...]:
    """Both stages of the split-KV plan for every dtype, serving head dim, mask and mode."""
    splits = tuple(
        _splitkv(dtype, hdim, mask, mode)
        for dtype, hdim, mask, mode in itertools.product(
            DTYPES, SPLITKV_HDIMS, MASKS, ("batch", "group")
        )
    )
    combines = tuple(
        _combine(dtype, hdim, mode)
        for dtype, hdim, mode in itertools.product(DTYPES, SPLITKV_HDIMS, ("batch", "group"))
    )
    return splits + combines


def _paged(
    dtype: str, hdim: int, mask: str, family: str, page_layout: str = "linear"
) -> FwdSignature:
    """A paged split kernel: fwd_pagedkv takes batch-mode queries, batch_prefill group-mode."""
    mode = "group" if family == BATCH_PREFILL else "batch"
    return _fwd(dtype, hdim, mask, True, mode=mode, family=family, page_layout=page_layout)


def _paged_signatures() -> tuple[FwdSignature, ...]:
    """Both paged families for every dtype, serving head dim, mask and page layout; their
    combine stages are the split-KV ones (batch and group mode), built by _splitkv_signatures."""
    return tuple(
        _paged(dtype, hdim, mask, family, page_layout)
        for family, dtype, hdim, mask, page_layout in itertools.product(
            PAGED_FAMILIES, DTYPES, SPLITKV_HDIMS, MASKS, PAGE_LAYOUTS
        )
    )


def _fp8_kv(dtype: str, hdim: int, mask: str, family: str) -> FwdSignature:
    """A split-KV body reading fp8 (e4m3) K/V: contiguous (fwd_splitkv) or paged."""
    mode = "group" if family == BATCH_PREFILL else "batch"
    return _fwd(dtype, hdim, mask, True, mode=mode, family=family, kv_quant="e4m3")


def _fp8_kv_signatures() -> tuple[FwdSignature, ...]:
    """Decode over fp8 K/V caches, contiguous and paged, with no mask or causal, and batch
    prefill over fp8 pages, causal; sm_89 and later (the rules drop older archs). Window masks
    and contiguous group mode compile on first use."""
    decode = tuple(
        _fp8_kv(dtype, hdim, mask, family)
        for family, dtype, hdim, mask in itertools.product(
            ("fwd_splitkv", FWD_PAGEDKV), DTYPES, SPLITKV_HDIMS, ("none", "causal")
        )
    )
    prefill = tuple(
        _fp8_kv(dtype, hdim, "causal", BATCH_PREFILL)
        for dtype, hdim in itertools.product(DTYPES, SPLITKV_HDIMS)
    )
    return decode + prefill


# The Hopper fp8 forward's head dims (rules/sm90_fwd.py: SM90_FP8_HDIMS).
FP8_FORWARD_HDIMS = (64, 128, 256)


def _fp8_forward(
    dtype: str, hdim: int, mask: str, lse: bool = True, mode: str = "batch"
) -> FwdSignature:
    """The Hopper fp8 forward: Q, K and V in e4m3, O in dtype (sm_90a only: the rules drop the
    other archs and templates)."""
    return _fwd(dtype, hdim, mask, lse, mode=mode, q_quant="e4m3", kv_quant="e4m3")


def _fp8_forward_signatures(lse_options: Iterable[bool]) -> tuple[FwdSignature, ...]:
    """{fp16,bf16} x its head dims x {no mask, causal} x {batch, group}; window masks compile
    on first use."""
    return tuple(
        _fp8_forward(dtype, hdim, mask, lse, mode)
        for dtype, hdim, mask, mode, lse in itertools.product(
            DTYPES, FP8_FORWARD_HDIMS, ("none", "causal"), ("batch", "group"), lse_options
        )
    )


def _fp32_signatures(full: bool) -> tuple[FwdSignature, ...]:
    """fp32 runs on the SIMT template, far slower than the tensor-core kernels, so the default
    set holds the common head dims and a few feature combinations; `full` every head dim."""
    hdims = HDIMS if full else FEATURE_HDIMS
    lse_options = (True, False) if full else (True,)
    masks = tuple(
        _fwd("fp32", h, mask, lse)
        for h, mask, lse in itertools.product(hdims, MASKS, lse_options)
    )
    extras = (
        _fwd("fp32", 64, "causal", mode="group"),
        _fwd("fp32", 128, "causal", mode="group"),
        _fwd("fp32", 64, "none", bias="elementwise", softcap=True),
        _fwd("fp32", 128, "causal", dropout=True),
        _fwd("fp32", 128, "window", mode="group", bias="alibi", dropout=True, softcap=True,
             sink=True),
        _fwd("fp32", 64, "window", mode="group", bias="elementwise", dropout=True, sink=True),
    )
    if not full:
        extras += (_fwd("fp32", (192, 128), "none"), _fwd("fp32", 256, "window"))
    return masks + extras


def _bwd_plan(
    dtype: str, hdims: tuple[int, int] | int, mask: str, mode: str = "batch", **features: Any
) -> tuple[BwdSignature, ...]:
    """The three stages one backward problem runs: D = rowsum(dO * O) over hdim_v, the main
    stage, and the dQ conversion over hdim_q."""
    hdim_q, hdim_v = (hdims, hdims) if isinstance(hdims, int) else hdims
    return (
        BwdSignature(BWD_DOT_DO_O, dtype, mode, hdim_v, hdim_v),
        BwdSignature(BWD_DQ_DK_DV, dtype, mode, hdim_q, hdim_v, mask, **features),
        BwdSignature(BWD_CONVERT_DQ, dtype, mode, hdim_q, hdim_q),
    )


def _bwd_signatures() -> tuple[BwdSignature, ...]:
    """Backward plans: every mask in batch and group mode at every head dim (where a tile fits
    the arch)."""
    plans = [
        _bwd_plan(dtype, hdims, mask, mode)
        for dtype, hdims, mask, mode in itertools.product(
            DTYPES, HDIMS, MASKS, ("batch", "group")
        )
    ]
    # Features (recomputed logits and the forward's dropout stream) at d64/d128: each bias
    # kind, soft-cap and dropout, alone and together, over the masks and both modes.
    feature_combos = (
        ("causal", "batch", {"bias": "alibi"}),
        ("none", "batch", {"bias": "elementwise", "softcap": True}),
        ("window", "batch", {"dropout": True}),
        ("causal", "group", {"bias": "alibi", "dropout": True, "softcap": True}),
    )
    plans += [
        _bwd_plan(dtype, hdims, mask, mode, **features)
        for dtype, hdims, (mask, mode, features) in itertools.product(
            DTYPES, FEATURE_HDIMS, feature_combos
        )
    ]
    # Soft-capped logits at head dim 256, globally causal and in sliding windows (Gemma 2's
    # layers), on the Hopper template's head-split layout.
    plans += [
        _bwd_plan(dtype, 256, mask, softcap=True)
        for dtype, mask in itertools.product(DTYPES, ("causal", "window"))
    ]
    # Dropout on the Hopper template's head-split layout (d192x128; d256 has no shared memory
    # left for the random words), packed sequences.
    plans += [_bwd_plan(dtype, (192, 128), "causal", "group", dropout=True) for dtype in DTYPES]
    # The elementwise bias's gradient (dbias): no mask and causal in batch mode, and two plans
    # where dbias and dS differ by the soft-cap's derivative (one with dropout, one in group
    # mode).
    dbias = {"bias": "elementwise", "dbias": True}
    plans += [
        _bwd_plan(dtype, hdims, mask, **dbias)
        for dtype, hdims, mask in itertools.product(DTYPES, FEATURE_HDIMS, ("none", "causal"))
    ]
    plans += [
        _bwd_plan("bf16", 128, "none", softcap=True, dropout=True, **dbias),
        _bwd_plan("fp16", 64, "causal", "group", softcap=True, **dbias),
    ]
    # Plans share their row-wise stages; each signature appears once.
    return tuple(dict.fromkeys(sig for plan in plans for sig in plan))


# What models train with: each feature a model family uses, with the mask it uses it with, as
# a forward (with LSE) and the backward plan that differentiates it. The backward takes no
# sink flag (the forward's LSE carries the sink), so a sink forward pairs with the plain plan.
TRAINING_COMBOS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("causal", {"softcap": True}),  # Gemma 2, global layers
    ("window", {"softcap": True}),  # Gemma 2, sliding-window layers
    ("causal", {"sink": True}),  # gpt-oss, full layers
    ("window", {"sink": True}),  # gpt-oss, sliding-window layers
    ("causal", {"bias": "alibi"}),  # BLOOM, MPT
    ("causal", {"dropout": True}),  # decoders trained with attention dropout
    ("none", {"dropout": True}),  # encoders trained with attention dropout
    ("none", {"bias": "elementwise"}),  # padding masks passed as a bias (SDPA's attn_mask)
    ("causal", {"bias": "elementwise"}),  # padded decoder batches: causal plus key padding
)


def _unique(signatures: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(signatures))


def _training_signatures() -> tuple[FwdSignature | BwdSignature, ...]:
    signatures: list[FwdSignature | BwdSignature] = []
    for dtype, hdims, (mask, features) in itertools.product(
        DTYPES, FEATURE_HDIMS, TRAINING_COMBOS
    ):
        signatures.append(_fwd(dtype, hdims, mask, True, **features))
        backward = {name: value for name, value in features.items() if name != "sink"}
        signatures.extend(_bwd_plan(dtype, hdims, mask, **backward))
    return tuple(dict.fromkeys(signatures))


# Appending to a KV cache: every RoPE mode, contiguous and paged caches.
APPENDKV_HDIMS = (32, 64, 96, 128, 256)
APPENDKV_FP32_HDIMS = (64, 128)


def _appendkv(
    dtype: str, hdim: int, rope: str = "none", paged: bool = False, kv_quant: str = "none"
) -> AppendKvSignature:
    return AppendKvSignature(
        dtype=dtype, hdim_q=hdim, hdim_v=hdim, rope=rope, paged=paged, kv_quant=kv_quant
    )


def _appendkv_signatures() -> tuple[AppendKvSignature, ...]:
    """fp16/bf16 at every serving head dim and fp32 at d64/d128, x RoPE modes x cache kinds;
    appends into fp8 caches (sm_89 and later) at the fp8 decode head dims, d64/d128."""
    shapes = [(dtype, hdim) for dtype in DTYPES for hdim in APPENDKV_HDIMS]
    shapes += [("fp32", hdim) for hdim in APPENDKV_FP32_HDIMS]
    plain = tuple(
        _appendkv(dtype, hdim, rope, paged)
        for (dtype, hdim), rope, paged in itertools.product(shapes, ROPE_MODES, (False, True))
    )
    fp8 = tuple(
        _appendkv(dtype, hdim, rope, paged, kv_quant="e4m3")
        for dtype, hdim, rope, paged in itertools.product(
            DTYPES, SPLITKV_HDIMS, ROPE_MODES, (False, True)
        )
    )
    return plain + fp8


def _conv(
    dtype: str, spatial_dims: int, vector: int, max_channels: int = 0, family: str = CONV_FWD
) -> ConvSignature:
    return ConvSignature(
        dtype=dtype, spatial_dims=spatial_dims, vector=vector, max_channels=max_channels,
        family=family,
    )  # fmt: skip


def _conv_signatures() -> tuple[ConvSignature, ...]:
    """The grouped-convolution forward and weight gradient for {fp16,bf16} x {2D,3D} x every
    channel vector: the runtime takes the widest vector a problem's channels, strides and
    pointers allow, so each width serves problems no wider one can. The data gradient runs on
    the forward's kernels."""
    implicit_gemm = tuple(
        _conv(dtype, spatial_dims, vector, family=family)
        for family, dtype, spatial_dims, vector in itertools.product(
            (CONV_FWD, CONV_BWD_WEIGHT), DTYPES, CONV_SPATIAL_DIMS, CONV_VECTORS
        )
    )
    return implicit_gemm + _direct_conv_signatures()


def _direct_conv_signatures() -> tuple[ConvSignature, ...]:
    """The direct kernels for {fp16,bf16} x {2D,3D} x the built channel buckets, one channel a
    load: the forward's for groups of at most 1, 2 or 4 input and output channels (depthwise
    and narrow groups), the weight gradient's for groups of at most 1 or 2."""
    built = {CONV_FWD: DIRECT_BUCKETS, CONV_BWD_WEIGHT: BWD_WEIGHT_DIRECT_BUCKETS}
    return tuple(
        _conv(dtype, spatial_dims, 1, max_channels, family)
        for family, buckets in built.items()
        for dtype, spatial_dims, max_channels in itertools.product(
            DTYPES, CONV_SPATIAL_DIMS, buckets
        )
    )


def _core_conv_signatures() -> tuple[ConvSignature, ...]:
    """16-byte loads (channel counts of multiples of 8) in bf16 2D and 3D and fp16 2D, and bf16
    2D one channel at a time, which runs any channel count (the first layer's 3 channels), for
    the forward (and so the data gradient) and the weight gradient; and the bf16 2D direct
    kernels for depthwise groups (1 channel) and groups of up to 4, and the weight gradient's
    for the same two buckets and for groups of 8 (ResNeXt's first two stages; a 2-channel
    bucket compiles on first use)."""
    implicit_gemm = (("bf16", 2, 8), ("bf16", 3, 8), ("fp16", 2, 8), ("bf16", 2, 1))
    return (
        *(_conv(*shape) for shape in implicit_gemm),
        _conv("bf16", 2, 1, max_channels=1), _conv("bf16", 2, 1, max_channels=4),
        *(_conv(*shape, family=CONV_BWD_WEIGHT) for shape in implicit_gemm),
        *(_conv("bf16", 2, 1, bucket, CONV_BWD_WEIGHT) for bucket in (1, 4, 8)),
    )  # fmt: skip


def _core_signatures() -> tuple[Signature, ...]:
    """The kernels most calls hit, plus one instance of each template and feature path so that
    building the set proves every template compiles (each adds little: instances of a template
    share one compile unit, generator/units.py)."""
    common = (
        # Forward: fp16/bf16 at d64/d128, no mask or causal; varlen causal.
        *(
            _fwd(dtype, hdim, mask)
            for dtype, hdim, mask in itertools.product(DTYPES, FEATURE_HDIMS, ("none", "causal"))
        ),
        *(_fwd(dtype, hdim, "causal", mode="group") for dtype, hdim in
          itertools.product(DTYPES, FEATURE_HDIMS)),
        # Decode: the split-KV plan at d128 (every split tile) and paged decode over vLLM pages.
        *(_splitkv(dtype, 128, mask) for dtype, mask in itertools.product(DTYPES, ("none", "causal"))),
        *(_combine(dtype, 128) for dtype in DTYPES),
        *(_paged(dtype, 128, "causal", "fwd_pagedkv") for dtype in DTYPES),
        # Decode over fp8 K/V caches (sm_89 and later), contiguous and paged.
        *(_fp8_kv(dtype, 128, "causal", "fwd_splitkv") for dtype in DTYPES),
        _fp8_kv("bf16", 128, "causal", FWD_PAGEDKV),
        # The Hopper fp8 forward (sm_90a only), Q, K and V in e4m3.
        *(_fp8_forward("bf16", 128, mask) for mask in ("none", "causal")),
        # Backward: the same problems as the forward's batch mode.
        *(
            sig
            for dtype, hdim, mask in itertools.product(DTYPES, FEATURE_HDIMS, ("none", "causal"))
            for sig in _bwd_plan(dtype, hdim, mask)
        ),
        # Appending a decode step's tokens, with and without RoPE, contiguous and paged, and
        # into fp8 caches.
        *(
            _appendkv(dtype, 128, rope, paged)
            for dtype, rope, paged in itertools.product(
                DTYPES, ("none", "half_rotated"), (False, True)
            )
        ),
        *(_appendkv("bf16", 128, "none", paged, kv_quant="e4m3") for paged in (False, True)),
        # Grouped convolution, one tile each.
        *_core_conv_signatures(),
    )
    # One instance of each remaining template and feature path (the ci set's coverage).
    coverage = (
        _fwd("bf16", 128, "window", mode="group", bias="elementwise"),
        _fwd("fp16", 64, "causal", bias="alibi", dropout=True),
        _fwd("bf16", (192, 128), "none", softcap=True, sink=True),
        _fwd("fp16", 64, "causal", mode="group", v_col_major=True),
        _fwd("fp32", 64, "window", mode="group", bias="alibi", dropout=True, sink=True),
        _paged("bf16", 128, "window", BATCH_PREFILL, page_layout="vectorized"),
        _combine("bf16", 128, mode="group"),
        *_bwd_plan("fp16", 64, "window", mode="group"),
        *_bwd_plan("bf16", 64, "causal", bias="elementwise"),
        _appendkv("fp16", 64, "interleaved"),
    )
    return tuple(dict.fromkeys(common + coverage))


RECEIPTS: dict[str, Receipt] = {
    receipt.name: receipt
    for receipt in (
        Receipt(
            name="core",
            description="the prebuilt core a plain install builds: forward and backward for "
            "{fp16,bf16} x d{64,128} x {no mask, causal}, varlen causal forward, the d128 "
            "decode plans (split-KV and paged, K/V in dtype or fp8 e4m3), the bf16 d128 fp8 "
            "forward (Q, K and V in e4m3, no mask or causal; sm_90a), KV-cache appends at d128 "
            "(bf16 also into fp8 caches), the grouped-convolution forward (bf16 2D and 3D and "
            "fp16 2D with 8-channel loads, bf16 2D with 1-channel loads; tile m128n128k32w4s3, "
            "on sm_90a m128n128k64w8s3 on wgmma; and the bf16 2D direct kernels for groups of "
            "1 and of up to 4 channels) and its weight gradient (the same four signatures, "
            "tile m128n128k32w4s3 on every arch, and the bf16 2D direct kernels for groups of "
            "1, of up to 4 and of 8 channels), "
            "and one kernel of each "
            "other template and feature path; each signature on its preferred template only. "
            "Everything else compiles on first use",
            signatures=_core_signatures(),
            all_tiles=False,
            preferred_only=True,
            conv_tiles=CONV_CORE_TILES,
        ),
        Receipt(
            name="ci",
            description="nine forward kernels per arch covering dtypes (one fp32), head dims, "
            "masks and features, plus one split-KV plan (bf16 d128 window, group mode: every "
            "split tile and the combine stage), its paged twins (batch_prefill over linear "
            "and vectorized pages, every tile, sharing that combine stage), two backward plans (bf16 d128 causal, fp16 "
            "d64 window in group mode) and two KV-cache appends (bf16 d128 half-rotated RoPE "
            "into pages, fp16 d64 interleaved RoPE into a contiguous cache)",
            signatures=(
                _fwd("fp16", 64, "none"),
                _fwd("fp16", 128, "causal"),
                _fwd("bf16", 64, "causal", mode="group"),
                _fwd("bf16", 128, "none"),
                _fwd("bf16", 128, "window", mode="group", bias="elementwise"),
                _fwd("fp16", 64, "causal", bias="alibi", dropout=True),
                _fwd("bf16", (192, 128), "none", softcap=True, sink=True),
                _fwd("fp16", 64, "causal", mode="group", v_col_major=True),
                _fwd("fp32", 64, "window", mode="group", bias="alibi", dropout=True, sink=True),
                _splitkv("bf16", 128, "window", mode="group"),
                _combine("bf16", 128, mode="group"),
                _paged("bf16", 128, "window", BATCH_PREFILL),
                _paged("bf16", 128, "window", BATCH_PREFILL, page_layout="vectorized"),
                *_bwd_plan("bf16", 128, "causal"),
                *_bwd_plan("fp16", 64, "window", mode="group"),
                _appendkv("bf16", 128, "half_rotated", paged=True),
                _appendkv("fp16", 64, "interleaved"),
            ),
            all_tiles=False,
        ),
        Receipt(
            name="default",
            description="{fp16,bf16} x head dims {32,64,96,128,192x128,256} x mask "
            "{none,causal,window} with LSE, plain group mode and column-major V (batch and group) "
            "at d64/d128, plus "
            "mode/bias/dropout/softcap/sink covered "
            "pairwise at d64 and d128; fp32 at d64/d128 x masks, d192x128, d256 window and a few "
            "feature combinations; split-KV and its combine stage for {fp16,bf16} x d{64,128} x "
            "masks x {batch,group}; paged K/V (fwd_pagedkv in batch mode, batch_prefill in "
            "group mode) for {fp16,bf16} x d{64,128} x masks x {linear,vectorized} pages; fp8 (e4m3) "
            "K/V decode (split-KV and fwd_pagedkv, no mask or causal) and causal batch_prefill "
            "for {fp16,bf16} x d{64,128} on sm_89+; the fp8 forward (Q, K and V in e4m3) for "
            "{fp16,bf16} x d{64,128,256} x {none,causal} x {batch,group} on sm_90a; backward plans for {fp16,bf16} x every mask x {batch,group} "
            "at every head dim (plus four feature combinations of bias, ALiBi, soft-cap and "
            "dropout at d64/d128, soft-capped d256 and d192x128 dropout), "
            "forward and backward pairs for the features models train with (soft-cap, sinks, "
            "ALiBi, dropout with the masks their models use) at d64/d128; KV-cache appends for {fp16,bf16} x "
            "d{32,64,96,128,256} and fp32 x d{64,128}, x RoPE {none,interleaved,half_rotated} x "
            "{contiguous,paged}, and into fp8 caches for {fp16,bf16} x d{64,128} (sm_89+); the "
            "grouped-convolution forward for {fp16,bf16} x {2D,3D} x channel vectors {8,4,2,1} "
            "with tiles m128n128k32w4s3, m128n64k32w4s3, m64n32k32w4s4 and m128n16k32w4s4 "
            "(and on sm_90a five wgmma tiles), and its direct kernel for {fp16,bf16} x {2D,3D} "
            "x groups of at most {1,2,4} channels (one tile each), and its weight gradient for "
            "{fp16,bf16} x {2D,3D} x channel vectors {8,4,2,1} with tiles m128n128k32w4s3, "
            "m64n64k32w4s4, m128n64k32w4s3 and m64n128k32w4s3, and its direct kernel for "
            "{fp16,bf16} x {2D,3D} x groups of at most {1,2} channels (one tile each); "
            "default tiles (split-KV, conv: every tile)",
            # Training pairs repeat signatures other layers hold: each is listed once.
            signatures=_unique(
                _mask_signatures((True,)) + _group_signatures() + _v_col_major_signatures()
                + _feature_signatures() + _fp32_signatures(full=False) + _splitkv_signatures()
                + _paged_signatures() + _fp8_kv_signatures() + _fp8_forward_signatures((True,))
                + _bwd_signatures() + _training_signatures() + _appendkv_signatures()
                + _conv_signatures()
            ),
            all_tiles=False,
        ),
        Receipt(
            name="full",
            description="default plus no-LSE variants (the fp8 forward's too), fp32 at every "
            "head dim and every "
            "alternative tile, the conv tiles m256n128k32w8s3 and m128n128k64w4s3 (the "
            "latter where its shared memory fits: not on sm_86 or sm_89) and the weight "
            "gradient's m128n128k64w8s3 (also not on sm_86 or sm_89)",
            signatures=_unique(
                _mask_signatures((True, False)) + _group_signatures()
                + _v_col_major_signatures() + _feature_signatures() + _fp32_signatures(full=True)
                + _splitkv_signatures() + _paged_signatures() + _fp8_kv_signatures()
                + _fp8_forward_signatures((True, False)) + _bwd_signatures() + _training_signatures() + _appendkv_signatures()
                + _conv_signatures()
            ),
            all_tiles=True,
            conv_tiles=CONV_FULL_TILES,
        ),
    )
}


def get_receipt(name: str) -> Receipt:
    try:
        return RECEIPTS[name.strip()]
    except KeyError:
        raise ValueError(
            f"unknown kernel set {name!r}; known sets: {', '.join(RECEIPTS)}"
        ) from None


def compile_filter(pattern: str | None) -> re.Pattern[str] | None:
    """A regex searched (not fully matched) in kernel names, so 'bf16.*causal' works."""
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid kernel filter regex {pattern!r}: {exc}") from None
