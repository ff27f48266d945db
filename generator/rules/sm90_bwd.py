"""Limits of the sm90 backward main stage (bwd_dq_dk_dv on TMA + wgmma, warp-specialized;
BwdSm90Traits, which picks the key-split or the head-split layout)."""

from __future__ import annotations

from ..signature import KernelConfig
from ..specs import ArchSpec
from .common import ELEMENT_BYTES, TemplateRules, named_if_on, template_basics
from .traits_assertions import TraitsAssertion, assertions_from

# The sm90 backward main stage: a TMA producer warpgroup, two consumer warpgroups, 64 query rows
# per step and a two-stage Q/dO ring. At head dims 64, 96 and 128 the warpgroups own 64 keys each
# (128 keys per CTA); at 256 and 192x128 they share 64 keys and split the head dims (dK and dV of
# 64 keys would not fit one warpgroup's registers). Keyed by (hdim_q, hdim_v).
BWD_SM90_TILE_M = 64
BWD_SM90_KEYS_BY_HDIM = {(64, 64): 128, (96, 96): 128, (128, 128): 128, (256, 256): 64,
                         (192, 128): 64}  # fmt: skip
BWD_SM90_WARPS = 12
BWD_SM90_CONSUMER_WARPGROUPS = 2
BWD_SM90_STAGES = 2
BWD_SM90_HDIMS = tuple(BWD_SM90_KEYS_BY_HDIM)
BWD_SM90_COVERS = (
    "sm90_tma_wgmma's backward covers fp16/bf16, head dims 64, 96, 128, 256 and 192x128, every "
    "mask (causal and sliding windows), GQA/MQA, ALiBi, logit soft-caps, dropout, batch and group "
    "mode and fast (atomic dQ) mode, and in batch mode an elementwise bias broadcast over the "
    "query rows ([b, 1 or h, 1, sk], key padding; the dispatcher sends other biases to "
    "sm80_cpasync_mma); sm80_cpasync_mma covers the rest"
)
# The mbarriers after the last tile: K/V full, Q/dO full and empty per stage, and dQ full and
# empty per consumer warpgroup. The storage struct is 1 KiB aligned, so they round its size up
# to the next KiB.
BWD_SM90_BARRIER_BYTES = 8 * (1 + 2 * BWD_SM90_STAGES + 2 * BWD_SM90_CONSUMER_WARPGROUPS)
BWD_SM90_SMEM_ALIGNMENT = 1024


def _bwd_sm90_parts(hdim: int, elem: int, hdim_v: int | None = None) -> tuple[int, int]:
    """(tiles, rows): the 1 KiB aligned tiles of the layout at `hdim` x `hdim_v` in bytes, and
    each Q/dO stage's fp32 LSE and D rows that follow them."""
    hdim_v = hdim if hdim_v is None else hdim_v
    keys = BWD_SM90_KEYS_BY_HDIM.get((hdim, hdim_v), 128)
    rows, fp32, both = BWD_SM90_TILE_M, 4, hdim + hdim_v
    tiles = (keys * both + BWD_SM90_STAGES * rows * both + 2 * keys * rows) * elem
    if keys == 64:
        tiles += 2 * keys * rows * elem
    if keys != 64 or hdim != hdim_v:
        tiles += rows * hdim * fp32
    return tiles, BWD_SM90_STAGES * 2 * rows * fp32


def bwd_sm90_dropout_bytes(hdim: int, hdim_v: int | None = None) -> int:
    """Dropout's random words: per consumer warpgroup, 16 words per query row of its tile (64
    rows in the key split, 32 in the head split), after the storage struct."""
    hdim_v = hdim if hdim_v is None else hdim_v
    keys = BWD_SM90_KEYS_BY_HDIM.get((hdim, hdim_v), 128)
    queries = BWD_SM90_TILE_M if keys != 64 else BWD_SM90_TILE_M // BWD_SM90_CONSUMER_WARPGROUPS
    return BWD_SM90_CONSUMER_WARPGROUPS * queries * 16 * 4


def bwd_sm90_smem_bytes(hdim: int, elem: int = 2, hdim_v: int | None = None) -> int:
    """Shared memory of the sm90 backward main stage at `hdim` x `hdim_v` (hdim_v defaults to
    hdim), barriers aside (the traits' kSmemBytes is bwd_sm90_traits_smem_bytes). Both layouts
    hold K and V (their keys x head dim), two stages of Q and dO (64 rows) with their rows'
    fp32 LSE and D, two dS^T buffers (keys x 64) and the 1 KiB the base is rounded up by. The
    key split (d64, d96, d128) adds the fp32 dQ staging tile (64 x hdim); the head split
    (d256, d192x128) adds two P^T buffers, and at d256 stages dQ in the bytes of the Q/dO
    stage its products are done with, at d192x128 in a tile of its own (64 x 192 fp32)."""
    tiles, rows = _bwd_sm90_parts(hdim, elem, hdim_v)
    return tiles + rows + BWD_SM90_SMEM_ALIGNMENT


