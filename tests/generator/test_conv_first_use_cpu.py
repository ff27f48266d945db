"""First use of a grouped convolution: the key a runner passes, the kernels it builds (every tile
of the default set on the arch's preferred template, for the dispatcher picks the tile by shape
and prefers wgmma where it has it, and the direct kernel of the key's channel bucket; the
forward's kernels for the data gradient, the weight gradient's own on its preferred template and
its own direct kernel), and the channel vector and buckets the key names, which the C runtime
works out by the same rules."""

from __future__ import annotations

import pytest

from ckfmha import first_use
from ckfmha.first_use import ConvKey, conv_direct_bucket, conv_vector, conv_weight_direct_bucket
from generator.enumerate import select
from generator.receipts import BWD_WEIGHT_DIRECT_BUCKETS, DIRECT_BUCKETS, get_receipt
from generator.specs import load_specs

FP16, BF16, FP32 = 0, 1, 2
FORWARD, BWD_DATA, BWD_WEIGHT = 0, 1, 2
ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90a")
SM80 = "sm80_cpasync_mma"
SM90 = "sm90_cpasync_wgmma"
TMA = "sm90_tma_wgmma"
DIRECT = "conv_direct"


def _default_conv_names(arch: str, signature: str, pipeline: str | None = None) -> list[str]:
    """The default set's kernels of `signature` on `arch` (of one template if given)."""
    return [
        c.name
        for c in select(get_receipt("default"), load_specs()[arch]).accepted
        if c.signature.name == signature and pipeline in (None, c.algorithm.pipeline)
    ]


def test_the_raw_key_of_a_runner_is_a_conv_key() -> None:
    key = first_use.key_of(("conv", (FORWARD, BF16, 2, 8, 4)))
    assert key == ConvKey(direction=FORWARD, dtype=BF16, spatial_dims=2, vector=8, max_channels=4)


def test_a_raw_key_without_a_bucket_has_none() -> None:
    """Runners that pass four fields still work: no channel bucket, no direct kernel."""
    key = first_use.key_of(("conv", (FORWARD, BF16, 2, 8)))
    assert key == ConvKey(direction=FORWARD, dtype=BF16, spatial_dims=2, vector=8)
    assert key.max_channels == 0
    assert key == first_use.key_of(("conv", (FORWARD, BF16, 2, 8, 0)))


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize(
    ("dtype", "spatial_dims", "vector", "signature"),
    [
        (BF16, 2, 8, "conv_fwd_bf16_2d_v8"),
        (FP16, 3, 1, "conv_fwd_fp16_3d_v1"),
        (BF16, 3, 4, "conv_fwd_bf16_3d_v4"),
        (FP16, 2, 2, "conv_fwd_fp16_2d_v2"),
    ],
)
def test_a_conv_key_builds_the_default_sets_kernels(
    arch: str, dtype: int, spatial_dims: int, vector: int, signature: str
) -> None:
    """Every default tile of the arch's preferred template: the wgmma ones on sm_90a (the
    dispatcher ranks wgmma above mma.sync whatever the shape, so it never picks the default
    set's mma.sync kernels there unless forced by name) and, at 8-channel vectors, the TMA ones
    before them (which run channel counts their tile_k divides); the mma.sync ones
    elsewhere."""
    names = [c.name for c in first_use.kernels_for(ConvKey(FORWARD, dtype, spatial_dims, vector),
                                                   arch)]  # fmt: skip
    pipeline = SM90 if arch == "sm_90a" else SM80
    tma = _default_conv_names(arch, signature, TMA)
    assert names == tma + _default_conv_names(arch, signature, pipeline)
    assert len(tma) == (5 if (arch, vector) == ("sm_90a", 8) else 0)
    assert len(names) - len(tma) == (5 if arch == "sm_90a" else 4), "every default tile"
    if arch == "sm_90a":
        built_beside = _default_conv_names(arch, signature, SM80)
        assert len(built_beside) == 4 and not set(built_beside) & set(names)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("bucket", (0, 4))
