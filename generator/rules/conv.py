"""Limits of the grouped-convolution forward's implicit-GEMM templates. ConvFwdSm80Traits: an
implicit GEMM per group on cp.async + mma.sync, rows the output positions, columns the output
channels, the reduction the filter taps times the input channels, streamed through shared memory
in stages; ConvFwdSm90Traits: the same gathers feeding wgmma on sm_90a. The helpers that check
what every conv template computes (problem_reasons, vector_reasons), the mma.sync templates'
stages (stage_reasons) and shared memory (smem_reasons) serve the backward-weight template too
(conv_bwd_weight.py) and the direct templates (conv_direct.py)."""

from __future__ import annotations

from ..signature import (
    CONV_FWD,
    CONV_SPATIAL_DIMS,
    CONV_VECTORS,
    KernelConfig,
)
from ..specs import ArchSpec
from .common import ELEMENT_BYTES, MMA_ROWS, TemplateRules
from .pipelines import CONV_DIRECT_PIPELINE
from .traits_assertions import TraitsAssertion, assertions_from

CONV_DTYPES = ("fp16", "bf16")
# cp.async and bf16 mma.sync are sm_80's; every arch in arch_specs.json has them.
CONV_MIN_ARCH = 80
CONV_WARPS = (4, 8)
CONV_TILE_M = (64, 128, 256)
CONV_TILE_N = (16, 32, 64, 128)
# A reduction stage is two or four k-steps of mma.sync m16n8k16.
CONV_TILE_K = (32, 64)
# cp.async stages of the A (tile_m x tile_k) and B (tile_n x tile_k) tiles in flight: one
# computed while the others load.
CONV_STAGES = (2, 3, 4)
# Each output row's batch and output offsets and first input coordinates (ConvRow), kept in
# shared memory beside the operand stages so that the gathers decode a row once per CTA.
CONV_ROW_BYTES = 32
# Output-channel tiles of 64 or more are split over two warp columns, narrower ones are held by
# one (a warp's B fragments then cover the whole tile).
CONV_WARPS_N_FROM_TILE_N = 64


def conv_warp_grid(tile_n: int, warps: int) -> tuple[int, int]:
    """(WarpsM, WarpsN): how the CTA's warps tile the output block (ConvFwdSm80Traits'
    kWarpsM and kWarpsN)."""
    warps_n = 2 if tile_n >= CONV_WARPS_N_FROM_TILE_N else 1
    return warps // warps_n, warps_n


def conv_smem_bytes(tile_m: int, tile_n: int, tile_k: int, stages: int, elem: int = 2) -> int:
    """`stages` A tiles (tile_m x tile_k) and B tiles (tile_n x tile_k) of `elem`-byte
    elements. ConvFwdSm80Traits::kSmemBytes."""
    return stages * (tile_m + tile_n) * tile_k * elem


def conv_smem_launch_bytes(
    tile_m: int, tile_n: int, tile_k: int, stages: int, elem: int = 2
) -> int:
    """What a CTA is launched with: the operand stages and, after them, the table of its
    output rows (ConvFwdSm80Traits::kSmemLaunchBytes). The table tips the 64-wide reduction
    tile's 3 stages (96 KiB of operands) over sm_86's and sm_89's 99 KiB."""
    return conv_smem_bytes(tile_m, tile_n, tile_k, stages, elem) + tile_m * CONV_ROW_BYTES


# What the tensor-core conv templates compute in, for the dtype reason.
MMA_ARITHMETIC = "mma.sync m16n8k16, fp32 accumulators"


