"""The direct grouped-convolution template (conv_direct, ConvFwdDirectTraits) in the generator:
groups of at most 1, 2, 4 or 8 channels computed on the CUDA cores. Its names (the channel
bucket token), its limits, its instances and table entries, the one tile each direct signature
gets in the kernel sets, and that direct tiles and implicit-GEMM signatures never meet. The
weight gradient's direct template has test_conv_bwd_weight_generator_cpu.py."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from support.paths import REPO_ROOT

from generator import build, emit, rules, toolchain
from generator.enumerate import select
from generator.names import parse_kernel_name
from generator.receipts import (
    CONV_CORE_TILES,
    CONV_DEFAULT_TILES,
    CONV_DIRECT_TILES,
    CONV_FULL_TILES,
    DIRECT_BUCKETS,
    ConvTile,
    get_receipt,
)
from generator.signature import CONV_MAX_CHANNELS, Algorithm, ConvSignature, KernelConfig
from generator.specs import load_specs
from generator.units import plan_units

SPECS = load_specs()
ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90a")
DTYPES = ("fp16", "bf16")
DIRECT = "conv_direct"
SM80 = "sm80_cpasync_mma"
SM90 = "sm90_cpasync_wgmma"

Shape = tuple[int, int, int, int, int]  # tile_m (Run), tile_n, tile_k, warps, stages


def _direct(
    max_channels: int = 4,
    arch: str = "sm_80",
    dtype: str = "bf16",
    spatial_dims: int = 2,
    tile: Shape | None = None,
    vector: int = 1,
    ctas_per_sm: int = 1,
) -> KernelConfig:
    """A direct config; by default the sets' 2D tile for the bucket (Run 16, 8 warps)."""
    tile_m, tile_n, tile_k, warps, stages = tile or (16, 32, max_channels, 8, 1)
    return KernelConfig(
        ConvSignature(dtype, spatial_dims, vector, max_channels=max_channels),
        Algorithm(arch, DIRECT, tile_m, tile_n, tile_k, warps, stages, ctas_per_sm),
    )


def _reasons(config: KernelConfig) -> str:
    return "\n".join(rules.check(config, SPECS[config.algorithm.arch]))


def _tile_of(tile: ConvTile, arch: str, dtype: str) -> KernelConfig:
    return KernelConfig(
        ConvSignature(dtype, tile.spatial_dims, 1, max_channels=tile.max_channels),
        Algorithm(arch, DIRECT, tile.tile_m, tile.tile_n, tile.tile_k, tile.warps, tile.stages),
    )


def _tile_id(tile: ConvTile) -> str:
    return f"{tile.spatial_dims}d_c{tile.max_channels}_m{tile.tile_m}w{tile.warps}"


def _conv_kernels(kernel_set: str, arch: str) -> list[KernelConfig]:
    return [
        c for c in select(get_receipt(kernel_set), SPECS[arch]).accepted
        if c.signature.family == "conv_fwd"
    ]  # fmt: skip


def _direct_name(dtype: str, dims: int, bucket: int, arch: str) -> str:
    """The sets' tile for (dims, bucket): 2D Run 16 (8 at 8 channels) over 8 warps, 3D Run 8
    over 4 warps."""
    run, warps = ((8 if bucket == 8 else 16), 8) if dims == 2 else (8, 4)
    return f"conv_fwd_{dtype}_{dims}d_v1_c{bucket}__{arch}_{DIRECT}_m{run}n32k{bucket}_w{warps}s1"


# ---- names ----


def test_the_channel_bucket_follows_the_vector_in_the_name() -> None:
    assert ConvSignature("bf16", 2, 1, max_channels=4).name == "conv_fwd_bf16_2d_v1_c4"
    assert ConvSignature("fp16", 3, 1, max_channels=1).name == "conv_fwd_fp16_3d_v1_c1"
    # No bucket (the implicit-GEMM kernels): the name is unchanged.
    assert ConvSignature("bf16", 2, 8).name == "conv_fwd_bf16_2d_v8"
    assert ConvSignature("bf16", 2, 8).max_channels == 0
    assert _direct(4).name == "conv_fwd_bf16_2d_v1_c4__sm_80_conv_direct_m16n32k4_w8s1"


