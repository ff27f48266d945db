"""Limits of the fp32 SIMT forward template (plain FFMA, FwdSimtTraits)."""

from __future__ import annotations

from ..signature import KernelConfig
from ..specs import ArchSpec
from .common import ELEMENT_BYTES, MAX_ACCUMULATOR_REGISTERS, TemplateRules, template_basics
from .traits_assertions import TraitsAssertion, assertions_from

# SIMT template: 128 threads as 16 row groups x 8 lanes; a row's 8 lanes own keys 8 apart, two
# per 16-key dropout block, so key tiles step in 16s. Q, K and P rows are padded so that 8 lanes
# reading 8 rows (or 32 lanes writing 4 rows) hit distinct banks.
SIMT_WARPS = 4
SIMT_ROW_GROUPS = 16
SIMT_LANES = 8
SIMT_KEY_MULTIPLE = 16
SIMT_QK_PAD = 4
SIMT_P_PAD = 8


def simt_smem_bytes(hdim_q: int, hdim_v: int, tile_m: int, tile_n: int, elem: int = 4) -> int:
    """Shared memory of the SIMT template: padded Q and K, V and the padded P tile;
    FwdSimtTraits::kSmemBytes."""
    return (
        tile_m * (hdim_q + SIMT_QK_PAD)
        + tile_n * (hdim_q + SIMT_QK_PAD)
        + tile_n * hdim_v
        + tile_m * (tile_n + SIMT_P_PAD)
    ) * elem


def simt_fwd_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the fp32 SIMT forward template (plain FFMA, K/V single-buffered)."""
    sig, alg = config.signature, config.algorithm
    reasons = template_basics(config)
    if alg.warps != SIMT_WARPS:
        reasons.append(
            f"warps={alg.warps} is not supported; the {alg.pipeline} template maps exactly "
            f"{SIMT_WARPS * 32} threads to {SIMT_ROW_GROUPS} row groups x {SIMT_LANES} lanes "
            f"(warps={SIMT_WARPS})"
        )
    if alg.tile_m <= 0 or alg.tile_m % SIMT_ROW_GROUPS:
        reasons.append(
            f"tile_m={alg.tile_m} is not a positive multiple of {SIMT_ROW_GROUPS}; each of the "
            f"{SIMT_ROW_GROUPS} row groups owns every {SIMT_ROW_GROUPS}th query row"
        )
    if alg.tile_n <= 0 or alg.tile_n % SIMT_KEY_MULTIPLE:
        reasons.append(
            f"tile_n={alg.tile_n} is not a positive multiple of {SIMT_KEY_MULTIPLE}; each of "
            f"the {SIMT_LANES} lanes of a row owns key pairs 8 apart inside one 16-key dropout "
            "block"
        )
    if alg.stages != 1:
        reasons.append(
            f"stages={alg.stages} is not supported; the {alg.pipeline} template single-buffers "
            "K and V (stages=1)"
        )
    if alg.ctas_per_sm != 1:
        reasons.append(
            f"ctas_per_sm={alg.ctas_per_sm} is not supported; the {alg.pipeline} template has "
            "no occupancy parameter (ctas_per_sm=1)"
        )
    if sig.v_col_major:
        reasons.append(
            f"column-major V is not implemented for {alg.pipeline} (fp32); store V row-major "
            "(head dim contiguous)"
        )
    elem = ELEMENT_BYTES.get(sig.dtype, 4)
    smem = simt_smem_bytes(sig.hdim_q, sig.hdim_v, alg.tile_m, alg.tile_n, elem)
    if smem > arch.max_dynamic_smem_per_block:
        reasons.append(
            f"shared memory {smem} bytes (Q {alg.tile_m}x{sig.hdim_q}+{SIMT_QK_PAD}, K "
            f"{alg.tile_n}x{sig.hdim_q}+{SIMT_QK_PAD}, V {alg.tile_n}x{sig.hdim_v}, P {alg.tile_m}x"
            f"{alg.tile_n}+{SIMT_P_PAD}, {elem} B each) exceeds {arch.name}'s limit of "
            f"{arch.max_dynamic_smem_per_block} bytes per block; use a smaller tile"
        )
    if alg.warps > 0 and alg.tile_m > 0 and alg.tile_n > 0:
        threads = alg.warps * 32
        acc = (alg.tile_m * sig.hdim_v + alg.tile_m * alg.tile_n) // threads
        # One 4-wide operand vector per owned row (Q) and per owned key (K) per k-step.
        operands = 4 * (alg.tile_m // SIMT_ROW_GROUPS) + 4 * (alg.tile_n // SIMT_LANES)
        if acc + operands > MAX_ACCUMULATOR_REGISTERS:
            reasons.append(
                f"estimated {acc + operands} registers per thread for accumulators and operands "
                f"(O {alg.tile_m}x{sig.hdim_v} + S {alg.tile_m}x{alg.tile_n} over {threads} "
                f"threads, plus {operands} for Q/K vectors) exceeds "
                f"{MAX_ACCUMULATOR_REGISTERS}; use a smaller tile_n or tile_m"
            )
    return reasons


def simt_fwd_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The shared memory the rules fit under the arch's limit, and the thread mapping their
    register estimate counts operands by (rows and keys each thread owns)."""
    sig, alg = config.signature, config.algorithm
    elem = ELEMENT_BYTES.get(sig.dtype, 4)
    smem = simt_smem_bytes(sig.hdim_q, sig.hdim_v, alg.tile_m, alg.tile_n, elem)
    return assertions_from(
        __name__,
        ("kSmemBytes", smem, "shared-memory bytes"),
        ("kThreads", alg.warps * 32, "threads per CTA"),
        ("kRowsPerThread", alg.tile_m // SIMT_ROW_GROUPS, "query rows per thread"),
        ("kKeysPerThread", alg.tile_n // SIMT_LANES, "keys per thread"),
    )


TEMPLATE = TemplateRules(simt_fwd_rules, simt_fwd_traits_assertions)
