"""Limits of the split-KV combine kernel (FwdSplitKvCombineTraits): a CUDA-core kernel that
merges the fp32 partials of the split stage."""

from __future__ import annotations

from ..signature import KernelConfig
from ..specs import ArchSpec, hdim_label
from .common import TemplateRules, named_if_on, template_basics
from .traits_assertions import TraitsAssertion, assertions_from

# Combine: each thread merges one 16-byte fp32 vector (4 columns) of a row.
COMBINE_COLUMNS_PER_THREAD = 4


def combine_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the split-KV combine kernel: whole rows per CTA, one 16-byte fp32 vector per
    thread, and nothing to compute but the merge (mask, bias and features belong to the split
    stage)."""
    sig, alg = config.signature, config.algorithm
    reasons = template_basics(config)
    if sig.hdim_q != sig.hdim_v:
        reasons.append(
            f"head dims {hdim_label(sig.hdim_q, sig.hdim_v)}: combine kernels are keyed by hdim_v "
            "alone, so their signature has hdim_q == hdim_v"
        )
    extras = named_if_on(
        (f"mask {sig.mask!r}", sig.mask != "none"),
        (f"bias {sig.bias!r}", sig.bias != "none"),
        ("dropout", sig.dropout),
        ("softcap", sig.softcap),
        ("sink", sig.sink),
        ("column-major V", sig.v_col_major),
        ("no LSE", not sig.lse),
    )
    if extras:
        reasons.append(
            f"{', '.join(extras)}: a combine kernel only merges partials (mask 'none', no "
            "features, LSE written when asked); the split stage computes the rest"
        )
    if alg.tile_n != COMBINE_COLUMNS_PER_THREAD:
        reasons.append(
            f"tile_n={alg.tile_n} must be {COMBINE_COLUMNS_PER_THREAD}: each thread merges one "
            "16-byte fp32 vector of a row"
        )
    row_threads = alg.tile_m * sig.hdim_v // alg.tile_n if alg.tile_n > 0 else 0
    if alg.warps > 0 and (alg.tile_m < 1 or row_threads <= 0 or (alg.warps * 32) % row_threads):
        reasons.append(
            f"warps*32={alg.warps * 32} threads must be a multiple of tile_m={alg.tile_m} rows x "
            f"hdim_v={sig.hdim_v} / tile_n={alg.tile_n}: each CTA merges whole rows, and the "
            "threads beyond one per 16-byte vector form groups that share a row's splits"
        )
    if alg.stages != 1 or alg.ctas_per_sm != 1:
        reasons.append(
            f"stages={alg.stages}, ctas_per_sm={alg.ctas_per_sm}: the combine kernel has no "
            "pipeline stages or occupancy parameter (both 1)"
        )
    return reasons


def combine_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The tile the kernel table records: tile_m rows per CTA and tile_n columns per thread,
    which the instance does not pass (the traits derive them from hdim_v and warps)."""
    alg = config.algorithm
    return assertions_from(
        __name__,
        ("kThreads", alg.warps * 32, "threads per CTA"),
        ("kColsPerThread", alg.tile_n, "columns per thread (tile_n)"),
        ("kRowsPerCta", alg.tile_m, "rows per CTA (tile_m)"),
    )


TEMPLATE = TemplateRules(combine_rules, combine_traits_assertions)
