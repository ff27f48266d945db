"""Rules every template shares: what the arch offers, the signature fields every kernel knows,
and what each template needs of a config before its own limits (a dtype it computes in, the
whole head dim resident)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..signature import (
    CONV_FAMILIES,
    KV_QUANTS,
    PAGE_LAYOUTS,
    PAGED_FAMILIES,
    Q_QUANTS,
    KernelConfig,
)
from ..specs import ArchSpec, hdim_label
from .pipelines import (
    FAMILY_PIPELINES,
    PIPELINE_DTYPES,
    Q_FP8_FAMILY,
    Q_FP8_PIPELINE,
    SUPPORTED_FAMILIES,
)
from .traits_assertions import TraitsAssertion

ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
SUPPORTED_MASKS = ("none", "causal", "window")
SUPPORTED_BIASES = ("none", "elementwise", "alibi")
KNOWN_MODES = ("batch", "group")
# Above this many accumulator registers per thread the compiler spills: the O accumulator and
# the S/P tile both live in registers next to addressing and softmax state.
MAX_ACCUMULATOR_REGISTERS = 192
# Shared-memory rows are swizzled in 32- or 64-element chunks (16-byte vectors within).
HDIM_MULTIPLE = 32
MAX_HDIM = 256
# mma.sync m16n8k16: each warp owns 16 query rows; key tiles step in 16s.
MMA_ROWS = 16

Rule = Callable[[KernelConfig, ArchSpec], list[str]]


@dataclass(frozen=True)
class TemplateRules:
    """One kernel template's limits (the reasons a config cannot be built on it), the
    numbers its instances assert against its traits struct, and whether an instance takes
    only elementwise biases broadcast over the query rows (its kernel entry's
    bias_rows_only, which the runtime's selection reads)."""

    check: Rule
    traits_assertions: Callable[[KernelConfig], tuple[TraitsAssertion, ...]]
    bias_rows_only: Callable[[KernelConfig], bool] = lambda config: False


def arch_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    sig, alg = config.signature, config.algorithm
    reasons: list[str] = []
    if sig.family not in SUPPORTED_FAMILIES:
        reasons.append(
            f"family {sig.family!r} is not implemented; supported: {', '.join(SUPPORTED_FAMILIES)}"
        )
    elif alg.pipeline not in FAMILY_PIPELINES[sig.family]:
        reasons.append(
            f"family {sig.family!r} has no {alg.pipeline!r} template; it runs on "
            f"{', '.join(FAMILY_PIPELINES[sig.family])}"
        )
    if alg.arch != arch.name:
        reasons.append(f"config targets arch {alg.arch!r} but is checked against {arch.name!r}")
    if sig.dtype not in arch.dtypes:
        reasons.append(
            f"dtype {sig.dtype!r} is not supported on {arch.name}; supported: "
            f"{', '.join(arch.dtypes)}"
        )
    if alg.pipeline not in arch.pipelines:
        reasons.append(
            f"pipeline {alg.pipeline!r} is not available on {arch.name}; available: "
            f"{', '.join(arch.pipelines)}"
        )
    # Convolutions have no head dims (their signatures say 0); rules/conv.py sizes their tiles.
    if sig.family not in CONV_FAMILIES:
        reasons.extend(_head_dim_reasons(config, arch))
    if sig.bias not in SUPPORTED_BIASES:
        reasons.append(f"bias {sig.bias!r} is unknown; supported: {', '.join(SUPPORTED_BIASES)}")
    if sig.mask not in SUPPORTED_MASKS:
        reasons.append(f"mask {sig.mask!r} is unknown; supported: {', '.join(SUPPORTED_MASKS)}")
    if sig.mode not in KNOWN_MODES:
        reasons.append(f"mode {sig.mode!r} is unknown; supported: {', '.join(KNOWN_MODES)}")
    page_layout = getattr(sig, "page_layout", "linear")
    if page_layout not in PAGE_LAYOUTS:
        reasons.append(
            f"page_layout {page_layout!r} is unknown; supported: {', '.join(PAGE_LAYOUTS)}"
        )
    elif page_layout != "linear" and sig.family not in PAGED_FAMILIES:
        reasons.append(
            f"page_layout {page_layout!r} applies to the paged families "
            f"({', '.join(PAGED_FAMILIES)}) only; {sig.family} reads contiguous K/V"
        )
    reasons.extend(_kv_quant_reasons(config, arch))
    reasons.extend(_q_quant_reasons(config))
    if alg.warps <= 0 or alg.warps * 32 > arch.max_threads_per_block:
        reasons.append(
            f"warps={alg.warps} gives {alg.warps * 32} threads; {arch.name} allows 1 to "
            f"{arch.max_threads_per_block // 32} warps per block"
        )
    return reasons


def _head_dim_reasons(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Attention head dims: a tile table for them, and a size the shared-memory swizzle takes."""
    sig, alg = config.signature, config.algorithm
    reasons: list[str] = []
    hdims = arch.hdims_for(sig.family, alg.pipeline)
    if (sig.hdim_q, sig.hdim_v) not in hdims:
        listed = ", ".join(hdim_label(q, v) for q, v in hdims) or "none"
        reasons.append(
            f"head dims {hdim_label(sig.hdim_q, sig.hdim_v)} have no tile table for "
            f"{sig.family}/{alg.pipeline} on {arch.name}; head dims with tiles: {listed}"
        )
    for label, hdim in (("hdim_q", sig.hdim_q), ("hdim_v", sig.hdim_v)):
        if hdim <= 0 or hdim % HDIM_MULTIPLE or hdim > MAX_HDIM:
            reasons.append(
                f"{label}={hdim} is not a multiple of {HDIM_MULTIPLE} in 32..{MAX_HDIM}; shared "
                "memory rows are swizzled in 32- or 64-element chunks, so pad q/k/v to the next "
                "supported head dim"
            )
    return reasons


# Families with fp8 K/V: the split-KV body of the sm80 template reads it, contiguous or paged, and
# the KV-cache append writes it.
KV_QUANT_FAMILIES = ("fwd_splitkv", *PAGED_FAMILIES, "fwd_appendkv")
# cvt.rn.f16x2.e4m3x2, which widens two e4m3 values at once, is sm_89's and later.
KV_FP8_MIN_ARCH = 89


def _kv_quant_reasons(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """fp8 K/V: which families, archs and layouts read it."""
    sig = config.signature
    if sig.kv_quant not in KV_QUANTS:
        return [f"kv_quant {sig.kv_quant!r} is unknown; supported: {', '.join(KV_QUANTS)}"]
    if sig.kv_quant == "none":
        return []
    reasons: list[str] = []
    fp8_forward = sig.family == Q_FP8_FAMILY and sig.q_quant != "none"
    if sig.family not in KV_QUANT_FAMILIES and not fp8_forward:
        reasons.append(
            f"fp8 K/V (kv_quant {sig.kv_quant!r}) is read by the split-KV body and written by "
            f"the cache append ({', '.join(KV_QUANT_FAMILIES)}), and read by {Q_FP8_FAMILY} "
            f"only with fp8 queries (q_quant e4m3) on {Q_FP8_PIPELINE}; not by {sig.family}"
        )
    if arch.arch_number < KV_FP8_MIN_ARCH:
        reasons.append(
            f"fp8 K/V needs sm_{KV_FP8_MIN_ARCH} or later (cvt to and from e4m3 pairs); "
            f"{arch.name} has no such conversion"
        )
    if getattr(sig, "page_layout", "linear") != "linear":
        reasons.append(
            "fp8 K/V is read from linear pages only: vectorized pages group K in chunks of 8 "
            "two-byte channels"
        )
    if sig.v_col_major:
        reasons.append("fp8 K/V takes V row-major (head dim contiguous) only")
    return reasons


def _q_quant_reasons(config: KernelConfig) -> list[str]:
    """fp8 queries: the Hopper forward only, and only beside fp8 K/V (both products in e4m3)."""
    sig, alg = config.signature, config.algorithm
    if sig.q_quant not in Q_QUANTS:
        return [f"q_quant {sig.q_quant!r} is unknown; supported: {', '.join(Q_QUANTS)}"]
    if sig.q_quant == "none":
        return []
    reasons: list[str] = []
    if sig.family != Q_FP8_FAMILY:
        reasons.append(
            f"fp8 queries (q_quant {sig.q_quant!r}) are read by the one-stage forward "
            f"({Q_FP8_FAMILY}) only, not by {sig.family}"
        )
    if alg.pipeline != Q_FP8_PIPELINE:
        reasons.append(
            f"fp8 queries run on the sm_90a wgmma template only ({Q_FP8_PIPELINE}); "
            f"{alg.pipeline} reads queries in their dtype"
        )
    if sig.kv_quant != sig.q_quant:
        reasons.append(
            f"fp8 queries (q_quant {sig.q_quant!r}) need K/V in the same format (kv_quant "
            f"{sig.q_quant!r}, not {sig.kv_quant!r}): both products run in e4m3"
        )
    return reasons


def template_basics(config: KernelConfig) -> list[str]:
    """What every template requires: a dtype it computes in, and tile_k equal to hdim_q (each
    keeps the whole head dim resident in shared memory)."""
    sig, alg = config.signature, config.algorithm
    reasons = _dtype_reasons(config)
    if alg.tile_k != sig.hdim_q:
        reasons.append(
            f"tile_k={alg.tile_k} must equal hdim_q={sig.hdim_q}; the {alg.pipeline} template "
            "keeps the whole head dim resident"
        )
    return reasons


def _dtype_reasons(config: KernelConfig) -> list[str]:
    pipeline, dtype = config.algorithm.pipeline, config.signature.dtype
    takes = PIPELINE_DTYPES.get(pipeline, ())
    if dtype in takes:
        return []
    others = [f"{p} takes {', '.join(d)}" for p, d in PIPELINE_DTYPES.items() if p != pipeline]
    reason = (
        f"dtype {dtype!r} does not run on the {pipeline} template, which takes "
        f"{', '.join(takes) or 'nothing'}; {'; '.join(others)}"
    )
    return [reason]


def named_if_on(*features: tuple[str, bool]) -> list[str]:
    """The names of the (name, on) features that are on, in order."""
    return [name for name, on in features if on]
