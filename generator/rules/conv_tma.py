"""Limits of the grouped-convolution forward fed by the copy engine (ConvFwdTmaTraits,
pipeline sm90_tma_wgmma): one producer warpgroup asks for each k-tile's x tile in im2col mode
and w tile as a 3D box, one or two consumer warpgroups multiply them with wgmma. The copy engine
moves 16-byte channel runs, so only the 8-channel vector of fp16/bf16 applies; a k-tile is
tile_k channels of one filter tap, 64 or 128 bytes, the swizzle span of its shared-memory rows.
What depends on the problem (channels a multiple of tile_k, the im2col walk's corner and stride
limits) the runtime checks per call (kernel::conv_tma_limit)."""

from __future__ import annotations

from ..signature import CONV_FWD, KernelConfig
from ..specs import ArchSpec
from .common import ELEMENT_BYTES, TemplateRules
from .conv import CONV_ROW_BYTES, problem_reasons, smem_reasons
from .traits_assertions import TraitsAssertion, assertions_from

TMA_VECTOR = 8
# A producer warpgroup and one or two consumer warpgroups.
TMA_WARPS = (8, 12)
TMA_TILE_M = (64, 128, 256)
TMA_TILE_N = (16, 32, 64, 128, 256)
TMA_TILE_K = (32, 64)
TMA_STAGES = tuple(range(2, 9))
WGMMA_ROWS = 64
# One barrier pair (full, empty) of 8 bytes each per stage.
BARRIER_BYTES = 16
WGMMA_ARITHMETIC = "wgmma, fp32 accumulators"
# The epilogue stores 8 KiB of a consumer warpgroup's output at a time through shared memory,
# rows padded by 16 bytes against bank conflicts.
EPILOGUE_CHUNK_BYTES = 8192
EPILOGUE_ROW_PAD = 16


