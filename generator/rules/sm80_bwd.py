"""Limits of the sm80 backward main stage (bwd_dq_dk_dv on cp.async + mma.sync, BwdSm80Traits):
one CTA per key tile, walking the query tiles."""

from __future__ import annotations

from ..signature import KernelConfig
from ..specs import ArchSpec
from .common import ELEMENT_BYTES, MMA_ROWS, TemplateRules, template_basics
from .traits_assertions import TraitsAssertion, assertions_from

# bwd_dq_dk_dv keeps dK and dV (BlockN x head dims) and S, dP (BlockM x BlockN) in registers.
BWD_MAX_ACCUMULATOR_REGISTERS = 192
# Q/dO shared-memory stages of the sm80 backward template.
BWD_SM80_STAGES = (1, 2)
# P and dS rows are swizzled in 32- or 64-element chunks like head-dim rows.
BWD_KEY_TILE_MULTIPLE = 32


def squarest_warps_m(m: int, n: int, warps: int) -> int:
    """Warps along M of the warp grid whose warp tiles of an m x n product are the most nearly
    square (fewest shared-memory operand bytes per MMA), each warp owning whole 16 x 16 steps;
    0 when no grid fits. Must match squarest_warps_m in sm80/bwd_traits.cuh."""
    best, best_perimeter = 0, 0
    for wm in range(1, warps + 1):
        if warps % wm:
            continue
        wn = warps // wm
        if m % (MMA_ROWS * wm) or n % (MMA_ROWS * wn):
            continue
        perimeter = m // wm + n // wn
        if best == 0 or perimeter < best_perimeter:
            best, best_perimeter = wm, perimeter
    return best


def bwd_sm80_smem_bytes(
    hdim_q: int, hdim_v: int, tile_m: int, tile_n: int, stages: int, elem: int = 2
) -> int:
    """Q and dO stages, K, V, P and dS tiles; must match BwdSm80Traits::kSmemBytes."""
    return (
        stages * tile_m * (hdim_q + hdim_v) + tile_n * (hdim_q + hdim_v) + 2 * tile_m * tile_n
    ) * elem


def _load_rows(hdim: int, threads: int, elem: int) -> int:
    """Rows one pass of the 16-byte global->shared loads covers (SmemRows in the traits)."""
    chunk = 64 if hdim % 64 == 0 else 32
    return threads // (chunk * elem // 16)


def _warp_grid_products(config: KernelConfig) -> tuple[tuple[str, str, int, int], ...]:
    """(what, traits member of its warps along M, m, n) of each product the warps tile."""
    sig, alg = config.signature, config.algorithm
    return (
        ("S = Q K^T and dP = dO V^T", "kWarpsMSdP", alg.tile_m, alg.tile_n),
        ("dK += dS^T Q", "kWarpsMdK", alg.tile_n, sig.hdim_q),
        ("dV += P^T dO", "kWarpsMdV", alg.tile_n, sig.hdim_v),
        ("dQ = dS K", "kWarpsMdQ", alg.tile_m, sig.hdim_q),
    )