def test_a_backward_data_key_builds_the_forward_kernels(arch: str, bucket: int) -> None:
    """The data gradient runs forward kernels over dy: its key (the transformed problem's)
    builds exactly what the forward key of the same fields builds, direct kernel included."""
    backward = first_use.kernels_for(ConvKey(BWD_DATA, BF16, 2, 8, bucket), arch)
    forward = first_use.kernels_for(ConvKey(FORWARD, BF16, 2, 8, bucket), arch)
    assert [c.name for c in backward] == [c.name for c in forward] != []
    assert all(c.signature.family == "conv_fwd" for c in backward)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize(
    ("dtype", "spatial_dims", "vector", "signature"),
    [
        (BF16, 2, 8, "conv_bwd_weight_bf16_2d_v8"),
        (FP16, 3, 1, "conv_bwd_weight_fp16_3d_v1"),
        (BF16, 3, 4, "conv_bwd_weight_bf16_3d_v4"),
    ],
)
def test_a_backward_weight_key_builds_its_default_tiles(
    arch: str, dtype: int, spatial_dims: int, vector: int, signature: str
) -> None:
    """Every default tile of the weight gradient's preferred template: wgmma on sm_90a (which
    the dispatcher ranks above mma.sync whatever the shape), mma.sync elsewhere; and, at
    8-channel vectors on sm_90a, the TMA ones (which take only channel counts their copies
    divide, so the gathering ones stay)."""
    key = ConvKey(BWD_WEIGHT, dtype, spatial_dims, vector)
    names = [c.name for c in first_use.kernels_for(key, arch)]
    pipeline = SM90 if arch == "sm_90a" else SM80
    tma = _default_conv_names(arch, signature, TMA)
    assert names == tma + _default_conv_names(arch, signature, pipeline)
    assert len(tma) == (4 if (arch, vector) == ("sm_90a", 8) else 0)
    assert len(names) - len(tma) == 4, "every tile of the default set"


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize(
    ("dtype", "spatial_dims", "vector", "bucket", "implicit", "direct"),
    [
        (BF16, 2, 1, 1, "conv_bwd_weight_bf16_2d_v1", "conv_bwd_weight_bf16_2d_v1_c1"),
        (FP16, 3, 2, 2, "conv_bwd_weight_fp16_3d_v2", "conv_bwd_weight_fp16_3d_v1_c2"),
    ],
)
def test_a_bucketed_backward_weight_key_adds_its_direct_kernel(
    arch: str,
    dtype: int,
    spatial_dims: int,
    vector: int,
    bucket: int,
    implicit: str,
    direct: str,
) -> None:
    """The implicit-GEMM kernels of the key's vector, then the default set's weight-gradient
    direct kernel of the bucket, on every arch; the plan without it follows."""
    from ckfmha import jit

    key = ConvKey(BWD_WEIGHT, dtype, spatial_dims, vector, bucket)
    plans = first_use.plans_for(key, jit.generator_modules())
    assert [[s.name for s in plan] for plan in plans] == [[implicit, direct], [implicit]]
    names = [c.name for c in first_use.kernels_for(key, arch)]
    direct_names = _default_conv_names(arch, direct, DIRECT)
    assert len(direct_names) == 1
    pipeline = SM90 if arch == "sm_90a" else SM80
    assert names == _default_conv_names(arch, implicit, pipeline) + direct_names


@pytest.mark.parametrize("bucket", (3, 16))
def test_a_backward_weight_bucket_without_a_kernel_falls_back(bucket: int) -> None:
    """The sets build the weight gradient's direct kernels for groups of 1, 2, 4 and 8
    channels: a bucket they do not build leaves the implicit-GEMM kernels alone."""
    key = ConvKey(BWD_WEIGHT, BF16, 2, 1, bucket)
    names = [c.name for c in first_use.kernels_for(key, "sm_86")]
    assert names == [c.name for c in first_use.kernels_for(ConvKey(BWD_WEIGHT, BF16, 2, 1),
                                                           "sm_86")]  # fmt: skip
    assert names == _default_conv_names("sm_86", "conv_bwd_weight_bf16_2d_v1", SM80)


def test_the_raw_key_of_a_backward_weight_runner() -> None:
    key = first_use.key_of(("conv", (BWD_WEIGHT, FP16, 3, 8, 0)))
    assert key == ConvKey(direction=BWD_WEIGHT, dtype=FP16, spatial_dims=3, vector=8)
    # The default set's four gathering wgmma tiles and four TMA ones.
    assert [c.signature.family for c in first_use.kernels_for(key, "sm_90a")] == [
        "conv_bwd_weight"
    ] * 8


@pytest.mark.parametrize(
    "key",
    [
        ConvKey(direction=3, dtype=BF16, spatial_dims=2, vector=8),  # no such pass
        ConvKey(FORWARD, FP32, 2, 8),
        ConvKey(FORWARD, 7, 2, 8),  # not a ckfmha_dtype
        ConvKey(FORWARD, BF16, 1, 8),
        ConvKey(FORWARD, BF16, 2, 3),
    ],
)
def test_keys_without_kernels_build_nothing(key: ConvKey) -> None:
    """The launch reports what is unsupported; first use has nothing to compile for it."""
    assert first_use.kernels_for(key, "sm_80") == []


