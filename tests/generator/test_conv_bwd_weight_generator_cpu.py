"""The grouped convolution's weight gradient (conv_bwd_weight) in the generator: its names, the
limits of its two templates, their instances and table entries, and the kernel sets that build
them. ConvBwdWeightSm80Traits (cp.async + mma.sync on every arch, sm_90a included) takes any
channel count; its tile is the GEMM dw[K, taps x C] = dy^T x: tile_m output channels, tile_n
filter taps x input channels, tile_k batch x output positions per stage.
ConvBwdWeightDirectTraits (conv_direct, CUDA cores, every arch) takes groups of at most 1 or 2
channels; its tile is the forward's direct one: Run positions a thread, 32 groups, the
bucket, a row a warp, one stage."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO_ROOT

from generator import build, emit, rules, toolchain
from generator.enumerate import select
from generator.names import parse_kernel_name
from generator.receipts import (
    BWD_WEIGHT_DIRECT_BUCKETS,
    CONV_BWD_WEIGHT_DIRECT_TILES,
    CONV_CORE_TILES,
    CONV_DEFAULT_TILES,
    CONV_FULL_TILES,
    ConvTile,
    get_receipt,
)
from generator.rules import conv_bwd_weight_direct
from generator.rules.conv_bwd_weight import bwd_weight_smem_launch_bytes
from generator.rules.conv_direct import direct_tile_reasons
from generator.signature import (
    CONV_BWD_WEIGHT,
    CONV_FAMILIES,
    Algorithm,
    ConvSignature,
    KernelConfig,
)
from generator.specs import ArchSpec, load_specs
from generator.units import plan_units

SPECS = load_specs()
ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90a")
DTYPES = ("fp16", "bf16")
VECTORS = (8, 4, 2, 1)
SM80 = "sm80_cpasync_mma"
SM90 = "sm90_cpasync_wgmma"
DIRECT = "conv_direct"
TMA = "sm90_tma_wgmma"

Shape = tuple[int, int, int, int, int]  # tile_m, tile_n, tile_k, warps, stages


def _bwd_weight(
    arch: str = "sm_80",
    dtype: str = "bf16",
    spatial_dims: int = 2,
    vector: int = 8,
    tile: Shape = (128, 128, 32, 4, 3),
    max_channels: int = 0,
    ctas_per_sm: int = 1,
    pipeline: str = SM80,
) -> KernelConfig:
    """A weight-gradient config; by default the core set's tile."""
    tile_m, tile_n, tile_k, warps, stages = tile
    return KernelConfig(
        ConvSignature(dtype, spatial_dims, vector, max_channels, family=CONV_BWD_WEIGHT),
        Algorithm(arch, pipeline, tile_m, tile_n, tile_k, warps, stages, ctas_per_sm),
    )


def _reasons(config: KernelConfig, spec: ArchSpec | None = None) -> str:
    return "\n".join(rules.check(config, spec or SPECS[config.algorithm.arch]))


def _tiles(tiles: tuple[ConvTile, ...], pipeline: str = SM80) -> list[Shape]:
    """The family's implicit-GEMM tiles of one template among `tiles`."""
    return [
        (t.tile_m, t.tile_n, t.tile_k, t.warps, t.stages) for t in tiles
        if t.family == CONV_BWD_WEIGHT and t.pipeline == pipeline
    ]  # fmt: skip


def _bwd_weight_names(kernel_set: str, arch: str, pipeline: str = SM80) -> list[str]:
    """The set's weight-gradient kernels of one template."""
    return [
        c.name for c in select(get_receipt(kernel_set), SPECS[arch]).accepted
        if c.signature.family == CONV_BWD_WEIGHT and c.algorithm.pipeline == pipeline
    ]  # fmt: skip


def _names(arch: str, signatures: list[str], tiles: list[Shape], pipeline: str = SM80) -> list[str]:
    """Kernel names in the generator's order: by signature, then by tile."""
    return [
        f"{signature}__{arch}_{pipeline}_m{m}n{n}k{k}_w{w}s{s}"
        for signature in signatures
        for m, n, k, w, s in tiles
    ]


# ---- names ----


def test_names_spell_the_family_dtype_dims_vector_and_tile() -> None:
    sig = ConvSignature("bf16", 2, 8, family=CONV_BWD_WEIGHT)
    assert sig.name == "conv_bwd_weight_bf16_2d_v8"
    assert CONV_BWD_WEIGHT in CONV_FAMILIES
    config = _bwd_weight("sm_90a", "fp16", 3, 1, (64, 128, 32, 4, 3))
    assert config.name == "conv_bwd_weight_fp16_3d_v1__sm_90a_sm80_cpasync_mma_m64n128k32_w4s3"
    assert config.symbol == f"ckfmha_kernel_{config.name}"


@pytest.mark.parametrize(
    "config",
    [
        _bwd_weight(),
        _bwd_weight("sm_86", "fp16", 3, 2, (64, 64, 32, 4, 4)),
        _bwd_weight("sm_90a", "bf16", 3, 1, (128, 128, 64, 8, 3)),
    ],
    ids=lambda config: config.name,
)
def test_names_read_back_as_their_configs(config: KernelConfig) -> None:
    assert parse_kernel_name(config.name) == config


def test_a_forward_name_reads_back_as_the_forward() -> None:
    """The two families' names differ only in the family token."""
    forward = parse_kernel_name("conv_fwd_bf16_2d_v8__sm_80_sm80_cpasync_mma_m128n128k32_w4s3")
    backward = parse_kernel_name(
        "conv_bwd_weight_bf16_2d_v8__sm_80_sm80_cpasync_mma_m128n128k32_w4s3"
    )
    assert forward is not None and backward is not None
    assert (forward.signature.family, backward.signature.family) == ("conv_fwd", CONV_BWD_WEIGHT)
    assert forward.algorithm == backward.algorithm


