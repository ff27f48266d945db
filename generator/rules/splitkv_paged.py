"""What the split-KV variant of the sm80 forward template leaves out, and what its paged address
mode (fwd_pagedkv, batch_prefill) needs on top; the sm80 forward rules apply these to those
families besides its own limits."""

from __future__ import annotations

from ..signature import BATCH_PREFILL, FWD_PAGEDKV, KernelConfig
from ..specs import hdim_label
from .common import named_if_on

# Paged families and the query mode each serves: decode steps over a paged cache take batch-mode
# queries, batch prefill ragged (group-mode) ones.
PAGED_FAMILY_MODES = {FWD_PAGEDKV: "batch", BATCH_PREFILL: "group"}
# The paged body loads K and V of a key tile together (double-buffered only).
PAGED_STAGES = 2


def splitkv_feature_reasons(config: KernelConfig) -> list[str]:
    """What the split-KV variant of the sm80 template leaves out: per-split partials are merged
    by LSE alone, so features that need the head of a packed row (bias, dropout) or a term added
    once per row (sink) are not in it, nor is column-major V (not built for it yet)."""
    sig = config.signature
    unsupported = named_if_on(
        (f"bias {sig.bias!r}", sig.bias != "none"),
        ("dropout", sig.dropout),
        ("sink", sig.sink),
        ("column-major V", sig.v_col_major),
    )
    if not unsupported:
        return []
    reason = (
        f"{', '.join(unsupported)} not implemented by {sig.family}; it covers masks, soft-cap, "
        "LSE, GQA and group mode, and the one-stage fwd kernels cover the rest"
    )
    return [reason]


def paged_reasons(config: KernelConfig) -> list[str]:
    """What the paged address mode of the split-KV body needs beyond the split-KV limits."""
    sig, alg = config.signature, config.algorithm
    reasons: list[str] = []
    mode = PAGED_FAMILY_MODES[sig.family]
    if sig.mode != mode:
        other = next(f for f, m in PAGED_FAMILY_MODES.items() if m == sig.mode)
        reasons.append(
            f"mode {sig.mode!r}: {sig.family} takes {mode}-mode queries; {other} serves "
            f"{sig.mode}-mode queries over a paged cache"
        )
    if sig.hdim_q != sig.hdim_v:
        reasons.append(
            f"head dims {hdim_label(sig.hdim_q, sig.hdim_v)}: K and V rows share one page lookup "
            "per key row and one copy partition, so hdim_q must equal hdim_v"
        )
    # fp8 K/V has its own byte stages (sm80_fwd.py's stages rule), loaded K and V together.
    if alg.stages != PAGED_STAGES and sig.kv_quant == "none":
        reasons.append(
            f"stages={alg.stages}: the paged body loads a key tile's K and V rows together, "
            f"double-buffered (stages={PAGED_STAGES})"
        )
    if sig.page_layout == "vectorized" and alg.tile_n % 32 != 0:
        reasons.append(
            f"tile_n={alg.tile_n} with vectorized pages: V is loaded per channel as rows of "
            "tile_n keys, swizzled in 32- or 64-key chunks, so tile_n must be a multiple of 32"
        )
    return reasons
