"""The grouped-convolution forward (conv_fwd) in the generator: names, the limits of its two
implicit-GEMM templates (cp.async + mma.sync on every arch, cp.async + wgmma on sm_90a), the
emitted instances and table entries, and the kernel sets that build them. The direct template
for groups of few channels has test_conv_direct_generator_cpu.py, the weight gradient
test_conv_bwd_weight_generator_cpu.py."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.compile_unit import compile_one_unit
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
from generator.rules.conv import conv_smem_launch_bytes, sm90_min_ctas_per_sm
from generator.signature import Algorithm, ConvSignature, FwdSignature, KernelConfig
from generator.specs import ArchSpec, load_specs
from generator.units import plan_units

SPECS = load_specs()
ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90a")
DTYPES = ("fp16", "bf16")
VECTORS = (8, 4, 2, 1)
SM80 = "sm80_cpasync_mma"
SM90 = "sm90_cpasync_wgmma"
TMA = "sm90_tma_wgmma"
DIRECT = "conv_direct"
SM80_TILES = tuple(
    t for t in CONV_FULL_TILES if t.pipeline == SM80 and t.family == "conv_fwd"
)
SM90_TILES = tuple(t for t in CONV_FULL_TILES if t.pipeline == SM90 and t.family == "conv_fwd")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

Shape = tuple[int, int, int, int, int]  # tile_m, tile_n, tile_k, warps, stages


def _conv(
    arch: str = "sm_80",
    dtype: str = "bf16",
    spatial_dims: int = 2,
    vector: int = 8,
    tile: Shape = (128, 128, 32, 4, 3),
    ctas_per_sm: int = 1,
    pipeline: str = SM80,
) -> KernelConfig:
    tile_m, tile_n, tile_k, warps, stages = tile
    return KernelConfig(
        ConvSignature(dtype, spatial_dims, vector),
        Algorithm(arch, pipeline, tile_m, tile_n, tile_k, warps, stages, ctas_per_sm),
    )


def _sm90(
    dtype: str = "bf16",
    spatial_dims: int = 2,
    vector: int = 8,
    tile: Shape = (128, 128, 64, 8, 3),
    ctas_per_sm: int = 1,
    arch: str = "sm_90a",
) -> KernelConfig:
    """A config of the wgmma template; by default the core set's tile on sm_90a."""
    return _conv(arch, dtype, spatial_dims, vector, tile, ctas_per_sm, SM90)


def _shape(tile: ConvTile) -> Shape:
    return (tile.tile_m, tile.tile_n, tile.tile_k, tile.warps, tile.stages)


def _reasons(config: KernelConfig, arch: str | None = None) -> str:
    return "\n".join(rules.check(config, SPECS[arch or config.algorithm.arch]))


def _conv_names(kernel_set: str, arch: str) -> list[str]:
    """The set's implicit-GEMM conv kernels on `arch` (the direct ones are another file's)."""
    return [
        c.name
        for c in select(get_receipt(kernel_set), SPECS[arch]).accepted
        if c.signature.family == "conv_fwd" and c.algorithm.pipeline != DIRECT
    ]


def _tile_token(tile: ConvTile) -> str:
    return f"m{tile.tile_m}n{tile.tile_n}k{tile.tile_k}_w{tile.warps}s{tile.stages}"


def _tile_id(tile: ConvTile) -> str:
    """The sets list some shapes on both templates: the id names the template too."""
    return f"{tile.pipeline.split('_')[0]}-{_tile_token(tile)}"


def _of(pipeline: str, tiles: tuple[ConvTile, ...]) -> tuple[ConvTile, ...]:
    """The forward's tiles of `pipeline` (the weight gradient shares the mma.sync one)."""
    return tuple(t for t in tiles if t.pipeline == pipeline and t.family == "conv_fwd")


def _names(arch: str, signatures: list[str], tiles: tuple[ConvTile, ...]) -> list[str]:
    """Implicit-GEMM kernel names in the generator's order: by template as the arch lists its
    pipelines, then by signature, then by tile. Tiles of a template the arch lacks name no
    kernel; direct tiles (a channel bucket) apply to none of these signatures, TMA tiles only
    to 8-channel ones."""
    return [
        f"{signature}__{arch}_{pipeline}_{_tile_token(tile)}"
        for pipeline in SPECS[arch].pipelines
        for signature in signatures
        for tile in _of(pipeline, tiles)
        if tile.max_channels == 0 and (pipeline != TMA or signature.endswith("_v8"))
    ]


# ---- names ----