def problem_reasons(config: KernelConfig, family: str, arithmetic: str) -> list[str]:
    """What every conv template computes: its `family`, fp16/bf16 (in `arithmetic`), 2D or
    3D."""
    sig = config.signature
    reasons: list[str] = []
    if sig.family != family:
        reasons.append(f"the conv template computes {family} only, not {sig.family!r}")
    if sig.dtype not in CONV_DTYPES:
        reasons.append(
            f"dtype {sig.dtype!r} is not supported by {family}: it computes in "
            f"{' or '.join(CONV_DTYPES)} ({arithmetic})"
        )
    spatial_dims = getattr(sig, "spatial_dims", None)
    if spatial_dims not in CONV_SPATIAL_DIMS:
        reasons.append(
            f"spatial_dims={spatial_dims} is not supported; {family} takes 2D (NHWGC) and 3D "
            "(NDHWGC) problems"
        )
    return reasons


def vector_reasons(config: KernelConfig) -> list[str]:
    """The implicit-GEMM templates load channels in any vector of CONV_VECTORS."""
    vector = getattr(config.signature, "vector", None)
    if vector in CONV_VECTORS:
        return []
    return [
        (
            f"vector={vector} channels per load is not supported; supported: "
            f"{', '.join(map(str, CONV_VECTORS))} (8 is one 16-byte load of fp16/bf16, the "
            "narrower ones divide it)"
        )
    ]


def _signature_reasons(config: KernelConfig) -> list[str]:
    """The forward's implicit-GEMM templates' signatures: any channel count, in the channel
    vector the problem allows."""
    reasons = problem_reasons(config, CONV_FWD, MMA_ARITHMETIC)
    max_channels = getattr(config.signature, "max_channels", 0)
    if max_channels != 0:
        reasons.append(
            f"max_channels={max_channels} is the direct template's channel bucket "
            f"(pipeline {CONV_DIRECT_PIPELINE}); the implicit-GEMM conv templates take any channel "
            "count (max_channels=0)"
        )
    return reasons + vector_reasons(config)


def min_arch_reasons(family: str, arch: ArchSpec) -> list[str]:
    """The mma.sync templates need sm_80's cp.async and bf16 mma.sync."""
    if arch.arch_number >= CONV_MIN_ARCH:
        return []
    return [
        (
            f"{family} needs sm_{CONV_MIN_ARCH} or later (cp.async, bf16 mma.sync); "
            f"{arch.name} has neither"
        )
    ]


def stage_reasons(config: KernelConfig) -> list[str]:
    """The reduction step, cp.async stages and occupancy of the mma.sync conv templates."""
    alg = config.algorithm
    reasons: list[str] = []
    if alg.tile_k not in CONV_TILE_K:
        reasons.append(
            f"tile_k={alg.tile_k} reduction elements per stage is not supported; supported: "
            f"{', '.join(map(str, CONV_TILE_K))} (whole m16n8k16 steps in 16-byte rows)"
        )
    if alg.stages not in CONV_STAGES:
        reasons.append(
            f"stages={alg.stages} is not supported; the conv template keeps "
            f"{CONV_STAGES[0]} to {CONV_STAGES[-1]} cp.async stages in flight"
        )
    if alg.ctas_per_sm != 1:
        reasons.append(
            f"ctas_per_sm={alg.ctas_per_sm} is not supported; the conv template has no "
            "occupancy knob (ctas_per_sm=1)"
        )
    return reasons


def _tile_reasons(config: KernelConfig) -> list[str]:
    alg = config.algorithm
    reasons: list[str] = []
    if alg.warps not in CONV_WARPS:
        reasons.append(
            f"warps={alg.warps} is not supported; the conv template runs "
            f"{' or '.join(map(str, CONV_WARPS))} warps (a 2x2, 4x1, 4x2 or 8x1 warp grid)"
        )
    if alg.tile_m not in CONV_TILE_M:
        reasons.append(
            f"tile_m={alg.tile_m} output positions is not supported; supported: "
            f"{', '.join(map(str, CONV_TILE_M))}"
        )
    if alg.tile_n not in CONV_TILE_N:
        reasons.append(
            f"tile_n={alg.tile_n} output channels is not supported; supported: "
            f"{', '.join(map(str, CONV_TILE_N))}"
        )
    reasons += stage_reasons(config)
    if alg.warps in CONV_WARPS:
        warps_m, warps_n = conv_warp_grid(alg.tile_n, alg.warps)
        if alg.tile_m % (MMA_ROWS * warps_m):
            reasons.append(
                f"tile_m={alg.tile_m} is not a multiple of 16*WarpsM={MMA_ROWS * warps_m}: "
                f"{alg.warps} warps in a {warps_m}x{warps_n} grid each own whole 16-row MMA tiles"
            )
        if alg.tile_n % (MMA_ROWS * warps_n):
            reasons.append(
                f"tile_n={alg.tile_n} is not a multiple of 16*WarpsN={MMA_ROWS * warps_n}: "
                f"{alg.warps} warps in a {warps_m}x{warps_n} grid each own whole 16-column "
                "MMA tiles"
            )
    return reasons


