"""Limits of the sm80 forward template (cp.async + mma.sync, FwdSm80Traits), which also runs
the split-KV and paged families."""

from __future__ import annotations

from ..signature import PAGED_FAMILIES, KernelConfig
from ..specs import ArchSpec
from .common import (
    ELEMENT_BYTES,
    MAX_ACCUMULATOR_REGISTERS,
    MMA_ROWS,
    TemplateRules,
    template_basics,
)
from .splitkv_paged import paged_reasons, splitkv_feature_reasons
from .traits_assertions import TraitsAssertion, assertions_from

# Registers besides the accumulators: MMA operand fragments, tile addresses, softmax state.
NON_ACCUMULATOR_REGISTERS = 32
# K/V shared-memory stages of the sm80 template: single- or double-buffered.
SM80_STAGES = (1, 2)
# fp8 K/V: twice as many stages of bytes (FwdSm80Traits::kFp8Stages). Many CTAs a SM hide the
# loads of 16-key tiles, where a second pair of stages costs a CTA slot (NOTES 101).
SM80_FP8_KV_STAGES = (1, 2)


def sm80_fwd_smem_bytes(
    hdim_q: int,
    hdim_v: int,
    tile_m: int,
    tile_n: int,
    stages: int,
    elem: int = 2,
    kv_fp8: bool = False,
) -> int:
    """Q (O is staged over it, so the larger of the two tiles) and `stages` K and V tiles;
    with fp8 K/V, 2 * `stages` stages of bytes (as many bytes in flight, twice the keys),
    widened into one K and V tile of `elem`-byte elements. FwdSm80Traits::kSmemBytes."""
    kv_elems = tile_n * (hdim_q + hdim_v)
    kv_bytes = 2 * stages * kv_elems + kv_elems * elem if kv_fp8 else stages * kv_elems * elem
    return tile_m * max(hdim_q, hdim_v) * elem + kv_bytes


def sm80_fwd_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the sm80 forward template (cp.async + mma.sync, K/V single-buffered)."""
    sig, alg = config.signature, config.algorithm
    reasons = template_basics(config)
    if sig.family == "fwd_splitkv" or sig.family in PAGED_FAMILIES:
        reasons.extend(splitkv_feature_reasons(config))
    if sig.family in PAGED_FAMILIES:
        reasons.extend(paged_reasons(config))
    if alg.warps > 0 and (alg.tile_m <= 0 or alg.tile_m % (MMA_ROWS * alg.warps)):
        reasons.append(
            f"tile_m={alg.tile_m} is not a positive multiple of 16*warps={MMA_ROWS * alg.warps}; "
            "each warp owns a whole number of 16-row MMA tiles"
        )
    if alg.tile_n <= 0 or alg.tile_n % MMA_ROWS:
        reasons.append(
            f"tile_n={alg.tile_n} is not a positive multiple of {MMA_ROWS}; key tiles feed "
            "16-wide MMA steps"
        )
    if sig.kv_quant != "none" and alg.stages not in SM80_FP8_KV_STAGES:
        reasons.append(
            f"stages={alg.stages} with fp8 K/V: the body keeps 2 x stages byte stages, one "
            "(stages=1) or three (stages=2) tiles in flight while one is widened and used"
        )
    if alg.stages not in SM80_STAGES:
        reasons.append(
            f"stages={alg.stages} is not supported; the {alg.pipeline} template buffers K and V "
            f"in {' or '.join(map(str, SM80_STAGES))} shared-memory stages"
        )
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    smem = sm80_fwd_smem_bytes(
        sig.hdim_q, sig.hdim_v, alg.tile_m, alg.tile_n, alg.stages, elem, sig.kv_quant != "none"
    )
    if smem > arch.max_dynamic_smem_per_block:
        if sig.kv_quant != "none":
            stages = (
                f"Q {alg.tile_m}x{sig.hdim_q} x {elem} B + {2 * alg.stages} byte stages of K "
                f"{alg.tile_n}x{sig.hdim_q} + V {alg.tile_n}x{sig.hdim_v} (fp8 K/V) + one fp16 K "
                "and V tile"
            )
        else:
            stages = (
                f"Q {alg.tile_m}x{sig.hdim_q} + {alg.stages} x (K {alg.tile_n}x{sig.hdim_q} + V "
                f"{alg.tile_n}x{sig.hdim_v}), {elem} B each"
            )
        reasons.append(
            f"shared memory {smem} bytes ({stages}) exceeds {arch.name}'s limit of "
            f"{arch.max_dynamic_smem_per_block} bytes per block"
        )
    if alg.ctas_per_sm < 1:
        reasons.append(f"ctas_per_sm={alg.ctas_per_sm} must be at least 1")
    elif smem * alg.ctas_per_sm > arch.max_dynamic_smem_per_block:
        reasons.append(
            f"ctas_per_sm={alg.ctas_per_sm} needs {smem * alg.ctas_per_sm} bytes of shared "
            f"memory per SM ({smem} per CTA); {arch.name} offers {arch.max_dynamic_smem_per_block}"
        )
    if alg.warps > 0:
        acc = (alg.tile_m * sig.hdim_v + alg.tile_m * alg.tile_n) // (alg.warps * 32)
        if acc > MAX_ACCUMULATOR_REGISTERS:
            reasons.append(
                f"estimated {acc} accumulator registers per thread (O {alg.tile_m}x{sig.hdim_v} "
                f"+ S {alg.tile_m}x{alg.tile_n} over {alg.warps * 32} threads) exceeds "
                f"{MAX_ACCUMULATOR_REGISTERS}; use a smaller tile or more warps"
            )
        if alg.ctas_per_sm >= 1:
            # ptxas allocates registers in units of 8 per thread.
            budget = arch.registers_per_sm // (alg.warps * 32 * alg.ctas_per_sm) // 8 * 8
            budget = min(budget, arch.max_registers_per_thread)
            if acc + NON_ACCUMULATOR_REGISTERS > budget:
                reasons.append(
                    f"ctas_per_sm={alg.ctas_per_sm} caps registers at {budget} per thread, "
                    f"under the {acc} accumulators + {NON_ACCUMULATOR_REGISTERS} for operands, "
                    "addresses and softmax state; lower ctas_per_sm or shrink the tile"
                )
    return reasons


def sm80_fwd_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The shared memory the rules fit under the arch's limit, and the threads and CTAs per SM
    the register budget is worked out for (kMinCtasPerSm is the __launch_bounds__ occupancy that
    caps ptxas's registers per thread)."""
    sig, alg = config.signature, config.algorithm
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    smem = sm80_fwd_smem_bytes(
        sig.hdim_q, sig.hdim_v, alg.tile_m, alg.tile_n, alg.stages, elem, sig.kv_quant != "none"
    )
    return assertions_from(
        __name__,
        ("kSmemBytes", smem, "shared-memory bytes"),
        ("kThreads", alg.warps * 32, "threads per CTA"),
        ("kMinCtasPerSm", alg.ctas_per_sm, "CTAs per SM of the register budget"),
    )


TEMPLATE = TemplateRules(sm80_fwd_rules, sm80_fwd_traits_assertions)