def test_ensure_compiles_only_what_the_registry_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner's ensure(("conv", ...)) builds the key's kernels the registry lacks, once."""
    from ckfmha import jit

    wanted = _default_conv_names("sm_90a", "conv_fwd_bf16_3d_v8", TMA)
    wanted += _default_conv_names("sm_90a", "conv_fwd_bf16_3d_v8", SM90)
    built: list[tuple[list[str], str]] = []

    class Registry:
        def names(self) -> list[str]:
            return wanted[:1]

    monkeypatch.setattr(first_use, "_FIRST_USE", first_use._FirstUse())
    monkeypatch.setattr(first_use, "_SERVED_RAW", set())
    monkeypatch.setattr(first_use, "current_arch", lambda: 90)
    monkeypatch.setattr("ckfmha._registry.Registry", Registry)
    monkeypatch.setattr(jit, "build", lambda names, progress: built.append((names, progress)))
    monkeypatch.delenv("CKFMHA_JIT", raising=False)
    raw = ("conv", (FORWARD, BF16, 3, 8))
    first_use.ensure(raw)
    first_use.ensure(raw)
    assert built == [(wanted[1:], "line")]
    assert (90, raw) in first_use._SERVED_RAW


def _built_on_first_use(monkeypatch: pytest.MonkeyPatch, registered: list[str], arch: int,
                        raw_key: tuple[int, ...]) -> list[list[str]]:  # fmt: skip
    """The kernel lists first use hands the build for a runner's raw conv key on `arch`, with
    `registered` already in the registry (the build is recorded, not run)."""
    from ckfmha import jit

    built: list[list[str]] = []

    class Registry:
        def names(self) -> list[str]:
            return registered

    monkeypatch.setattr(first_use, "_FIRST_USE", first_use._FirstUse())
    monkeypatch.setattr(first_use, "_SERVED_RAW", set())
    monkeypatch.setattr(first_use, "current_arch", lambda: arch)
    monkeypatch.setattr("ckfmha._registry.Registry", Registry)
    monkeypatch.setattr(jit, "build", lambda names, progress: built.append(names))
    monkeypatch.delenv("CKFMHA_JIT", raising=False)
    first_use.ensure(("conv", raw_key))
    return built


def test_ensure_with_a_bucket_compiles_the_direct_kernel_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The five-field key the runner passes for groups of few channels: with the implicit-GEMM
    kernels registered, first use compiles the direct one alone."""

    implicit = _default_conv_names("sm_86", "conv_fwd_fp16_2d_v1", SM80)
    direct = _default_conv_names("sm_86", "conv_fwd_fp16_2d_v1_c1", DIRECT)
    built = _built_on_first_use(monkeypatch, implicit, 86,
                                (FORWARD, FP16, 2, 1, conv_direct_bucket(1, 1)))  # fmt: skip
    assert built == [direct] and len(direct) == 1


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize(
    ("dtype", "spatial_dims", "vector", "bucket", "implicit", "direct"),
    [
        (BF16, 2, 1, 1, "conv_fwd_bf16_2d_v1", "conv_fwd_bf16_2d_v1_c1"),  # depthwise
        (FP16, 3, 4, 4, "conv_fwd_fp16_3d_v4", "conv_fwd_fp16_3d_v1_c4"),
        (FP16, 2, 2, 2, "conv_fwd_fp16_2d_v2", "conv_fwd_fp16_2d_v1_c2"),
    ],
)
def test_a_bucketed_key_adds_the_direct_kernel(
    arch: str,
    dtype: int,
    spatial_dims: int,
    vector: int,
    bucket: int,
    implicit: str,
    direct: str,
) -> None:
    """The implicit-GEMM kernels of the key's vector as without a bucket, then the default
    set's direct kernel of the bucket (one channel a load, whatever the key's vector): the
    dispatcher weighs them per problem."""
    key = ConvKey(FORWARD, dtype, spatial_dims, vector, bucket)
    names = [c.name for c in first_use.kernels_for(key, arch)]
    pipeline = SM90 if arch == "sm_90a" else SM80
    direct_names = _default_conv_names(arch, direct, DIRECT)
    assert len(direct_names) == 1
    assert names == _default_conv_names(arch, implicit, pipeline) + direct_names
    unbucketed = ConvKey(FORWARD, dtype, spatial_dims, vector)
    assert [c.name for c in first_use.kernels_for(unbucketed, arch)] == names[:-1]


def test_a_bucket_without_a_kernel_falls_back_to_the_implicit_gemm_ones() -> None:
    """A bucket the generator cannot build (16 channels) leaves the implicit-GEMM kernels."""
    key = ConvKey(FORWARD, BF16, 2, 8, max_channels=16)
    names = [c.name for c in first_use.kernels_for(key, "sm_80")]
    assert names == _default_conv_names("sm_80", "conv_fwd_bf16_2d_v8", SM80)