def test_names_spell_dtype_dims_vector_and_tile() -> None:
    assert ConvSignature("bf16", 2, 8).name == "conv_fwd_bf16_2d_v8"
    assert ConvSignature("fp16", 3, 1).name == "conv_fwd_fp16_3d_v1"
    config = _conv("sm_90a")
    assert config.name == "conv_fwd_bf16_2d_v8__sm_90a_sm80_cpasync_mma_m128n128k32_w4s3"
    assert config.symbol == f"ckfmha_kernel_{config.name}"
    assert _sm90().name == "conv_fwd_bf16_2d_v8__sm_90a_sm90_cpasync_wgmma_m128n128k64_w8s3"


def test_attention_fields_of_a_conv_signature_are_neutral() -> None:
    sig = ConvSignature("fp16", 3, 4)
    assert (sig.family, sig.mode, sig.hdim_q, sig.hdim_v) == ("conv_fwd", "batch", 0, 0)
    assert (sig.mask, sig.bias, sig.page_layout, sig.kv_quant, sig.q_quant) == (
        "none", "none", "linear", "none", "none"
    )  # fmt: skip
    assert not (sig.lse or sig.dropout or sig.softcap or sig.sink or sig.v_col_major)


@pytest.mark.parametrize(
    "config",
    [
        _conv(),
        _conv("sm_86", "fp16", 3, 2, (64, 32, 32, 4, 4)),
        _sm90(),
        _sm90("fp16", 3, 1, (192, 256, 32, 12, 8)),
    ],
    ids=lambda config: config.name,
)
def test_conv_names_read_back_as_their_configs(config: KernelConfig) -> None:
    assert parse_kernel_name(config.name) == config


def test_names_outside_the_limits_read_back_for_the_rules_to_explain() -> None:
    config = parse_kernel_name("conv_fwd_fp32_1d_v3__sm_80_sm80_cpasync_mma_m128n128k32_w4s3")
    assert config is not None
    reasons = _reasons(config)
    assert "dtype 'fp32'" in reasons and "spatial_dims=1" in reasons and "vector=3" in reasons


# ---- rules ----


SIGNATURES = [(d, s, v) for d in DTYPES for s in (2, 3) for v in VECTORS]


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("tile", SM80_TILES, ids=_tile_id)
def test_the_sets_sm80_tiles_are_valid_where_they_fit(arch: str, tile: ConvTile) -> None:
    """Every set's mma.sync tile passes the rules on every arch, except the 64-wide reduction
    tile on the archs of 99 KiB per block (its 96 KiB of operands and its row table exceed
    them)."""
    for dtype, dims, vector in SIGNATURES:
        reasons = _reasons(_conv(arch, dtype, dims, vector, _shape(tile)))
        if tile.tile_k == 64 and arch in ("sm_86", "sm_89"):
            assert f"exceeds {arch}'s limit of 101376 bytes" in reasons
        else:
            assert reasons == ""


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("tile", SM90_TILES, ids=_tile_id)
def test_the_sets_sm90_tiles_are_valid_on_sm_90a_only(arch: str, tile: ConvTile) -> None:
    """Every set's wgmma tile passes the rules on sm_90a for every signature; on the other archs
    the rules reject it because the arch has no such pipeline."""
    for dtype, dims, vector in SIGNATURES:
        reasons = _reasons(_sm90(dtype, dims, vector, _shape(tile), arch=arch))
        if arch == "sm_90a":
            assert reasons == ""
        else:
            assert f"pipeline '{SM90}' is not available on {arch}; available: " in reasons


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (_conv(tile=(128, 128, 32, 5, 3)), "warps=5 is not supported"),
        (_conv(tile=(128, 128, 32, 3, 3)), "runs 4 or 8 warps"),
        (_conv(tile=(128, 48, 32, 4, 3)), "tile_n=48 output channels is not supported"),
        (_conv(tile=(96, 64, 32, 4, 3)), "tile_m=96 output positions is not supported"),
        (_conv(tile=(128, 64, 48, 4, 3)), "tile_k=48 reduction elements"),
        (_conv(tile=(128, 64, 32, 4, 1)), "stages=1 is not supported"),
        (_conv(tile=(128, 64, 32, 4, 5)), "2 to 4 cp.async stages"),
        (_conv(ctas_per_sm=2), "ctas_per_sm=2 is not supported"),
        # 8 warps over 16 channels: an 8x1 grid needs 128 rows.
        (_conv(tile=(64, 16, 32, 8, 3)), "tile_m=64 is not a multiple of 16*WarpsM=128"),
        (_conv(dtype="fp32"), "dtype 'fp32' is not supported by conv_fwd"),
        (_conv(spatial_dims=1), "spatial_dims=1 is not supported"),
        (_conv(vector=3), "vector=3 channels per load is not supported; supported: 8, 4, 2, 1"),
        (
            _conv("sm_86", tile=(128, 128, 64, 4, 4)),
            (
                "shared memory 135168 bytes (4 stages x (A 128x64 + B 128x64), 2 B each, + 128 "
                "rows x 32 B of row table) exceeds sm_86's limit of 101376 bytes per block"
            ),
        ),
    ],
    ids=lambda value: value.name if isinstance(value, KernelConfig) else "",
)
def test_rule_fires_with_a_reason_naming_the_limit(config: KernelConfig, expected: str) -> None:
    reasons = _reasons(config)
    assert expected in reasons, reasons