@pytest.mark.parametrize(
    "config",
    [
        _direct(1),
        _direct(8, "sm_90a", "fp16", 3, (8, 32, 8, 4, 1)),
        _direct(2, "sm_86", tile=(4, 32, 2, 4, 1)),
        # Outside the limits, for the rules to explain.
        _direct(16, tile=(4, 32, 16, 4, 1)),
        _direct(4, vector=8),
    ],
    ids=lambda config: config.name,
)
def test_direct_names_read_back_as_their_configs(config: KernelConfig) -> None:
    assert parse_kernel_name(config.name) == config


def test_a_zero_bucket_is_not_spelled() -> None:
    """max_channels=0 has no token, so `_c0` is no canonical name."""
    assert parse_kernel_name("conv_fwd_bf16_2d_v8_c0__sm_80_sm80_cpasync_mma_m128n128k32_w4s3") is (
        None
    )


def test_a_bucket_outside_the_limits_reads_back_for_the_rules_to_explain() -> None:
    config = parse_kernel_name("conv_fwd_bf16_2d_v1_c16__sm_80_conv_direct_m4n32k16_w4s1")
    assert config is not None and config.signature.max_channels == 16
    assert "max_channels=16 is not supported; supported: 1, 2, 4, 8" in _reasons(config)


# ---- rules ----


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("tile", CONV_DIRECT_TILES, ids=_tile_id)
def test_the_sets_direct_tiles_are_valid_on_every_arch(arch: str, tile: ConvTile) -> None:
    """Plain CUDA-core code: every arch lists the pipeline, and each set tile passes with its
    signature in both dtypes."""
    assert DIRECT in SPECS[arch].pipelines
    for dtype in DTYPES:
        assert _reasons(_tile_of(tile, arch, dtype)) == ""


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            _direct(4, vector=8),
            (
                "vector=8 is not supported by the direct conv template; it reads a group's "
                "channels one by one (vector=1)"
            ),
        ),
        (
            _direct(0, tile=(16, 32, 0, 8, 1)),
            (
                "max_channels=0 (any channel count) is the implicit-GEMM templates'; the direct "
                "conv template computes groups of at most 1, 2, 4 or 8 input and output channels"
            ),
        ),
        (
            _direct(16, tile=(4, 32, 16, 4, 1)),
            "max_channels=16 is not supported; supported: 1, 2, 4, 8 input and output channels",
        ),
        (_direct(3, tile=(8, 32, 3, 4, 1)), "max_channels=3 is not supported"),
        (
            _direct(4, tile=(16, 64, 4, 8, 1)),
            (
                "tile_n=64 is not supported; the direct conv template takes 32 consecutive "
                "groups a CTA, one a lane (tile_n=32)"
            ),
        ),
        (
            _direct(4, tile=(16, 32, 2, 8, 1)),
            (
                "tile_k=2 does not equal max_channels=4; the direct conv template's reduction "
                "step is one group's input channels"
            ),
        ),
        (
            _direct(1, tile=(32, 32, 1, 8, 1)),
            "tile_m=32 output positions a thread (Run) is not supported; supported: 4, 8, 16",
        ),
        (
            _direct(8, tile=(16, 32, 8, 8, 1)),
            (
                "tile_m x max_channels = 16 x 8 = 128 fp32 accumulators a thread exceed 64: "
                "each thread keeps Run output positions of every output channel of its group "
                "in registers"
            ),
        ),
        (
            _direct(4, tile=(16, 32, 4, 2, 1)),
            "warps=2 is not supported; the direct conv template runs 4 or 8 warps",
        ),
        (
            _direct(4, tile=(16, 32, 4, 8, 2)),
            (
                "stages=2 is not supported; the direct conv template loads its input tile and "
                "filters into shared memory once (stages=1)"
            ),
        ),
        (_direct(4, ctas_per_sm=2), "ctas_per_sm=2 is not supported; the direct conv template"),
        (
            _direct(4, dtype="fp32"),
            (
                "dtype 'fp32' is not supported by conv_fwd: it computes in fp16 or bf16 (fp32 "
                "FMA on the CUDA cores)"
            ),
        ),
        (_direct(4, spatial_dims=1), "spatial_dims=1 is not supported"),
    ],
    ids=lambda value: value.name if isinstance(value, KernelConfig) else "",
)
def test_direct_rule_fires_with_a_reason_naming_the_limit(
    config: KernelConfig, expected: str
) -> None:
    reasons = _reasons(config)
    assert expected in reasons, reasons


