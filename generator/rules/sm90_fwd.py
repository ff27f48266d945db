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
# O leaves in chunks of at most this many columns, each consumer warpgroup's 64 rows through a
# staging buffer of its own (batch mode).
SM90_O_CHUNK_COLS = 128
SM90_MAX_Q_STAGES = 2


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def fwd_sm90_layout_bytes(
    config: KernelConfig, q_stages: int, o_staging_elems: int, elem: int = 2
) -> int:
    """kSmemBytes of one of the template's layouts: `q_stages` Q tiles, the K/V ring, O's
    staging buffers (0 elements: none), the mbarriers (full/empty per Q stage, full/empty of K
    and of V per ring stage), all in 1 KiB units, and a KiB to round the base up."""
    sig, alg = config.signature, config.algorithm
    tiles = (
        _round_up(q_stages * alg.tile_m * sig.hdim_q * elem, SM90_SMEM_ALIGNMENT)
        + _round_up(alg.stages * alg.tile_n * sig.hdim_q * elem, SM90_SMEM_ALIGNMENT)
        + _round_up(alg.stages * alg.tile_n * sig.hdim_v * elem, SM90_SMEM_ALIGNMENT)
        + _round_up(o_staging_elems * elem, SM90_SMEM_ALIGNMENT)
    )
    barriers = 8 * (2 * SM90_MAX_Q_STAGES + 4 * alg.stages)
    return _round_up(tiles + barriers, SM90_SMEM_ALIGNMENT) + SM90_SMEM_ALIGNMENT


def fwd_sm90_smem_bytes(config: KernelConfig) -> int:
    """kSmemBytes of the layout the traits choose: O staged (64 rows by one column chunk per
    consumer warpgroup in batch mode, the whole tile as swizzled rows in group mode) and Q
    double-buffered where both fit SM90_SMEM_LIMIT; O staged with one Q where only that fits;
    else one Q and O written from registers."""
    sig, alg = config.signature, config.algorithm
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    if sig.mode == "group":
        o_staging = alg.tile_m * sig.hdim_v
    else:
        o_staging = (alg.tile_m // 64) * 64 * min(sig.hdim_v, SM90_O_CHUNK_COLS)
    two_q = fwd_sm90_layout_bytes(config, SM90_MAX_Q_STAGES, o_staging, elem)
    q_stages = SM90_MAX_Q_STAGES if two_q <= SM90_SMEM_LIMIT else 1
    with_o = fwd_sm90_layout_bytes(config, q_stages, o_staging, elem)
    if with_o <= SM90_SMEM_LIMIT:
        return with_o
    return fwd_sm90_layout_bytes(config, q_stages, 0, elem)


def sm90_fwd_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the sm90 forward template (TMA + wgmma, warp-specialized)."""
    sig, alg = config.signature, config.algorithm
    reasons = template_basics(config)
    unsupported = named_if_on(
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
    # The smallest layout the traits can choose (one Q, O written from registers), the bytes
    # each instance asserts equal to the traits' when that is the layout they pick.
    smem = fwd_sm90_layout_bytes(config, 1, 0, elem)
    if smem > arch.max_dynamic_smem_per_block:
        reasons.append(
            f"shared memory {smem} bytes (Q {alg.tile_m}x{sig.hdim_q} + {alg.stages} x (K "
            f"{alg.tile_n}x{sig.hdim_q} + V {alg.tile_n}x{sig.hdim_v}), {elem} B each, the "
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
    if alg.tile_m in SM90_CONSUMER_REGISTERS:
        registers = SM90_CONSUMER_REGISTERS[alg.tile_m]
        facts.append(("kConsumerRegisters", registers, "consumer registers per thread"))
    facts += [
        ("kSmemLimit", SM90_SMEM_LIMIT, "the shared-memory limit"),
        ("kSmemBytes", fwd_sm90_smem_bytes(config), "shared-memory bytes"),
    ]
    return assertions_from(__name__, *facts)


TEMPLATE = TemplateRules(sm90_fwd_rules, sm90_fwd_traits_assertions)
