"""Limits of the append kernel (FwdAppendKvTraits): new K/V tokens copied into a KV cache, with
optional RoPE, a memory-bound kernel of its own."""

from __future__ import annotations

from ..signature import APPENDKV, ROPE_MODES, KernelConfig
from ..specs import ArchSpec
from .common import ELEMENT_BYTES, TemplateRules, template_basics
from .traits_assertions import TraitsAssertion, assertions_from

# Append kernel: each thread keeps this many 16-byte vectors (and half-rotated partners) in
# registers between its loads and its stores.
APPENDKV_MAX_VECTORS_PER_THREAD = 16


def _vectors_per_thread(config: KernelConfig) -> int:
    """16-byte K and V vectors of the CTA's tokens each thread holds (FwdAppendKvTraits'
    kKvItems)."""
    sig, alg = config.signature, config.algorithm
    vector = 16 // ELEMENT_BYTES.get(sig.dtype, 2)
    row_vectors = (sig.hdim_q + sig.hdim_v) // vector
    return -(-alg.tile_m * row_vectors // (alg.warps * 32))


def appendkv_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the append kernel: tile_m tokens of one head per CTA, 16-byte vectors, all of
    a thread's vectors loaded before any is stored."""
    sig, alg = config.signature, config.algorithm
    reasons = template_basics(config)
    rope = getattr(sig, "rope", None)
    if rope not in ROPE_MODES:
        reasons.append(f"rope {rope!r} is unknown; supported: {', '.join(ROPE_MODES)}")
    if sig.family != APPENDKV:
        reasons.append(f"the appendkv template computes {APPENDKV} only, not {sig.family!r}")
    if alg.tile_n != 0 or alg.stages != 1 or alg.ctas_per_sm != 1:
        reasons.append(
            f"{APPENDKV} has no key tile, stages or occupancy knob: tile_n=0, stages=1, "
            f"ctas_per_sm=1 (got {alg.tile_n}, {alg.stages}, {alg.ctas_per_sm})"
        )
    if alg.tile_m < 1 or alg.warps < 1:
        reasons.append(f"tile_m={alg.tile_m} tokens and warps={alg.warps} must be positive")
        return reasons
    vector = 16 // ELEMENT_BYTES.get(sig.dtype, 2)
    row_vectors = (sig.hdim_q + sig.hdim_v) // vector
    per_thread = _vectors_per_thread(config)
    if per_thread > APPENDKV_MAX_VECTORS_PER_THREAD:
        reasons.append(
            f"{per_thread} vectors per thread ({alg.tile_m} tokens x {row_vectors} 16-byte "
            f"K and V vectors over {alg.warps * 32} threads) exceeds "
            f"{APPENDKV_MAX_VECTORS_PER_THREAD} held in registers; use fewer tokens per CTA or "
            "more warps"
        )
    return reasons


def appendkv_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The vectors per thread the rules hold to APPENDKV_MAX_VECTORS_PER_THREAD registers."""
    alg = config.algorithm
    facts: list[tuple[str, int | bool, str]] = [("kThreads", alg.warps * 32, "threads per CTA")]
    if alg.warps > 0:
        facts.append(("kKvItems", _vectors_per_thread(config), "K/V vectors per thread"))
    return assertions_from(__name__, *facts)


TEMPLATE = TemplateRules(appendkv_rules, appendkv_traits_assertions)
