"""The Hopper forward's elementwise bias ring in the generator's shared-memory model: how many
stages the traits fit beside the other tiles, and the bytes every instance asserts its traits
agree on (FwdSm90Traits::kBiasStages and kSmemBytes)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from generator.rules.sm90_fwd import (
    SM90_SMEM_LIMIT,
    fwd_sm90_bias_ring_bytes,
    fwd_sm90_bias_stages,
    fwd_sm90_smem_bytes,
)
from generator.signature import Algorithm, FwdSignature, KernelConfig

KIB = 1024


def _config(hdim: int, tile_n: int = 128, bias: str = "elementwise", mode: str = "batch",
            **changes: object) -> KernelConfig:  # fmt: skip
    sig = FwdSignature("bf16", mode, hdim, hdim, "causal", True, bias=bias)
    alg = Algorithm("sm_90a", "sm90_tma_wgmma", tile_m=128, tile_n=tile_n, tile_k=hdim, warps=12,
                    stages=2)  # fmt: skip
    return KernelConfig(replace(sig, **changes), alg)


def _up(n: int, unit: int = KIB) -> int:
    return -(-n // unit) * unit


def _storage(q_stages: int, hdim: int, tile_n: int, o_bytes: int) -> int:
    """sizeof of the plain bf16 storage struct: Q stages, two K and two V stages, O staging,
    then the mbarriers, each array on a KiB boundary."""
    arrays = [q_stages * 128 * hdim * 2, 2 * tile_n * hdim * 2, 2 * tile_n * hdim * 2, o_bytes]
    return _up(sum(_up(a) for a in arrays) + 8 * (2 * 2 + 4 * 2))


def test_ring_rows_and_barriers() -> None:
    # 128 rows of 128 bf16 keys (swizzled, as the TMA writes them), then a full and an empty
    # barrier per stage and per row slot of row mode, rounded to the ring's 1 KiB alignment.
    assert fwd_sm90_bias_ring_bytes(_config(64), 1) == 128 * 256 + KIB
    assert fwd_sm90_bias_ring_bytes(_config(64), 2) == 2 * 128 * 256 + KIB
    assert fwd_sm90_bias_ring_bytes(_config(64), 0) == 0


@pytest.mark.parametrize(("hdim", "tile_n", "stages", "q_stages"),
                         [(64, 128, 2, 2), (128, 128, 1, 1), (256, 64, 0, 1)])  # fmt: skip
def test_stages_and_bytes_by_head_dim(hdim: int, tile_n: int, stages: int, q_stages: int) -> None:
    """d64 keeps two Q stages beside two ring stages; d128's ring takes the second Q's room and
    holds one stage; at d256 O staged beside one Q leaves no room, and the bias goes through
    registers."""
    config = _config(hdim, tile_n)
    assert fwd_sm90_bias_stages(config) == stages
    o_bytes = 2 * 64 * min(hdim, 128) * 2
    if stages == 0:
        plain = fwd_sm90_smem_bytes(_config(hdim, tile_n, bias="none"))
        assert fwd_sm90_smem_bytes(config) == plain
        assert _storage(1, hdim, tile_n, o_bytes) + KIB + fwd_sm90_bias_ring_bytes(
            config, 1) > SM90_SMEM_LIMIT  # fmt: skip
        return
    ring = fwd_sm90_bias_ring_bytes(config, stages)
    smem = _storage(q_stages, hdim, tile_n, o_bytes) + ring + KIB
    assert fwd_sm90_smem_bytes(config) == smem <= SM90_SMEM_LIMIT
    if stages == 1:  # a second stage would not fit
        assert _storage(1, hdim, tile_n, o_bytes) + KIB + fwd_sm90_bias_ring_bytes(
            config, 2) > SM90_SMEM_LIMIT  # fmt: skip


def test_no_ring_without_an_elementwise_bias() -> None:
    assert fwd_sm90_bias_stages(_config(64, bias="alibi")) == 0
    assert fwd_sm90_bias_stages(_config(64, bias="none")) == 0
    # Group mode stages the whole O tile (128 x 64 bf16 at d64) and still holds two stages.
    assert fwd_sm90_bias_stages(_config(64, mode="group")) == 2
