"""Limits of the grouped-convolution backward-weight template on sm_90a
(ConvBwdWeightSm90Traits): the mma.sync template's position tables and gathers
(conv_bwd_weight.py) feeding wgmma. Both operands stay channel-major in shared memory, which
wgmma reads as they are for 16-bit types; warpgroups stack along the output channels (tile_m),
64 each, and wgmma's N covers tile_n filter taps x input channels."""

from __future__ import annotations

from ..signature import KernelConfig
from ..specs import ArchSpec
from .common import ELEMENT_BYTES, TemplateRules
from .conv import CONV_TILE_K, SM90_STAGES, SM90_TWO_CTA_SMEM, WGMMA_ROWS, conv_smem_bytes
from .conv_bwd_weight import (
    bwd_weight_signature_reasons,
    bwd_weight_smem_launch_bytes,
    bwd_weight_smem_reasons,
)
from .traits_assertions import TraitsAssertion, assertions_from

# One or two warpgroups, each owning one 64-channel wgmma tile of the output channels.
SM90_WEIGHT_WARPS = (4, 8)
# Whole 64-channel (128-byte) shared-memory atoms, up to wgmma's N of 256.
SM90_WEIGHT_TILE_N = (64, 128, 256)


def sm90_weight_min_ctas_per_sm(config: KernelConfig) -> int:
    """CTAs an SM holds at once that the kernel's registers are sized for: two where their
    shared memory fits (ConvBwdWeightSm90Traits::kMinCtasPerSm), else one."""
    alg = config.algorithm
    elem = ELEMENT_BYTES.get(config.signature.dtype, 2)
    smem = bwd_weight_smem_launch_bytes(alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, elem)
    return 2 if 2 * smem <= SM90_TWO_CTA_SMEM else 1


def _tile_reasons(config: KernelConfig) -> list[str]:
    alg = config.algorithm
    reasons: list[str] = []
    if alg.warps not in SM90_WEIGHT_WARPS:
        reasons.append(
            f"warps={alg.warps} is not supported; the sm90 backward-weight template runs one or "
            f"two warpgroups: {' or '.join(map(str, SM90_WEIGHT_WARPS))} warps"
        )
    elif alg.tile_m != WGMMA_ROWS * (alg.warps // 4):
        reasons.append(
            f"tile_m={alg.tile_m} output channels is not supported with {alg.warps} warps: each "
            f"warpgroup owns one {WGMMA_ROWS}-channel wgmma tile, so tile_m is "
            f"{WGMMA_ROWS * (alg.warps // 4)}"
        )
    if alg.tile_n not in SM90_WEIGHT_TILE_N:
        reasons.append(
            f"tile_n={alg.tile_n} filter taps x input channels is not supported; supported: "
            f"{', '.join(map(str, SM90_WEIGHT_TILE_N))} (whole 64-channel shared-memory atoms, "
            "wgmma N up to 256)"
        )
    vector = getattr(config.signature, "vector", 0)
    if vector and alg.tile_n // vector > alg.warps * 32:
        reasons.append(
            f"tile_n={alg.tile_n} at {vector}-channel loads is {alg.tile_n // vector} vector "
            f"columns, more than the {alg.warps * 32} threads that each gather one; use more "
            "warps or a narrower tile"
        )
    if alg.tile_k not in CONV_TILE_K:
        reasons.append(
            f"tile_k={alg.tile_k} positions per stage is not supported; supported: "
            f"{', '.join(map(str, CONV_TILE_K))} (whole 16-position wgmma steps)"
        )
    if alg.stages not in SM90_STAGES:
        reasons.append(
            f"stages={alg.stages} is not supported; the sm90 backward-weight template keeps "
            f"{SM90_STAGES[0]} to {SM90_STAGES[-1]} stages (loads run stages - 2 tiles ahead)"
        )
    if alg.ctas_per_sm != 1:
        reasons.append(
            f"ctas_per_sm={alg.ctas_per_sm} is not supported; the template sizes its registers "
            "for two CTAs an SM where their shared memory fits (ctas_per_sm=1)"
        )
    return reasons


def conv_bwd_weight_sm90_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the sm90 backward-weight template: the signatures of the mma.sync one, whole
    warpgroups of 64 output channels, tile_n of whole atoms up to 256, and its stages and
    position table within the arch's shared memory."""
    reasons = bwd_weight_signature_reasons(config) + _tile_reasons(config)
    return reasons + bwd_weight_smem_reasons(config, arch)


def conv_bwd_weight_sm90_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The threads, warpgroups, shared memory and CTAs per SM the rules assume, which
    ConvBwdWeightSm90Traits computes from the same template arguments."""
    sig, alg = config.signature, config.algorithm
    tile = (alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, ELEMENT_BYTES.get(sig.dtype, 2))
    return assertions_from(
        __name__,
        ("kThreads", alg.warps * 32, "threads per CTA"),
        ("kWarpgroups", alg.warps // 4, "warpgroups along the output channels"),
        ("kSmemBytes", conv_smem_bytes(*tile), "shared-memory bytes of the operand stages"),
        ("kSmemLaunchBytes", bwd_weight_smem_launch_bytes(*tile), "shared-memory bytes per CTA"),
        ("kMinCtasPerSm", sm90_weight_min_ctas_per_sm(config), "CTAs an SM holds at once"),
    )


TEMPLATE = TemplateRules(conv_bwd_weight_sm90_rules, conv_bwd_weight_sm90_traits_assertions)