def test_the_same_tile_fits_sm_80() -> None:
    assert _reasons(_conv("sm_80", tile=(128, 128, 64, 4, 4))) == ""


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            _sm90(tile=(128, 128, 64, 6, 3)),
            (
                "warps=6 is not supported; the sm90 conv template runs whole warpgroups: 4, 8, "
                "12 warps"
            ),
        ),
        # Two warpgroups own 64 rows each: 128, 256, ... rows.
        (
            _sm90(tile=(96, 128, 64, 8, 3)),
            (
                "tile_m=96 is not a multiple of 64 x 2 warpgroups: each warpgroup owns whole "
                "64-row wgmma tiles"
            ),
        ),
        (_sm90(tile=(64, 128, 64, 8, 3)), "tile_m=64 is not a multiple of 64 x 2 warpgroups"),
        (_sm90(tile=(128, 64, 64, 12, 3)), "tile_m=128 is not a multiple of 64 x 3 warpgroups"),
        (_sm90(tile=(0, 128, 64, 4, 3)), "tile_m=0"),
        (
            _sm90(tile=(128, 48, 64, 8, 3)),
            (
                "tile_n=48 output channels is not supported; supported: 16, 32, 64, 128, 256 "
                "(wgmma N)"
            ),
        ),
        (_sm90(tile=(128, 128, 48, 8, 3)), "tile_k=48 reduction elements per stage"),
        (
            _sm90(tile=(128, 128, 64, 8, 2)),
            (
                "stages=2 is not supported; the sm90 conv template keeps 3 to 8 stages (loads "
                "run stages - 2 tiles ahead)"
            ),
        ),
        (_sm90(tile=(128, 64, 32, 4, 9)), "stages=9 is not supported"),
        (_sm90(ctas_per_sm=2), "ctas_per_sm=2 is not supported; the sm90 conv template sizes"),
        (_sm90("fp32"), "dtype 'fp32' is not supported by conv_fwd"),
        (_sm90(spatial_dims=1), "spatial_dims=1 is not supported"),
        (_sm90(vector=3), "vector=3 channels per load is not supported; supported: 8, 4, 2, 1"),
        (
            _sm90(tile=(256, 256, 64, 8, 6)),
            (
                "shared memory 401408 bytes (6 stages x (A 256x64 + B 256x64), 2 B each, + 256 "
                "rows x 32 B of row table) exceeds sm_90a's limit of 232448 bytes per block"
            ),
        ),
    ],
    ids=lambda value: value.name if isinstance(value, KernelConfig) else "",
)
def test_sm90_rule_fires_with_a_reason_naming_the_limit(
    config: KernelConfig, expected: str
) -> None:
    reasons = _reasons(config)
    assert expected in reasons, reasons


@pytest.mark.parametrize(
    "tile",
    [(128, 16, 32, 4, 3), (64, 256, 64, 4, 4), (192, 64, 64, 12, 3), (256, 128, 32, 8, 8)],
    ids=str,
)
def test_sm90_shapes_outside_the_sets_pass_within_the_limits(tile: Shape) -> None:
    """Any whole number of 64-row wgmma tiles per warpgroup, any wgmma N the rules list, 3 to
    8 stages: the sets pick among them, the rules do not."""
    assert _reasons(_sm90(tile=tile)) == ""


def test_conv_signatures_have_no_head_dim_rules() -> None:
    """A conv signature's head dims are 0: the attention rules about them do not apply."""
    assert "hdim" not in _reasons(_conv(vector=3))
    assert "head dims" not in _reasons(_conv(vector=3))


def test_conv_runs_on_its_four_templates_only() -> None:
    config = _conv("sm_90a", pipeline="simt_fma")
    assert (
        "family 'conv_fwd' has no 'simt_fma' template; it runs on sm80_cpasync_mma, "
        "sm90_cpasync_wgmma, sm90_tma_wgmma, conv_direct"
    ) in _reasons(config)


def test_attention_has_no_sm90_conv_template() -> None:
    """The cp.async + wgmma pipeline is the convolution's: an attention forward on it is
    rejected by the family's template list, not run through the conv rules."""
    config = KernelConfig(
        FwdSignature("bf16", "batch", 128, 128, "causal", True),
        Algorithm("sm_90a", SM90, 128, 128, 128, 8, 3),
    )
    reasons = rules.check(config, SPECS["sm_90a"])
    assert reasons[0] == (
        "family 'fwd' has no 'sm90_cpasync_wgmma' template; it runs on sm80_cpasync_mma, "
        "sm90_tma_wgmma, simt_fma"
    )
    assert not any("conv" in reason for reason in reasons), reasons


