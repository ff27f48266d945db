"""The grouped convolution's weight gradient (conv_bwd_weight) in the generator: its names, the
limits of its one template (ConvBwdWeightSm80Traits: cp.async + mma.sync on every arch, sm_90a
included), its instances and table entries, and the kernel sets that build it. Its tile is the
GEMM dw[K, taps x C] = dy^T x: tile_m output channels, tile_n filter taps x input channels,
tile_k batch x output positions per stage."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from support.paths import REPO_ROOT

from generator import emit, rules
from generator.enumerate import select
from generator.names import parse_kernel_name
from generator.receipts import (
    CONV_CORE_TILES,
    CONV_DEFAULT_TILES,
    CONV_FULL_TILES,
    ConvTile,
    get_receipt,
)
from generator.rules.conv_bwd_weight import bwd_weight_smem_launch_bytes
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


def _tiles(tiles: tuple[ConvTile, ...]) -> list[Shape]:
    return [
        (t.tile_m, t.tile_n, t.tile_k, t.warps, t.stages) for t in tiles
        if t.family == CONV_BWD_WEIGHT
    ]  # fmt: skip


def _bwd_weight_names(kernel_set: str, arch: str) -> list[str]:
    return [
        c.name for c in select(get_receipt(kernel_set), SPECS[arch]).accepted
        if c.signature.family == CONV_BWD_WEIGHT
    ]  # fmt: skip


def _names(arch: str, signatures: list[str], tiles: list[Shape]) -> list[str]:
    """Kernel names in the generator's order: by signature, then by tile."""
    return [
        f"{signature}__{arch}_{SM80}_m{m}n{n}k{k}_w{w}s{s}"
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
    assert "max_channels=4 is not supported: conv_bwd_weight has no direct kernel" in reasons


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
                "max_channels=1 is not supported: conv_bwd_weight has no direct kernel for "
                "groups of few channels; its implicit-GEMM template takes any channel count "
                "(max_channels=0)"
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


@pytest.mark.parametrize("pipeline", ("sm90_cpasync_wgmma", "conv_direct", "sm90_tma_wgmma"))
def test_the_family_runs_on_the_mma_sync_template_only(pipeline: str) -> None:
    config = _bwd_weight("sm_90a", pipeline=pipeline)
    assert (
        f"family 'conv_bwd_weight' has no '{pipeline}' template; it runs on sm80_cpasync_mma"
    ) in _reasons(config)


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
    """All on the mma.sync template and with no channel bucket; each set extends the one
    before."""
    assert _tiles(CONV_CORE_TILES) == [(128, 128, 32, 4, 3)]
    assert _tiles(CONV_DEFAULT_TILES) == [
        (128, 128, 32, 4, 3), (64, 64, 32, 4, 4), (128, 64, 32, 4, 3), (64, 128, 32, 4, 3)
    ]  # fmt: skip
    assert _tiles(CONV_FULL_TILES) == [*_tiles(CONV_DEFAULT_TILES), (128, 128, 64, 8, 3)]
    ours = [t for t in CONV_FULL_TILES if t.family == CONV_BWD_WEIGHT]
    assert all(t.pipeline == SM80 and t.max_channels == 0 for t in ours)


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
    """The forward's four implicit-GEMM signatures, on the mma.sync template on every arch:
    on sm_90a it is the family's preferred (only) template."""
    assert _bwd_weight_names("core", arch) == _names(arch, CORE_SIGNATURES, _tiles(CONV_CORE_TILES))


@pytest.mark.parametrize("arch", ARCHES)
def test_default_builds_every_signature_with_every_default_tile(arch: str) -> None:
    names = _bwd_weight_names("default", arch)
    assert names == _names(arch, ALL_SIGNATURES, _tiles(CONV_DEFAULT_TILES))
    assert len(names) == 16 * 4


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
    assert len(rejected) == (16 if arch in ("sm_86", "sm_89") else 0)
    assert all(r.algorithm is not None and r.algorithm.tile_k == 64 for r in rejected)


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
    assert result.stdout.split() == _names(arch, CORE_SIGNATURES, [(128, 128, 32, 4, 3)])