@pytest.mark.parametrize(
    ("pipeline", "arch", "tile"),
    [(SM80, "sm_80", (128, 128, 32, 4, 3)), (SM90, "sm_90a", (128, 128, 64, 8, 3))],
)
def test_implicit_gemm_templates_reject_a_channel_bucket(
    pipeline: str, arch: str, tile: Shape
) -> None:
    config = KernelConfig(
        ConvSignature("bf16", 2, 1, max_channels=4), Algorithm(arch, pipeline, *tile)
    )
    assert (
        "max_channels=4 is the direct template's channel bucket (pipeline conv_direct); the "
        "implicit-GEMM conv templates take any channel count (max_channels=0)"
    ) in _reasons(config)


@pytest.mark.parametrize(
    ("max_channels", "tile"),
    [(8, (4, 32, 8, 4, 1)), (1, (16, 32, 1, 4, 1)), (2, (8, 32, 2, 8, 1)), (4, (4, 32, 4, 8, 1))],
    ids=str,
)
def test_shapes_outside_the_sets_pass_within_the_limits(max_channels: int, tile: Shape) -> None:
    assert _reasons(_direct(max_channels, tile=tile)) == ""
    assert _reasons(_direct(max_channels, spatial_dims=3, tile=tile)) == ""


def test_no_shared_memory_rule() -> None:
    """The kernel's shared memory depends on the problem's stride, dilation and filter, so the
    runtime checks it per problem: an arch of 1 KiB a block still accepts the config."""
    small = dataclasses.replace(SPECS["sm_80"], max_dynamic_smem_per_block=1024)
    assert rules.check(_direct(8, tile=(8, 32, 8, 8, 1)), small) == []


def test_signatures_meet_the_template_of_their_kind() -> None:
    """A bucketed signature meets the direct template alone, one without the implicit-GEMM
    ones; so neither is paired with the other's tiles, nor rejected for it."""
    pipelines = SPECS["sm_90a"].pipelines
    bucketed = ConvSignature("bf16", 2, 1, max_channels=2)
    assert rules.pipelines_for_signature(bucketed, pipelines) == (DIRECT,)
    plain = ConvSignature("bf16", 2, 1)
    assert rules.pipelines_for_signature(plain, pipelines) == (SM80, SM90)
    assert rules.pipelines_for_signature(plain, SPECS["sm_80"].pipelines) == (SM80,)


# ---- emitted sources ----

INSTANCE = """\
// Generated by the ckfmha generator (python -m generator). Do not edit.
#include "ckfmha/kernel/conv/fwd_launch.cuh"

namespace ckfmha_instance_{name} {{
using Traits = ckfmha::kernel::ConvFwdDirectTraits<cutlass::bfloat16_t, /*SpatialDims=*/2, /*MaxChannels=*/4, /*Run=*/16, /*Warps=*/8>;
static_assert(Traits::kThreads == 256,
              "generator/rules/conv_direct.py and ConvFwdDirectTraits::kThreads disagree on threads per CTA");
static_assert(Traits::kMaxChannels == 4,
              "generator/rules/conv_direct.py and ConvFwdDirectTraits::kMaxChannels disagree on input and output channels a group");
static_assert(Traits::kRun == 16,
              "generator/rules/conv_direct.py and ConvFwdDirectTraits::kRun disagree on output positions a thread computes");
static_assert(Traits::kTileH == 8,
              "generator/rules/conv_direct.py and ConvFwdDirectTraits::kTileH disagree on output rows a CTA computes (one a warp)");
static_assert(Traits::kGroups == 32,
              "generator/rules/conv_direct.py and ConvFwdDirectTraits::kGroups disagree on groups a CTA computes");
}}  // namespace ckfmha_instance_{name}

extern "C" int ckfmha_kernel_{name}(const void* problem, const void* args, const ckfmha_launch_context* context, ckfmha_stream_t stream) {{
  return ckfmha::kernel::launch_conv_fwd_direct<ckfmha_instance_{name}::Traits>(problem, args, context, stream);
}}
"""