def _limited(arch: str, smem: int) -> ArchSpec:
    return dataclasses.replace(SPECS[arch], max_dynamic_smem_per_block=smem)


def test_the_shared_memory_limit_is_the_launched_bytes() -> None:
    """The launch asks for the operand stages and the row table: one byte less than that is
    rejected quoting the number, exactly that is accepted."""
    config = _conv(tile=(128, 64, 32, 4, 3))
    launched = conv_smem_launch_bytes(128, 64, 32, 3)
    assert launched == 3 * (128 + 64) * 32 * 2 + 128 * 32
    under = "\n".join(rules.check(config, _limited("sm_80", launched - 1)))
    assert f"shared memory {launched} bytes" in under, under
    assert rules.check(config, _limited("sm_80", launched)) == []


def test_the_sm90_shared_memory_limit_is_the_launched_bytes() -> None:
    """The wgmma template launches the same operand stages and row table: the six-stage square
    tile's 196 KiB of stages and 4 KiB of rows fit sm_90a's 227 KiB to the byte."""
    config = _sm90(tile=(128, 128, 64, 8, 6))
    launched = conv_smem_launch_bytes(128, 128, 64, 6)
    assert launched == 6 * (128 + 128) * 64 * 2 + 128 * 32 == 200704
    under = "\n".join(rules.check(config, _limited("sm_90a", launched - 1)))
    assert f"shared memory {launched} bytes" in under, under
    assert rules.check(config, _limited("sm_90a", launched)) == []


# ---- emitted sources ----

INSTANCE = """\
// Generated by the ckfmha generator (python -m generator). Do not edit.
#include "ckfmha/kernel/conv/fwd_launch.cuh"

namespace ckfmha_instance_{name} {{
using Traits = ckfmha::kernel::ConvFwdSm80Traits<cutlass::half_t, /*SpatialDims=*/3, /*Vector=*/4,
    /*TileM=*/128, /*TileN=*/64, /*TileK=*/32, /*Warps=*/4, /*Stages=*/3>;
static_assert(Traits::kThreads == 128,
              "generator/rules/conv.py and ConvFwdSm80Traits::kThreads disagree on threads per CTA");
static_assert(Traits::kWarpsM == 2,
              "generator/rules/conv.py and ConvFwdSm80Traits::kWarpsM disagree on warps along the output positions");
static_assert(Traits::kWarpsN == 2,
              "generator/rules/conv.py and ConvFwdSm80Traits::kWarpsN disagree on warps along the output channels");
static_assert(Traits::kSmemBytes == 36864,
              "generator/rules/conv.py and ConvFwdSm80Traits::kSmemBytes disagree on shared-memory bytes of the operand stages");
static_assert(Traits::kSmemLaunchBytes == 40960,
              "generator/rules/conv.py and ConvFwdSm80Traits::kSmemLaunchBytes disagree on shared-memory bytes per CTA");
}}  // namespace ckfmha_instance_{name}

extern "C" int ckfmha_kernel_{name}(const void* problem, const void* args, const ckfmha_launch_context* context, ckfmha_stream_t stream) {{
  return ckfmha::kernel::launch_conv_fwd_sm80<ckfmha_instance_{name}::Traits>(problem, args, context, stream);
}}
"""


def test_instance_names_the_conv_template_and_its_traits() -> None:
    config = _conv("sm_80", "fp16", 3, 4, (128, 64, 32, 4, 3))
    assert emit.render_instance(config) == INSTANCE.format(name=config.name)


SM90_INSTANCE = """\
// Generated by the ckfmha generator (python -m generator). Do not edit.
#include "ckfmha/kernel/conv/fwd_launch.cuh"

namespace ckfmha_instance_{name} {{
using Traits = ckfmha::kernel::ConvFwdSm90Traits<cutlass::bfloat16_t, /*SpatialDims=*/2, /*Vector=*/8,
    /*TileM=*/128, /*TileN=*/128, /*TileK=*/64, /*Warps=*/8, /*Stages=*/3>;
static_assert(Traits::kThreads == 256,
              "generator/rules/conv.py and ConvFwdSm90Traits::kThreads disagree on threads per CTA");
static_assert(Traits::kWarpgroups == 2,
              "generator/rules/conv.py and ConvFwdSm90Traits::kWarpgroups disagree on warpgroups along the output positions");
static_assert(Traits::kSmemBytes == 98304,
              "generator/rules/conv.py and ConvFwdSm90Traits::kSmemBytes disagree on shared-memory bytes of the operand stages");
static_assert(Traits::kSmemLaunchBytes == 102400,
              "generator/rules/conv.py and ConvFwdSm90Traits::kSmemLaunchBytes disagree on shared-memory bytes per CTA");
static_assert(Traits::kMinCtasPerSm == 2,
              "generator/rules/conv.py and ConvFwdSm90Traits::kMinCtasPerSm disagree on CTAs an SM holds at once");
}}  // namespace ckfmha_instance_{name}

extern "C" int ckfmha_kernel_{name}(const void* problem, const void* args, const ckfmha_launch_context* context, ckfmha_stream_t stream) {{
  return ckfmha::kernel::launch_conv_fwd_sm90<ckfmha_instance_{name}::Traits>(problem, args, context, stream);
}}
"""