@pytest.mark.parametrize(
    ("in_channels", "out_channels", "bucket"),
    [
        (1, 1, 1),  # depthwise
        (1, 2, 2),  # depthwise with a channel multiplier of 2
        (2, 1, 2),
        (3, 3, 4),
        (4, 4, 4),
        (4, 5, 0),  # 8-channel groups run on the implicit GEMM (no direct kernel is built)
        (8, 8, 0),
        (8, 9, 0),
        (16, 16, 0),
        (64, 1, 0),
        (0, 4, 0),  # an empty group: the launch reports it
    ],
)
def test_conv_direct_bucket_is_the_narrowest_holding_both_counts(
    in_channels: int, out_channels: int, bucket: int
) -> None:
    assert conv_direct_bucket(in_channels, out_channels) == bucket


@pytest.mark.parametrize(
    ("in_channels", "out_channels", "bucket"),
    [
        (1, 1, 1),  # depthwise
        (1, 2, 2),  # depthwise with a channel multiplier of 2
        (2, 1, 2),
        (2, 2, 2),
        (1, 3, 4),
        (3, 3, 4),
        (4, 4, 4),
        (8, 8, 8),  # the 8-channel kernel's vector path
        (8, 5, 0),  # other groups of more than 4 channels run on the implicit GEMM
        (4, 8, 0),
        (9, 1, 0),
        (64, 1, 0),
        (0, 1, 0),  # an empty group: the launch reports it
        (1, 0, 0),
    ],
)
def test_conv_weight_direct_bucket_is_the_narrowest_holding_both(
    in_channels: int, out_channels: int, bucket: int
) -> None:
    assert conv_weight_direct_bucket(in_channels, out_channels) == bucket


def test_the_buckets_are_the_ones_the_kernel_sets_build() -> None:
    """A bucket the sets build is the one first use asks for: the runners' buckets follow the
    generator's."""
    assert first_use.CONV_MAX_CHANNELS == DIRECT_BUCKETS
    assert first_use.CONV_WEIGHT_MAX_CHANNELS == BWD_WEIGHT_DIRECT_BUCKETS
    assert set(first_use.CONV_DIRECT_FAMILIES) == {"conv_fwd", "conv_bwd_weight"}


def test_ensure_with_a_weight_bucket_compiles_its_direct_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The weight-gradient runner's key with conv_weight_direct_bucket's value: with the
    implicit-GEMM kernels registered, first use compiles the direct one alone."""

    implicit = _default_conv_names("sm_90a", "conv_bwd_weight_bf16_3d_v8")
    implicit = [name for name in implicit if "_conv_direct_" not in name]
    direct = _default_conv_names("sm_90a", "conv_bwd_weight_bf16_3d_v1_c1", DIRECT)
    built = _built_on_first_use(monkeypatch, implicit, 90,
                                (BWD_WEIGHT, BF16, 3, 8, conv_weight_direct_bucket(1, 1)))  # fmt: skip
    assert built == [direct] and len(direct) == 1


# ---- the channel vector ----


# NHWC strides of a dense 2D input with C channels per group and G groups: (batch, h, w).
def _dense_strides(channels: int, groups: int = 1, h: int = 56, w: int = 56) -> list[int]:
    position = groups * channels
    return [h * w * position, w * position, position]


@pytest.mark.parametrize(
    ("in_channels", "strides", "x_ptr", "w_ptr", "expected"),
    [
        (64, _dense_strides(64), 0x10000, 0x20000, 8),  # dense, 16-byte aligned
        (4, _dense_strides(4), 0x10000, 0x20000, 4),
        (3, _dense_strides(3), 0x10000, 0x20000, 1),  # an RGB input layer
        (6, _dense_strides(6), 0x10000, 0x20000, 2),
        (64, _dense_strides(64), 0x10008, 0x20000, 4),  # x 8-byte aligned
        (64, _dense_strides(64), 0x10000, 0x20004, 2),  # w 4-byte aligned
        (64, _dense_strides(64), 0x10002, 0x20000, 1),  # x element-aligned only
        (8, _dense_strides(8, groups=3), 0x10000, 0x20000, 8),  # group stride 8: aligned
        (64, [56 * 56 * 64 + 4, 56 * 64, 64], 0x10000, 0x20000, 4),  # padded batch stride
        (64, [56 * 56 * 64, 56 * 64 + 2, 64], 0x10000, 0x20000, 2),  # padded rows
        (16, [0, 16 * 9, 16 * 3, 16], 0x10000, 0x20000, 8),  # 3D, broadcast batch
    ],
)
def test_conv_vector_is_the_widest_the_channels_strides_and_pointers_allow(
    in_channels: int, strides: list[int], x_ptr: int, w_ptr: int, expected: int
) -> None:
    assert conv_vector(in_channels, strides, x_ptr, w_ptr) == expected


def test_conv_vector_scales_the_alignment_with_the_element_size() -> None:
    assert conv_vector(64, _dense_strides(64), 0x10008, 0x20000) == 4
    assert conv_vector(64, _dense_strides(64), 0x10008, 0x20000, element_bytes=1) == 8
