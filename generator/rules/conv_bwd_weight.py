"""Limits of the grouped-convolution backward-weight template (ConvBwdWeightSm80Traits): per group
dw[K, taps x C] = dy[P, K]^T x x_gathered[P, taps x C] on cp.async + mma.sync, the GEMM's rows
(tile_m) the output channels K, its columns (tile_n) the filter taps times the input channels,
its reduction (tile_k) the batch times the output positions P, streamed through shared memory
in stages. It is the family's template for any channel count, on sm_80 and every later arch
(sm_90a included, where conv_bwd_weight_sm90.py's wgmma template is preferred); groups of up to
four channels also have a direct template (conv_bwd_weight_direct.py). What it shares with the forward's mma.sync template is checked by
conv.py's helpers."""

from __future__ import annotations

from ..signature import CONV_BWD_WEIGHT, KernelConfig
from ..specs import ArchSpec
from .common import ELEMENT_BYTES, TemplateRules
from .conv import (
    CONV_ROW_BYTES,
    CONV_WARPS,
    MMA_ARITHMETIC,
    conv_smem_bytes,
    min_arch_reasons,
    problem_reasons,
    smem_reasons,
    stage_reasons,
    vector_reasons,
)
from .conv_bwd_weight_direct import BWD_WEIGHT_DIRECT_MAX_CHANNELS
from .pipelines import CONV_DIRECT_PIPELINE
from .traits_assertions import TraitsAssertion, assertions_from

# Both operands are read along their channels (dy's K, x's C) into shared-memory atoms 64
# channels wide, so the output channels (tile_m) and the taps x input channels (tile_n) come in
# whole atoms.
BWD_WEIGHT_TILE_M = (64, 128)
BWD_WEIGHT_TILE_N = (64, 128)
# A fixed warp grid of two warp columns, the other warps stacked along the output channels: with
# tiles of 64 or 128 and at most 4x2 warps, every warp owns whole 16x16 MMA slices.
BWD_WEIGHT_WARPS_N = 2
# The table of the reduction positions (a ConvRow each) has two slots: one is filled while the
# other's tile is issued.
BWD_WEIGHT_TABLE_SLOTS = 2


def bwd_weight_warp_grid(warps: int) -> tuple[int, int]:
    """(WarpsM, WarpsN): ConvBwdWeightSm80Traits' kWarpsM and kWarpsN."""
    return warps // BWD_WEIGHT_WARPS_N, BWD_WEIGHT_WARPS_N


def bwd_weight_smem_launch_bytes(
    tile_m: int, tile_n: int, tile_k: int, stages: int, elem: int = 2
) -> int:
    """What a CTA is launched with: the operand stages (conv_smem_bytes, the traits'
    kSmemBytes) and the two slots of tile_k positions of the table after them
    (ConvBwdWeightSm80Traits::kSmemLaunchBytes)."""
    table = BWD_WEIGHT_TABLE_SLOTS * tile_k * CONV_ROW_BYTES
    return conv_smem_bytes(tile_m, tile_n, tile_k, stages, elem) + table


def bwd_weight_signature_reasons(config: KernelConfig) -> list[str]:
    """Any channel count, in the channel vector the problem allows; a channel bucket is the
    direct template's. The wgmma template (conv_bwd_weight_sm90.py) takes the same."""
    reasons = problem_reasons(config, CONV_BWD_WEIGHT, MMA_ARITHMETIC)
    max_channels = getattr(config.signature, "max_channels", 0)
    if max_channels != 0:
        *narrower, widest = BWD_WEIGHT_DIRECT_MAX_CHANNELS
        reasons.append(
            f"max_channels={max_channels} is not supported: channel buckets are the direct "
            f"template's (pipeline {CONV_DIRECT_PIPELINE}), which takes "
            f"{', '.join(map(str, narrower))} and {widest}; {CONV_BWD_WEIGHT}'s implicit-GEMM "
            "template takes any channel count (max_channels=0)"
        )
    return reasons + vector_reasons(config)


def _tile_reasons(config: KernelConfig) -> list[str]:
    alg = config.algorithm
    reasons: list[str] = []
    if alg.warps not in CONV_WARPS:
        reasons.append(
            f"warps={alg.warps} is not supported; the backward-weight conv template runs "
            f"{' or '.join(map(str, CONV_WARPS))} warps (a 2x2 or 4x2 warp grid)"
        )
    if alg.tile_m not in BWD_WEIGHT_TILE_M:
        reasons.append(
            f"tile_m={alg.tile_m} output channels is not supported; supported: "
            f"{', '.join(map(str, BWD_WEIGHT_TILE_M))} (whole 64-channel shared-memory atoms)"
        )
    if alg.tile_n not in BWD_WEIGHT_TILE_N:
        reasons.append(
            f"tile_n={alg.tile_n} filter taps x input channels is not supported; supported: "
            f"{', '.join(map(str, BWD_WEIGHT_TILE_N))} (whole 64-channel shared-memory atoms)"
        )
    return reasons + stage_reasons(config)


def bwd_weight_smem_reasons(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """The operand stages and the position table's slots against the arch's shared memory
    (both implicit-GEMM templates)."""
    sig, alg = config.signature, config.algorithm
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    launched = bwd_weight_smem_launch_bytes(alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, elem)
    table = (
        f"{BWD_WEIGHT_TABLE_SLOTS} slots x {alg.tile_k} positions x {CONV_ROW_BYTES} B of "
        "position table"
    )
    return smem_reasons(config, arch, launched, table)


def conv_bwd_weight_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the backward-weight template: fp16/bf16, 2D or 3D, a channel vector of 8, 4,
    2 or 1 and no channel bucket, tiles of 64 or 128 channels, its stages within the arch's
    shared memory, sm_80 or later."""
    reasons = bwd_weight_signature_reasons(config) + _tile_reasons(config)
    reasons += min_arch_reasons(CONV_BWD_WEIGHT, arch)
    return reasons + bwd_weight_smem_reasons(config, arch)


def conv_bwd_weight_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The threads, warp grid and shared memory the rules check, which ConvBwdWeightSm80Traits
    computes from the same template arguments: the operand stages, and with the position
    table's two slots the bytes the launch asks for, which the rules hold to the arch's
    limit."""
    sig, alg = config.signature, config.algorithm
    warps_m, warps_n = bwd_weight_warp_grid(alg.warps)
    tile = (alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, ELEMENT_BYTES.get(sig.dtype, 2))
    return assertions_from(
        __name__,
        ("kThreads", alg.warps * 32, "threads per CTA"),
        ("kWarpsM", warps_m, "warps along the output channels"),
        ("kWarpsN", warps_n, "warps along the filter taps x input channels"),
        ("kSmemBytes", conv_smem_bytes(*tile), "shared-memory bytes of the operand stages"),
        ("kSmemLaunchBytes", bwd_weight_smem_launch_bytes(*tile), "shared-memory bytes per CTA"),
    )


TEMPLATE = TemplateRules(conv_bwd_weight_rules, conv_bwd_weight_traits_assertions)
