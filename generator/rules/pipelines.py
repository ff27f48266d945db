"""Which kernel templates implement each family, and which element types each template takes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..signature import (
    APPENDKV,
    BWD_DQ_DK_DV,
    BWD_FAMILIES,
    BWD_ROWWISE_FAMILIES,
    CONV_BWD_WEIGHT,
    CONV_FAMILIES,
    CONV_FWD,
    PAGED_FAMILIES,
)

if TYPE_CHECKING:
    from ..signature import Signature

# The grouped convolution's template for groups of few channels (plain CUDA-core code, so every
# arch has it).
CONV_DIRECT_PIPELINE = "conv_direct"
SUPPORTED_FAMILIES = (
    "fwd", "fwd_splitkv", "fwd_splitkv_combine", *PAGED_FAMILIES, *BWD_FAMILIES, APPENDKV,
    CONV_FWD, CONV_BWD_WEIGHT,
)  # fmt: skip
# The templates that implement each family: split-KV is a variant of the sm80 template, and its
# combine stage a small CUDA-core kernel of its own; the backward runs on the sm80 path (its
# row-wise stages are plain 16-byte vector passes that every arch runs) and its main stage also
# on the sm90 path; appending to a KV cache is a memory-bound copy kernel of its own; the
# grouped convolution is an implicit GEMM on the sm80 path's cp.async + mma.sync, and on sm_90a
# the same gathers feed wgmma, or the copy engine's im2col mode feeds it; groups of few channels (depthwise) run on a direct CUDA-core
# kernel of their own; the convolution's weight gradient is an implicit GEMM on the sm80 path
# and, on sm_90a, on wgmma (gathered or fed by the copy engine), and has a direct CUDA-core kernel of its own for groups of up to
# four channels.
FAMILY_PIPELINES: dict[str, tuple[str, ...]] = {
    "fwd": ("sm80_cpasync_mma", "sm90_tma_wgmma", "simt_fma"),
    "fwd_splitkv": ("sm80_cpasync_mma",),
    "fwd_splitkv_combine": ("splitkv_combine",),
    # Paged K/V: the split-KV body with key rows gathered through a page table.
    **{family: ("sm80_cpasync_mma",) for family in PAGED_FAMILIES},
    **{family: ("sm80_cpasync_mma",) for family in BWD_ROWWISE_FAMILIES},
    # The backward main stage also has a Hopper template; the row-wise stages around it are
    # the sm80 path's on every arch.
    BWD_DQ_DK_DV: ("sm80_cpasync_mma", "sm90_tma_wgmma"),
    APPENDKV: ("appendkv",),
    CONV_FWD: ("sm80_cpasync_mma", "sm90_cpasync_wgmma", "sm90_tma_wgmma", CONV_DIRECT_PIPELINE),
    CONV_BWD_WEIGHT: (
        "sm80_cpasync_mma", "sm90_cpasync_wgmma", "sm90_tma_wgmma", CONV_DIRECT_PIPELINE,
    ),
}  # fmt: skip
# The conv forward and weight gradient fed by the copy engine, which moves whole 16-byte channel
# runs: only the 8-channel signatures meet them (their rules reject the others, for names asked
# for explicitly).
CONV_TMA_TEMPLATE = (CONV_FWD, "sm90_tma_wgmma")
CONV_WEIGHT_TMA_TEMPLATE = (CONV_BWD_WEIGHT, "sm90_tma_wgmma")
CONV_TMA_TEMPLATES = frozenset({CONV_TMA_TEMPLATE, CONV_WEIGHT_TMA_TEMPLATE})
CONV_TMA_VECTOR = 8
# fp8 queries: the one-stage forward on the Hopper template, whose wgmma multiplies e4m3 tiles
# as they are (Q K^T, then P quantised to e4m3 times V); K/V are fp8 too.
Q_FP8_FAMILY = "fwd"
Q_FP8_PIPELINE = "sm90_tma_wgmma"
# Element types each template computes in; enumeration pairs a signature only with the
# pipelines that take its dtype, so --explain is not flooded with dtype mismatches.
PIPELINE_DTYPES: dict[str, tuple[str, ...]] = {
    "sm80_cpasync_mma": ("fp16", "bf16"),
    "sm90_tma_wgmma": ("fp16", "bf16"),
    "sm90_cpasync_wgmma": ("fp16", "bf16"),
    "simt_fma": ("fp32",),
    "splitkv_combine": ("fp16", "bf16"),
    "appendkv": ("fp16", "bf16", "fp32"),
    CONV_DIRECT_PIPELINE: ("fp16", "bf16"),
}


def pipelines_for_dtype(dtype: str, pipelines: Sequence[str]) -> tuple[str, ...]:
    """The pipelines among `pipelines` that take `dtype`; all of them when none does, so the
    rejections still say why."""
    taking = tuple(p for p in pipelines if dtype in PIPELINE_DTYPES.get(p, ()))
    return taking or tuple(pipelines)


def pipelines_for_family(family: str, dtype: str, pipelines: Sequence[str]) -> tuple[str, ...]:
    """The pipelines among `pipelines` that take `dtype` and template `family`; all of them
    when none does."""
    templated = FAMILY_PIPELINES.get(family, tuple(pipelines))
    taking = tuple(p for p in pipelines_for_dtype(dtype, pipelines) if p in templated)
    return taking or tuple(pipelines)


def pipelines_for_signature(signature: Signature, pipelines: Sequence[str]) -> tuple[str, ...]:
    """pipelines_for_family's, and for fp8 queries only their template where `pipelines` has
    it: on other archs every one meets them, so the rejections say why. A convolution with a
    channel bucket meets the direct template alone, one without it the implicit-GEMM ones
    (each template's rules reject the other kind, for names asked for explicitly), the TMA
    templates only at 8-channel vectors."""
    meeting = pipelines_for_family(signature.family, signature.dtype, pipelines)
    if getattr(signature, "q_quant", "none") != "none" and Q_FP8_PIPELINE in meeting:
        return (Q_FP8_PIPELINE,)
    if signature.family in CONV_FAMILIES and CONV_DIRECT_PIPELINE in meeting:
        direct = getattr(signature, "max_channels", 0) != 0
        kind = tuple(p for p in meeting if (p == CONV_DIRECT_PIPELINE) == direct)
        if getattr(signature, "vector", 0) != CONV_TMA_VECTOR:
            kind = tuple(p for p in kind if (signature.family, p) not in CONV_TMA_TEMPLATES)
        return kind or meeting
    return meeting