def smem_reasons(config: KernelConfig, arch: ArchSpec, launched: int, table: str) -> list[str]:
    """An implicit-GEMM template's `launched` bytes (its operand stages and the table that
    `table` describes) against the arch's shared memory."""
    alg = config.algorithm
    if launched <= arch.max_dynamic_smem_per_block:
        return []
    elem = ELEMENT_BYTES.get(config.signature.dtype, 2)
    return [
        (
            f"shared memory {launched} bytes ({alg.stages} stages x (A {alg.tile_m}x{alg.tile_k} "
            f"+ B {alg.tile_n}x{alg.tile_k}), {elem} B each, + {table}) exceeds {arch.name}'s "
            f"limit of {arch.max_dynamic_smem_per_block} bytes per block; use fewer stages or a "
            "smaller tile"
        )
    ]


def _smem_reasons(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """The forward's implicit-GEMM stages and row table against the arch's shared memory."""
    sig, alg = config.signature, config.algorithm
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    launched = conv_smem_launch_bytes(alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, elem)
    table = f"{alg.tile_m} rows x {CONV_ROW_BYTES} B of row table"
    return smem_reasons(config, arch, launched, table)


def conv_fwd_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the conv forward template: fp16/bf16, 2D or 3D, a channel vector of 8, 4, 2
    or 1, its tile shapes and warp grids, and its stages within the arch's shared memory."""
    reasons = _signature_reasons(config) + _tile_reasons(config)
    return reasons + min_arch_reasons(CONV_FWD, arch) + _smem_reasons(config, arch)


def conv_fwd_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The threads, warp grid and shared memory the rules check, which ConvFwdSm80Traits
    computes from the same template arguments: the operand stages, and with the row table the
    bytes the launch asks for, which the rules hold to the arch's limit."""
    sig, alg = config.signature, config.algorithm
    warps_m, warps_n = conv_warp_grid(alg.tile_n, alg.warps)
    tile = (alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, ELEMENT_BYTES.get(sig.dtype, 2))
    return assertions_from(
        __name__,
        ("kThreads", alg.warps * 32, "threads per CTA"),
        ("kWarpsM", warps_m, "warps along the output positions"),
        ("kWarpsN", warps_n, "warps along the output channels"),
        ("kSmemBytes", conv_smem_bytes(*tile), "shared-memory bytes of the operand stages"),
        ("kSmemLaunchBytes", conv_smem_launch_bytes(*tile), "shared-memory bytes per CTA"),
    )


TEMPLATE = TemplateRules(conv_fwd_rules, conv_fwd_traits_assertions)


# The sm90 template (ConvFwdSm90Traits): the same gathers feeding wgmma. Warpgroups of four
# warps stack along the output positions, each owning whole 64-row wgmma tiles; wgmma's N runs
# from 16 to 256 output channels. Loads run stages - 2 tiles ahead (one more stage is read by
# the wgmma batch left in flight), so three stages is the least.
SM90_WARPS = (4, 8, 12)
SM90_TILE_N = (16, 32, 64, 128, 256)
SM90_STAGES = tuple(range(3, 9))
WGMMA_ROWS = 64
# Two CTAs share an SM where both fit in this much shared memory (kMinCtasPerSm); ptxas then
# holds each thread to half the register file's share.
SM90_TWO_CTA_SMEM = 220 * 1024


# Channel vectors narrower than this keep one CTA an SM: their copies need the registers.
SM90_TWO_CTA_MIN_VECTOR = 4


def sm90_min_ctas_per_sm(config: KernelConfig) -> int:
    """CTAs an SM holds at once that the kernel's registers are sized for: two where their
    shared memory fits and the channel vector is 4 or 8 (ConvFwdSm90Traits::kMinCtasPerSm),
    else one."""
    alg = config.algorithm
    elem = ELEMENT_BYTES.get(config.signature.dtype, 2)
    smem = conv_smem_launch_bytes(alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, elem)
    wide = getattr(config.signature, "vector", 0) >= SM90_TWO_CTA_MIN_VECTOR
    return 2 if 2 * smem <= SM90_TWO_CTA_SMEM and wide else 1


def _sm90_tile_reasons(config: KernelConfig) -> list[str]:
    alg = config.algorithm
    reasons: list[str] = []
    if alg.warps not in SM90_WARPS:
        reasons.append(
            f"warps={alg.warps} is not supported; the sm90 conv template runs whole warpgroups: "
            f"{', '.join(map(str, SM90_WARPS))} warps"
        )
    elif alg.tile_m <= 0 or alg.tile_m % (WGMMA_ROWS * (alg.warps // 4)):
        reasons.append(
            f"tile_m={alg.tile_m} is not a multiple of 64 x {alg.warps // 4} warpgroups: each "
            "warpgroup owns whole 64-row wgmma tiles"
        )
    if alg.tile_n not in SM90_TILE_N:
        reasons.append(
            f"tile_n={alg.tile_n} output channels is not supported; supported: "
            f"{', '.join(map(str, SM90_TILE_N))} (wgmma N)"
        )
    if alg.tile_k not in CONV_TILE_K:
        reasons.append(
            f"tile_k={alg.tile_k} reduction elements per stage is not supported; supported: "
            f"{', '.join(map(str, CONV_TILE_K))} (64- or 128-byte swizzled rows)"
        )
    if alg.stages not in SM90_STAGES:
        reasons.append(
            f"stages={alg.stages} is not supported; the sm90 conv template keeps "
            f"{SM90_STAGES[0]} to {SM90_STAGES[-1]} stages (loads run stages - 2 tiles ahead)"
        )
    if alg.ctas_per_sm != 1:
        reasons.append(
            f"ctas_per_sm={alg.ctas_per_sm} is not supported; the sm90 conv template sizes its "
            "registers for two CTAs an SM where their shared memory fits (ctas_per_sm=1)"
        )
    return reasons


def conv_fwd_sm90_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the sm90 conv forward template: fp16/bf16, 2D or 3D, a channel vector of 8,
    4, 2 or 1, whole warpgroups of 64-row wgmma tiles, and its stages within the arch's shared
    memory."""
    reasons = _signature_reasons(config) + _sm90_tile_reasons(config)
    return reasons + _smem_reasons(config, arch)


def conv_fwd_sm90_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The threads, warpgroups, shared memory and CTAs per SM the rules assume, which
    ConvFwdSm90Traits computes from the same template arguments."""
    sig, alg = config.signature, config.algorithm
    tile = (alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, ELEMENT_BYTES.get(sig.dtype, 2))
    return assertions_from(
        __name__,
        ("kThreads", alg.warps * 32, "threads per CTA"),
        ("kWarpgroups", alg.warps // 4, "warpgroups along the output positions"),
        ("kSmemBytes", conv_smem_bytes(*tile), "shared-memory bytes of the operand stages"),
        ("kSmemLaunchBytes", conv_smem_launch_bytes(*tile), "shared-memory bytes per CTA"),
        ("kMinCtasPerSm", sm90_min_ctas_per_sm(config), "CTAs an SM holds at once"),
    )


SM90_TEMPLATE = TemplateRules(conv_fwd_sm90_rules, conv_fwd_sm90_traits_assertions)