def test_names_outside_the_limits_read_back_for_the_rules_to_explain() -> None:
    """A channel bucket and an unsupported dtype, dims and vector read back, so that the rules
    say why none of them is built."""
    config = parse_kernel_name(
        "conv_bwd_weight_fp32_1d_v3_c4__sm_80_sm80_cpasync_mma_m128n128k32_w4s3"
    )
    assert config is not None and config.signature.max_channels == 4
    reasons = _reasons(config)
    assert "dtype 'fp32' is not supported by conv_bwd_weight" in reasons
    assert "spatial_dims=1 is not supported; conv_bwd_weight takes 2D" in reasons
    assert "vector=3 channels per load is not supported" in reasons
    assert "max_channels=4 is not supported: channel buckets are the direct template's" in reasons


# ---- rules ----


SIGNATURES = [(d, s, v) for d in DTYPES for s in (2, 3) for v in VECTORS]


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("tile", _tiles(CONV_FULL_TILES), ids=str)
def test_the_sets_tiles_are_valid_where_they_fit(arch: str, tile: Shape) -> None:
    """Every set's tile passes the rules on every arch for every signature, except the 64-wide
    reduction step on the archs of 99 KiB per block (its 96 KiB of operand stages and 4 KiB of
    position table exceed them)."""
    for dtype, dims, vector in SIGNATURES:
        reasons = _reasons(_bwd_weight(arch, dtype, dims, vector, tile))
        if tile[2] == 64 and arch in ("sm_86", "sm_89"):
            assert f"exceeds {arch}'s limit of 101376 bytes" in reasons
        else:
            assert reasons == ""


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (_bwd_weight(tile=(128, 128, 32, 5, 3)), "warps=5 is not supported"),
        (_bwd_weight(tile=(128, 128, 32, 2, 3)), "runs 4 or 8 warps (a 2x2 or 4x2 warp grid)"),
        (
            _bwd_weight(tile=(96, 128, 32, 4, 3)),
            (
                "tile_m=96 output channels is not supported; supported: 64, 128 (whole "
                "64-channel shared-memory atoms)"
            ),
        ),
        (_bwd_weight(tile=(32, 128, 32, 4, 3)), "tile_m=32 output channels is not supported"),
        (_bwd_weight(tile=(256, 128, 32, 8, 3)), "tile_m=256 output channels is not supported"),
        (
            _bwd_weight(tile=(128, 32, 32, 4, 3)),
            "tile_n=32 filter taps x input channels is not supported; supported: 64, 128",
        ),
        (_bwd_weight(tile=(128, 256, 32, 8, 3)), "tile_n=256 filter taps x input channels"),
        (_bwd_weight(tile=(128, 128, 16, 4, 3)), "tile_k=16 reduction elements per stage"),
        (_bwd_weight(tile=(128, 128, 128, 4, 2)), "tile_k=128 reduction elements per stage"),
        (_bwd_weight(tile=(128, 128, 32, 4, 1)), "stages=1 is not supported"),
        (_bwd_weight(tile=(64, 64, 32, 4, 5)), "2 to 4 cp.async stages"),
        (_bwd_weight(ctas_per_sm=2), "ctas_per_sm=2 is not supported"),
        (_bwd_weight(dtype="fp32"), "dtype 'fp32' is not supported by conv_bwd_weight"),
        (_bwd_weight(spatial_dims=1), "spatial_dims=1 is not supported"),
        (
            _bwd_weight(vector=3),
            "vector=3 channels per load is not supported; supported: 8, 4, 2, 1",
        ),
        (
            _bwd_weight(vector=1, max_channels=1),
            (
                "max_channels=1 is not supported: channel buckets are the direct template's "
                "(pipeline conv_direct), which takes 1, 2, 4 and 8; conv_bwd_weight's implicit-GEMM "
                "template takes any channel count (max_channels=0)"
            ),
        ),
        (
            _bwd_weight("sm_89", tile=(128, 128, 64, 8, 3)),
            (
                "shared memory 102400 bytes (3 stages x (A 128x64 + B 128x64), 2 B each, + 2 "
                "slots x 64 positions x 32 B of position table) exceeds sm_89's limit of 101376 "
                "bytes per block"
            ),
        ),
        (
            _bwd_weight("sm_86", tile=(128, 128, 64, 8, 4)),
            "shared memory 135168 bytes",
        ),
    ],
    ids=lambda value: value.name if isinstance(value, KernelConfig) else "",
)
def test_rule_fires_with_a_reason_naming_the_limit(config: KernelConfig, expected: str) -> None:
    reasons = _reasons(config)
    assert expected in reasons, reasons


def test_the_same_tile_fits_sm_80_and_sm_90a() -> None:
    assert _reasons(_bwd_weight("sm_80", tile=(128, 128, 64, 8, 3))) == ""
    assert _reasons(_bwd_weight("sm_90a", tile=(128, 128, 64, 8, 3))) == ""


def test_an_arch_before_sm_80_is_rejected() -> None:
    """cp.async and bf16 mma.sync are sm_80's."""
    sm_75 = dataclasses.replace(SPECS["sm_80"], name="sm_75", compute_capability=(7, 5))
    reasons = _reasons(_bwd_weight("sm_75"), sm_75)
    assert "conv_bwd_weight needs sm_80 or later (cp.async, bf16 mma.sync); sm_75 has" in reasons