def sm80_bwd_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the sm80 backward template (bwd_dq_dk_dv: one CTA per key tile)."""
    sig, alg = config.signature, config.algorithm
    reasons = template_basics(config)
    if sig.dbias and sig.bias != "elementwise":
        reasons.append(
            f"dbias with bias {sig.bias!r}: dbias is the gradient of an elementwise bias "
            "(bias='elementwise'); ALiBi's slopes are constants with no gradient"
        )
    threads = alg.warps * 32
    if alg.warps <= 0:
        return reasons
    if sig.dbias and (alg.tile_n <= 0 or threads % max(1, alg.tile_n // 2)):
        reasons.append(
            f"tile_n={alg.tile_n} with {threads} threads: dbias zeroes the unvisited rows of a "
            "key tile one column pair per thread, so tile_n / 2 must divide the threads"
        )
    for what, _, m, n in _warp_grid_products(config):
        if m <= 0 or n <= 0 or squarest_warps_m(m, n, alg.warps) == 0:
            reasons.append(
                f"no grid of {alg.warps} warps tiles {what} ({m}x{n}) in whole 16x16 MMA steps; "
                "use tile sizes that are multiples of 16 * warps along some split"
            )
    if alg.tile_n <= 0 or alg.tile_n % BWD_KEY_TILE_MULTIPLE:
        reasons.append(
            f"tile_n={alg.tile_n} is not a positive multiple of {BWD_KEY_TILE_MULTIPLE}; P and "
            "dS rows are swizzled in 32- or 64-element chunks"
        )
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    for label, hdim in (("hdim_q", sig.hdim_q), ("hdim_v", sig.hdim_v)):
        rows = _load_rows(hdim, threads, elem)
        if rows > 0 and (alg.tile_m % rows or alg.tile_n % rows):
            reasons.append(
                f"tile_m={alg.tile_m} and tile_n={alg.tile_n} must be multiples of {rows}: one "
                f"pass of {threads} threads' 16-byte loads covers {rows} rows of {label}={hdim}"
            )
    if alg.stages not in BWD_SM80_STAGES:
        reasons.append(
            f"stages={alg.stages} is not supported; the {alg.pipeline} backward buffers Q and dO "
            f"in {' or '.join(map(str, BWD_SM80_STAGES))} shared-memory stages"
        )
    smem = bwd_sm80_smem_bytes(sig.hdim_q, sig.hdim_v, alg.tile_m, alg.tile_n, alg.stages, elem)
    if smem > arch.max_dynamic_smem_per_block:
        reasons.append(
            f"shared memory {smem} bytes ({alg.stages} x (Q {alg.tile_m}x{sig.hdim_q} + dO "
            f"{alg.tile_m}x{sig.hdim_v}) + K {alg.tile_n}x{sig.hdim_q} + V {alg.tile_n}x"
            f"{sig.hdim_v} + P and dS {alg.tile_m}x{alg.tile_n}, {elem} B each) exceeds "
            f"{arch.name}'s limit of {arch.max_dynamic_smem_per_block} bytes per block"
        )
    acc = (alg.tile_n * (sig.hdim_q + sig.hdim_v) + 2 * alg.tile_m * alg.tile_n) // threads
    if acc > BWD_MAX_ACCUMULATOR_REGISTERS:
        reasons.append(
            f"estimated {acc} accumulator registers per thread (dK, dV {alg.tile_n}x"
            f"({sig.hdim_q}+{sig.hdim_v}) + S, dP 2x{alg.tile_m}x{alg.tile_n} over {threads} "
            f"threads) exceeds {BWD_MAX_ACCUMULATOR_REGISTERS}; use a smaller tile or more warps"
        )
    if alg.ctas_per_sm != 1:
        reasons.append(
            f"ctas_per_sm={alg.ctas_per_sm} is not supported by the {alg.pipeline} backward "
            "(ctas_per_sm=1)"
        )
    return reasons


def sm80_bwd_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The shared memory the rules fit under the arch's limit, the warp grid of each product
    (squarest_warps_m mirrors the traits' own), and the threads and CTAs per SM."""
    sig, alg = config.signature, config.algorithm
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    smem = bwd_sm80_smem_bytes(sig.hdim_q, sig.hdim_v, alg.tile_m, alg.tile_n, alg.stages, elem)
    grids = [
        (member, squarest_warps_m(m, n, alg.warps), f"warps along M of {what}")
        for what, member, m, n in _warp_grid_products(config)
    ]
    return assertions_from(
        __name__,
        ("kSmemBytes", smem, "shared-memory bytes"),
        ("kThreads", alg.warps * 32, "threads per CTA"),
        ("kMinCtasPerSm", alg.ctas_per_sm, "CTAs per SM"),
        *grids,
    )


TEMPLATE = TemplateRules(sm80_bwd_rules, sm80_bwd_traits_assertions)
