"""The grouped-convolution forward fed by the copy engine (pipeline sm90_tma_wgmma on
conv_fwd) in the generator: its limits with reasons, its tiles in the kernel sets (beside the
gathering template even where a set keeps one template per signature), the instances' traits
assertions and launcher, and an instance that compiles."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.compile_unit import compile_one_unit

from generator import emit, rules
from generator.enumerate import select
from generator.receipts import CONV_CORE_TILES, CONV_DEFAULT_TILES, CONV_FULL_TILES, get_receipt
from generator.rules.conv_tma import tma_min_ctas_per_sm, tma_smem_launch_bytes
from generator.signature import CONV_FWD, Algorithm, ConvSignature, KernelConfig
from generator.specs import load_specs

SPECS = load_specs()
TMA = "sm90_tma_wgmma"
GATHER = "sm90_cpasync_wgmma"


def _tma(
    vector: int = 8,
    tile: tuple[int, int, int, int, int] = (128, 256, 64, 12, 4),
    dtype: str = "bf16",
    spatial_dims: int = 2,
    arch: str = "sm_90a",
    max_channels: int = 0,
) -> KernelConfig:
    tile_m, tile_n, tile_k, warps, stages = tile
    return KernelConfig(
        ConvSignature(dtype, spatial_dims, vector, max_channels),
        Algorithm(arch, TMA, tile_m, tile_n, tile_k, warps, stages),
    )


def _reasons(config: KernelConfig) -> str:
    return "\n".join(rules.check(config, SPECS[config.algorithm.arch]))


def _tma_tokens(tiles: tuple) -> list[str]:
    return [
        f"m{t.tile_m}n{t.tile_n}k{t.tile_k}_w{t.warps}s{t.stages}"
        for t in tiles
        if t.pipeline == TMA and t.family == CONV_FWD
    ]


def test_the_sets_tma_tiles_pass_the_rules_for_both_dims_and_dtypes() -> None:
    tiles = [t for t in CONV_FULL_TILES if t.pipeline == TMA and t.family == CONV_FWD]
    assert tiles and all(t.warps in (8, 12) for t in tiles)
    for tile in tiles:
        for dtype in ("fp16", "bf16"):
            for dims in (2, 3):
                shape = (tile.tile_m, tile.tile_n, tile.tile_k, tile.warps, tile.stages)
                assert _reasons(_tma(tile=shape, dtype=dtype, spatial_dims=dims)) == ""


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (_tma(vector=4), "the copy engine moves whole 16-byte channel runs"),
        (_tma(max_channels=4, vector=8), "max_channels=4 is the direct template's"),
        (_tma(tile=(128, 256, 64, 4, 4)), "warps=4 is not supported"),
        (_tma(tile=(192, 128, 64, 12, 4)), "tile_m=192 is not supported"),
        (_tma(tile=(64, 128, 64, 12, 4)), "a multiple of 64 rows per consumer warpgroup"),
        (_tma(tile=(128, 48, 64, 12, 4)), "tile_n=48 output channels is not supported"),
        (_tma(tile=(128, 128, 16, 12, 4)), "tile_k=16 is not supported"),
        (_tma(tile=(128, 128, 64, 12, 9)), "stages=9 is not supported"),
        (_tma(tile=(128, 256, 64, 12, 5)), "exceeds sm_90a's limit"),
        (_tma(arch="sm_89"), "pipeline 'sm90_tma_wgmma' is not available on sm_89"),
    ],
)
def test_rule_fires_with_a_reason_naming_the_limit(config: KernelConfig, expected: str) -> None:
    assert expected in _reasons(config)


def test_shared_memory_counts_stages_epilogue_rows_and_barriers() -> None:
    # 4 stages of (128 + 256) x 64 bf16; the epilogue's 64-channel chunk of 128 rows, each of
    # 128 bytes and 16 of padding; 128 rows of 32 bytes of table; 4 barrier pairs.
    stages, epilogue, table, barriers = 4 * 384 * 128, 128 * 144, 128 * 32, 4 * 16
    assert tma_smem_launch_bytes(128, 256, 64, 4, 2) == stages + epilogue + table + barriers
    # 256 rows: a warpgroup's 128 rows in chunks of 32 channels (8 KiB).
    assert tma_smem_launch_bytes(256, 128, 64, 4, 2) == 4 * 384 * 128 + 256 * 80 + 256 * 32 + 64
    assert _reasons(_tma(tile=(128, 256, 64, 12, 4))) == ""


@pytest.mark.parametrize(
    ("tile", "ctas"),
    [((128, 128, 64, 12, 6), 1), ((128, 64, 64, 12, 8), 1), ((64, 128, 64, 8, 4), 2),
     ((128, 64, 64, 12, 3), 2), ((256, 128, 64, 12, 4), 1)],
)  # fmt: skip
def test_small_tiles_fit_two_ctas_an_sm(tile: tuple[int, int, int, int, int], ctas: int) -> None:
    """Two CTAs where both fit in an SM's 228 KiB (1 KiB each reserved): the instance asserts
    it, and the traits size the registers for it."""
    config = _tma(tile=tile)
    assert tma_min_ctas_per_sm(config) == ctas
    assert f"Traits::kMinCtasPerSm == {ctas}" in emit.render_instance(config)


def test_the_sets_list_tma_tiles_from_core_on() -> None:
    assert _tma_tokens(CONV_CORE_TILES) == ["m128n128k64_w12s6", "m128n64k64_w12s8"]
    assert _tma_tokens(CONV_DEFAULT_TILES) == [
        "m128n128k64_w12s6", "m128n64k64_w12s8", "m64n128k64_w8s4", "m128n128k32_w12s8",
        "m256n128k64_w12s4",
    ]  # fmt: skip
    assert _tma_tokens(CONV_FULL_TILES) == [*_tma_tokens(CONV_DEFAULT_TILES), "m128n256k64_w12s4"]


def test_core_keeps_the_gathering_kernels_beside_the_tma_ones() -> None:
    """Core builds one template per signature, but the TMA one runs only channel counts its
    tile_k divides: the 8-channel signatures keep their wgmma gathering kernel too, and the
    narrower signatures get no TMA tile at all."""
    accepted = [
        c for c in select(get_receipt("core"), SPECS["sm_90a"]).accepted
        if c.signature.family == "conv_fwd"
    ]  # fmt: skip
    by_pipeline: dict[str, set[str]] = {}
    for c in accepted:
        by_pipeline.setdefault(c.algorithm.pipeline, set()).add(c.signature.name)
    assert by_pipeline[TMA] == {"conv_fwd_bf16_2d_v8", "conv_fwd_bf16_3d_v8", "conv_fwd_fp16_2d_v8"}
    assert by_pipeline[TMA] <= by_pipeline[GATHER]
    assert "conv_fwd_bf16_2d_v1" in by_pipeline[GATHER]


def test_narrow_vectors_never_meet_the_tma_template() -> None:
    """The copy engine moves 16-byte runs: 4-, 2- and 1-channel signatures are not paired with
    the TMA tiles (no kernel and no rejection), while a name asking for one is rejected with
    the reason."""
    pipelines = SPECS["sm_90a"].pipelines
    assert TMA in rules.pipelines_for_signature(ConvSignature("bf16", 2, 8), pipelines)
    for vector in (4, 2, 1):
        assert TMA not in rules.pipelines_for_signature(ConvSignature("bf16", 2, vector), pipelines)
    selection = select(get_receipt("full"), SPECS["sm_90a"])
    tma = [c for c in selection.accepted
           if c.algorithm.pipeline == TMA and c.signature.family == "conv_fwd"]  # fmt: skip
    assert tma and {c.signature.vector for c in tma} == {8}
    assert not [r for r in selection.rejected
                if r.pipeline == TMA and r.signature.family == "conv_fwd"]  # fmt: skip
    assert "16-byte channel runs" in _reasons(_tma(vector=2))


def test_instance_asserts_the_traits_and_names_the_tma_launcher() -> None:
    text = emit.render_instance(_tma())
    assert "ckfmha::kernel::ConvFwdTmaTraits<cutlass::bfloat16_t, /*SpatialDims=*/2" in text
    assert "launch_conv_fwd_tma<" in text
    assert "Traits::kConsumerWarpgroups == 2" in text
    assert f"Traits::kSmemLaunchBytes == {tma_smem_launch_bytes(128, 256, 64, 4, 2)}" in text
    assert emit.template_for(_tma()).header == "ckfmha/kernel/conv/fwd_launch.cuh"


@pytest.mark.slow
def test_a_3d_tma_instance_compiles(tmp_path: Path) -> None:
    """The 3D walk (five-dim im2col copies) and the 32-channel k-tile (64-byte swizzle), beside
    a 2D 128 x 256 tile, in one unit."""
    configs = [_tma(tile=(128, 128, 32, 12, 8), spatial_dims=3), _tma(dtype="fp16")]
    compile_one_unit(tmp_path, configs, "sm_90a")