def tma_epilogue_bytes(tile_m: int, tile_n: int, warps: int, elem: int) -> int:
    """The epilogue's chunk of every consumer warpgroup's rows: 8 KiB of output each (64
    channels of 64 rows), rows padded by 16 bytes (ConvFwdTmaTraits::kSmemEpilogueBytes)."""
    rows = tile_m // max(warps // 4 - 1, 1)
    cols = min(tile_n, EPILOGUE_CHUNK_BYTES // (rows * elem))
    return tile_m * (cols * elem + EPILOGUE_ROW_PAD)


def tma_smem_launch_bytes(
    tile_m: int, tile_n: int, tile_k: int, stages: int, elem: int, warps: int = 12
) -> int:
    """The operand stages, the epilogue's chunks, the row table the epilogue stores through and
    the stages' barriers (ConvFwdTmaTraits::kSmemLaunchBytes)."""
    return (
        stages * (tile_m + tile_n) * tile_k * elem
        + tma_epilogue_bytes(tile_m, tile_n, warps, elem)
        + tile_m * CONV_ROW_BYTES
        + BARRIER_BYTES * stages
    )


# Two CTAs share an SM where both fit in its 228 KiB, 1 KiB of each reserved by the system
# (ConvFwdTmaTraits::kMinCtasPerSm).
SM_SMEM_BYTES = 228 * 1024
CTA_RESERVED_SMEM = 1024


def tma_min_ctas_per_sm(config: KernelConfig) -> int:
    """CTAs an SM holds at once that the kernel's registers are sized for: two where their
    shared memory fits, else one."""
    alg = config.algorithm
    elem = ELEMENT_BYTES.get(config.signature.dtype, 2)
    smem = tma_smem_launch_bytes(alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, elem, alg.warps)
    return 2 if 2 * (smem + CTA_RESERVED_SMEM) <= SM_SMEM_BYTES else 1


def consumers(config: KernelConfig) -> int:
    """The consumer warpgroups of a TMA conv template: all but the producer."""
    return config.algorithm.warps // 4 - 1


def tma_signature_reasons(config: KernelConfig, family: str) -> list[str]:
    """What the TMA conv templates (forward and weight gradient) compute: `family`, fp16/bf16,
    2D or 3D, as an implicit GEMM at 8-channel vectors."""
    sig = config.signature
    reasons = problem_reasons(config, family, WGMMA_ARITHMETIC)
    if getattr(sig, "max_channels", 0) != 0:
        reasons.append(
            f"max_channels={sig.max_channels} is the direct template's channel bucket; the TMA "
            "template is an implicit GEMM (max_channels=0)"
        )
    vector = getattr(sig, "vector", None)
    if vector != TMA_VECTOR:
        reasons.append(
            f"vector={vector} is not supported by the TMA template: the copy engine moves whole "
            f"16-byte channel runs (vector={TMA_VECTOR}); narrower vectors run on the gathering "
            "templates"
        )
    return reasons


def tma_warps_reasons(config: KernelConfig) -> list[str]:
    """A producer warpgroup and one or two consumer warpgroups."""
    warps = config.algorithm.warps
    if warps in TMA_WARPS:
        return []
    choices = " or ".join(map(str, TMA_WARPS))
    reason = (
        f"warps={warps} is not supported; the TMA template runs a producer warpgroup "
        f"and one or two consumer warpgroups: {choices} warps"
    )
    return [reason]


def tma_stage_reasons(config: KernelConfig) -> list[str]:
    """The stages the TMA conv templates keep, and their registers sized by the traits."""
    alg = config.algorithm
    reasons: list[str] = []
    if alg.stages not in TMA_STAGES:
        reasons.append(
            f"stages={alg.stages} is not supported; the TMA template keeps "
            f"{TMA_STAGES[0]} to {TMA_STAGES[-1]} stages"
        )
    if alg.ctas_per_sm != 1:
        reasons.append(
            f"ctas_per_sm={alg.ctas_per_sm} is not supported; the TMA template sizes its "
            "registers for two CTAs an SM where their shared memory fits (ctas_per_sm=1)"
        )
    return reasons


def _tile_reasons(config: KernelConfig) -> list[str]:
    alg = config.algorithm
    reasons = tma_warps_reasons(config)
    if not reasons and (
        alg.tile_m not in TMA_TILE_M or alg.tile_m % (WGMMA_ROWS * consumers(config))
    ):
        reasons.append(
            f"tile_m={alg.tile_m} is not supported with {consumers(config)} consumer "
            f"warpgroups: one of {', '.join(map(str, TMA_TILE_M))} (the im2col copy's "
            "positions), a multiple of 64 rows per consumer warpgroup"
        )
    if alg.tile_n not in TMA_TILE_N:
        reasons.append(
            f"tile_n={alg.tile_n} output channels is not supported; supported: "
            f"{', '.join(map(str, TMA_TILE_N))} (wgmma N)"
        )
    if alg.tile_k not in TMA_TILE_K:
        reasons.append(
            f"tile_k={alg.tile_k} is not supported; supported: "
            f"{', '.join(map(str, TMA_TILE_K))} (one 64- or 128-byte swizzled row per position)"
        )
    return reasons + tma_stage_reasons(config)


def _smem_reasons(config: KernelConfig, arch: ArchSpec) -> list[str]:
    sig, alg = config.signature, config.algorithm
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    launched = tma_smem_launch_bytes(
        alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, elem, alg.warps
    )
    table = (
        f"{tma_epilogue_bytes(alg.tile_m, alg.tile_n, alg.warps, elem)} B of epilogue chunks, "
        f"{alg.tile_m} rows x {CONV_ROW_BYTES} B of row table and the stages' barriers"
    )
    return smem_reasons(config, arch, launched, table)


def conv_tma_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the TMA conv forward: fp16/bf16, 2D or 3D, 8-channel vectors, a producer and
    one or two consumer warpgroups of 64-row wgmma tiles, and its stages within the arch's
    shared memory (the pipeline itself is sm_90a's, arch_specs.json)."""
    reasons = tma_signature_reasons(config, CONV_FWD) + _tile_reasons(config)
    return reasons + _smem_reasons(config, arch)


def conv_tma_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The threads, consumer warpgroups and shared memory the rules assume, which
    ConvFwdTmaTraits computes from the same template arguments."""
    sig, alg = config.signature, config.algorithm
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    return assertions_from(
        __name__,
        ("kThreads", alg.warps * 32, "threads per CTA"),
        ("kConsumerWarpgroups", consumers(config), "warpgroups that multiply"),
        (
            "kSmemLaunchBytes",
            tma_smem_launch_bytes(
                alg.tile_m, alg.tile_n, alg.tile_k, alg.stages, elem, alg.warps
            ),
            "shared-memory bytes per CTA",
        ),
        ("kMinCtasPerSm", tma_min_ctas_per_sm(config), "CTAs an SM holds at once"),
    )


TEMPLATE = TemplateRules(conv_tma_rules, conv_tma_traits_assertions)