def test_sm90_instance_names_the_wgmma_traits_and_launcher() -> None:
    """The core set's sm_90a tile: two warpgroups, 96 KiB of operand stages and 4 KiB of rows,
    which two CTAs an SM hold."""
    config = _sm90()
    assert emit.render_instance(config) == SM90_INSTANCE.format(name=config.name)
    template = emit.template_for(config)
    assert template.header == "ckfmha/kernel/conv/fwd_launch.cuh"
    assert template.traits == "ckfmha::kernel::ConvFwdSm90Traits"
    assert template.launcher == "ckfmha::kernel::launch_conv_fwd_sm90"


def _asserted(config: KernelConfig, member: str) -> int:
    match = re.search(rf"static_assert\(Traits::{member} == (\d+),", emit.render_instance(config))
    assert match is not None, f"{config.name} asserts no {member}"
    return int(match.group(1))


@pytest.mark.parametrize(
    ("config", "ctas"),
    [
        (_sm90(), 2),
        (_sm90(vector=4), 2),
        (_sm90("fp16", 3, 8, (128, 64, 64, 4, 4)), 2),
        (_sm90(vector=2), 1),  # 4-byte copies: the gathers need the registers
        (_sm90(vector=1), 1),
        (_sm90(tile=(128, 128, 64, 8, 6)), 1),  # 196 KiB: one CTA an SM
        (_sm90(tile=(128, 256, 64, 8, 4)), 1),
    ],
    ids=lambda value: value.name if isinstance(value, KernelConfig) else str(value),
)
def test_sm90_instances_assert_the_ctas_an_sm_holds(config: KernelConfig, ctas: int) -> None:
    """kMinCtasPerSm: two where two CTAs' launched bytes fit 220 KiB and the channel vector is
    4 or 8, else one."""
    assert sm90_min_ctas_per_sm(config) == ctas
    assert _asserted(config, "kMinCtasPerSm") == ctas


def test_sm90_two_ctas_fit_to_the_byte() -> None:
    """Two CTAs of exactly 110 KiB each fit the 220 KiB (as the traits' `<=` has it); the next
    wider tile does not. 80 output channels are outside the rules' wgmma widths but inside the
    traits': the number is a property of the shape alone."""
    fits = _sm90(tile=(64, 80, 64, 4, 6))
    over = _sm90(tile=(64, 96, 64, 4, 6))
    assert conv_smem_launch_bytes(64, 80, 64, 6) == 110 * 1024
    assert conv_smem_launch_bytes(64, 96, 64, 6) > 110 * 1024
    assert (sm90_min_ctas_per_sm(fits), sm90_min_ctas_per_sm(over)) == (2, 1)


@pytest.mark.parametrize(
    ("tile", "warpgroups"),
    [((128, 16, 32, 4, 4), 1), ((256, 128, 64, 8, 4), 2), ((192, 64, 64, 12, 3), 3)],
)
def test_sm90_instances_assert_threads_warpgroups_and_bytes(
    tile: Shape, warpgroups: int
) -> None:
    config = _sm90(tile=tile)
    tile_m, tile_n, tile_k, warps, stages = tile
    assert _asserted(config, "kThreads") == warps * 32
    assert _asserted(config, "kWarpgroups") == warpgroups
    assert _asserted(config, "kSmemBytes") == stages * (tile_m + tile_n) * tile_k * 2
    assert _asserted(config, "kSmemLaunchBytes") == conv_smem_launch_bytes(
        tile_m, tile_n, tile_k, stages
    )
    assert "kWarpsM" not in emit.render_instance(config)


@pytest.mark.parametrize(
    ("tile", "grid"),
    [((128, 16, 32, 4, 4), (4, 1)), ((64, 32, 32, 4, 4), (4, 1)), ((256, 128, 32, 8, 3), (4, 2))],
)
def test_instances_assert_the_warp_grid(
    tile: tuple[int, int, int, int, int], grid: tuple[int, int]
) -> None:
    text = emit.render_instance(_conv(tile=tile))
    assert f"Traits::kWarpsM == {grid[0]}," in text
    assert f"Traits::kWarpsN == {grid[1]}," in text
    assert f"Traits::kThreads == {tile[3] * 32}," in text