def test_instance_names_the_direct_traits_and_launcher() -> None:
    config = _direct(4)
    assert emit.render_instance(config) == INSTANCE.format(name=config.name)
    template = emit.template_for(config)
    assert template.header == "ckfmha/kernel/conv/fwd_launch.cuh"
    assert template.traits == "ckfmha::kernel::ConvFwdDirectTraits"
    assert template.launcher == "ckfmha::kernel::launch_conv_fwd_direct"
    assert template.resident_ctas is None


def test_3d_instance_arguments() -> None:
    text = emit.render_instance(_direct(8, "sm_90a", "fp16", 3, (8, 32, 8, 4, 1)))
    assert (
        "ckfmha::kernel::ConvFwdDirectTraits<cutlass::half_t, /*SpatialDims=*/3, "
        "/*MaxChannels=*/8, /*Run=*/8, /*Warps=*/4>;"
    ) in text
    assert "Traits::kThreads == 128," in text and "Traits::kTileH == 4," in text


def test_table_entry_carries_the_channel_bucket() -> None:
    config = _direct(2, "sm_89", "fp16", 3, (8, 32, 2, 4, 1))
    (entry,) = emit.render_table([config], SPECS).split("    {")[1:]
    entry = entry.split("\n};\n", 1)[0]
    assert "CKFMHA_FAMILY_CONV_FWD, CKFMHA_DTYPE_FP16, CKFMHA_MODE_BATCH, 0, 0," in entry
    assert '/*arch=*/89, "sm_89", "conv_direct", /*tile_m=*/8, /*tile_n=*/32, ' in entry
    assert "/*tile_k=*/2, /*warps=*/4, /*stages=*/1" in entry
    assert f"&{config.symbol}, nullptr, /*bias_rows_only=*/0" in entry
    # The last field, in kernel_entry.h's order.
    assert entry.endswith("/*conv_spatial_dims=*/3, /*conv_vector=*/1, /*conv_max_channels=*/2},")


def test_direct_instances_share_the_conv_launch_unit(tmp_path: Path) -> None:
    """fwd_launch.cuh holds the direct launcher too: one unit takes every conv template."""
    configs = [
        _direct(1, "sm_90a"),
        _direct(8, "sm_90a", spatial_dims=3, tile=(8, 32, 8, 4, 1)),
        KernelConfig(ConvSignature("bf16", 2, 8), Algorithm("sm_90a", SM90, 128, 128, 64, 8, 3)),
    ]
    headers = {c.name: emit.template_for(c).header for c in configs}
    units = plan_units(configs, 1, headers)
    assert [u.name for u in units] == ["unit_sm_90a_conv_fwd_launch_0"]
    files = emit.emit(tmp_path, configs, [], SPECS, jobs=1)
    manifest = files.manifest.read_text()
    assert '"max_channels": 8' in manifest and '"max_channels": 0' in manifest


# ---- kernel sets ----


def test_one_direct_tile_per_dims_and_bucket() -> None:
    """2D: Run 16 (8 at 8 channels, keeping 64 accumulators a thread) over 8 warps; 3D: Run 8
    over 4 warps. Each applies to its own (dims, bucket) only."""
    shapes = {
        (t.spatial_dims, t.max_channels): (t.tile_m, t.tile_n, t.tile_k, t.warps, t.stages)
        for t in CONV_DIRECT_TILES
    }
    # The sets build buckets 1, 2 and 4 (8-channel groups run faster on the implicit GEMM).
    assert shapes == {
        (2, 1): (16, 32, 1, 8, 1), (2, 2): (16, 32, 2, 8, 1), (2, 4): (16, 32, 4, 8, 1),
        (3, 1): (8, 32, 1, 4, 1), (3, 2): (8, 32, 2, 4, 1), (3, 4): (8, 32, 4, 4, 1),
    }  # fmt: skip
    assert len(CONV_DIRECT_TILES) == 6 and all(t.pipeline == DIRECT for t in CONV_DIRECT_TILES)
    for tiles in (CONV_CORE_TILES, CONV_DEFAULT_TILES, CONV_FULL_TILES):
        forward = [t for t in tiles if t.pipeline == DIRECT and t.family == "conv_fwd"]
        assert forward == list(CONV_DIRECT_TILES)
    for tile in CONV_DIRECT_TILES:
        for dims in (2, 3):
            for bucket in (0, *CONV_MAX_CHANNELS):
                sig = ConvSignature("bf16", dims, 1, max_channels=bucket)
                expected = (dims, bucket) == (tile.spatial_dims, tile.max_channels)
                assert tile.applies_to(sig) == expected
    implicit = [t for t in CONV_FULL_TILES if t.pipeline != DIRECT and t.family == "conv_fwd"]
    assert all(t.applies_to(ConvSignature("bf16", 3, 8)) for t in implicit)
    assert not any(t.applies_to(ConvSignature("bf16", 3, 1, max_channels=1)) for t in implicit)