def test_the_hopper_templates_are_the_gathers_and_the_copy_engines() -> None:
    """The family's Hopper templates are the cp.async-fed wgmma one (sm90_cpasync_wgmma) and
    the one fed by the copy engine (sm90_tma_wgmma, conv_bwd_weight_tma's rules: a producer
    warpgroup, so 8 or 12 warps), both on sm_90a only."""
    wgmma = _bwd_weight("sm_90a", pipeline=SM90, tile=(128, 128, 64, 8, 3))
    assert _reasons(wgmma) == ""
    assert "sm90_cpasync_wgmma" in _reasons(dataclasses.replace(
        wgmma, algorithm=dataclasses.replace(wgmma.algorithm, arch="sm_80")), SPECS["sm_80"])  # fmt: skip
    tma = _bwd_weight("sm_90a", pipeline=TMA, tile=(64, 128, 64, 8, 4))
    assert _reasons(tma) == ""
    assert "warps=4 is not supported; the TMA template runs a producer warpgroup" in _reasons(
        _bwd_weight("sm_90a", pipeline=TMA)
    )
    assert "tile_m=128 output channels is not supported with 8 warps" in _reasons(
        _bwd_weight("sm_90a", pipeline=TMA, tile=(128, 128, 64, 8, 4))
    )
    assert "tile_n=96 filter taps x input channels is not supported" in _reasons(
        _bwd_weight("sm_90a", pipeline=TMA, tile=(64, 96, 64, 8, 4))
    )
    assert "sm90_tma_wgmma" in _reasons(dataclasses.replace(
        tma, algorithm=dataclasses.replace(tma.algorithm, arch="sm_80")), SPECS["sm_80"])  # fmt: skip


@pytest.mark.parametrize(
    ("tile", "vector", "expected"),
    [
        ((128, 128, 64, 4, 3), 8, "tile_m=128 output channels is not supported with 4 warps"),
        ((64, 128, 64, 12, 3), 8, "warps=12 is not supported"),
        ((64, 96, 64, 4, 3), 8, "tile_n=96 filter taps x input channels is not supported"),
        ((64, 256, 64, 4, 3), 1, "256 vector columns, more than the 128 threads"),
        ((64, 128, 16, 4, 3), 8, "tile_k=16 positions per stage is not supported"),
        ((64, 128, 64, 4, 2), 8, "stages=2 is not supported"),
        ((128, 256, 64, 8, 6), 8, "exceeds sm_90a's limit"),
    ],
)
def test_wgmma_rules_name_the_limit(tile: Shape, vector: int, expected: str) -> None:
    reasons = _reasons(_bwd_weight("sm_90a", vector=vector, tile=tile, pipeline=SM90))
    assert expected in reasons, reasons


def test_the_shared_memory_limit_is_the_launched_bytes() -> None:
    """The launch asks for the operand stages and both slots of the position table: one byte
    less than that is rejected quoting the number, exactly that is accepted."""
    config = _bwd_weight(tile=(128, 64, 32, 4, 3))
    launched = bwd_weight_smem_launch_bytes(128, 64, 32, 3)
    assert launched == 3 * (128 + 64) * 32 * 2 + 2 * 32 * 32
    under = dataclasses.replace(SPECS["sm_80"], max_dynamic_smem_per_block=launched - 1)
    assert f"shared memory {launched} bytes" in _reasons(config, under)
    exact = dataclasses.replace(SPECS["sm_80"], max_dynamic_smem_per_block=launched)
    assert _reasons(config, exact) == ""


# ---- emitted sources ----

INSTANCE = """\
// Generated by the ckfmha generator (python -m generator). Do not edit.
#include "ckfmha/kernel/conv/bwd_weight_launch.cuh"

namespace ckfmha_instance_{name} {{
using Traits = ckfmha::kernel::ConvBwdWeightSm80Traits<cutlass::half_t, /*SpatialDims=*/3, /*Vector=*/4,
    /*TileM=*/64, /*TileN=*/128, /*TileK=*/32, /*Warps=*/4, /*Stages=*/3>;
static_assert(Traits::kThreads == 128,
              "generator/rules/conv_bwd_weight.py and ConvBwdWeightSm80Traits::kThreads disagree on threads per CTA");
static_assert(Traits::kWarpsM == 2,
              "generator/rules/conv_bwd_weight.py and ConvBwdWeightSm80Traits::kWarpsM disagree on warps along the output channels");
static_assert(Traits::kWarpsN == 2,
              "generator/rules/conv_bwd_weight.py and ConvBwdWeightSm80Traits::kWarpsN disagree on warps along the filter taps x input channels");
static_assert(Traits::kSmemBytes == 36864,
              "generator/rules/conv_bwd_weight.py and ConvBwdWeightSm80Traits::kSmemBytes disagree on shared-memory bytes of the operand stages");
static_assert(Traits::kSmemLaunchBytes == 38912,
              "generator/rules/conv_bwd_weight.py and ConvBwdWeightSm80Traits::kSmemLaunchBytes disagree on shared-memory bytes per CTA");
}}  // namespace ckfmha_instance_{name}

extern "C" int ckfmha_kernel_{name}(const void* problem, const void* args, const ckfmha_launch_context* context, ckfmha_stream_t stream) {{
  return ckfmha::kernel::launch_conv_bwd_weight_sm80<ckfmha_instance_{name}::Traits>(problem, args, context, stream);
}}
"""


def test_instance_names_the_template_its_traits_and_launcher() -> None:
    config = _bwd_weight("sm_80", "fp16", 3, 4, (64, 128, 32, 4, 3))
    assert emit.render_instance(config) == INSTANCE.format(name=config.name)
    template = emit.template_for(config)
    assert template.header == "ckfmha/kernel/conv/bwd_weight_launch.cuh"
    assert template.traits == "ckfmha::kernel::ConvBwdWeightSm80Traits"
    assert template.launcher == "ckfmha::kernel::launch_conv_bwd_weight_sm80"
    assert template.resident_ctas is None


