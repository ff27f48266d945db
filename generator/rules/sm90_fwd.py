"""Limits of the sm90 forward template (TMA + wgmma, warp-specialized, FwdSm90Traits)."""

from __future__ import annotations

from ..signature import KernelConfig
from ..specs import ArchSpec
from .common import (
    ELEMENT_BYTES,
    MAX_ACCUMULATOR_REGISTERS,
    TemplateRules,
    named_if_on,
    template_basics,
)
from .traits_assertions import TraitsAssertion, assertions_from

# The Hopper template: a producer warpgroup (TMA) and two or three consumer warpgroups of 64 rows.
SM90_TILE_M = (128, 192)


def _sm90_warps(tile_m: int) -> int:
    return 4 * (1 + tile_m // 64)


SM90_WARPS = tuple(_sm90_warps(tile_m) for tile_m in SM90_TILE_M)
# Registers per consumer thread after setmaxnreg, by tile_m: what the CTA's launch pool leaves
# after the producer's (24 + 2 x 240 fills 168 x 384 threads, 32 + 3 x 160 fills 128 x 512).
SM90_CONSUMER_REGISTERS = {128: 240, 192: 160}
SM90_THREE_WARPGROUP_ACCUMULATORS = 96
# N extents CuTe's wgmma selector covers with one instruction (its extended shapes are off by
# default); the S tile must be a single wgmma so that P can be reused in registers as A.
SM90_SINGLE_WGMMA_N = (16, 32, 64, 96, 128, 192, 256)
# The shared memory the traits fit their layouts under (FwdSm90Traits::kSmemLimit).
SM90_SMEM_LIMIT = 227 * 1024
# Swizzled TMA/wgmma tiles start on 1 KiB boundaries, so the storage struct is padded to whole
# KiB, and the kernel rounds the 16-byte aligned dynamic base up by at most one more KiB.
SM90_SMEM_ALIGNMENT = 1024
# Rows the elementwise bias ring holds in row mode (kBiasRowSlots in fwd_bias_ring.cuh).
SM90_BIAS_ROW_SLOTS = 8
# O leaves in chunks of at most this many columns, each consumer warpgroup's 64 rows through a
# staging buffer of its own (batch mode).
SM90_O_CHUNK_COLS = 128
SM90_MAX_Q_STAGES = 2
# Dropout (common/philox_dropout.cuh, apply_per_call): a thread's 2 x tile_n / 4 probabilities of a
# key tile fit one 64-bit keep mask, and each 64-key block is one generator call.
SM90_DROPOUT_TILE_N = (64, 128)
# The fp8 forward (Q, K and V in e4m3): its producer transposes V (fp8 wgmma reads B K-major)
# and so keeps more registers: 64 + 2 x 216 beside two consumer warpgroups, 56 + 3 x 144
# beside three (head dim 64 only: 144 hold its O and S accumulators).
SM90_FP8_PRODUCER_REGISTERS = {128: 64, 192: 56}
SM90_FP8_CONSUMER_REGISTERS = {128: 216, 192: 144}
SM90_FP8_THREE_WARPGROUP_HDIM = 64
SM90_FP8_WGMMA_K = 32
# Key tiles lie inside one block of per-block K/V scales (CKFMHA_FP8_SCALE_BLOCK, 128 keys),
# whose scale the kernel reads once per tile.
SM90_FP8_TILE_N = (64, 128)
SM90_FP8_SCALE_BLOCK = 128
SM90_FP8_HDIMS = (64, 128, 256)
SM90_FP8_STAGES = (2, 3)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def fwd_sm90_layout_bytes(
    config: KernelConfig, q_stages: int, o_staging_elems: int, elem: int = 2
) -> int:
    """kSmemBytes of one of the template's layouts: `q_stages` Q tiles, the K/V ring (fp8: one
    byte an element, and V's transposed ring beside its staging one), O's staging buffers (0
    elements: none; `elem` bytes each, O's dtype), the mbarriers (full/empty per Q stage,
    full/empty of K and of V per ring stage; fp8 also staged/free of V's staging ring), all in
    1 KiB units, and a KiB to round the base up."""
    sig, alg = config.signature, config.algorithm
    fp8 = is_fp8_forward(config)
    operand = 1 if fp8 else elem
    arrays = [
        q_stages * alg.tile_m * sig.hdim_q * operand,
        alg.stages * alg.tile_n * sig.hdim_q * operand,
        alg.stages * alg.tile_n * sig.hdim_v * operand,
        *([alg.stages * sig.hdim_v * alg.tile_n] if fp8 else []),
        o_staging_elems * elem,
    ]
    tiles = sum(_round_up(size, SM90_SMEM_ALIGNMENT) for size in arrays)
    barriers = 8 * (2 * SM90_MAX_Q_STAGES + (6 if fp8 else 4) * alg.stages)
    return _round_up(tiles + barriers, SM90_SMEM_ALIGNMENT) + SM90_SMEM_ALIGNMENT


def fwd_sm90_bias_ring_bytes(config: KernelConfig, stages: int, elem: int = 2) -> int:
    """sizeof(FwdBiasRingStorage) at `stages` (0: no ring): per stage a swizzled tile_m x tile_n
    bias tile as the TMA writes it, then a full and an empty mbarrier per stage and per row
    slot of row mode (a row-broadcast bias), on 1 KiB alignment."""
    if stages == 0:
        return 0
    alg = config.algorithm
    return _round_up(stages * alg.tile_m * alg.tile_n * elem + 16 * (stages + SM90_BIAS_ROW_SLOTS),
                     SM90_SMEM_ALIGNMENT)


def fwd_sm90_bias_stages(config: KernelConfig) -> int:
    """Stages of the elementwise bias ring the traits choose: 2 where they fit beside staged O
    and one Q, else 1, else 0 (no ring: the bias is read into registers)."""
    sig = config.signature
    if sig.bias != "elementwise" or is_fp8_forward(config):
        return 0
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    with_o = fwd_sm90_layout_bytes(config, 1, _o_staging_elems(config), elem)
    for stages in (2, 1):
        if with_o + fwd_sm90_bias_ring_bytes(config, stages, elem) <= SM90_SMEM_LIMIT:
            return stages
    return 0


def _o_staging_elems(config: KernelConfig) -> int:
    """O's staging elements: 64 rows by one column chunk per consumer warpgroup in batch mode,
    the whole tile as swizzled rows in group mode."""
    sig, alg = config.signature, config.algorithm
    if sig.mode == "group":
        return alg.tile_m * sig.hdim_v
    return (alg.tile_m // 64) * 64 * min(sig.hdim_v, SM90_O_CHUNK_COLS)


def fwd_sm90_smem_bytes(config: KernelConfig) -> int:
    """kSmemBytes of the layout the traits choose: staged O first, then the bias ring
    (fwd_sm90_bias_stages), then a second Q where all fit SM90_SMEM_LIMIT; O staged with one Q
    where only that fits; else one Q and O written from registers."""
    sig = config.signature
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    o_staging = _o_staging_elems(config)
    ring = fwd_sm90_bias_ring_bytes(config, fwd_sm90_bias_stages(config), elem)
    two_q = fwd_sm90_layout_bytes(config, SM90_MAX_Q_STAGES, o_staging, elem) + ring
    q_stages = SM90_MAX_Q_STAGES if two_q <= SM90_SMEM_LIMIT else 1
    with_o = fwd_sm90_layout_bytes(config, q_stages, o_staging, elem) + ring
    if with_o <= SM90_SMEM_LIMIT:
        return with_o
    return fwd_sm90_layout_bytes(config, q_stages, 0, elem) + ring


def is_fp8_forward(config: KernelConfig) -> bool:
    """Q, K and V in e4m3 (the traits' KvFp8 on this template)."""
    return config.signature.q_quant != "none"


def _fp8_reasons(config: KernelConfig) -> list[str]:
    """What the fp8 variant adds to the template's limits."""
    sig, alg = config.signature, config.algorithm
    reasons: list[str] = []
    features = named_if_on(
        (f"bias {sig.bias!r}", sig.bias != "none"),
        ("dropout", sig.dropout),
        ("softcap", sig.softcap),
        ("sink", sig.sink),
    )
    if features:
        reasons.append(
            f"{', '.join(features)}: the fp8 forward takes masks, LSE and GQA only (its "
            "softmax scales by the q and k descale factors and quantises P to e4m3)"
        )
    if sig.hdim_q != sig.hdim_v or sig.hdim_q not in SM90_FP8_HDIMS:
        reasons.append(
            f"head dims {sig.hdim_q}x{sig.hdim_v}: the fp8 forward takes hdim_q == hdim_v in "
            f"{{{', '.join(map(str, SM90_FP8_HDIMS))}}}"
        )
    if alg.tile_m not in SM90_FP8_CONSUMER_REGISTERS:
        reasons.append(
            f"tile_m={alg.tile_m}: the fp8 forward is tile_m 128 or 192, since its producer "
            "warpgroup transposes V in shared memory and needs the registers that only the "
            "splits 64 + 2 x 216 and 56 + 3 x 144 leave it"
        )
    elif alg.tile_m == 192 and sig.hdim_v != SM90_FP8_THREE_WARPGROUP_HDIM:
        reasons.append(
            f"tile_m=192 at head dim {sig.hdim_v}: three fp8 consumer warpgroups have 144 "
            f"registers each, which hold the accumulators of head dim "
            f"{SM90_FP8_THREE_WARPGROUP_HDIM} only"
        )
    if alg.tile_n not in SM90_FP8_TILE_N:
        reasons.append(
            f"tile_n={alg.tile_n}: the fp8 forward takes tile_n "
            f"{' or '.join(map(str, SM90_FP8_TILE_N))} (fp8 wgmma steps are "
            f"{SM90_FP8_WGMMA_K} keys deep, V's transposed rows are whole 64-byte swizzle "
            f"atoms, and a key tile must lie in one {SM90_FP8_SCALE_BLOCK}-key block of "
            "per-block K/V scales)"
        )
    if alg.stages not in SM90_FP8_STAGES:
        reasons.append(
            f"stages={alg.stages}: the fp8 forward's K/V rings (V staged, then transposed) are "
            f"{' or '.join(map(str, SM90_FP8_STAGES))} deep"
        )
    return reasons


def sm90_fwd_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the sm90 forward template (TMA + wgmma, warp-specialized)."""
    sig, alg = config.signature, config.algorithm
    reasons = template_basics(config)
    if sig.v_col_major:
        reasons.append(
            f"column-major V not implemented by {alg.pipeline}: its TMA loads and the P V "
            "product read V with the head dim contiguous; sm80_cpasync_mma reads either order"
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
    if sig.dropout and alg.tile_n not in SM90_DROPOUT_TILE_N:
        reasons.append(
            f"tile_n={alg.tile_n} with dropout: the sm90 template's dropout keeps one bit per "
            "probability of a thread in a 64-bit word and calls the generator once per 64-key "
            f"block, so tile_n is {' or '.join(map(str, SM90_DROPOUT_TILE_N))}"
        )
    if alg.stages < 2:
        reasons.append(f"stages={alg.stages}: the TMA ring needs at least 2 K/V stages")
    if alg.ctas_per_sm != 1:
        reasons.append(f"ctas_per_sm={alg.ctas_per_sm}: one warp-specialized CTA fills an SM")
    if is_fp8_forward(config):
        reasons += _fp8_reasons(config)
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    # The smallest layout the traits can choose (one Q, O written from registers), the bytes
    # each instance asserts equal to the traits' when that is the layout they pick.
    smem = fwd_sm90_layout_bytes(config, 1, 0, elem)
    if smem > arch.max_dynamic_smem_per_block:
        operands = (
            f"1 B each, V also transposed into a ring of {alg.stages} x {sig.hdim_v}x{alg.tile_n}"
            if is_fp8_forward(config)
            else f"{elem} B each"
        )
        reasons.append(
            f"shared memory {smem} bytes (Q {alg.tile_m}x{sig.hdim_q} + {alg.stages} x (K "
            f"{alg.tile_n}x{sig.hdim_q} + V {alg.tile_n}x{sig.hdim_v}), {operands}, the "
            f"mbarriers and 1 KiB alignment) exceeds {arch.name}'s limit of "
            f"{arch.max_dynamic_smem_per_block} bytes"
        )
    # Consumers hold the O and S accumulators of their 64 rows after setmaxnreg: 240 registers
    # with two consumer warpgroups, 160 with three (tested at head dim 64: 96 accumulators).
    acc = (64 * sig.hdim_v + 64 * alg.tile_n) // 128
    if alg.tile_m == 192 and acc > SM90_THREE_WARPGROUP_ACCUMULATORS:
        reasons.append(
            f"estimated {acc} accumulator registers per consumer thread (O 64x{sig.hdim_v} + S "
            f"64x{alg.tile_n} per warpgroup) exceeds {SM90_THREE_WARPGROUP_ACCUMULATORS}, what "
            f"three consumer warpgroups of {SM90_CONSUMER_REGISTERS[192]} registers hold; use "
            "tile_m=128"
        )
    if acc > MAX_ACCUMULATOR_REGISTERS:
        reasons.append(
            f"estimated {acc} accumulator registers per consumer thread (O 64x{sig.hdim_v} + S "
            f"64x{alg.tile_n} per warpgroup) exceeds {MAX_ACCUMULATOR_REGISTERS}; use a smaller "
            "tile_n"
        )
    return reasons


def sm90_fwd_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The threads behind `warps` (a producer warpgroup and a consumer warpgroup per 64 rows),
    the consumers' registers the accumulator limits are set by, and the shared memory of the
    layout the traits choose under the limit they choose it by."""
    alg = config.algorithm
    facts: list[tuple[str, int | bool, str]] = [("kThreads", alg.warps * 32, "threads per CTA")]
    if is_fp8_forward(config):
        registers = SM90_FP8_CONSUMER_REGISTERS[alg.tile_m]
        facts.append(("kConsumerRegisters", registers, "consumer registers per thread"))
    elif alg.tile_m in SM90_CONSUMER_REGISTERS:
        registers = SM90_CONSUMER_REGISTERS[alg.tile_m]
        facts.append(("kConsumerRegisters", registers, "consumer registers per thread"))
    facts += [
        ("kSmemLimit", SM90_SMEM_LIMIT, "the shared-memory limit"),
        ("kSmemBytes", fwd_sm90_smem_bytes(config), "shared-memory bytes"),
        ("kBiasStages", fwd_sm90_bias_stages(config), "elementwise bias ring stages"),
        ("kBiasRowsOnly", fwd_sm90_bias_rows_only(config), "row-broadcast biases only"),
    ]
    return assertions_from(__name__, *facts)


def fwd_sm90_bias_rows_only(config: KernelConfig) -> bool:
    """Three consumer warpgroups (192 rows) hold no bias tile: their elementwise bias is one
    row broadcast over the query rows (FwdSm90Traits::kBiasRowsOnly)."""
    return config.signature.bias == "elementwise" and config.algorithm.tile_m == 192


TEMPLATE = TemplateRules(sm90_fwd_rules, sm90_fwd_traits_assertions, fwd_sm90_bias_rows_only)