def test_table_entries_carry_the_family_and_conv_fields() -> None:
    conv = _conv("sm_86", "fp16", 3, 2, (64, 32, 32, 4, 4))
    attention = KernelConfig(
        FwdSignature("bf16", "batch", 128, 128, "causal", True),
        Algorithm("sm_86", "sm80_cpasync_mma", 128, 64, 128, 4, 1),
    )
    table = emit.render_table([conv, attention], SPECS)
    conv_entry, attention_entry = table.split("    {")[1:]
    assert "CKFMHA_FAMILY_CONV_FWD, CKFMHA_DTYPE_FP16, CKFMHA_MODE_BATCH, 0, 0," in conv_entry
    assert "CKFMHA_MASK_KIND_NONE, CKFMHA_BIAS_NONE" in conv_entry
    assert "/*tile_m=*/64, /*tile_n=*/32, /*tile_k=*/32, /*warps=*/4, /*stages=*/4" in conv_entry
    assert f"&{conv.symbol}, nullptr, /*bias_rows_only=*/0" in conv_entry
    assert "/*conv_spatial_dims=*/3, /*conv_vector=*/2, /*conv_max_channels=*/0}," in conv_entry
    assert "CKFMHA_FAMILY_FWD," in attention_entry
    assert (
        "/*conv_spatial_dims=*/0, /*conv_vector=*/0, /*conv_max_channels=*/0}," in attention_entry
    )


def test_sm90_table_entries_name_the_wgmma_pipeline() -> None:
    """The dispatcher tells the two templates apart by the entry's pipeline string (it prefers
    wgmma and sizes its CTAs per SM differently)."""
    config = _sm90("fp16", 3, 4, (256, 128, 64, 8, 4))
    (entry,) = emit.render_table([config], SPECS).split("    {")[1:]
    assert "CKFMHA_FAMILY_CONV_FWD, CKFMHA_DTYPE_FP16, CKFMHA_MODE_BATCH, 0, 0," in entry
    assert '/*arch=*/90, "sm_90a", "sm90_cpasync_wgmma", /*tile_m=*/256, /*tile_n=*/128, ' in entry
    assert "/*tile_k=*/64, /*warps=*/8, /*stages=*/4" in entry
    assert f"&{config.symbol}, nullptr, /*bias_rows_only=*/0" in entry
    assert "/*conv_spatial_dims=*/3, /*conv_vector=*/4, /*conv_max_channels=*/0}," in entry