@pytest.mark.parametrize(
    ("tile", "grid"),
    [((64, 64, 32, 4, 4), (2, 2)), ((128, 128, 64, 8, 3), (4, 2)), ((128, 64, 32, 8, 2), (4, 2))],
)
def test_instances_assert_the_fixed_warp_grid(tile: Shape, grid: tuple[int, int]) -> None:
    """Two warp columns whatever the tile; the other warps stack along the output channels."""
    text = emit.render_instance(_bwd_weight(tile=tile))
    assert f"Traits::kWarpsM == {grid[0]}," in text
    assert f"Traits::kWarpsN == {grid[1]}," in text
    assert f"Traits::kThreads == {tile[3] * 32}," in text
    launched = bwd_weight_smem_launch_bytes(*tile[:3], tile[4])
    assert f"Traits::kSmemLaunchBytes == {launched}," in text


def test_table_entries_carry_the_family_and_conv_fields() -> None:
    config = _bwd_weight("sm_90a", "fp16", 3, 2, (64, 128, 32, 4, 3))
    (entry,) = emit.render_table([config], SPECS).split("    {")[1:]
    assert "CKFMHA_FAMILY_CONV_BWD_WEIGHT, CKFMHA_DTYPE_FP16, CKFMHA_MODE_BATCH, 0, 0," in entry
    assert '/*arch=*/90, "sm_90a", "sm80_cpasync_mma", /*tile_m=*/64, /*tile_n=*/128, ' in entry
    assert f"&{config.symbol}, nullptr, /*bias_rows_only=*/0" in entry
    assert "/*conv_spatial_dims=*/3, /*conv_vector=*/2, /*conv_max_channels=*/0}," in entry


def test_instances_compile_in_units_of_their_own_header() -> None:
    """The launch header differs from the forward's, so the two families' instances never share
    a compile unit."""
    configs = [_bwd_weight(), _bwd_weight(vector=1), dataclasses.replace(
        _bwd_weight(), signature=ConvSignature("bf16", 2, 8))]  # fmt: skip
    headers = {c.name: emit.template_for(c).header for c in configs}
    units = plan_units(configs, 1, headers)
    assert sorted(u.name for u in units) == [
        "unit_sm_80_conv_bwd_weight_launch_0", "unit_sm_80_conv_fwd_launch_0"
    ]  # fmt: skip


# ---- kernel sets ----

CORE_SIGNATURES = [
    "conv_bwd_weight_bf16_2d_v8", "conv_bwd_weight_bf16_3d_v8", "conv_bwd_weight_fp16_2d_v8",
    "conv_bwd_weight_bf16_2d_v1",
]  # fmt: skip
ALL_SIGNATURES = [
    f"conv_bwd_weight_{dtype}_{dims}d_v{vector}"
    for dtype in DTYPES for dims in (2, 3) for vector in VECTORS
]  # fmt: skip


def test_the_sets_tiles() -> None:
    """The implicit-GEMM tiles, with no channel bucket; each set extends the one before."""
    assert _tiles(CONV_CORE_TILES) == [(128, 128, 32, 4, 3)]
    assert _tiles(CONV_DEFAULT_TILES) == [
        (128, 128, 32, 4, 3), (64, 64, 32, 4, 4), (128, 64, 32, 4, 3), (64, 128, 32, 4, 3)
    ]  # fmt: skip
    assert _tiles(CONV_FULL_TILES) == [*_tiles(CONV_DEFAULT_TILES), (128, 128, 64, 8, 3)]
    assert _tiles(CONV_CORE_TILES, SM90) == [(128, 128, 64, 8, 3)]
    assert _tiles(CONV_DEFAULT_TILES, SM90) == [
        (128, 128, 64, 8, 3), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (128, 256, 64, 8, 3)
    ]  # fmt: skip
    assert _tiles(CONV_FULL_TILES, SM90) == [
        *_tiles(CONV_DEFAULT_TILES, SM90), (64, 256, 64, 4, 3), (128, 128, 32, 8, 6)
    ]  # fmt: skip
    assert _tiles(CONV_CORE_TILES, TMA) == [(64, 128, 64, 8, 4)]
    assert _tiles(CONV_DEFAULT_TILES, TMA) == [
        (64, 128, 64, 8, 4), (128, 128, 64, 12, 6), (64, 192, 64, 8, 3), (128, 256, 64, 12, 4)
    ]  # fmt: skip
    assert _tiles(CONV_FULL_TILES, TMA) == [*_tiles(CONV_DEFAULT_TILES, TMA), (64, 256, 64, 8, 4)]
    ours = [t for t in CONV_FULL_TILES if t.family == CONV_BWD_WEIGHT and t.pipeline != DIRECT]
    assert all(t.pipeline in (SM80, SM90, TMA) and t.max_channels == 0 for t in ours)


def test_a_tile_applies_to_its_own_family_only() -> None:
    """The forward's and the weight gradient's mma.sync tiles share a pipeline, not a
    template: each pairs with its own family's signatures."""
    forward = ConvSignature("bf16", 2, 8)
    backward = ConvSignature("bf16", 2, 8, family=CONV_BWD_WEIGHT)
    theirs = ConvTile(128, 128, 32, 4, 3)
    ours = ConvTile(128, 128, 32, 4, 3, family=CONV_BWD_WEIGHT)
    assert theirs.family == "conv_fwd"
    assert ours.applies_to(backward) and not ours.applies_to(forward)
    assert theirs.applies_to(forward) and not theirs.applies_to(backward)
    assert not ours.applies_to(dataclasses.replace(backward, max_channels=4))