def bwd_sm90_traits_smem_bytes(hdim: int, elem: int = 2, hdim_v: int | None = None,
                               dropout: bool = False) -> int:  # fmt: skip
    """BwdSm90Traits::kSmemBytes at `hdim` x `hdim_v`: bwd_sm90_smem_bytes with the barriers
    after the LSE and D rows, which round the storage up to a whole KiB, and with dropout its
    random words after that."""
    tiles, rows = _bwd_sm90_parts(hdim, elem, hdim_v)
    tail = -(-(rows + BWD_SM90_BARRIER_BYTES) // BWD_SM90_SMEM_ALIGNMENT)
    words = bwd_sm90_dropout_bytes(hdim, hdim_v) if dropout else 0
    return tiles + tail * BWD_SM90_SMEM_ALIGNMENT + words + BWD_SM90_SMEM_ALIGNMENT


def sm90_bwd_rules(config: KernelConfig, arch: ArchSpec) -> list[str]:
    """Limits of the sm90 backward main stage (bwd_dq_dk_dv on TMA + wgmma)."""
    sig, alg = config.signature, config.algorithm
    reasons = template_basics(config)
    keys = BWD_SM90_KEYS_BY_HDIM.get((sig.hdim_q, sig.hdim_v), 128)
    unsupported = named_if_on(
        (f"bias {sig.bias!r} in group mode", sig.bias == "elementwise" and sig.mode == "group"),
        ("dbias", sig.dbias),
    )
    if unsupported:
        reasons.append(f"{', '.join(unsupported)} not implemented yet; {BWD_SM90_COVERS}")
    if (sig.hdim_q, sig.hdim_v) not in BWD_SM90_HDIMS:
        taken = ", ".join(f"{q}x{v}" if q != v else str(q) for q, v in BWD_SM90_HDIMS)
        reasons.append(
            f"head dims {sig.hdim_q}x{sig.hdim_v}: {alg.pipeline}'s backward takes head dims of "
            f"{taken} (the tiles its two consumer layouts are built for)"
        )
    dims = (f"head dim {sig.hdim_q}" if sig.hdim_q == sig.hdim_v
            else f"head dims {sig.hdim_q}x{sig.hdim_v}")  # fmt: skip
    if (alg.tile_m, alg.tile_n, alg.warps) != (BWD_SM90_TILE_M, keys, BWD_SM90_WARPS):
        layout = (
            "two consumer warpgroups sharing 64 keys, the head dim split between them"
            if keys == 64
            else "two consumer warpgroups of 64 keys"
        )
        reasons.append(
            f"tile_m={alg.tile_m}, tile_n={alg.tile_n}, warps={alg.warps}: the {alg.pipeline} "
            f"backward at {dims} is tile_m={BWD_SM90_TILE_M} query rows per step "
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
    # BwdSm90Traits::kSmemBytes, which every instance asserts equal to this.
    smem = bwd_sm90_traits_smem_bytes(sig.hdim_q, elem, sig.hdim_v, sig.dropout)
    if smem > arch.max_dynamic_smem_per_block:
        reasons.append(
            f"shared memory {smem} bytes exceeds {arch.name}'s limit of "
            f"{arch.max_dynamic_smem_per_block} bytes per block"
        )
    return reasons


def sm90_bwd_traits_assertions(config: KernelConfig) -> tuple[TraitsAssertion, ...]:
    """The layout the rules size (keys split across the consumer warpgroups, or the head dim
    at 64 keys), its shared memory, and the threads of the producer and consumer warpgroups."""
    sig, alg = config.signature, config.algorithm
    elem = ELEMENT_BYTES.get(sig.dtype, 2)
    splits_head_dim = BWD_SM90_KEYS_BY_HDIM.get((sig.hdim_q, sig.hdim_v), 128) == 64
    return assertions_from(
        __name__,
        ("kThreads", alg.warps * 32, "threads per CTA"),
        ("kSplitsHeadDim", splits_head_dim, "the consumer layout (head dim split or not)"),
        ("kSmemBytes", bwd_sm90_traits_smem_bytes(sig.hdim_q, elem, sig.hdim_v, sig.dropout),
         "shared-memory bytes"),
        ("kBiasRowsOnly", bwd_sm90_bias_rows_only(config), "row-broadcast biases only"),
    )


def bwd_sm90_bias_rows_only(config: KernelConfig) -> bool:
    """The main stage reads an elementwise bias as one value a key (BwdSm90KeyBias), so it
    takes only biases broadcast over the query rows."""
    return config.signature.bias == "elementwise"


TEMPLATE = TemplateRules(sm90_bwd_rules, sm90_bwd_traits_assertions, bwd_sm90_bias_rows_only)