@needs_gxx
def test_a_table_with_conv_entries_compiles(tmp_path: Path) -> None:
    configs = select(get_receipt("core"), SPECS["sm_86"]).accepted
    assert any(c.signature.family == "conv_fwd" for c in configs)
    files = emit.emit(tmp_path, configs, [], SPECS)
    command = ["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror"]
    command += [f"-I{REPO_ROOT / 'cpp' / 'include'}", f"-I{tmp_path}", str(files.table)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_manifest_and_units_carry_conv_kernels(tmp_path: Path) -> None:
    configs = [_conv(), _conv(vector=1), _conv(spatial_dims=3)]
    files = emit.emit(tmp_path, configs, [], SPECS, jobs=2)
    manifest = json.loads(files.manifest.read_text())
    assert [k["signature"] for k in manifest["kernels"]] == [
        {"dtype": "bf16", "spatial_dims": 2, "vector": 8, "max_channels": 0, "family": "conv_fwd"},
        {"dtype": "bf16", "spatial_dims": 2, "vector": 1, "max_channels": 0, "family": "conv_fwd"},
        {"dtype": "bf16", "spatial_dims": 3, "vector": 8, "max_channels": 0, "family": "conv_fwd"},
    ]
    headers = {c.name: emit.template_for(c).header for c in configs}
    assert set(headers.values()) == {"ckfmha/kernel/conv/fwd_launch.cuh"}
    units = plan_units(configs, 1, headers)
    assert [u.name for u in units] == ["unit_sm_80_conv_fwd_launch_0"]


def test_both_conv_templates_share_the_launch_header_and_unit() -> None:
    """fwd_launch.cuh holds both launchers, so sm_90a's mma.sync and wgmma conv instances
    compile in the same units."""
    configs = [_conv("sm_90a"), _sm90(), _sm90(vector=1)]
    headers = {c.name: emit.template_for(c).header for c in configs}
    assert set(headers.values()) == {"ckfmha/kernel/conv/fwd_launch.cuh"}
    units = plan_units(configs, 1, headers)
    assert [u.name for u in units] == ["unit_sm_90a_conv_fwd_launch_0"]
    assert sorted(c.name for c in units[0].configs) == sorted(c.name for c in configs)


# ---- kernel sets ----

CORE_SIGNATURES = ["conv_fwd_bf16_2d_v8", "conv_fwd_bf16_3d_v8", "conv_fwd_fp16_2d_v8",
                   "conv_fwd_bf16_2d_v1"]  # fmt: skip
ALL_SIGNATURES = [
    f"conv_fwd_{dtype}_{dims}d_v{vector}" for dtype in DTYPES for dims in (2, 3) for vector in VECTORS
]


def _tokens(pipeline: str, tiles: tuple[ConvTile, ...]) -> list[str]:
    return [_tile_token(t) for t in _of(pipeline, tiles)]


def test_the_sets_tiles() -> None:
    """Each set lists tiles of all four templates; every arch builds those of the templates
    it has (the TMA tiles are test_conv_tma_generator_cpu.py's)."""
    assert {t.pipeline for t in CONV_FULL_TILES} == {SM80, SM90, TMA, DIRECT}
    assert all(t.max_channels == 0 for t in CONV_FULL_TILES if t.pipeline != DIRECT)
    assert _tokens(SM80, CONV_CORE_TILES) == ["m128n128k32_w4s3"]
    assert _tokens(SM90, CONV_CORE_TILES) == ["m128n128k64_w8s3"]
    assert _tokens(SM80, CONV_DEFAULT_TILES) == [
        "m128n128k32_w4s3", "m128n64k32_w4s3", "m64n32k32_w4s4", "m128n16k32_w4s4"
    ]  # fmt: skip
    assert _tokens(SM90, CONV_DEFAULT_TILES) == [
        "m128n128k64_w8s3", "m128n128k64_w8s6", "m128n64k64_w4s4", "m128n32k64_w4s4",
        "m128n16k32_w4s4",
    ]  # fmt: skip
    assert CONV_FULL_TILES[: len(CONV_DEFAULT_TILES)] == CONV_DEFAULT_TILES
    assert _tokens(SM80, CONV_FULL_TILES) == [
        *_tokens(SM80, CONV_DEFAULT_TILES), "m256n128k32_w8s3", "m128n128k64_w4s3"
    ]  # fmt: skip
    assert _tokens(SM90, CONV_FULL_TILES) == [
        *_tokens(SM90, CONV_DEFAULT_TILES), "m128n256k64_w8s4", "m256n128k64_w8s4"
    ]  # fmt: skip


def test_conv_tile_defaults_to_the_sm80_template() -> None:
    assert ConvTile(128, 128, 32, 4, 3).pipeline == SM80


@pytest.mark.parametrize("arch", ("sm_80", "sm_86", "sm_89"))
def test_core_builds_four_sm80_conv_kernels_of_one_tile(arch: str) -> None:
    assert _conv_names("core", arch) == _names(arch, CORE_SIGNATURES, _of(SM80, CONV_CORE_TILES))


def test_core_on_sm_90a_builds_only_the_wgmma_conv_kernels() -> None:
    """Core keeps each signature's preferred template: on sm_90a the four conv signatures get
    the wgmma tile, though the mma.sync one passes the rules too, and the 8-channel ones the
    TMA tiles beside it (which run only channel counts their tile_k divides)."""
    names = _conv_names("core", "sm_90a")
    assert names == [
        f"{signature}__sm_90a_sm90_tma_wgmma_{_tile_token(tile)}"
        for signature in CORE_SIGNATURES if signature.endswith("_v8")
        for tile in _of(TMA, CONV_CORE_TILES)
    ] + [
        f"{signature}__sm_90a_sm90_cpasync_wgmma_m128n128k64_w8s3" for signature in CORE_SIGNATURES
    ]  # fmt: skip
    every_template = dataclasses.replace(get_receipt("core"), preferred_only=False)
    accepted = [
        c.name for c in select(every_template, SPECS["sm_90a"]).accepted
        if c.signature.family == "conv_fwd" and c.algorithm.pipeline != DIRECT
    ]  # fmt: skip
    assert accepted == _names("sm_90a", CORE_SIGNATURES, CONV_CORE_TILES)
    assert [n for n in accepted if SM80 not in n] == names


@pytest.mark.parametrize("arch", ARCHES)
def test_default_builds_every_conv_signature_with_every_default_tile(arch: str) -> None:
    """Every tile of every template the arch has: on sm_90a the four mma.sync tiles, the five
    wgmma ones and for the four 8-channel signatures the five TMA ones, elsewhere the mma.sync
    ones."""
    names = _conv_names("default", arch)
    assert names == _names(arch, ALL_SIGNATURES, CONV_DEFAULT_TILES)
    assert len(names) == (16 * (4 + 5) + 4 * 5 if arch == "sm_90a" else 16 * 4)
    assert any(SM90 in n for n in names) == (arch == "sm_90a")


@pytest.mark.parametrize("arch", ARCHES)
def test_full_adds_the_larger_tiles_that_fit(arch: str) -> None:
    spec = SPECS[arch]
    fits = tuple(
        t for t in CONV_FULL_TILES
        if t.pipeline in spec.pipelines and t.pipeline != DIRECT and t.family == "conv_fwd"
        and conv_smem_launch_bytes(t.tile_m, t.tile_n, t.tile_k, t.stages)
        <= spec.max_dynamic_smem_per_block
    )  # fmt: skip
    assert len(fits) == {"sm_80": 6, "sm_86": 5, "sm_89": 5, "sm_90a": 6 + 7 + 6}[arch]
    assert _conv_names("full", arch) == _names(arch, ALL_SIGNATURES, fits)
    selection = select(get_receipt("full"), SPECS[arch])
    conv_rejected = [r for r in selection.rejected if r.signature.family == "conv_fwd"]
    # Only the 64-wide reduction mma.sync tile on the 99 KiB archs; the wgmma tiles are not
    # candidates where the arch lacks their pipeline.
    assert len(conv_rejected) == (16 if arch in ("sm_86", "sm_89") else 0)
    assert {r.pipeline for r in conv_rejected} <= {SM80}


def test_ci_builds_no_conv_kernel() -> None:
    assert _conv_names("ci", "sm_80") == []
    assert _conv_names("ci", "sm_90a") == []


@pytest.mark.parametrize("arch", ("sm_89", "sm_90a"))
def test_cli_lists_conv_kernels_by_filter(arch: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "generator", "--kernels", "core", "--arch", arch,
         "--filter", "^conv_fwd_", "--list"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    pipeline = SM90 if arch == "sm_90a" else SM80
    # The direct kernels (bf16 2D, groups of 1 and of up to 4 channels) come last, as the arch
    # lists their pipeline last.
    direct = [f"conv_fwd_bf16_2d_v1_c1__{arch}_{DIRECT}_m16n32k1_w8s1",
              f"conv_fwd_bf16_2d_v1_c4__{arch}_{DIRECT}_m16n32k4_w8s1"]  # fmt: skip
    implicit_gemm = _names(arch, CORE_SIGNATURES, _of(pipeline, CONV_CORE_TILES))
    if arch == "sm_90a":  # the TMA tiles of the 8-channel signatures first, as sm_90a lists them
        implicit_gemm = _names(arch, CORE_SIGNATURES, _of(TMA, CONV_CORE_TILES)) + implicit_gemm
    assert result.stdout.split() == implicit_gemm + direct


# The weight gradient's launcher; its instances compile once it is there.
BWD_WEIGHT_LAUNCH = REPO_ROOT / "cpp/include/ckfmha/kernel/conv/bwd_weight_launch.cuh"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ("sm_80", "sm_90a"))
@pytest.mark.parametrize(
    ("family", "direct"),
    [
        ("conv_fwd", 2),
        pytest.param(
            "conv_bwd_weight", 3,
            marks=pytest.mark.skipif(
                not BWD_WEIGHT_LAUNCH.is_file(), reason="launcher header not present"
            ),
        ),
    ],
)  # fmt: skip
def test_core_conv_instances_compile(tmp_path: Path, arch: str, family: str, direct: int) -> None:
    """The core set's conv instances of `family` against the kernel templates, in one compile
    unit: each template takes the traits arguments the generator writes, and agrees with its
    numbers (the forward's on sm_90a the wgmma template's, kMinCtasPerSm included; the weight
    gradient's the mma.sync one's on either arch and its TMA one's on sm_90a; and each family's
    direct kernels: the forward's two, the weight gradient's three, of 1, 4 and 8 channels)."""
    configs = [c for c in select(get_receipt("core"), SPECS[arch]).accepted
               if c.signature.family == family]  # fmt: skip
    # sm_90a's TMA tiles x the 3 v8 signatures: the forward's 2, the weight gradient's 1.
    tma = {"conv_fwd": 6, "conv_bwd_weight": 3}[family] if arch == "sm_90a" else 0
    assert len(configs) == 4 + direct + tma
    assert sum(c.algorithm.pipeline == DIRECT for c in configs) == direct
    compile_one_unit(tmp_path, configs, arch)


@pytest.mark.slow
def test_every_wgmma_tile_compiles(tmp_path: Path) -> None:
    """Each wgmma tile of the full set, and three warpgroups, against ConvFwdSm90Traits: the
    swizzle atoms of 32- and 64-wide reduction steps, wgmma N from 16 to 256, one and two
    CTAs an SM (a 2-channel vector holds one)."""
    configs = [_sm90(tile=_shape(tile)) for tile in SM90_TILES]
    configs += [_sm90(tile=(192, 64, 64, 12, 3)), _sm90("fp16", 3, 2)]
    assert all(_reasons(config) == "" for config in configs)
    compile_one_unit(tmp_path, configs, "sm_90a")