@pytest.mark.parametrize("arch", ARCHES)
def test_core_builds_four_kernels_of_one_tile(arch: str) -> None:
    """The forward's four implicit-GEMM signatures on the arch's preferred template: wgmma on
    sm_90a, mma.sync elsewhere."""
    pipeline = SM90 if arch == "sm_90a" else SM80
    expected = _names(arch, CORE_SIGNATURES, _tiles(CONV_CORE_TILES, pipeline), pipeline)
    assert _bwd_weight_names("core", arch, pipeline) == expected
    if arch == "sm_90a":
        assert _bwd_weight_names("core", arch) == []


@pytest.mark.parametrize("arch", ARCHES)
def test_default_builds_every_signature_with_every_default_tile(arch: str) -> None:
    names = _bwd_weight_names("default", arch)
    assert names == _names(arch, ALL_SIGNATURES, _tiles(CONV_DEFAULT_TILES))
    assert len(names) == 16 * 4
    wgmma = _bwd_weight_names("default", arch, SM90)
    if arch == "sm_90a":
        assert wgmma == _names(arch, ALL_SIGNATURES, _tiles(CONV_DEFAULT_TILES, SM90), SM90)
        assert len(wgmma) == 16 * 4
    else:
        assert wgmma == []


@pytest.mark.parametrize("arch", ARCHES)
def test_full_adds_the_larger_tile_where_it_fits(arch: str) -> None:
    fits = [
        t for t in _tiles(CONV_FULL_TILES)
        if bwd_weight_smem_launch_bytes(*t[:3], t[4]) <= SPECS[arch].max_dynamic_smem_per_block
    ]  # fmt: skip
    assert len(fits) == (4 if arch in ("sm_86", "sm_89") else 5)
    assert _bwd_weight_names("full", arch) == _names(arch, ALL_SIGNATURES, fits)
    selection = select(get_receipt("full"), SPECS[arch])
    rejected = [r for r in selection.rejected if r.signature.family == CONV_BWD_WEIGHT]
    mma_rejected = [r for r in rejected if r.pipeline == SM80]
    assert len(mma_rejected) == (16 if arch in ("sm_86", "sm_89") else 0)
    assert all(r.algorithm is not None and r.algorithm.tile_k == 64 for r in mma_rejected)
    # On sm_90a the 64 x 256 wgmma tile has too few threads for 1-channel gathers.
    wgmma_rejected = [r for r in rejected if r.pipeline == SM90]
    assert len(wgmma_rejected) == (4 if arch == "sm_90a" else 0)
    assert all(r.signature.vector == 1 and r.algorithm.tile_n == 256 for r in wgmma_rejected)


def test_ci_builds_no_weight_gradient_kernel() -> None:
    assert _bwd_weight_names("ci", "sm_80") == []
    assert _bwd_weight_names("ci", "sm_90a") == []