@pytest.mark.parametrize("arch", ARCHES)
def test_core_builds_two_bf16_2d_direct_kernels(arch: str) -> None:
    """Depthwise (1 channel) and groups of up to 4, on every arch; preferred_only keeps them
    (they are signatures of their own, whose only template is the direct one)."""
    direct = [c.name for c in _conv_kernels("core", arch) if c.algorithm.pipeline == DIRECT]
    assert direct == [_direct_name("bf16", 2, 1, arch), _direct_name("bf16", 2, 4, arch)]
    every_template = dataclasses.replace(get_receipt("core"), preferred_only=False)
    unfiltered = [
        c.name for c in select(every_template, SPECS[arch]).accepted
        if c.algorithm.pipeline == DIRECT and c.signature.family == "conv_fwd"
    ]  # fmt: skip
    assert unfiltered == direct


@pytest.mark.parametrize("kernel_set", ("default", "full"))
@pytest.mark.parametrize("arch", ARCHES)
def test_default_and_full_build_every_direct_signature_once(kernel_set: str, arch: str) -> None:
    direct = [c.name for c in _conv_kernels(kernel_set, arch) if c.algorithm.pipeline == DIRECT]
    assert direct == [
        _direct_name(dtype, dims, bucket, arch)
        for dtype in DTYPES for dims in (2, 3) for bucket in DIRECT_BUCKETS
    ]  # fmt: skip


@pytest.mark.parametrize("kernel_set", ("core", "default", "full"))
@pytest.mark.parametrize("arch", ARCHES)
def test_direct_tiles_and_implicit_signatures_never_meet(kernel_set: str, arch: str) -> None:
    """Every candidate pairs a bucketed signature with a direct tile and an unbucketed one with
    an implicit-GEMM tile, in either family: no kernel or rejection of the other pairing
    exists."""
    selection = select(get_receipt(kernel_set), SPECS[arch])
    configs = [(c.signature, c.algorithm) for c in selection.accepted]
    configs += [(r.signature, r.algorithm) for r in selection.rejected]
    for sig, alg in configs:
        if sig.family not in ("conv_fwd", "conv_bwd_weight"):
            continue
        assert alg is not None
        assert (alg.pipeline == DIRECT) == (sig.max_channels != 0), (sig.name, alg.name)
    assert not any(r.pipeline == DIRECT for r in selection.rejected)


def test_ci_builds_no_direct_kernel() -> None:
    assert not any(c.algorithm.pipeline == DIRECT for c in _conv_kernels("ci", "sm_90a"))


@pytest.mark.slow
def test_every_direct_kernel_of_the_default_set_compiles(tmp_path: Path) -> None:
    """The 12 direct instances against ConvFwdDirectTraits, in the units the build would
    compile: the template takes the arguments the generator writes and agrees with the numbers
    it asserts."""
    try:
        toolchain.find_nvcc()
        toolchain.find_cutlass_include()
    except toolchain.ToolchainError as error:
        pytest.skip(f"CUDA toolchain unavailable: {error}")
    configs = [c for c in _conv_kernels("default", "sm_80") if c.algorithm.pipeline == DIRECT]
    assert len(configs) == 12
    files = emit.emit(tmp_path, configs, [], SPECS, jobs=1)
    compiler = toolchain.CudaToolchain(
        build.arch_specs_for(["sm_80"]), [REPO_ROOT / "cpp" / "include", tmp_path]
    )
    for unit_path, unit in files.units:
        job = toolchain.CompileJob(unit_path, unit_path.with_suffix(".o"), unit.arch)
        command = compiler.compile_command(job, unit_path.with_suffix(".d"))
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
