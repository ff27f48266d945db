"""Limits of the grouped-convolution backward-weight fed by the copy engine
(ConvBwdWeightTmaTraits, pipeline sm90_tma_wgmma): one producer warpgroup asks for each k-tile
of positions' dy and x chunks in im2col mode, 64 channels (128 bytes, the swizzle span) a copy,
and one or two consumer warpgroups of 64 output channels each multiply them with wgmma from
channel-major shared memory. Only the 8-channel vector of fp16/bf16 applies. What depends on the
problem (the packed group's input channels a multiple of 64, the im2col walk's corner and
stride limits) the runtime checks per call (kernel::conv_weight_tma_limit)."""

from __future__ import annotations

from ..signature import CONV_BWD_WEIGHT, KernelConfig
from ..specs import ArchSpec
from .common import ELEMENT_BYTES, TemplateRules
from .conv import smem_reasons
from .conv_tma import (
    BARRIER_BYTES,
    CTA_RESERVED_SMEM,
    SM_SMEM_BYTES,
    WGMMA_ROWS,
    consumers,
    tma_signature_reasons,
    tma_stage_reasons,
    tma_warps_reasons,
)
from .traits_assertions import TraitsAssertion, assertions_from

# A copy moves 64 channels of a position; tile_n is whole chunks, up to wgmma's N of 256.
WEIGHT_TMA_CHUNK = 64
WEIGHT_TMA_TILE_N = (64, 128, 192, 256)
# Positions a copy walks (whole 16-position wgmma k-steps).
WEIGHT_TMA_TILE_K = (32, 64)


def weight_tma_smem_launch_bytes(
    tile_m: int, tile_n: int, tile_k: int, stages: int, elem: int
) -> int:
    """The operand stages and the stages' barriers (ConvBwdWeightTmaTraits::kSmemLaunchBytes)."""
    return stages * (tile_m + tile_n) * tile_k * elem + BARRIER_BYTES * stages


def weight_tma_min_ctas_per_sm(config: KernelConfig) -> int:
    """CTAs an SM holds at once that the kernel's registers are sized for: two where their
    shared memory fits and they have one consumer warpgroup (two CTAs of three warpgroups leave
    80 registers a thread, too few for the accumulators), else one."""
    alg = config.algorithm
    elem = ELEMENT_BYTES.get(config.signature.dtype, 2)
    smem = weight_tma_smem_launch_bytes(alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, elem)
    fits = 2 * (smem + CTA_RESERVED_SMEM) <= SM_SMEM_BYTES
    return 2 if fits and alg.warps == 8 else 1


def _tile_reasons(config: KernelConfig) -> list[str]:
    alg = config.algorithm
    reasons = tma_warps_reasons(config)
    if not reasons and alg.tile_m != WGMMA_ROWS * consumers(config):
        reasons.append(
            f"tile_m={alg.tile_m} output channels is not supported with {alg.warps} warps: each "
            f"consumer warpgroup owns one {WGMMA_ROWS}-channel wgmma tile, so tile_m is "
            f"{WGMMA_ROWS * consumers(config)}"
        )
    if alg.tile_n not in WEIGHT_TMA_TILE_N:
        reasons.append(
            f"tile_n={alg.tile_n} filter taps x input channels is not supported; supported: "
            f"{', '.join(map(str, WEIGHT_TMA_TILE_N))} (whole {WEIGHT_TMA_CHUNK}-channel copies, "
            "wgmma N up to 256)"
        )
    if alg.tile_k not in WEIGHT_TMA_TILE_K:
        reasons.append(
            f"tile_k={alg.tile_k} positions per stage is not supported; supported: "
            f"{', '.join(map(str, WEIGHT_TMA_TILE_K))} (the positions a copy walks)"
        )
    return reasons + tma_stage_reasons(config)


def _smem_reasons(config: KernelConfig, arch: ArchSpec) -> list[str]:
    sig, alg = config.signature, config.algorithm
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    launched = weight_tma_smem_launch_bytes(alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, elem)
    return smem_reasons(config, arch, launched, "the stages' barriers")


def conv_bwd_weight_tma_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the TMA conv weight gradient: fp16/bf16, 2D or 3D, 8-channel vectors, a
    producer and one or two consumer warpgroups of 64 output channels, whole 64-channel copies
    along tile_n, and its stages within the arch's shared memory (the pipeline itself is
    sm_90a's, arch_specs.json)."""
    reasons = tma_signature_reasons(config, CONV_BWD_WEIGHT) + _tile_reasons(config)
    return reasons + _smem_reasons(config, arch)


def conv_bwd_weight_tma_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The threads, consumer warpgroups and shared memory the rules assume, which
    ConvBwdWeightTmaTraits computes from the same template arguments."""
    sig, alg = config.signature, config.algorithm
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    return assertions_from(
        __name__,
        ("kThreads", alg.warps * 32, "threads per CTA"),
        ("kConsumerWarpgroups", consumers(config), "warpgroups that multiply"),
        (
            "kSmemLaunchBytes",
            weight_tma_smem_launch_bytes(alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, elem),
            "shared-memory bytes per CTA",
        ),
        ("kMinCtasPerSm", weight_tma_min_ctas_per_sm(config), "CTAs an SM holds at once"),
    )


TEMPLATE = TemplateRules(conv_bwd_weight_tma_rules, conv_bwd_weight_tma_traits_assertions)