@pytest.mark.parametrize("arch", ("sm_89", "sm_90a"))
def test_cli_lists_the_core_kernels(arch: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "generator", "--kernels", "core", "--arch", arch,
         "--filter", "^conv_bwd_weight_", "--list"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    # The TMA kernels (8-channel signatures, sm_90a) come first and the direct kernels last, as
    # the arch lists their pipelines.
    pipeline = SM90 if arch == "sm_90a" else SM80
    implicit_gemm = _names(arch, CORE_SIGNATURES, _tiles(CONV_CORE_TILES, pipeline), pipeline)
    eight = [s for s in CORE_SIGNATURES if s.endswith("_v8")]
    tma = _names(arch, eight, _tiles(CONV_CORE_TILES, TMA), TMA) if arch == "sm_90a" else []
    assert result.stdout.split() == tma + implicit_gemm + _core_direct_names(arch)


# ---- the direct template ----


def _direct(
    max_channels: int = 2,
    arch: str = "sm_80",
    dtype: str = "bf16",
    spatial_dims: int = 2,
    tile: Shape | None = None,
    vector: int = 1,
    ctas_per_sm: int = 1,
) -> KernelConfig:
    """A direct weight-gradient config; by default the sets' 2D tile (Run 16, 8 warps)."""
    tile_m, tile_n, tile_k, warps, stages = tile or (16, 32, max_channels, 8, 1)
    return KernelConfig(
        ConvSignature(dtype, spatial_dims, vector, max_channels, family=CONV_BWD_WEIGHT),
        Algorithm(arch, DIRECT, tile_m, tile_n, tile_k, warps, stages, ctas_per_sm),
    )


def _direct_name(dtype: str, dims: int, bucket: int, arch: str) -> str:
    """The sets' tile for (dims, bucket): 2D over 8 warps, 3D over 4, a run of 16 (2D) or 8 (3D)
    shortened to keep Run x channels within 32."""
    warps = 8 if dims == 2 else 4
    run = min(16 if dims == 2 else 8, 32 // bucket)
    return (
        f"conv_bwd_weight_{dtype}_{dims}d_v1_c{bucket}__{arch}_{DIRECT}_m{run}n32k{bucket}"
        f"_w{warps}s1"
    )


def _core_direct_names(arch: str) -> list[str]:
    # The core set builds the depthwise kernel and the 4- and 8-channel buckets (ResNeXt's
    # first two stages); the 2-channel bucket compiles on first use.
    return [_direct_name("bf16", 2, bucket, arch) for bucket in (1, 4, 8)]


def test_direct_names_spell_the_channel_bucket() -> None:
    sig = ConvSignature("bf16", 2, 1, 1, family=CONV_BWD_WEIGHT)
    assert sig.name == "conv_bwd_weight_bf16_2d_v1_c1"
    assert _direct().name == "conv_bwd_weight_bf16_2d_v1_c2__sm_80_conv_direct_m16n32k2_w8s1"
    assert _direct().name == _direct_name("bf16", 2, 2, "sm_80")


@pytest.mark.parametrize(
    "config",
    [
        _direct(1),
        _direct(2, "sm_90a", "fp16", 3, (8, 32, 2, 4, 1)),
        _direct(1, "sm_86", tile=(4, 32, 1, 4, 1)),
        _direct(8, tile=(4, 32, 8, 8, 1)),
        # Outside the limits, for the rules to explain.
        _direct(4, tile=(16, 32, 4, 8, 1)),
        _direct(2, vector=8),
    ],
    ids=lambda config: config.name,
)
def test_direct_names_read_back_as_their_configs(config: KernelConfig) -> None:
    assert parse_kernel_name(config.name) == config


def test_the_direct_pipeline_resolves_to_each_familys_template() -> None:
    assert rules.PIPELINE_TEMPLATES[DIRECT](CONV_BWD_WEIGHT) is conv_bwd_weight_direct.TEMPLATE
    assert rules.PIPELINE_TEMPLATES[DIRECT]("conv_fwd") is not conv_bwd_weight_direct.TEMPLATE


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize(
    "tile", CONV_BWD_WEIGHT_DIRECT_TILES, ids=lambda t: f"{t.spatial_dims}d_c{t.max_channels}"
)
def test_the_sets_direct_tiles_are_valid_on_every_arch(arch: str, tile: ConvTile) -> None:
    """Plain CUDA-core code: every arch runs it, in both dtypes."""
    for dtype in DTYPES:
        shape = (tile.tile_m, tile.tile_n, tile.tile_k, tile.warps, tile.stages)
        config = _direct(tile.max_channels, arch, dtype, tile.spatial_dims, shape)
        assert _reasons(config) == ""


@pytest.mark.parametrize("dims", (2, 3))
@pytest.mark.parametrize("bucket", (1, 2))
@pytest.mark.parametrize("run", (4, 8, 16))
@pytest.mark.parametrize("warps", (4, 8))
def test_every_run_fits_the_dy_registers(dims: int, bucket: int, run: int, warps: int) -> None:
    """Run x channels <= 32 (the traits' static_assert) holds for every run and bucket the
    template takes: no shape within its limits is rejected."""
    assert _reasons(_direct(bucket, spatial_dims=dims, tile=(run, 32, bucket, warps, 1))) == ""


def test_a_dy_run_over_the_registers_is_named() -> None:
    """The register reason the traits' static_assert stands behind, were a 4-channel bucket
    taken."""
    wider = dataclasses.replace(conv_bwd_weight_direct.LIMITS, buckets=(1, 2, 4))
    reasons = direct_tile_reasons(_direct(4, tile=(16, 32, 4, 8, 1)), wider)
    assert reasons == [
        (
            "tile_m x max_channels = 16 x 4 = 64 fp32 dy values a thread exceed 32: each thread "
            "keeps its group's dy over Run output positions of every output channel in registers"
        )
    ]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            _direct(2, vector=8),
            (
                "vector=8 is not supported by the backward-weight direct template; it reads a "
                "group's channels one by one (vector=1)"
            ),
        ),
        (
            _direct(0, tile=(16, 32, 0, 8, 1)),
            (
                "max_channels=0 (any channel count) is the implicit-GEMM templates'; the "
                "backward-weight direct template computes groups of at most 1, 2, 4 or 8 input "
                "and output channels (the partial dw in shared memory and the dy run in "
                "registers grow with the channels; wider groups run on the implicit-GEMM "
                "template)"
            ),
        ),
        (
            _direct(16, tile=(2, 32, 16, 8, 1)),
            (
                "max_channels=16 is not supported; supported: 1, 2, 4, 8 input and output "
                "channels a group (the partial dw in shared memory and the dy run in registers "
                "grow with the channels"
            ),
        ),
        (
            _direct(2, tile=(16, 64, 2, 8, 1)),
            (
                "tile_n=64 is not supported; the backward-weight direct template takes 32 "
                "consecutive groups a CTA, one a lane (tile_n=32)"
            ),
        ),
        (
            _direct(2, tile=(16, 32, 1, 8, 1)),
            (
                "tile_k=1 does not equal max_channels=2; the backward-weight direct template's "
                "reduction step is one group's input channels"
            ),
        ),
        (
            _direct(1, tile=(32, 32, 1, 8, 1)),
            "tile_m=32 output positions a thread (Run) is not supported; supported: 4, 8, 16",
        ),
        (
            _direct(2, tile=(16, 32, 2, 2, 1)),
            (
                "warps=2 is not supported; the backward-weight direct template runs 4 or 8 warps "
                "(one output row each)"
            ),
        ),
        (
            _direct(2, tile=(16, 32, 2, 8, 2)),
            (
                "stages=2 is not supported; the backward-weight direct template loads each "
                "input tile into shared memory once (stages=1)"
            ),
        ),
        (
            _direct(2, ctas_per_sm=2),
            (
                "ctas_per_sm=2 is not supported; the backward-weight direct template has no "
                "occupancy knob (ctas_per_sm=1)"
            ),
        ),
        (
            _direct(2, dtype="fp32"),
            (
                "dtype 'fp32' is not supported by conv_bwd_weight: it computes in fp16 or bf16 "
                "(fp32 FMA on the CUDA cores)"
            ),
        ),
        (_direct(2, spatial_dims=1), "spatial_dims=1 is not supported; conv_bwd_weight takes"),
    ],
    ids=lambda value: value.name if isinstance(value, KernelConfig) else "",
)
def test_direct_rule_fires_with_a_reason_naming_the_limit(
    config: KernelConfig, expected: str
) -> None:
    reasons = _reasons(config)
    assert expected in reasons, reasons


