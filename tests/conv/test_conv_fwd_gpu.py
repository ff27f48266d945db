"""Grouped convolution forward on the GPU against the float64 reference (ckfmha.reference_conv),
over the cases of support.conv_cases (its docstring states the shapes and the error bound).
Arrays come dense, cut from larger tensors (batch and spatial strides free, outputs too), with
a channel offset that misaligns the pointers and the position stride (narrower channel loads),
and as torch channels_last tensors viewed as [N, *spatial, G, C]. Outputs are poisoned with
NaN first; around a cut-out output every other element must stay NaN.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

import numpy as np
import pytest
from support.conv_cases import (
    CASES,
    DEPTHWISE_LANE_CASES,
    DEPTHWISE_VECTOR_CASES,
    DRAWN,
    LEARNED,
    SPLIT_TMA_CASES,
    VECTOR_FWD_CASES,
    VECTOR_FWD_LANE_CASES,
    Case,
    Inputs,
    assert_outside_untouched,
    assert_within,
    f64,
    make_out,
    make_x,
)
from support.device_kernels import runs_on

import ckfmha
from ckfmha import errors
from ckfmha.reference_conv import conv_fwd as reference_conv_fwd

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

NAME = re.compile(r"^conv_fwd_(?P<dtype>fp16|bf16)_(?P<dims>[23])d_v(?P<vector>\d+)__")
# Kernels fed by the copy engine's im2col mode: tile_k channels of one tap per k-tile.
TMA_NAME = re.compile(
    r"^conv_fwd_(?P<dtype>fp16|bf16)_(?P<dims>[23])d_v8__.*_sm90_tma_wgmma_m\d+n\d+k(?P<tile_k>\d+)_"
)
# Direct kernels: groups of at most `bucket` input and output channels.
DIRECT_NAME = re.compile(r"^conv_fwd_(?P<dtype>fp16|bf16)_(?P<dims>[23])d_v1_c(?P<bucket>\d+)__")


def assert_conv_close(y: Any, x: Any, w: Any, case: Case, what: str) -> None:
    x64, w64 = f64(x), f64(w)
    geometry = {"stride": case.stride, "padding": case.padding, "dilation": case.dilation}
    ref = reference_conv_fwd(x64, w64, **geometry)
    magnitude = reference_conv_fwd(np.abs(x64), np.abs(w64), **geometry)
    got = f64(y) if hasattr(y, "detach") else np.asarray(y, dtype=np.float64)
    assert_within(got, ref, magnitude, case.dtype, what)


def run_case(case: Case, kernel: str | None = None) -> None:
    inputs = Inputs()
    x = make_x(case, inputs)
    w = inputs.normal(case.problem.w_shape, case.dtype)
    out, whole = make_out(case)
    what = f"{case.label} seed {inputs.seed}" + (f" kernel {kernel}" if kernel else "")
    y = ckfmha.conv_fwd(x, w, stride=case.stride, padding=case.padding,
                        dilation=case.dilation, out=out, kernel=kernel)  # fmt: skip
    assert y is out
    torch.cuda.synchronize()
    assert_conv_close(y, x, w, case, what)
    assert_outside_untouched(whole, out, case.problem.y_shape, what)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_conv_fwd_cases(case: Case) -> None:
    run_case(case)


@pytest.mark.parametrize("case", DRAWN, ids=lambda c: c.label)
def test_conv_fwd_drawn(case: Case) -> None:
    run_case(case)


@pytest.mark.parametrize("case", LEARNED, ids=lambda c: c.label)
def test_learned_plans(case: Case) -> None:
    """The plan the learned selection makes (another kernel than the hand rules' for some)."""
    with ckfmha.selection("learned"):
        run_case(case)


def test_allocated_output_follows_the_input() -> None:
    case = Case("bf16", 3, (13, 13), 4, 8, 12, (3, 3), 2, 1, layout="channels_last")
    inputs = Inputs()
    x = make_x(case, inputs)
    w = inputs.normal(case.problem.w_shape, case.dtype)
    y = ckfmha.conv_fwd(x, w, stride=2, padding=1)
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.dtype == torch.bfloat16
    assert tuple(y.shape) == case.problem.y_shape
    assert_conv_close(y, x, w, case, f"allocated output seed {inputs.seed}")


def test_runs_on_the_callers_stream() -> None:
    case = Case("bf16", 8, (28, 28), 32, 8, 8, (3, 3), 1, 1)
    inputs = Inputs()
    x = make_x(case, inputs)
    w = inputs.normal(case.problem.w_shape, case.dtype)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = ckfmha.conv_fwd(x, w, padding=1)
    stream.synchronize()
    assert_conv_close(y, x, w, case, f"side stream seed {inputs.seed}")


def test_numpy_inputs_are_staged() -> None:
    case = Case("fp16", 2, (13, 7), 2, 16, 24, (3, 3), 1, 1)
    rng = np.random.default_rng(secrets.randbits(62))
    x = rng.standard_normal(case.problem.x_shape).astype(np.float16)
    w = rng.standard_normal(case.problem.w_shape).astype(np.float16)
    y = ckfmha.conv_fwd(x, w, padding=1)
    assert isinstance(y, np.ndarray) and y.dtype == np.float16
    assert_conv_close(y, torch.from_numpy(x), torch.from_numpy(w), case, "numpy inputs")


def test_cupy_arrays_in_cupy_out() -> None:
    # Read over DLPack / the CUDA Array Interface; the output comes back as CuPy.
    cupy = pytest.importorskip("cupy")
    case = Case("fp16", 2, (9, 7), 4, 8, 12, (3, 3), 2, 1)
    rng = np.random.default_rng(secrets.randbits(62))
    x = cupy.asarray(rng.standard_normal(case.problem.x_shape).astype(np.float16))
    w = cupy.asarray(rng.standard_normal(case.problem.w_shape).astype(np.float16))
    y = ckfmha.conv_fwd(x, w, stride=2, padding=1)
    assert isinstance(y, cupy.ndarray) and y.dtype == np.float16
    torch.cuda.synchronize()
    assert_conv_close(cupy.asnumpy(y), torch.from_numpy(cupy.asnumpy(x)),
                      torch.from_numpy(cupy.asnumpy(w)), case, "cupy inputs")  # fmt: skip


def test_empty_batch_returns_an_empty_output() -> None:
    x = torch.empty((0, 7, 9, 2, 8), dtype=torch.bfloat16, device="cuda")
    w = torch.empty((2, 12, 3, 3, 8), dtype=torch.bfloat16, device="cuda")
    y = ckfmha.conv_fwd(x, w, padding=(1, 0))
    assert tuple(y.shape) == (0, 7, 7, 2, 12) and y.dtype == torch.bfloat16


def _device_conv_kernels() -> list[dict[str, Any]]:
    if ckfmha.device_count() == 0:
        return []
    arch = ckfmha.device_arch()
    return [k for k in ckfmha.Registry().kernels()
            if k["family"] == "conv_fwd" and runs_on(k, arch) and NAME.match(k["name"])
            and not TMA_NAME.match(k["name"])]  # fmt: skip


def _device_tma_kernels() -> list[dict[str, Any]]:
    if ckfmha.device_count() == 0:
        return []
    arch = ckfmha.device_arch()
    return [k for k in ckfmha.Registry().kernels()
            if k["family"] == "conv_fwd" and runs_on(k, arch) and TMA_NAME.match(k["name"])]  # fmt: skip


@pytest.mark.parametrize("kernel", _device_tma_kernels(), ids=lambda k: k["name"])
def test_every_tma_kernel_forced_by_name(kernel: dict[str, Any]) -> None:
    """The copy engine's walk over the output positions: row tiles that end inside an image
    and past the batch, strides and dilations per dim, padding that differs between h and w
    (and negative reach past it: a 1x1 filter at stride 2), several channel chunks a tap,
    output channels that leave a partial tile (the w box reads past the group's rows), several
    groups, and sliced and channels_last inputs."""
    match = TMA_NAME.match(kernel["name"])
    dtype, dims, tile_k = match["dtype"], int(match["dims"]), int(match["tile_k"])
    if dims == 2:
        cases = [Case(dtype, 3, (13, 11), 2, 2 * tile_k, 40, (3, 3), 1, 1),
                 Case(dtype, 2, (17, 9), 1, tile_k, 72, (3, 1), (2, 1), (1, 0), layout="slice"),
                 Case(dtype, 1, (20, 19), 3, tile_k, 24, (3, 3), 2, (2, 3), 2,
                      layout="channels_last"),
                 Case(dtype, 2, (14, 14), 1, 4 * tile_k, 288, (1, 1), 2, 0),
                 Case(dtype, 1, (9, 30), 5, tile_k, 136, (5, 7), (1, 3), (2, 0), (1, 2))]  # fmt: skip
    else:
        cases = [Case(dtype, 2, (4, 7, 5), 2, tile_k, 16, (3, 3, 3), 1, 1),
                 Case(dtype, 1, (5, 9, 8), 1, 2 * tile_k, 72, (3, 3, 3), (1, 2, 2), (1, 1, 0),
                      (1, 1, 2), layout="slice")]  # fmt: skip
    for case in cases:
        run_case(case, kernel=kernel["name"])


def test_tma_kernels_take_whole_channel_runs() -> None:
    """Where the group's channels are a multiple of a TMA kernel's tile_k the dispatcher picks
    a TMA kernel; with a channel count it does not divide, forcing one fails with the reason
    and the automatic choice computes the problem on a gathering kernel."""
    tma = [k["name"] for k in _device_tma_kernels()
           if TMA_NAME.match(k["name"])["dtype"] == "bf16" and TMA_NAME.match(k["name"])["dims"] == "2"]  # fmt: skip
    if not tma:
        pytest.skip("no bf16 2D TMA conv kernel is registered for this device")
    tile_k = min(int(TMA_NAME.match(name)["tile_k"]) for name in tma)
    fitting = Case("bf16", 2, (15, 15), 2, 2 * tile_k, 64, (3, 3), 1, 1)
    inputs = Inputs()
    x = make_x(fitting, inputs)
    w = inputs.normal(fitting.problem.w_shape, fitting.dtype)
    assert TMA_NAME.match(ckfmha.conv_select(x, w, padding=1))
    run_case(fitting)
    odd = Case("bf16", 2, (15, 15), 2, 24, 64, (3, 3), 1, 1)
    x = make_x(odd, inputs)
    w = inputs.normal(odd.problem.w_shape, odd.dtype)
    assert not TMA_NAME.match(ckfmha.conv_select(x, w, padding=1))
    run_case(odd)
    with pytest.raises(errors.UnsupportedError, match="im2col"):
        ckfmha.conv_fwd(x, w, padding=1, kernel=tma[0])


@pytest.mark.parametrize("kernel", _device_conv_kernels(), ids=lambda k: k["name"])
def test_every_kernel_forced_by_name(kernel: dict[str, Any]) -> None:
    match = NAME.match(kernel["name"])
    dtype, dims, vector = match["dtype"], int(match["dims"]), int(match["vector"])
    # Channels the kernel's vector divides, and one more group of them where vectors are wide.
    c = vector * (3 if vector > 1 else 5)
    if dims == 2:
        cases = [Case(dtype, 2, (13, 11), 2, c, 24, (3, 3), 1, 1),
                 Case(dtype, 1, (9, 9), 1, c, 40, (5, 5), 2, 2)]  # fmt: skip
    else:
        cases = [Case(dtype, 2, (4, 7, 5), 2, c, 16, (3, 3, 3), 1, 1)]
    for case in cases:
        run_case(case, kernel=kernel["name"])


def _device_direct_kernels() -> list[dict[str, Any]]:
    if ckfmha.device_count() == 0:
        return []
    arch = ckfmha.device_arch()
    return [k for k in ckfmha.Registry().kernels()
            if k["family"] == "conv_fwd" and runs_on(k, arch) and DIRECT_NAME.match(k["name"])]  # fmt: skip


@pytest.mark.parametrize("kernel", _device_direct_kernels(), ids=lambda k: k["name"])
def test_every_direct_kernel_forced_by_name(kernel: dict[str, Any]) -> None:
    """The direct kernels over their channel bucket (both counts at the bucket, and fewer,
    unequal ones), group counts that leave a partial block of 32, unit stride along w (its
    windowed loop) and stride or dilation along w (the general one), odd sizes and padding."""
    match = DIRECT_NAME.match(kernel["name"])
    dtype, dims, bucket = match["dtype"], int(match["dims"]), int(match["bucket"])
    narrow = (max(1, bucket - 1), max(1, bucket // 2))
    if dims == 2:
        cases = [Case(dtype, 2, (13, 19), 35, bucket, bucket, (3, 3), 1, 1),
                 Case(dtype, 1, (17, 23), 70, *narrow, (7, 7), 1, 3),
                 Case(dtype, 2, (11, 9), 33, bucket, narrow[1], (3, 5), (2, 2), (1, 2), (1, 2)),
                 Case(dtype, 1, (9, 40), 3, narrow[0], bucket, (1, 3), 1, (0, 1), layout="slice")]  # fmt: skip
    else:
        cases = [Case(dtype, 2, (4, 7, 9), 33, bucket, bucket, (3, 3, 3), 1, 1),
                 Case(dtype, 1, (5, 6, 7), 5, *narrow, (2, 3, 3), (1, 2, 1), (0, 1, 1),
                      (2, 1, 1))]  # fmt: skip
    for case in cases:
        run_case(case, kernel=kernel["name"])


def test_a_tile_the_direct_kernel_cannot_stage_falls_back() -> None:
    """Stride 3 along w over a run of 16 outputs, 4-channel groups: the direct kernel's input
    tile would outgrow shared memory, so the dispatcher takes an implicit-GEMM kernel, which
    computes it; forcing the direct kernel fails with the reason."""
    case = Case("bf16", 2, (11, 9), 33, 4, 2, (3, 5), (2, 3), (1, 2), (1, 2))
    direct = [k["name"] for k in _device_direct_kernels()
              if DIRECT_NAME.match(k["name"])["dtype"] == "bf16"
              and DIRECT_NAME.match(k["name"])["dims"] == "2"
              and DIRECT_NAME.match(k["name"])["bucket"] == "4"]  # fmt: skip
    if not direct:
        pytest.skip("no bf16 2D direct kernel for 4-channel groups is registered")
    inputs = Inputs()
    x = make_x(case, inputs)
    w = inputs.normal(case.problem.w_shape, case.dtype)
    geometry = {"stride": case.stride, "padding": case.padding, "dilation": case.dilation}
    chosen = ckfmha.conv_select(x, w, **geometry)
    assert "_conv_direct_" not in chosen
    run_case(case)
    with pytest.raises(errors.UnsupportedError, match="shared memory|per block"):
        ckfmha.conv_fwd(x, w, kernel=direct[0], **geometry)


def test_direct_kernel_refuses_wider_groups() -> None:
    """A direct kernel forced onto groups wider than its bucket fails with the reason."""
    direct = _device_direct_kernels()
    if not direct:
        pytest.skip("no direct conv kernel is registered for this device")
    kernel = direct[0]
    match = DIRECT_NAME.match(kernel["name"])
    bucket = int(match["bucket"])
    shape = (2, 5, 6, 4, 2 * bucket) if match["dims"] == "2" else (2, 3, 5, 6, 4, 2 * bucket)
    torch_dtype = torch.bfloat16 if match["dtype"] == "bf16" else torch.float16
    x = torch.randn(shape, device="cuda", dtype=torch_dtype)
    w = torch.randn((4, 2 * bucket, *(3,) * int(match["dims"]), 2 * bucket), device="cuda",
                    dtype=torch_dtype)  # fmt: skip
    with pytest.raises(errors.CkfmhaError, match="at most"):
        ckfmha.conv_fwd(x, w, padding=1, kernel=kernel["name"])


def run_direct_path(case: Case, buckets: tuple[str, ...], path: str, on_path: bool) -> None:
    """`case` on a direct kernel of one of `buckets` (channels a group), whose explanation names
    `path` exactly where `on_path` (the geometry allows it), checked against the reference."""
    inputs = Inputs()
    x = make_x(case, inputs)
    w = inputs.normal(case.problem.w_shape, case.dtype)
    geometry = {"stride": case.stride, "padding": case.padding, "dilation": case.dilation}
    name = ckfmha.conv_select(x, w, **geometry)
    match = DIRECT_NAME.match(name)
    if not (match and match["bucket"] in buckets):
        pytest.skip(f"no {buckets} direct kernel for {case.label} in this build ({name})")
    text = ckfmha.conv_explain(case.problem)
    assert (path in text) == on_path, text
    run_case(case)


@pytest.mark.parametrize("case", DEPTHWISE_VECTOR_CASES + DEPTHWISE_LANE_CASES,
                         ids=lambda c: c.label)  # fmt: skip
def test_depthwise_paths(case: Case) -> None:
    """The one-channel direct kernel on both of its paths; explain names the path the
    problem's geometry allows."""
    on_path = case in DEPTHWISE_VECTOR_CASES or case.layout == "offset"
    run_direct_path(case, ("1",), "(the depthwise path) where", on_path)


@pytest.mark.parametrize("case", VECTOR_FWD_CASES + VECTOR_FWD_LANE_CASES, ids=lambda c: c.label)
def test_vector_fwd_paths(case: Case) -> None:
    """The 2- and 4-channel direct kernels on both of their paths; explain names the path the
    problem's geometry allows."""
    on_path = case in VECTOR_FWD_CASES or case.layout == "offset"
    run_direct_path(case, ("2", "4"), "(the vector path) where x and y", on_path)


@pytest.mark.parametrize("case", SPLIT_TMA_CASES, ids=lambda c: c.label)
def test_few_tiles_split_their_reduction_over_a_cluster(case: Case) -> None:
    """A batch-1 layer of a few tiles and a long reduction runs on the TMA forward with each
    tile's k-tiles shared by a cluster's CTAs (explain says so), its sum checked as any other."""
    if not _have_tma(case.dtype, len(case.input)):
        pytest.skip(f"no {case.dtype} {len(case.input)}D TMA forward kernel in this build")
    if case is SPLIT_TMA_CASES[0]:
        x = torch.empty((1, 7, 7, 1, 512), dtype=torch.bfloat16, device="cuda")
        w = torch.empty((1, 512, 3, 3, 512), dtype=torch.bfloat16, device="cuda")
        text = ckfmha.conv_explain(x, w, padding=1)
        assert "each tile's reduction split over the" in text, text
    run_case(case)


def test_select_names_a_kernel_that_runs() -> None:
    case = Case("bf16", 4, (14, 14), 1, 64, 64, (3, 3), 1, 1)
    inputs = Inputs()
    x = make_x(case, inputs)
    w = inputs.normal(case.problem.w_shape, case.dtype)
    # Fill the registry with what an automatic call needs first (compiled on first use).
    ckfmha.conv_fwd(x, w, padding=1)
    name = ckfmha.conv_select(x, w, padding=1)
    assert NAME.match(name), name
    run_case(case, kernel=name)


def test_unknown_kernel_is_not_found() -> None:
    x = torch.zeros((1, 5, 5, 1, 8), dtype=torch.bfloat16, device="cuda")
    w = torch.zeros((1, 8, 3, 3, 8), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(errors.NotFoundError, match="no registered kernel named conv_fwd_nope"):
        ckfmha.conv_fwd(x, w, kernel="conv_fwd_nope")


def test_other_families_cannot_be_forced() -> None:
    attention = [k["name"] for k in ckfmha.Registry().kernels() if k["family"] == "fwd"]
    if not attention:
        pytest.skip("build has no forward attention kernel")
    x = torch.zeros((1, 5, 5, 1, 8), dtype=torch.bfloat16, device="cuda")
    w = torch.zeros((1, 8, 3, 3, 8), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(errors.InvalidArgumentError, match="ckfmha_conv_fwd_run runs conv_fwd"):
        ckfmha.conv_fwd(x, w, kernel=attention[0])


def test_drawn_shapes_cover_the_space() -> None:
    # The draw keeps its promises: both ranks, depthwise, every layout, odd channel counts.
    problems = [case.problem for case in DRAWN]
    assert {p.spatial_dims for p in problems} == {2, 3}
    assert any(p.in_channels == p.out_channels == 1 for p in problems)
    assert {case.layout for case in DRAWN} == {"dense", "slice", "offset", "channels_last"}
    assert any(p.out_channels % 8 for p in problems if p.out_channels > 1)


# Groups of 8-32 input channels on the TMA template, several to a block-diagonal filter in the
# workspace (from 1024 output positions, where the unpacked groups do not run on it already):
# packs of 8, 4 and 2, unequal channel counts, strides, dilation, 3D, and the channels_last and
# sliced layouts.
PACKED = [
    Case("bf16", 8, (28, 28), 32, 8, 8, (3, 3), 2, 1),
    Case("bf16", 2, (24, 24), 32, 16, 16, (3, 3), 1, 1, layout="channels_last"),
    Case("fp16", 4, (19, 15), 8, 16, 24, (3, 3), 1, 1, layout="slice"),
    Case("bf16", 32, (14, 14), 32, 32, 32, (3, 3), 2, 1),
    Case("bf16", 16, (17, 9), 16, 8, 24, (5, 3), (1, 2), (2, 1), (1, 2)),
    Case("bf16", 9, (6, 9, 8), 16, 16, 8, (3, 3, 3), (1, 2, 2), 1),
]


def _have_tma(dtype: str, dims: int) -> bool:
    return any(TMA_NAME.match(k["name"])["dtype"] == dtype
               and int(TMA_NAME.match(k["name"])["dims"]) == dims
               for k in _device_tma_kernels())  # fmt: skip


@pytest.mark.parametrize("case", PACKED, ids=lambda c: c.label)
def test_groups_run_packed_on_the_tma_kernel(case: Case) -> None:
    if not _have_tma(case.dtype, len(case.input)):
        pytest.skip(f"no {case.dtype} {len(case.input)}D TMA forward kernel in this build")
    text = ckfmha.conv_explain(case.problem)
    assert "block-diagonal filters" in text, text
    run_case(case)


def test_a_forced_tma_kernel_packs_small_problems_and_misaligned_inputs_do_not() -> None:
    """Below 1024 output positions the automatic plan keeps the groups apart, but a TMA kernel
    forced by name takes them packed; x at a channel offset (narrower loads than the copy
    engine's) runs unpacked on a gathering kernel."""
    if not _have_tma("bf16", 2):
        pytest.skip("no bf16 2D TMA forward kernel in this build")
    small = Case("bf16", 1, (9, 9), 8, 8, 8, (3, 3), 1, 1)
    assert "block-diagonal filters" not in ckfmha.conv_explain(small.problem)
    tma = [k["name"] for k in _device_tma_kernels()
           if k["name"].startswith("conv_fwd_bf16_2d_") and "k64_" in k["name"]]  # fmt: skip
    for name in tma[:2]:
        run_case(small, kernel=name)
    offset = Case("bf16", 8, (28, 28), 32, 8, 8, (3, 3), 2, 1, layout="offset")
    inputs = Inputs()
    x = make_x(offset, inputs)
    w = inputs.normal(offset.problem.w_shape, offset.dtype)
    assert not TMA_NAME.match(ckfmha.conv_select(x, w, stride=2, padding=1))
    run_case(offset)
