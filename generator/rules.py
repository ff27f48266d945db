"""Validation: why a kernel config cannot be built for an arch.

Each reason names what was wrong and what is supported, because these strings are shown to
users (`python -m generator --explain`, the manifest) who must decide what to change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .signature import (
    APPENDKV,
    BATCH_PREFILL,
    BWD_DQ_DK_DV,
    BWD_FAMILIES,
    BWD_ROWWISE_FAMILIES,
    FWD_PAGEDKV,
    PAGE_LAYOUTS,
    PAGED_FAMILIES,
    ROPE_MODES,
    KernelConfig,
)
from .specs import ArchSpec, hdim_label

ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
SUPPORTED_FAMILIES = (
    "fwd", "fwd_splitkv", "fwd_splitkv_combine", *PAGED_FAMILIES, *BWD_FAMILIES, APPENDKV
)
# The templates that implement each family: split-KV is a variant of the sm80 template, and its
# combine stage a small CUDA-core kernel of its own; the backward runs on the sm80 path (its
# row-wise stages are plain 16-byte vector passes that every arch runs) and its main stage also
# on the sm90 path; appending to a KV
# cache is a memory-bound copy kernel of its own.
FAMILY_PIPELINES: dict[str, tuple[str, ...]] = {
    "fwd": ("sm80_cpasync_mma", "sm90_tma_wgmma", "simt_fma"),
    "fwd_splitkv": ("sm80_cpasync_mma",),
    "fwd_splitkv_combine": ("splitkv_combine",),
    # Paged K/V: the split-KV body with key rows gathered through a page table.
    **{family: ("sm80_cpasync_mma",) for family in PAGED_FAMILIES},
    **{family: ("sm80_cpasync_mma",) for family in BWD_ROWWISE_FAMILIES},
    # The backward main stage also has a Hopper template; the row-wise stages around it are
    # the sm80 path's on every arch.
    BWD_DQ_DK_DV: ("sm80_cpasync_mma", "sm90_tma_wgmma"),
    APPENDKV: ("appendkv",),
}
# Paged families and the query mode each serves: decode steps over a paged cache take batch-mode
# queries, batch prefill ragged (group-mode) ones.
PAGED_FAMILY_MODES = {FWD_PAGEDKV: "batch", BATCH_PREFILL: "group"}
# The paged body loads K and V of a key tile together (double-buffered only).
PAGED_STAGES = 2
# Combine: each thread merges one 16-byte fp32 vector (4 columns) of a row.
COMBINE_COLUMNS_PER_THREAD = 4
SUPPORTED_MASKS = ("none", "causal", "window")
SUPPORTED_BIASES = ("none", "elementwise", "alibi")
KNOWN_MODES = ("batch", "group")
# Above this many accumulator registers per thread the compiler spills: the O accumulator and
# the S/P tile both live in registers next to addressing and softmax state.
MAX_ACCUMULATOR_REGISTERS = 192
# Registers besides the accumulators: MMA operand fragments, tile addresses, softmax state.
NON_ACCUMULATOR_REGISTERS = 32
# Shared-memory rows are swizzled in 32- or 64-element chunks (16-byte vectors within).
HDIM_MULTIPLE = 32
MAX_HDIM = 256
# mma.sync m16n8k16: each warp owns 16 query rows; key tiles step in 16s.
MMA_ROWS = 16
# K/V shared-memory stages of the sm80 template: single- or double-buffered.
SM80_STAGES = (1, 2)
# SIMT template: 128 threads as 16 row groups x 8 lanes; a row's 8 lanes own keys 8 apart, two
# per 16-key dropout block, so key tiles step in 16s. Q, K and P rows are padded so that 8 lanes
# reading 8 rows (or 32 lanes writing 4 rows) hit distinct banks.
SIMT_WARPS = 4
SIMT_ROW_GROUPS = 16
SIMT_LANES = 8
SIMT_KEY_MULTIPLE = 16
SIMT_QK_PAD = 4
SIMT_P_PAD = 8

Rule = Callable[[KernelConfig, ArchSpec], list[str]]


def _arch_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
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
    if alg.warps <= 0 or alg.warps * 32 > arch.max_threads_per_block:
        reasons.append(
            f"warps={alg.warps} gives {alg.warps * 32} threads; {arch.name} allows 1 to "
            f"{arch.max_threads_per_block // 32} warps per block"
        )
    return reasons


def _sm80_template_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the sm80 forward template (cp.async + mma.sync, K/V single-buffered)."""
    sig, alg = config.signature, config.algorithm
    reasons = _template_basics(config)
    if sig.family == "fwd_splitkv" or sig.family in PAGED_FAMILIES:
        reasons.extend(_splitkv_feature_reasons(config))
    if sig.family in PAGED_FAMILIES:
        reasons.extend(_paged_reasons(config))
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
    if alg.stages not in SM80_STAGES:
        reasons.append(
            f"stages={alg.stages} is not supported; the {alg.pipeline} template buffers K and V "
            f"in {' or '.join(map(str, SM80_STAGES))} shared-memory stages"
        )
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    # O is staged over Q's space, so the first term is the larger of the two tiles.
    smem = (
        alg.tile_m * max(sig.hdim_q, sig.hdim_v)
        + alg.stages * alg.tile_n * (sig.hdim_q + sig.hdim_v)
    ) * elem
    if smem > arch.max_dynamic_smem_per_block:
        reasons.append(
            f"shared memory {smem} bytes (Q {alg.tile_m}x{sig.hdim_q} + {alg.stages} x (K "
            f"{alg.tile_n}x{sig.hdim_q} + V {alg.tile_n}x{sig.hdim_v}), {elem} B each) exceeds "
            f"{arch.name}'s limit of {arch.max_dynamic_smem_per_block} bytes per block"
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


def _named_if_on(*features: tuple[str, bool]) -> list[str]:
    """The names of the (name, on) features that are on, in order."""
    return [name for name, on in features if on]


def _splitkv_feature_reasons(config: KernelConfig) -> list[str]:
    """What the split-KV variant of the sm80 template leaves out: per-split partials are merged
    by LSE alone, so features that need the head of a packed row (bias, dropout) or a term added
    once per row (sink) are not in it, nor is column-major V (not built for it yet)."""
    sig = config.signature
    unsupported = _named_if_on(
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


def _paged_reasons(config: KernelConfig) -> list[str]:
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
    if alg.stages != PAGED_STAGES:
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


def _combine_template_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the split-KV combine kernel: whole rows per CTA, one 16-byte fp32 vector per
    thread, and nothing to compute but the merge (mask, bias and features belong to the split
    stage)."""
    sig, alg = config.signature, config.algorithm
    reasons = _template_basics(config)
    if sig.hdim_q != sig.hdim_v:
        reasons.append(
            f"head dims {hdim_label(sig.hdim_q, sig.hdim_v)}: combine kernels are keyed by hdim_v "
            "alone, so their signature has hdim_q == hdim_v"
        )
    extras = _named_if_on(
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
    if alg.warps > 0 and alg.tile_m * sig.hdim_v != alg.warps * 32 * alg.tile_n:
        reasons.append(
            f"tile_m={alg.tile_m} rows x hdim_v={sig.hdim_v} must equal warps*32*tile_n="
            f"{alg.warps * 32 * alg.tile_n} columns: each CTA merges whole rows"
        )
    if alg.stages != 1 or alg.ctas_per_sm != 1:
        reasons.append(
            f"stages={alg.stages}, ctas_per_sm={alg.ctas_per_sm}: the combine kernel has no "
            "pipeline stages or occupancy parameter (both 1)"
        )
    return reasons


# Append kernel: each thread keeps this many 16-byte vectors (and half-rotated partners) in
# registers between its loads and its stores.
APPENDKV_MAX_VECTORS_PER_THREAD = 16


def _appendkv_template_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the append kernel: tile_m tokens of one head per CTA, 16-byte vectors, all of
    a thread's vectors loaded before any is stored."""
    sig, alg = config.signature, config.algorithm
    reasons = _template_basics(config)
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
    per_thread = -(-alg.tile_m * row_vectors // (alg.warps * 32))
    if per_thread > APPENDKV_MAX_VECTORS_PER_THREAD:
        reasons.append(
            f"{per_thread} vectors per thread ({alg.tile_m} tokens x {row_vectors} 16-byte "
            f"K and V vectors over {alg.warps * 32} threads) exceeds "
            f"{APPENDKV_MAX_VECTORS_PER_THREAD} held in registers; use fewer tokens per CTA or "
            "more warps"
        )
    return reasons


# The Hopper template: a producer warpgroup (TMA) and two or three consumer warpgroups of 64 rows.
SM90_TILE_M = (128, 192)


def _sm90_warps(tile_m: int) -> int:
    return 4 * (1 + tile_m // 64)


SM90_WARPS = tuple(_sm90_warps(tile_m) for tile_m in SM90_TILE_M)
SM90_THREE_WARPGROUP_ACCUMULATORS = 96
# N extents CuTe's wgmma selector covers with one instruction (its extended shapes are off by
# default); the S tile must be a single wgmma so that P can be reused in registers as A.
SM90_SINGLE_WGMMA_N = (16, 32, 64, 96, 128, 192, 256)


def _sm90_template_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the sm90 forward template (TMA + wgmma, warp-specialized)."""
    sig, alg = config.signature, config.algorithm
    reasons = _template_basics(config)
    unsupported = _named_if_on(
        (f"bias {sig.bias!r}", sig.bias != "none"),
        ("dropout", sig.dropout),
        ("softcap", sig.softcap),
        ("sink", sig.sink),
        ("column-major V", sig.v_col_major),
    )
    if unsupported:
        reasons.append(
            f"{', '.join(unsupported)} not implemented by {alg.pipeline} yet; it covers masks, "
            "LSE and GQA, and sm80_cpasync_mma covers the rest"
        )
    if alg.tile_m not in SM90_TILE_M or alg.warps != _sm90_warps(alg.tile_m):
        reasons.append(
            f"tile_m={alg.tile_m}, warps={alg.warps}: the {alg.pipeline} template is "
            f"tile_m {' or '.join(map(str, SM90_TILE_M))} with a TMA producer warpgroup and "
            f"a consumer warpgroup per 64 rows ({' or '.join(map(str, SM90_WARPS))} warps)"
        )
    if alg.tile_n not in SM90_SINGLE_WGMMA_N:
        reasons.append(
            f"tile_n={alg.tile_n} must be one wgmma's N: "
            f"{', '.join(map(str, SM90_SINGLE_WGMMA_N))} (P is reused in registers as its A)"
        )
    if alg.stages < 2:
        reasons.append(f"stages={alg.stages}: the TMA ring needs at least 2 K/V stages")
    if alg.ctas_per_sm != 1:
        reasons.append(f"ctas_per_sm={alg.ctas_per_sm}: one warp-specialized CTA fills an SM")
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    smem = (
        alg.tile_m * sig.hdim_q + alg.stages * alg.tile_n * (sig.hdim_q + sig.hdim_v)
    ) * elem + 1024  # the base is rounded up to 1024 bytes for the swizzled tiles
    if smem > arch.max_dynamic_smem_per_block:
        reasons.append(
            f"shared memory {smem} bytes (Q {alg.tile_m}x{sig.hdim_q} + {alg.stages} x (K "
            f"{alg.tile_n}x{sig.hdim_q} + V {alg.tile_n}x{sig.hdim_v}), {elem} B each, + 1 KiB "
            f"alignment) exceeds {arch.name}'s limit of {arch.max_dynamic_smem_per_block} bytes"
        )
    # Consumers hold the O and S accumulators of their 64 rows after setmaxnreg: 240 registers
    # with two consumer warpgroups, 160 with three (tested at head dim 64: 96 accumulators).
    acc = (64 * sig.hdim_v + 64 * alg.tile_n) // 128
    if alg.tile_m == 192 and acc > SM90_THREE_WARPGROUP_ACCUMULATORS:
        reasons.append(
            f"estimated {acc} accumulator registers per consumer thread (O 64x{sig.hdim_v} + S "
            f"64x{alg.tile_n} per warpgroup) exceeds {SM90_THREE_WARPGROUP_ACCUMULATORS}, what "
            "three consumer warpgroups of 160 registers hold; use tile_m=128"
        )
    if acc > MAX_ACCUMULATOR_REGISTERS:
        reasons.append(
            f"estimated {acc} accumulator registers per consumer thread (O 64x{sig.hdim_v} + S "
            f"64x{alg.tile_n} per warpgroup) exceeds {MAX_ACCUMULATOR_REGISTERS}; use a smaller "
            "tile_n"
        )
    return reasons


def _simt_template_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the fp32 SIMT forward template (plain FFMA, K/V single-buffered)."""
    sig, alg = config.signature, config.algorithm
    reasons = _template_basics(config)
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


def simt_smem_bytes(hdim_q: int, hdim_v: int, tile_m: int, tile_n: int, elem: int = 4) -> int:
    """Shared memory of the SIMT template: padded Q and K, V and the padded P tile; must match
    FwdSimtTraits::kSmemBytes."""
    return (
        tile_m * (hdim_q + SIMT_QK_PAD)
        + tile_n * (hdim_q + SIMT_QK_PAD)
        + tile_n * hdim_v
        + tile_m * (tile_n + SIMT_P_PAD)
    ) * elem


def squarest_warps_m(m: int, n: int, warps: int) -> int:
    """Warps along M of the warp grid whose warp tiles of an m x n product are the most nearly
    square (fewest shared-memory operand bytes per MMA), each warp owning whole 16 x 16 steps;
    0 when no grid fits. Must match squarest_warps_m in bwd_sm80_traits.cuh."""
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


# bwd_dq_dk_dv keeps dK and dV (BlockN x head dims) and S, dP (BlockM x BlockN) in registers.
BWD_MAX_ACCUMULATOR_REGISTERS = 192
# Q/dO shared-memory stages of the sm80 backward template.
BWD_SM80_STAGES = (1, 2)
# P and dS rows are swizzled in 32- or 64-element chunks like head-dim rows.
BWD_KEY_TILE_MULTIPLE = 32


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


def _sm80_bwd_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the sm80 backward template (bwd_dq_dk_dv: one CTA per key tile)."""
    sig, alg = config.signature, config.algorithm
    reasons = _template_basics(config)
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
    products = (
        ("S = Q K^T and dP = dO V^T", alg.tile_m, alg.tile_n),
        ("dK += dS^T Q", alg.tile_n, sig.hdim_q),
        ("dV += P^T dO", alg.tile_n, sig.hdim_v),
        ("dQ = dS K", alg.tile_m, sig.hdim_q),
    )
    for what, m, n in products:
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


# Row-wise stages: rows of BlockM per CTA, a row's 16-byte vectors spread over 2 to 8 lanes.
ROWWISE_MIN_VECTORS = 2


def _rowwise_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the row-wise backward stages (bwd_dot_do_o, bwd_convert_dq)."""
    sig, alg = config.signature, config.algorithm
    reasons = _template_basics(config)
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
        vectors = sig.hdim_q * ELEMENT_BYTES.get(sig.dtype, 2) // 16
        lanes = 8 if vectors % 8 == 0 else 4 if vectors % 4 == 0 else 2
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


# The sm90 backward main stage: a TMA producer warpgroup, two consumer warpgroups, 64 query rows
# per step and a two-stage Q/dO ring. At head dims 64 and 128 the warpgroups own 64 keys each
# (128 keys per CTA); at 256 they share 64 keys and split the head dim (dK and dV of 64 keys
# would not fit one warpgroup's registers).
BWD_SM90_TILE_M = 64
BWD_SM90_KEYS_BY_HDIM = {64: 128, 128: 128, 256: 64}
BWD_SM90_WARPS = 12
BWD_SM90_STAGES = 2
BWD_SM90_HDIMS = tuple(BWD_SM90_KEYS_BY_HDIM)
BWD_SM90_MASKS = ("none", "causal")
BWD_SM90_COVERS = (
    "sm90_tma_wgmma's backward covers fp16/bf16, head dims 64, 128 and 256, no mask and causal "
    "masks, GQA/MQA, batch mode and fast (atomic dQ) mode; sm80_cpasync_mma covers the rest"
)


def bwd_sm90_smem_bytes(hdim: int, elem: int = 2) -> int:
    """Shared memory of the sm90 backward main stage at `hdim`; must match the traits'
    kSmemBytes (barriers and alignment aside). Both layouts hold K and V (their keys x hdim),
    two stages of Q and dO (64 rows) with their rows' fp32 LSE and D, two dS^T buffers (keys x
    64) and the 1 KiB the base is rounded up by. The key split (d64, d128) adds the fp32 dQ
    staging tile (64 x hdim); the head split (d256) adds two P^T buffers instead, as it stages
    dQ in the bytes of the Q/dO stage its products are done with."""
    keys, rows, fp32 = BWD_SM90_KEYS_BY_HDIM.get(hdim, 128), BWD_SM90_TILE_M, 4
    common = (
        (2 * keys * hdim + BWD_SM90_STAGES * 2 * rows * hdim + 2 * keys * rows) * elem
        + BWD_SM90_STAGES * 2 * rows * fp32
        + 1024
    )
    if keys == 64:
        return common + 2 * keys * rows * elem
    return common + rows * hdim * fp32


def _sm90_bwd_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the sm90 backward main stage (bwd_dq_dk_dv on TMA + wgmma)."""
    sig, alg = config.signature, config.algorithm
    reasons = _template_basics(config)
    unsupported = _named_if_on(
        (f"bias {sig.bias!r}", sig.bias != "none"),
        ("dropout", sig.dropout),
        ("softcap", sig.softcap),
        ("dbias", sig.dbias),
        (f"mask {sig.mask!r}", sig.mask not in BWD_SM90_MASKS),
        (f"mode {sig.mode!r}", sig.mode != "batch"),
    )
    if unsupported:
        reasons.append(f"{', '.join(unsupported)} not implemented yet; {BWD_SM90_COVERS}")
    if sig.hdim_q != sig.hdim_v or sig.hdim_q not in BWD_SM90_HDIMS:
        reasons.append(
            f"head dims {sig.hdim_q}x{sig.hdim_v}: {alg.pipeline}'s backward takes equal q/k and "
            f"v head dims of {', '.join(map(str, BWD_SM90_HDIMS))} (the tiles its two consumer "
            "layouts are built for)"
        )
    keys = BWD_SM90_KEYS_BY_HDIM.get(sig.hdim_q, 128)
    if (alg.tile_m, alg.tile_n, alg.warps) != (BWD_SM90_TILE_M, keys, BWD_SM90_WARPS):
        layout = (
            "two consumer warpgroups sharing 64 keys, the head dim split between them"
            if keys == 64
            else "two consumer warpgroups of 64 keys"
        )
        reasons.append(
            f"tile_m={alg.tile_m}, tile_n={alg.tile_n}, warps={alg.warps}: the {alg.pipeline} "
            f"backward at head dim {sig.hdim_q} is tile_m={BWD_SM90_TILE_M} query rows per step "
            f"and tile_n={keys} keys per CTA with {BWD_SM90_WARPS} warps (a TMA producer "
            f"warpgroup and {layout})"
        )
    if alg.stages != BWD_SM90_STAGES:
        reasons.append(
            f"stages={alg.stages}: the {alg.pipeline} backward's Q/dO ring has "
            f"{BWD_SM90_STAGES} stages"
        )
    if alg.ctas_per_sm != 1:
        reasons.append(f"ctas_per_sm={alg.ctas_per_sm}: one warp-specialized CTA fills an SM")
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    smem = bwd_sm90_smem_bytes(sig.hdim_q, elem)
    if smem > arch.max_dynamic_smem_per_block:
        reasons.append(
            f"shared memory {smem} bytes exceeds {arch.name}'s limit of "
            f"{arch.max_dynamic_smem_per_block} bytes per block"
        )
    return reasons


def _sm90_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """The sm90 path's templates: forward and the backward main stage."""
    if config.signature.family == BWD_DQ_DK_DV:
        return _sm90_bwd_rules(config, arch)
    return _sm90_template_rules(config, arch)


def _sm80_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """The sm80 path's templates: forward, the backward main stage, the row-wise stages."""
    family = config.signature.family
    if family == BWD_DQ_DK_DV:
        return _sm80_bwd_rules(config, arch)
    if family in BWD_ROWWISE_FAMILIES:
        return _rowwise_rules(config, arch)
    return _sm80_template_rules(config, arch)


PIPELINE_RULES: dict[str, tuple[Rule, ...]] = {
    "sm80_cpasync_mma": (_sm80_rules,),
    "sm90_tma_wgmma": (_sm90_rules,),
    "simt_fma": (_simt_template_rules,),
    "splitkv_combine": (_combine_template_rules,),
    "appendkv": (_appendkv_template_rules,),
}
# Element types each template computes in; enumeration pairs a signature only with the
# pipelines that take its dtype, so --explain is not flooded with dtype mismatches.
PIPELINE_DTYPES: dict[str, tuple[str, ...]] = {
    "sm80_cpasync_mma": ("fp16", "bf16"),
    "sm90_tma_wgmma": ("fp16", "bf16"),
    "simt_fma": ("fp32",),
    "splitkv_combine": ("fp16", "bf16"),
    "appendkv": ("fp16", "bf16", "fp32"),
}


def pipelines_for_dtype(dtype: str, pipelines: Sequence[str]) -> tuple[str, ...]:
    """The pipelines among `pipelines` that take `dtype`; all of them when none does, so the
    rejections still say why."""
    taking = tuple(p for p in pipelines if dtype in PIPELINE_DTYPES.get(p, ()))
    return taking or tuple(pipelines)


def pipelines_for_family(family: str, dtype: str, pipelines: Sequence[str]) -> tuple[str, ...]:
    """The pipelines among `pipelines` that take `dtype` and template `family`; all of them
    when none does."""
    templated = FAMILY_PIPELINES.get(family, tuple(pipelines))
    taking = tuple(p for p in pipelines_for_dtype(dtype, pipelines) if p in templated)
    return taking or tuple(pipelines)


def _template_basics(config: KernelConfig) -> list[str]:
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
    others = [
        f"{p} takes {', '.join(d)}" for p, d in PIPELINE_DTYPES.items() if p != pipeline
    ]
    reason = (
        f"dtype {dtype!r} does not run on the {pipeline} template, which takes "
        f"{', '.join(takes) or 'nothing'}; {'; '.join(others)}"
    )
    return [reason]


def check(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Reasons `config` cannot be built for `arch`; an empty list means it is valid."""
    reasons = _arch_rules(config, arch)
    pipeline = config.algorithm.pipeline
    family = config.signature.family
    if pipeline not in PIPELINE_RULES:
        reasons.append(
            f"pipeline {pipeline!r} has no kernel template; templates exist for: "
            f"{', '.join(PIPELINE_RULES)}"
        )
    elif family in FAMILY_PIPELINES and pipeline not in FAMILY_PIPELINES[family]:
        # _arch_rules said why; this template's own rules do not apply to the family.
        return reasons
    for rule in PIPELINE_RULES.get(pipeline, ()):
        reasons.extend(rule(config, arch))
    return reasons