def test_the_direct_template_has_no_shared_memory_rule() -> None:
    """Its input tile and partial dw depend on the problem's filter, stride and dilation, so the
    runtime checks them per problem: an arch of 1 KiB a block still accepts the config."""
    small = dataclasses.replace(SPECS["sm_80"], max_dynamic_smem_per_block=1024)
    assert rules.check(_direct(2), small) == []


def test_signatures_meet_the_template_of_their_kind() -> None:
    """A bucketed signature meets the direct template alone, one without the implicit-GEMM
    ones (wgmma too on sm_90a)."""
    for arch, implicit in (("sm_80", (SM80,)), ("sm_90a", (SM80, SM90))):
        pipelines = SPECS[arch].pipelines
        bucketed = ConvSignature("bf16", 3, 1, 2, family=CONV_BWD_WEIGHT)
        assert rules.pipelines_for_signature(bucketed, pipelines) == (DIRECT,)
        plain = ConvSignature("bf16", 3, 1, family=CONV_BWD_WEIGHT)
        assert set(rules.pipelines_for_signature(plain, pipelines)) == set(implicit)


DIRECT_INSTANCE = """\
// Generated by the ckfmha generator (python -m generator). Do not edit.
#include "ckfmha/kernel/conv/bwd_weight_launch.cuh"

namespace ckfmha_instance_{name} {{
using Traits = ckfmha::kernel::ConvBwdWeightDirectTraits<cutlass::bfloat16_t, /*SpatialDims=*/2, /*MaxChannels=*/2, /*Run=*/16, /*Warps=*/8>;
static_assert(Traits::kThreads == 256,
              "generator/rules/conv_bwd_weight_direct.py and ConvBwdWeightDirectTraits::kThreads disagree on threads per CTA");
static_assert(Traits::kMaxChannels == 2,
              "generator/rules/conv_bwd_weight_direct.py and ConvBwdWeightDirectTraits::kMaxChannels disagree on input and output channels a group");
static_assert(Traits::kRun == 16,
              "generator/rules/conv_bwd_weight_direct.py and ConvBwdWeightDirectTraits::kRun disagree on output positions of dy a thread sums over");
static_assert(Traits::kTileH == 8,
              "generator/rules/conv_bwd_weight_direct.py and ConvBwdWeightDirectTraits::kTileH disagree on output rows a CTA computes (one a warp)");
static_assert(Traits::kGroups == 32,
              "generator/rules/conv_bwd_weight_direct.py and ConvBwdWeightDirectTraits::kGroups disagree on groups a CTA computes");
}}  // namespace ckfmha_instance_{name}

extern "C" int ckfmha_kernel_{name}(const void* problem, const void* args, const ckfmha_launch_context* context, ckfmha_stream_t stream) {{
  return ckfmha::kernel::launch_conv_bwd_weight_direct<ckfmha_instance_{name}::Traits>(problem, args, context, stream);
}}
"""


def test_direct_instance_names_its_traits_and_launcher() -> None:
    config = _direct(2)
    assert emit.render_instance(config) == DIRECT_INSTANCE.format(name=config.name)
    template = emit.template_for(config)
    assert template.header == "ckfmha/kernel/conv/bwd_weight_launch.cuh"
    assert template.traits == "ckfmha::kernel::ConvBwdWeightDirectTraits"
    assert template.launcher == "ckfmha::kernel::launch_conv_bwd_weight_direct"
    assert template.resident_ctas is None


def test_direct_3d_instance_arguments() -> None:
    text = emit.render_instance(_direct(1, "sm_90a", "fp16", 3, (8, 32, 1, 4, 1)))
    assert (
        "ckfmha::kernel::ConvBwdWeightDirectTraits<cutlass::half_t, /*SpatialDims=*/3, "
        "/*MaxChannels=*/1, /*Run=*/8, /*Warps=*/4>;"
    ) in text
    assert "Traits::kThreads == 128," in text and "Traits::kTileH == 4," in text


def test_direct_table_entry_carries_the_family_and_bucket() -> None:
    config = _direct(2, "sm_89", "fp16", 3, (8, 32, 2, 4, 1))
    (entry,) = emit.render_table([config], SPECS).split("    {")[1:]
    entry = entry.split("\n};\n", 1)[0]
    assert "CKFMHA_FAMILY_CONV_BWD_WEIGHT, CKFMHA_DTYPE_FP16, CKFMHA_MODE_BATCH, 0, 0," in entry
    assert '/*arch=*/89, "sm_89", "conv_direct", /*tile_m=*/8, /*tile_n=*/32, ' in entry
    assert entry.endswith("/*conv_spatial_dims=*/3, /*conv_vector=*/1, /*conv_max_channels=*/2},")


def test_direct_instances_share_the_weight_gradients_unit() -> None:
    """bwd_weight_launch.cuh holds both launchers: one unit takes both templates."""
    configs = [_bwd_weight(), _direct(1), _direct(2, spatial_dims=3, tile=(8, 32, 2, 4, 1))]
    headers = {c.name: emit.template_for(c).header for c in configs}
    units = plan_units(configs, 1, headers)
    assert [u.name for u in units] == ["unit_sm_80_conv_bwd_weight_launch_0"]


