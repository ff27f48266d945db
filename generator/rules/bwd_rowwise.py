"""Limits of the backward's row-wise stages (bwd_dot_do_o, bwd_convert_dq; BwdRowwiseTraits):
plain 16-byte vector passes over rows, on the sm80 path of every arch."""

from __future__ import annotations

from ..signature import KernelConfig
from ..specs import ArchSpec
from .common import ELEMENT_BYTES, TemplateRules, template_basics
from .traits_assertions import TraitsAssertion, assertions_from

# Row-wise stages: rows of BlockM per CTA, a row's 16-byte vectors spread over 2 to 8 lanes.
ROWWISE_MIN_VECTORS = 2


def _lanes_per_row(config: KernelConfig) -> int:
    """Lanes sharing one row: the largest power of two up to 8 dividing the row's vectors."""
    sig = config.signature
    vectors = sig.hdim_q * ELEMENT_BYTES.get(sig.dtype, 2) // 16
    return 8 if vectors % 8 == 0 else 4 if vectors % 4 == 0 else 2


def rowwise_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the row-wise backward stages (bwd_dot_do_o, bwd_convert_dq)."""
    sig, alg = config.signature, config.algorithm
    reasons = template_basics(config)
    if sig.hdim_q != sig.hdim_v:
        reasons.append(
            f"{sig.family} passes over one head dim; its signature carries it twice, got "
            f"{sig.hdim_q}x{sig.hdim_v}"
        )
    if alg.tile_n != 0 or alg.stages != 1 or alg.ctas_per_sm != 1:
        reasons.append(
            f"{sig.family} has no key tile, stages or occupancy knob: tile_n=0, stages=1, "
            f"ctas_per_sm=1 (got {alg.tile_n}, {alg.stages}, {alg.ctas_per_sm})"
        )
    if alg.warps > 0 and alg.tile_m > 0:
        lanes = _lanes_per_row(config)
        rows_per_pass = alg.warps * 32 // lanes
        if alg.tile_m % rows_per_pass:
            reasons.append(
                f"tile_m={alg.tile_m} is not a multiple of {rows_per_pass}: {alg.warps * 32} "
                f"threads cover {rows_per_pass} rows of {lanes} lanes per pass, and a pass must "
                "hold whole warps for the row reduction's shuffles"
            )
    else:
        reasons.append(f"tile_m={alg.tile_m} and warps={alg.warps} must be positive")
    return reasons


def rowwise_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The lanes per row and rows per pass the rules hold tile_m to."""
    alg = config.algorithm
    lanes = _lanes_per_row(config)
    return assertions_from(
        __name__,
        ("kThreads", alg.warps * 32, "threads per CTA"),
        ("kLanesPerRow", lanes, "lanes per row"),
        ("kRowsPerPass", alg.warps * 32 // lanes, "rows per pass"),
    )


TEMPLATE = TemplateRules(rowwise_rules, rowwise_traits_assertions)