def test_one_direct_tile_per_dims_and_bucket() -> None:
    """The forward's direct shapes (2D over 8 warps, 3D over 4), the run shortened to keep
    Run x channels within 32 registers, for buckets 1, 2, 4 and 8, in every set; each applies
    to its own family, dims and bucket only."""
    shapes = {
        (t.spatial_dims, t.max_channels): (t.tile_m, t.tile_n, t.tile_k, t.warps, t.stages)
        for t in CONV_BWD_WEIGHT_DIRECT_TILES
    }
    assert set(BWD_WEIGHT_DIRECT_BUCKETS) == set(
        conv_bwd_weight_direct.BWD_WEIGHT_DIRECT_MAX_CHANNELS
    )
    assert shapes == {
        (2, 1): (16, 32, 1, 8, 1), (2, 2): (16, 32, 2, 8, 1),
        (2, 4): (8, 32, 4, 8, 1), (2, 8): (4, 32, 8, 8, 1),
        (3, 1): (8, 32, 1, 4, 1), (3, 2): (8, 32, 2, 4, 1),
        (3, 4): (8, 32, 4, 4, 1), (3, 8): (4, 32, 8, 4, 1),
    }  # fmt: skip
    assert all(t.pipeline == DIRECT for t in CONV_BWD_WEIGHT_DIRECT_TILES)
    for tiles in (CONV_CORE_TILES, CONV_DEFAULT_TILES, CONV_FULL_TILES):
        ours = [t for t in tiles if t.pipeline == DIRECT and t.family == CONV_BWD_WEIGHT]
        assert ours == list(CONV_BWD_WEIGHT_DIRECT_TILES)
    for tile in CONV_BWD_WEIGHT_DIRECT_TILES:
        for family in ("conv_fwd", CONV_BWD_WEIGHT):
            for dims in (2, 3):
                for bucket in (0, 1, 2, 4, 8):
                    sig = ConvSignature("bf16", dims, 1, bucket, family=family)
                    expected = (family, dims, bucket) == (
                        CONV_BWD_WEIGHT, tile.spatial_dims, tile.max_channels
                    )  # fmt: skip
                    assert tile.applies_to(sig) == expected


@pytest.mark.parametrize("arch", ARCHES)
def test_core_builds_three_bf16_2d_direct_kernels(arch: str) -> None:
    """Groups of 1, of up to 4 and of 8 channels, on every arch; preferred_only keeps them (they are
    signatures of their own, whose only template is the direct one)."""
    assert _bwd_weight_names("core", arch, DIRECT) == _core_direct_names(arch)


@pytest.mark.parametrize("kernel_set", ("default", "full"))
@pytest.mark.parametrize("arch", ARCHES)
def test_default_and_full_build_every_direct_signature_once(kernel_set: str, arch: str) -> None:
    assert _bwd_weight_names(kernel_set, arch, DIRECT) == [
        _direct_name(dtype, dims, bucket, arch)
        for dtype in DTYPES for dims in (2, 3) for bucket in BWD_WEIGHT_DIRECT_BUCKETS
    ]  # fmt: skip
    selection = select(get_receipt(kernel_set), SPECS[arch])
    assert not any(
        r.pipeline == DIRECT for r in selection.rejected if r.signature.family == CONV_BWD_WEIGHT
    )


def test_ci_builds_no_direct_kernel() -> None:
    assert _bwd_weight_names("ci", "sm_90a", DIRECT) == []


def _require_toolchain() -> None:
    try:
        toolchain.find_nvcc()
        toolchain.find_cutlass_include()
    except toolchain.ToolchainError as error:
        pytest.skip(f"CUDA toolchain unavailable: {error}")


def _compile_units(tmp_path: Path, configs: list[KernelConfig], arch: str) -> None:
    """`configs` emitted and compiled for `arch` in the units the build would compile."""
    files = emit.emit(tmp_path, configs, [], SPECS, jobs=1)
    compiler = toolchain.CudaToolchain(
        build.arch_specs_for([arch]), [REPO_ROOT / "cpp" / "include", tmp_path]
    )
    for unit_path, unit in files.units:
        job = toolchain.CompileJob(unit_path, unit_path.with_suffix(".o"), unit.arch)
        command = compiler.compile_command(job, unit_path.with_suffix(".d"))
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_every_direct_kernel_of_the_default_set_compiles(tmp_path: Path) -> None:
    """The 16 direct instances (both dtypes, 2D and 3D, the four buckets) against
    ConvBwdWeightDirectTraits, in the units the build would compile: the template takes the
    arguments the generator writes and agrees with the numbers it asserts."""
    _require_toolchain()
    configs = [
        c for c in select(get_receipt("default"), SPECS["sm_80"]).accepted
        if c.signature.family == CONV_BWD_WEIGHT and c.algorithm.pipeline == DIRECT
    ]  # fmt: skip
    assert len(configs) == 16
    _compile_units(tmp_path, configs, "sm_80")


@pytest.mark.slow
def test_every_wgmma_tile_compiles(tmp_path: Path) -> None:
    """Each wgmma tile of the full set against ConvBwdWeightSm90Traits (one and two
    warpgroups, wgmma N of 64 to 256, 32- and 64-position steps, one and two CTAs an SM), and
    the narrowest channel vector in 3D: the template takes the arguments the generator writes
    and agrees with the numbers it asserts."""
    _require_toolchain()
    configs = [_bwd_weight("sm_90a", tile=tile, pipeline=SM90)
               for tile in _tiles(CONV_FULL_TILES, SM90)]  # fmt: skip
    configs.append(_bwd_weight("sm_90a", "fp16", 3, 1, (64, 64, 64, 4, 4), pipeline=SM90))
    assert len(configs) == 7 and all(_reasons(c) == "" for c in configs)
    _compile_units(tmp_path, configs, "sm_90a")
