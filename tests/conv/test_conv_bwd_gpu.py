"""Grouped convolution backward-data and backward-weight on the GPU against the float64
reference (ckfmha.reference_conv), over the forward's cases (support.conv_cases: shapes and
the error bound, S being the pass applied to the inputs' absolute values).

dy comes in the case's layout (dense, cut from a larger tensor, at a misaligning channel
offset, channels_last); dx is poisoned with NaN first (backward-data writes every position,
zeros where no filter tap reaches one), and so is dw. Strides above 1 exercise the stride
phases of backward-data, including phases no tap reaches (1x1 filters at stride 2); long
reductions over positions with few output channels exercise the split backward-weight plan.
"""

from __future__ import annotations

import dataclasses
import re
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
    TMA_WEIGHT_CLUSTER_CASES,
    VECTOR_FWD_CASES,
    VECTOR_FWD_LANE_CASES,
    VECTOR_WEIGHT_CASES,
    VECTOR_WEIGHT_LANE_CASES,
    Case,
    Inputs,
    assert_outside_untouched,
    assert_within,
    f64,
    make_poisoned,
    make_positions,
    make_x,
)
from support.device_kernels import runs_on

import ckfmha
from ckfmha import errors
from ckfmha.reference_conv import conv_bwd_data as reference_bwd_data
from ckfmha.reference_conv import conv_bwd_weight as reference_bwd_weight

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

WEIGHT_NAME = re.compile(r"^conv_bwd_weight_(?P<dtype>fp16|bf16)_(?P<dims>[23])d_v(?P<vector>\d)__")
# The weight gradient fed by the copy engine (64-channel copies of one tap).
WEIGHT_TMA_NAME = re.compile(
    r"^conv_bwd_weight_(?P<dtype>fp16|bf16)_(?P<dims>[23])d_v8__.*_sm90_tma_wgmma_"
)
# Direct kernels: groups of at most `bucket` input and output channels.
WEIGHT_DIRECT_NAME = re.compile(
    r"^conv_bwd_weight_(?P<dtype>fp16|bf16)_(?P<dims>[23])d_v1_c(?P<bucket>\d+)__"
)

# Beyond the forward's cases: stride phases that no tap reaches, a stride larger than the
# filter, negative effective padding (padding beyond the dilated filter), and backward-weight
# reductions over many positions into few outputs (split plans).
EXTRA = [
    Case("bf16", 2, (9, 8), 4, 8, 16, (1, 1), 2, 0),
    Case("fp16", 1, (11, 10), 1, 16, 8, (2, 2), 3, 0, layout="channels_last"),
    Case("bf16", 2, (7, 7), 2, 8, 8, (1, 1), 1, 2),
    Case("bf16", 1, (10, 9, 8), 2, 8, 8, (1, 3, 3), (2, 2, 1), (0, 1, 1)),
    Case("bf16", 8, (56, 56), 1, 64, 16, (3, 3), 1, 1),
    Case("fp16", 4, (28, 28), 4, 8, 8, (3, 3), 1, 1, layout="slice"),
    Case("bf16", 16, (14, 14), 1, 12, 40, (1, 1), 1, 0),
    # Backward-data's filter rearrangement: tiled transposes (at least 32 channels in and out)
    # with partial tiles, over 4, 8 and 9 phases (the last over two launches), and the
    # elementwise copy over 9 phases.
    Case("bf16", 2, (15, 13), 1, 72, 40, (3, 3), 2, 1),
    Case("bf16", 1, (5, 7, 6), 1, 48, 40, (3, 3, 3), 2, 1),
    Case("fp16", 1, (13, 11), 2, 40, 96, (3, 3), 3, 1, layout="channels_last"),
    Case("bf16", 2, (10, 11), 4, 8, 12, (3, 3), 3, 1),
]


def geometry(case: Case) -> dict[str, Any]:
    return {"stride": case.stride, "padding": case.padding, "dilation": case.dilation}


def run_bwd_data(case: Case, kernel: str | None = None, misaligned_w: bool = False) -> None:
    """misaligned_w: w one element past a 16-byte boundary (kernels that copy it by tensor
    copies then read the rearranged filter instead)."""
    inputs = Inputs()
    problem = case.problem
    dy = make_positions(case.layout, problem.y_shape, case.dtype, inputs)
    w = inputs.normal(problem.w_shape, case.dtype)
    if misaligned_w:
        storage = torch.empty(w.numel() + 8, dtype=w.dtype, device=w.device)
        storage[1 : 1 + w.numel()].copy_(w.flatten())
        w = storage[1 : 1 + w.numel()].view(w.shape)
        assert w.data_ptr() % 16 != 0
    out, whole = make_poisoned(case.layout, problem.x_shape, case.dtype)
    what = f"bwd_data {case.label} seed {inputs.seed}" + (f" kernel {kernel}" if kernel else "")
    dx = ckfmha.conv_bwd_data(dy, w, input_size=problem.input, out=out, kernel=kernel,
                              **geometry(case))  # fmt: skip
    assert dx is out
    torch.cuda.synchronize()
    dy64, w64 = f64(dy), f64(w)
    ref = reference_bwd_data(dy64, w64, problem.input, **geometry(case))
    magnitude = reference_bwd_data(np.abs(dy64), np.abs(w64), problem.input, **geometry(case))
    assert_within(f64(dx), ref, magnitude, case.dtype, what)
    assert_outside_untouched(whole, out, problem.x_shape, what)


def run_bwd_weight(case: Case, kernel: str | None = None, splits: int | None = None) -> None:
    inputs = Inputs()
    problem = case.problem
    x = make_x(case, inputs)
    dy = make_positions(case.layout, problem.y_shape, case.dtype, inputs)
    out = torch.full(problem.w_shape, float("nan"), dtype=x.dtype, device="cuda")
    what = f"bwd_weight {case.label} seed {inputs.seed}" + (f" kernel {kernel}" if kernel else "")
    what += f" splits {splits}" if splits else ""
    dw = ckfmha.conv_bwd_weight(x, dy, filter_size=problem.filter, out=out, kernel=kernel,
                                splits=splits, **geometry(case))  # fmt: skip
    assert dw is out
    torch.cuda.synchronize()
    x64, dy64 = f64(x), f64(dy)
    ref = reference_bwd_weight(x64, dy64, problem.filter, **geometry(case))
    magnitude = reference_bwd_weight(np.abs(x64), np.abs(dy64), problem.filter, **geometry(case))
    assert_within(f64(dw), ref, magnitude, case.dtype, what)


ALL = CASES + EXTRA + DRAWN


@pytest.mark.parametrize("case", ALL, ids=lambda c: c.label)
def test_conv_bwd_data(case: Case) -> None:
    run_bwd_data(case)


@pytest.mark.parametrize("case", ALL, ids=lambda c: c.label)
def test_conv_bwd_weight(case: Case) -> None:
    run_bwd_weight(case)


def test_allocated_gradients_follow_the_inputs() -> None:
    case = Case("bf16", 3, (13, 13), 4, 8, 12, (3, 3), 2, 1, layout="channels_last")
    inputs = Inputs()
    x = make_x(case, inputs)
    w = inputs.normal(case.problem.w_shape, case.dtype)
    dy = make_positions("dense", case.problem.y_shape, case.dtype, inputs)
    dx = ckfmha.conv_bwd_data(dy, w, input_size=(13, 13), stride=2, padding=1)
    dw = ckfmha.conv_bwd_weight(x, dy, filter_size=(3, 3), stride=2, padding=1)
    for got, shape in ((dx, case.problem.x_shape), (dw, case.problem.w_shape)):
        assert isinstance(got, torch.Tensor) and got.is_cuda and got.dtype == torch.bfloat16
        assert tuple(got.shape) == shape
    ref = reference_bwd_weight(f64(x), f64(dy), (3, 3), stride=2, padding=1)
    magnitude = reference_bwd_weight(np.abs(f64(x)), np.abs(f64(dy)), (3, 3), stride=2,
                                     padding=1)  # fmt: skip
    assert_within(f64(dw), ref, magnitude, "bf16", f"allocated dw seed {inputs.seed}")


@pytest.mark.parametrize(
    "case",
    [
        Case("bf16", 2, (15, 13), 1, 72, 40, (3, 3), 2, 1),
        Case("bf16", 1, (20, 19), 32, 4, 4, (3, 3), 3, 1, layout="channels_last"),
    ],
    ids=lambda c: c.label,
)
def test_bwd_data_phases_on_the_callers_stream_and_in_a_graph(case: Case) -> None:
    """The stride phases (4, and 9: more than the side streams) run concurrently on side
    streams forked off the caller's stream and joined again: inputs written on that stream
    just before the call are read, and a captured graph replays every phase on new inputs."""
    problem = case.problem
    geometry_kw = geometry(case)

    def check(dy: Any, w: Any, dx: Any, what: str) -> None:
        dy64, w64 = f64(dy), f64(w)
        ref = reference_bwd_data(dy64, w64, problem.input, **geometry_kw)
        magnitude = reference_bwd_data(np.abs(dy64), np.abs(w64), problem.input, **geometry_kw)
        assert_within(f64(dx), ref, magnitude, case.dtype, what)

    inputs = Inputs()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        dy = make_positions(case.layout, problem.y_shape, case.dtype, inputs)
        w = inputs.normal(problem.w_shape, case.dtype)
        dx, _ = make_poisoned("dense", problem.x_shape, case.dtype)
        ckfmha.conv_bwd_data(dy, w, input_size=problem.input, out=dx, **geometry_kw)
    stream.synchronize()
    check(dy, w, dx, f"bwd_data on a side stream {case.label} seed {inputs.seed}")

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ckfmha.conv_bwd_data(dy, w, input_size=problem.input, out=dx, **geometry_kw)
    fresh = Inputs()
    dy.copy_(make_positions(case.layout, problem.y_shape, case.dtype, fresh))
    w.copy_(fresh.normal(problem.w_shape, case.dtype))
    dx.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(dy, w, dx, f"bwd_data graph replay {case.label} seed {fresh.seed}")


def test_numpy_inputs_are_staged() -> None:
    case = Case("fp16", 2, (9, 7), 2, 8, 16, (3, 3), 1, 1)
    rng = np.random.default_rng()
    dy = rng.standard_normal(case.problem.y_shape).astype(np.float16)
    w = rng.standard_normal(case.problem.w_shape).astype(np.float16)
    x = rng.standard_normal(case.problem.x_shape).astype(np.float16)
    dx = ckfmha.conv_bwd_data(dy, w, input_size=(9, 7), padding=1)
    dw = ckfmha.conv_bwd_weight(x, dy, filter_size=(3, 3), padding=1)
    assert isinstance(dx, np.ndarray) and isinstance(dw, np.ndarray)
    ref = reference_bwd_data(dy, w, (9, 7), padding=1)
    magnitude = reference_bwd_data(np.abs(dy), np.abs(w), (9, 7), padding=1)
    assert_within(dx.astype(np.float64), ref, magnitude, "fp16", "numpy dx")
    ref = reference_bwd_weight(x, dy, (3, 3), padding=1)
    magnitude = reference_bwd_weight(np.abs(x), np.abs(dy), (3, 3), padding=1)
    assert_within(dw.astype(np.float64), ref, magnitude, "fp16", "numpy dw")


def test_empty_batch() -> None:
    """No positions: dx is empty, dw is zero (the gradient of a sum of nothing)."""
    x = torch.empty((0, 7, 9, 2, 8), dtype=torch.bfloat16, device="cuda")
    dy = torch.empty((0, 7, 7, 2, 12), dtype=torch.bfloat16, device="cuda")
    w = torch.randn((2, 12, 3, 3, 8), dtype=torch.bfloat16, device="cuda")
    dx = ckfmha.conv_bwd_data(dy, w, input_size=(7, 9), padding=(1, 0))
    assert tuple(dx.shape) == (0, 7, 9, 2, 8)
    out = torch.full((2, 12, 3, 3, 8), float("nan"), dtype=torch.bfloat16, device="cuda")
    dw = ckfmha.conv_bwd_weight(x, dy, padding=(1, 0), out=out)
    assert dw is out and bool((dw == 0).all())


def _weight_kernels() -> list[dict[str, Any]]:
    if ckfmha.device_count() == 0:
        return []
    arch = ckfmha.device_arch()
    return [k for k in ckfmha.Registry().kernels()
            if k["family"] == "conv_bwd_weight" and runs_on(k, arch)]  # fmt: skip


@pytest.mark.parametrize(
    "kernel",
    [k for k in _weight_kernels()
     if WEIGHT_NAME.match(k["name"]) and not WEIGHT_TMA_NAME.match(k["name"])],
    ids=lambda k: k["name"],
)  # fmt: skip
def test_every_weight_kernel_forced_by_name(kernel: dict[str, Any]) -> None:
    match = WEIGHT_NAME.match(kernel["name"])
    dtype, dims, vector = match["dtype"], int(match["dims"]), int(match["vector"])
    c = vector * (3 if vector > 1 else 5)
    # From 4096 positions, groups of few channels are multiplied several at a time (packed,
    # ckfmha.conv_selection's weight_pack): 8 groups of vector and 2 x vector channels pack by
    # 4 (8 at one channel), 6 groups of 5 and 3 by 2, whose packed channels are not a multiple
    # of any vector; 12 such groups over 270 positions run one by one.
    if dims == 2:
        cases = [Case(dtype, 2, (13, 11), 2, c, 8 * vector, (3, 3), 1, 1),
                 Case(dtype, 4, (24, 24), 1, c, 2 * vector, (5, 5), 2, 2),
                 Case(dtype, 4, (32, 32), 8, vector, 2 * vector, (3, 3), 1, 1),
                 Case(dtype, 3, (9, 10), 12, vector, 2 * vector, (3, 3), 1, 1)]  # fmt: skip
        if vector == 1:
            cases.append(Case(dtype, 4, (32, 32), 6, 5, 3, (3, 3), 1, 1))
    else:
        cases = [Case(dtype, 2, (4, 7, 5), 2, c, 2 * vector, (3, 3, 3), 1, 1),
                 Case(dtype, 1, (4, 32, 32), 8, vector, 2 * vector, (1, 3, 3), 1, (0, 1, 1))]  # fmt: skip
    # The rules' split count; 3 splits sum in a cluster of 3 on the sm_90 wgmma kernel and add
    # into the fp32 workspace on the mma.sync one, 9 add into it on both.
    for case in cases:
        for splits in (None, 3, 9):
            run_bwd_weight(case, kernel=kernel["name"], splits=splits)


@pytest.mark.parametrize(
    "kernel",
    [k for k in _weight_kernels()
     if (m := WEIGHT_NAME.match(k["name"])) and m["dims"] == "2" and m["vector"] == "8"],
    ids=lambda k: k["name"],
)  # fmt: skip
def test_split_plans_over_many_splits_and_groups(kernel: dict[str, Any]) -> None:
    """Split plans that add into the zeroed fp32 workspace and convert it after: several
    output-channel and reduction tiles of several groups over more splits than position tiles
    (each split then takes one, past any cluster), the same plan twice (the workspace is
    zeroed on every call), and more groups than the grid's 65535 (CTAs take a second group)."""
    dtype = WEIGHT_NAME.match(kernel["name"])["dtype"]
    channels = 64 if WEIGHT_TMA_NAME.match(kernel["name"]) else 72
    tiles = Case(dtype, 3, (17, 15), 2, channels, 136, (3, 3), 1, 1)
    for splits in (13, 40):
        for _ in range(2):
            run_bwd_weight(tiles, kernel=kernel["name"], splits=splits)
    if not WEIGHT_TMA_NAME.match(kernel["name"]):
        # (The TMA kernel's copies take 64 channels a tap: 8x these operands.)
        run_bwd_weight(Case(dtype, 1, (9, 9), 65537, 8, 8, (1, 1), 1, 0),
                       kernel=kernel["name"], splits=13)  # fmt: skip


@pytest.mark.parametrize(
    "kernel", [k for k in _weight_kernels() if WEIGHT_TMA_NAME.match(k["name"])],
    ids=lambda k: k["name"],
)  # fmt: skip
def test_every_weight_tma_kernel_forced_by_name(kernel: dict[str, Any]) -> None:
    """The copy engine's walks over x and dy: position tiles that end inside an image and past
    the batch, strides, paddings and dilations per dim (a 1x1 filter at stride 2), output
    channels that leave a partial chunk (dy's copy reads the next group's channels, whose
    products are dropped), reductions that end inside a tile, several groups, groups of 16 and
    32 channels multiplied 4 and 2 at a time as one of 64 (from 4096 positions), channels_last
    and sliced inputs; dense dy (and x at 1x1, stride 1, no padding) copied as plain matrices,
    sliced ones in im2col mode; packed groups with fewer output than input channels, as a
    power of two (dw's pairs found by shifts) and not (one element at a time); each at one
    split and at several (partial sums added)."""
    match = WEIGHT_TMA_NAME.match(kernel["name"])
    dtype, dims = match["dtype"], int(match["dims"])
    if dims == 2:
        cases = [Case(dtype, 3, (13, 11), 1, 64, 64, (3, 3), 1, 1),
                 Case(dtype, 2, (17, 15), 2, 128, 72, (3, 3), 2, (1, 2), (2, 1), layout="slice"),
                 Case(dtype, 2, (14, 14), 1, 64, 136, (1, 1), 2, 0, layout="channels_last"),
                 Case(dtype, 3, (9, 7), 2, 128, 64, (1, 1), 1, 0),
                 Case(dtype, 2, (9, 7), 1, 64, 64, (1, 1), 1, 0, layout="slice"),
                 Case(dtype, 4, (33, 32), 8, 16, 16, (3, 3), 1, 1),
                 Case(dtype, 5, (60, 58), 4, 32, 32, (3, 3), 2, 1),
                 Case(dtype, 4, (33, 32), 4, 32, 8, (3, 3), 1, 1),
                 Case(dtype, 2, (33, 32), 2, 32, 24, (3, 3), 1, 1),
                 Case(dtype, 1, (9, 30), 1, 192, 64, (5, 7), (1, 3), (2, 0), (1, 2))]  # fmt: skip
    else:
        cases = [Case(dtype, 2, (4, 7, 5), 1, 64, 64, (3, 3, 3), 1, 1),
                 Case(dtype, 1, (5, 9, 8), 2, 64, 40, (3, 3, 3), (1, 2, 2), (1, 1, 0),
                      (1, 1, 2), layout="slice")]  # fmt: skip
    for case in cases:
        for splits in (None, 1, 3, 7, 9):
            run_bwd_weight(case, kernel=kernel["name"], splits=splits)


def test_weight_tma_kernels_take_whole_channel_chunks() -> None:
    """Where a (packed) group's input channels are a multiple of 64 the dispatcher picks a TMA
    kernel for a dense layer; with 48 channels forcing one fails with the reason, and the
    automatic choice computes the problem on a gathering kernel."""
    tma = [k["name"] for k in _weight_kernels()
           if (m := WEIGHT_TMA_NAME.match(k["name"])) and m["dtype"] == "bf16" and m["dims"] == "2"]  # fmt: skip
    if not tma:
        pytest.skip("no bf16 2D TMA weight kernel is registered for this device")
    fitting = Case("bf16", 8, (28, 28), 1, 128, 128, (3, 3), 1, 1)
    chosen = ckfmha.conv_select(fitting.problem, direction="bwd_weight")
    assert WEIGHT_TMA_NAME.match(chosen), chosen
    run_bwd_weight(fitting)
    odd = Case("bf16", 2, (15, 15), 1, 48, 64, (3, 3), 1, 1)
    assert not WEIGHT_TMA_NAME.match(ckfmha.conv_select(odd.problem, direction="bwd_weight"))
    run_bwd_weight(odd)
    inputs = Inputs()
    x = make_x(odd, inputs)
    dy = make_positions(odd.layout, odd.problem.y_shape, odd.dtype, inputs)
    with pytest.raises(errors.UnsupportedError, match="im2col"):
        ckfmha.conv_bwd_weight(x, dy, filter_size=(3, 3), padding=1, kernel=tma[0])


@pytest.mark.parametrize(
    "kernel", [k for k in _weight_kernels() if WEIGHT_DIRECT_NAME.match(k["name"])],
    ids=lambda k: k["name"],
)  # fmt: skip
def test_every_direct_weight_kernel_forced_by_name(kernel: dict[str, Any]) -> None:
    """The direct kernels over their bucket: group counts that leave a partial block of 32,
    the windowed path (unit stride and dilation along w) and the general one, odd sizes,
    several images and output tiles per CTA. Wide buckets take filters whose partial dw fits
    in shared memory (taps x C x K x 32 groups, fp32): forced, the 8-channel kernel runs
    these on its lane path, which the dispatcher never gives it."""
    match = WEIGHT_DIRECT_NAME.match(kernel["name"])
    dtype, dims, bucket = match["dtype"], int(match["dims"]), int(match["bucket"])
    narrow = max(1, bucket - 1)
    wide = bucket >= 4
    if dims == 2:
        cases = [Case(dtype, 3, (13, 19), 35, bucket, bucket, (3, 3), 1, 1),
                 Case(dtype, 2, (17, 23), 70, narrow, bucket, (3, 3) if wide else (7, 7), 1,
                      1 if wide else 3),
                 Case(dtype, 2, (11, 9), 33, bucket, narrow, (3, 5) if bucket < 8 else (3, 3),
                      (2, 2), (1, 2), (1, 2)),
                 Case(dtype, 1, (9, 40), 3, bucket, bucket, (1, 3), 1, (0, 1), layout="slice")]  # fmt: skip
    else:
        cases = [Case(dtype, 2, (4, 7, 9), 33, bucket, bucket, (1, 3, 3) if wide else (3, 3, 3),
                      1, 1),
                 Case(dtype, 1, (5, 6, 7), 5, narrow, bucket, (2, 3, 3), (1, 2, 1), (0, 1, 1),
                      (2, 1, 1))]  # fmt: skip
    for case in cases:
        run_bwd_weight(case, kernel=kernel["name"])


@pytest.mark.parametrize("case", [Case("bf16", 3, (17, 15), 2, 16, 24, (3, 3), 1, 1),
                                  Case("bf16", 8, (48, 48), 40, 1, 1, (5, 5), 1, 2)],
                         ids=lambda c: c.label)  # fmt: skip
def test_every_split_count_the_selection_weighs(case: Case) -> None:
    """Backward-weight forced to each (kernel, splits) plan the learned selection weighs
    (ckfmha.conv_selection): split counts from 1 up for the implicit GEMM, CTAs per block of
    groups for the direct kernel, more than there are output tiles among them."""
    from ckfmha.conv_selection import conv_candidate_plans, problem_record

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plans = conv_candidate_plans(problem_record(case.problem), "bwd_weight", ckfmha.Registry().kernels(), sms,
                                 ckfmha.device_arch(), case.dtype)  # fmt: skip
    assert len({s for _, s in plans}) > 2, plans
    for name, splits in plans:
        run_bwd_weight(case, kernel=name, splits=splits)


@pytest.mark.parametrize("case", LEARNED, ids=lambda c: c.label)
def test_learned_plans(case: Case) -> None:
    """The plans the learned selection makes: one kernel for every backward-data phase, and
    backward-weight's kernel and split count."""
    with ckfmha.selection("learned"):
        run_bwd_data(case)
        run_bwd_weight(case)


def test_depthwise_weight_gradient_runs_directly() -> None:
    problem = Case("bf16", 32, (56, 56), 96, 1, 1, (7, 7), 1, 3).problem
    assert "_conv_direct_" in ckfmha.conv_select(problem, direction="bwd_weight")
    # Four-channel groups with an 11x11 filter: the partial dw of 32 groups (242 KiB) would
    # not fit in shared memory, so the implicit GEMM runs them.
    case = Case("bf16", 2, (15, 15), 40, 4, 4, (11, 11), 1, 5)
    assert "_conv_direct_" not in ckfmha.conv_select(case.problem, direction="bwd_weight")
    run_bwd_weight(case)


# Beyond the forward's depthwise cases, reductions over many runs a thread: 3-wide filters on
# 8 images of 56x56; whole rows wider than 3 (four channels a load): 7-wide at stride 2, a
# 6-wide row over 24 groups (CTAs of 2 vectors), a 3D filter 7 wide, ConvNeXt's first stage
# at batch 32; 28x28 maps, whose 7 runs take CTAs of 4 vectors (more slots a task); and a
# batch-1 layer of 768 groups on a 7x7 map, where the launch shrinks its CTAs; maps wider
# than a task's runs (several chunks along w) over depths and images, so that a CTA's strips
# (stepped by the grid, digit by digit) carry through every digit.
DEPTHWISE_WEIGHT_CASES = [
    Case("bf16", 8, (56, 56), 64, 1, 1, (3, 3), 1, 1),
    Case("bf16", 3, (5, 20, 300), 16, 1, 1, (3, 3, 3), 1, 1),
    Case("fp16", 5, (9, 700), 24, 1, 1, (3, 3), (1, 2), 1),
    Case("bf16", 2, (28, 28), 64, 1, 1, (3, 3), 1, 1, layout="channels_last"),
    Case("fp16", 4, (29, 31), 48, 1, 1, (7, 7), 2, 3, layout="channels_last"),
    Case("bf16", 3, (19, 26), 24, 1, 1, (5, 6), 1, (2, 3)),
    Case("fp16", 2, (3, 9, 13), 40, 1, 1, (3, 3, 7), 1, (1, 1, 3)),
    Case("bf16", 32, (56, 56), 96, 1, 1, (7, 7), 1, 3),
    Case("bf16", 1, (7, 7), 768, 1, 1, (7, 7), 1, 3),
]


@pytest.mark.parametrize(
    "case",
    DEPTHWISE_VECTOR_CASES + DEPTHWISE_WEIGHT_CASES + DEPTHWISE_LANE_CASES,
    ids=lambda c: c.label,
)
def test_depthwise_weight_paths(case: Case) -> None:
    """The one-channel direct backward-weight kernel on both of its paths; explain names the
    path the problem's geometry allows."""
    name = ckfmha.conv_select(case.problem, direction="bwd_weight")
    match = WEIGHT_DIRECT_NAME.match(name)
    if not (match and match["bucket"] == "1"):
        pytest.skip(f"no one-channel direct kernel for {case.label} in this build ({name})")
    text = ckfmha.conv_explain(case.problem, direction="bwd_weight")
    vector_geometry = case not in DEPTHWISE_LANE_CASES or case.layout == "offset"
    assert ("(the depthwise path) where x and dy" in text) == vector_geometry, text
    run_bwd_weight(case)


@pytest.mark.parametrize(
    "case", VECTOR_WEIGHT_CASES + VECTOR_WEIGHT_LANE_CASES, ids=lambda c: c.label
)
def test_vector_weight_paths(case: Case) -> None:
    """The direct backward-weight kernels of 2, 4 and 8 channels a group on both of their paths
    (the 8-channel one is given only problems of its vector path); explain names the path the
    problem's geometry allows."""
    name = ckfmha.conv_select(case.problem, direction="bwd_weight")
    match = WEIGHT_DIRECT_NAME.match(name)
    if not (match and match["bucket"] in ("2", "4", "8")):
        pytest.skip(f"no 2-, 4- or 8-channel direct kernel for {case.label} in this build ({name})")
    text = ckfmha.conv_explain(case.problem, direction="bwd_weight")
    vector_geometry = case not in VECTOR_WEIGHT_LANE_CASES or case.layout == "offset"
    assert ("(the vector path) where x and dy" in text) == vector_geometry, text
    run_bwd_weight(case)


# Problems small enough that the vector path's CTAs of a block of dw sum it among themselves
# and store dw, with no workspace (conv_vector_weight_layout): one CTA for every strip (960,
# 768 and 96 groups), clusters of 2, 4 and 8 (8 over 13-14 strips, two a CTA for some; over 7
# or 8 at batch 32, one CTA idle on 114-SM parts), every group width, 2D and 3D, stride 2,
# channels_last; 7x7 maps of 768 groups at batch 32, whose clusters would not fit one wave;
# and 20 strips (3D, 32 groups); the last two add into the workspace.
CLUSTER_WEIGHT_CASES = [
    Case("bf16", 1, (7, 7), 960, 1, 1, (3, 3), 1, 1),
    Case("bf16", 32, (7, 7), 768, 1, 1, (7, 7), 1, 3),
    Case("bf16", 1, (15, 15), 96, 1, 1, (3, 3), 2, 1, layout="channels_last"),
    Case("fp16", 1, (9, 9), 64, 1, 1, (3, 3), 1, 1),
    Case("bf16", 1, (7, 7), 768, 1, 1, (7, 7), 1, 3),
    Case("bf16", 1, (14, 14), 384, 1, 1, (7, 7), 1, 3, layout="channels_last"),
    Case("bf16", 32, (7, 7), 960, 1, 1, (3, 3), 1, 1),
    Case("bf16", 2, (5, 8, 8), 48, 1, 1, (3, 3, 3), 1, 1),
    Case("bf16", 1, (12, 12), 64, 2, 2, (3, 3), 1, 1),
    Case("fp16", 1, (20, 20), 64, 4, 4, (3, 3), 1, 1),
    Case("bf16", 1, (6, 6, 6), 24, 4, 4, (3, 3, 3), 1, 1),
    Case("bf16", 1, (13, 13), 16, 8, 8, (3, 3), 1, 1),
    Case("bf16", 1, (4, 9, 9), 32, 1, 1, (3, 3, 3), 1, 1),
]
CLUSTER_TEXT = re.compile(
    r"on its vector path \([^)]*\): (?:(one) CTA sums|(\d+) CTAs in a cluster sum)"
)


def _direct_weight_kernel(case: Case) -> str | None:
    """This device's direct backward-weight kernel of the case's dtype, dims and group width."""
    for k in _weight_kernels():
        match = WEIGHT_DIRECT_NAME.match(k["name"])
        if (match and match["dtype"] == case.dtype and int(match["dims"]) == len(case.input)
                and int(match["bucket"]) == case.c):  # fmt: skip
            return str(k["name"])
    return None


@pytest.mark.parametrize("case", CLUSTER_WEIGHT_CASES, ids=lambda c: c.label)
def test_small_weight_gradients_store_dw_from_one_cta_or_a_cluster(case: Case) -> None:
    """The direct kernel of the case's group width forced (the plan gives groups of 8 this
    small to the implicit GEMM): dw, poisoned first, against the float64 reference."""
    name = _direct_weight_kernel(case)
    if name is None:
        pytest.skip(f"no direct weight kernel for {case.label} in this build")
    run_bwd_weight(case, kernel=name)


def test_cluster_sizes_follow_the_strips() -> None:
    """explain names the CTAs that sum a block of dw: one, and on sm_90 clusters of 2, 4 and
    8 over the depthwise cases above; 20 strips add into the workspace."""
    sizes = set()
    for case in CLUSTER_WEIGHT_CASES[:-1]:
        text = ckfmha.conv_explain(case.problem, direction="bwd_weight")
        match = CLUSTER_TEXT.search(text)
        if match:
            sizes.add(1 if match[1] else int(match[2]))
    text = ckfmha.conv_explain(CLUSTER_WEIGHT_CASES[-1].problem, direction="bwd_weight")
    if "_conv_direct_" in text.split("plan: ")[1]:
        assert "zero the fp32 partial sums" in text and not CLUSTER_TEXT.search(text), text
    if ckfmha.device_arch() >= 90 and _direct_weight_kernel(CLUSTER_WEIGHT_CASES[0]):
        assert {1, 2, 4, 8} <= sizes, sizes
    else:
        assert sizes <= {1}, sizes


@pytest.mark.parametrize("case", VECTOR_FWD_CASES + VECTOR_FWD_LANE_CASES, ids=lambda c: c.label)
def test_vector_fwd_paths_in_backward_data(case: Case) -> None:
    """Backward-data of groups of 2 and 4 channels runs the forward's direct kernels over dy
    (per stride phase), on their vector path where it fits."""
    run_bwd_data(case)


@pytest.mark.parametrize("case", SPLIT_TMA_CASES, ids=lambda c: c.label)
def test_few_tiles_split_their_reduction_in_backward_data(case: Case) -> None:
    """Backward-data's phases run the same problems' transposes: where a phase is on the TMA
    forward with few tiles and a long reduction (K x taps), its tiles' k-tiles are shared over
    a cluster's CTAs as in the forward; the others run whole."""
    run_bwd_data(case)


@pytest.mark.parametrize("case", TMA_WEIGHT_CLUSTER_CASES, ids=lambda c: c.label)
def test_tma_weight_cluster_sums(case: Case) -> None:
    """The TMA weight kernel's splits of a tile summed in one cluster and stored as dw (no
    workspace), forced to 2-8 splits, whose bands of rows divide the tile unevenly at 3, 5, 6
    and 7 (each count sums in a cluster where every cluster is resident at once, else through
    the workspace); the rules' own plan adds any splits into the workspace (NOTES 128)."""
    dims = len(case.input)
    if not any(WEIGHT_TMA_NAME.match(k["name"])["dtype"] == case.dtype
               and int(WEIGHT_TMA_NAME.match(k["name"])["dims"]) == dims
               for k in _weight_kernels() if WEIGHT_TMA_NAME.match(k["name"])):  # fmt: skip
        pytest.skip(f"no {case.dtype} {dims}D TMA weight kernel this device runs in this build")
    plan = ckfmha.conv_explain(case.problem, direction="bwd_weight").split("plan: ")[1]
    assert "_sm90_tma_wgmma_" in plan and "one cluster" not in plan, plan
    run_bwd_weight(case)
    name = ckfmha.conv_select(case.problem, direction="bwd_weight")
    for splits in (2, 3, 5, 6, 7, 8):
        run_bwd_weight(case, kernel=name, splits=splits)


def test_eight_channel_groups_off_the_vector_path_run_on_the_implicit_gemm() -> None:
    """Misaligned 8-channel groups: the 8-channel direct kernel's lane path is slower than the
    implicit GEMM, so the plan takes the GEMM, and its result is checked."""
    case = Case("bf16", 48, (9, 11), 16, 8, 8, (3, 3), 1, 1, layout="offset")
    # The offset layout's positions: 16 x 8 + 5 elements apart, in x and in dy.
    strides = (9 * 11 * 133, 11 * 133, 133)
    problem = dataclasses.replace(case.problem, x_strides=strides, y_strides=strides)
    name = ckfmha.conv_select(problem, direction="bwd_weight")
    assert "_conv_direct_" not in name, name
    assert "_conv_direct_" in ckfmha.conv_select(case.problem, direction="bwd_weight")
    run_bwd_weight(case)


def test_bwd_data_runs_every_phase_on_a_forced_kernel() -> None:
    case = Case("bf16", 2, (13, 11), 2, 16, 24, (3, 3), 2, 1)
    name = ckfmha.conv_select(case.problem, direction="bwd_data")
    assert name.startswith("conv_fwd_"), name
    run_bwd_data(case, kernel=name)


def _device_fwd_kernels(name: re.Pattern[str]) -> list[dict[str, Any]]:
    """The forward kernels whose names `name` matches that run on this device."""
    if ckfmha.device_count() == 0:
        return []
    arch = ckfmha.device_arch()
    return [k for k in ckfmha.Registry().kernels()
            if k["family"] == "conv_fwd" and runs_on(k, arch) and name.match(k["name"])]  # fmt: skip


# The implicit-GEMM forward kernels that gather x through cp.async: in backward-data they read
# the rearranged filter of conv_phase_filters.cu, except the sm_90 8-channel ones where w is
# aligned and C a multiple of 8 (test_every_gathering_wgmma_kernel_reads_the_filter_in_place).
FWD_GATHER_NAME = re.compile(r"^conv_fwd_bf16_(?P<dims>[23])d_v(?P<vector>\d)__.*_cpasync_")


@pytest.mark.parametrize(
    "case",
    # Output channels that are not a multiple of 8 (an element a thread; with stride-2 phases),
    # and that are (16-byte vectors a thread), in 2D and 3D.
    [
        Case("bf16", 1, (9, 7), 3, 80, 12, (3, 3), 2, 1),
        Case("bf16", 2, (6, 5), 2, 4, 40, (3, 3), 1, 1),
        Case("bf16", 1, (6, 6, 6), 2, 8, 8, (5, 5, 5), 1, 2),
    ],
    ids=lambda c: c.label,
)
def test_phase_filters_of_narrow_groups(case: Case) -> None:
    """Filters of groups too narrow for a transposed tile, rearranged a row vector at a time
    (w off a 16-byte boundary, so that no kernel reads it in place)."""
    dims = len(case.input)
    reduction = case.k  # dy's channels: the forward's reduction in backward-data
    names = [k["name"] for k in _device_fwd_kernels(FWD_GATHER_NAME)
             if int(FWD_GATHER_NAME.match(k["name"])["dims"]) == dims
             and reduction % int(FWD_GATHER_NAME.match(k["name"])["vector"]) == 0]  # fmt: skip
    if not names:
        pytest.skip(f"no bf16 {dims}D gathering forward kernel in this build")
    run_bwd_data(case, kernel=names[0], misaligned_w=True)


# The gathering forward kernels on wgmma with 16-byte vectors, which read w in place through
# the phase's view where C is a multiple of 8 (16-byte runs along C, B stored MN-major).
FWD_GATHER_WGMMA_NAME = re.compile(
    r"^conv_fwd_(?P<dtype>fp16|bf16)_(?P<dims>[23])d_v8__.*_sm90_cpasync_wgmma_m\d+n(?P<tile_n>\d+)k"
)


@pytest.mark.parametrize(
    "kernel", _device_fwd_kernels(FWD_GATHER_WGMMA_NAME), ids=lambda k: k["name"]
)
def test_every_gathering_wgmma_kernel_reads_the_filter_in_place(kernel: dict[str, Any]) -> None:
    """Backward-data on each 8-channel gathering wgmma kernel, which gathers the flipped,
    transposed filter from w: C past a whole N tile by one vector (a partial tile), several
    groups, K that leaves the reduction's last k-tile partial (24 and 40 channels a tap) or
    makes every 8 rows a new tap (8), stride-2 phases of 1-4 taps, filters that are not square,
    dilation, ResNeXt's groups of 16 at stride 2, 3D, sliced and channels_last layouts; then w
    off a 16-byte boundary and C not a multiple of 8, where the plan copies the rearranged
    filter instead."""
    match = FWD_GATHER_WGMMA_NAME.match(kernel["name"])
    dtype, dims, tile_n = match["dtype"], int(match["dims"]), int(match["tile_n"])
    if dims == 2:
        cases = [Case(dtype, 2, (13, 11), 3, tile_n + 8, 24, (3, 3), 1, 1),
                 Case(dtype, 1, (17, 9), 2, 16, 40, (3, 1), (2, 1), (1, 0), layout="slice"),
                 Case(dtype, 1, (20, 19), 2, 8, 16, (3, 5), 2, (1, 2), layout="channels_last"),
                 Case(dtype, 2, (9, 30), 4, 32, 8, (3, 3), 1, 2, (1, 2)),
                 Case(dtype, 1, (28, 28), 32, 16, 16, (3, 3), 2, 1)]  # fmt: skip
        copied = Case(dtype, 1, (9, 9), 2, 12, 16, (3, 3), 1, 1)
    else:
        cases = [Case(dtype, 2, (4, 7, 5), 2, 16, 24, (3, 3, 3), 1, 1),
                 Case(dtype, 1, (5, 9, 8), 1, 40, 16, (3, 3, 3), (1, 2, 2), 1, layout="slice")]  # fmt: skip
        copied = Case(dtype, 1, (4, 5, 6), 2, 12, 16, (3, 3, 3), 1, 1)
    for case in cases:
        text = ckfmha.conv_explain(case.problem, direction="bwd_data")
        assert "its filter is read from w in place" in text or kernel["name"] not in text, text
        run_bwd_data(case, kernel=kernel["name"])
    run_bwd_data(cases[0], kernel=kernel["name"], misaligned_w=True)
    run_bwd_data(copied, kernel=kernel["name"])


# The forward's direct kernels: groups of at most `bucket` channels in and out.
FWD_DIRECT_NAME = re.compile(
    r"^conv_fwd_(?P<dtype>fp16|bf16)_(?P<dims>[23])d_v1_c(?P<bucket>\d+)__"
)


@pytest.mark.parametrize("kernel", _device_fwd_kernels(FWD_DIRECT_NAME), ids=lambda k: k["name"])
def test_every_direct_kernel_reads_the_filter_in_place_in_backward_data(
    kernel: dict[str, Any],
) -> None:
    """Backward-data on each direct forward kernel, which reads w through the phase's
    transposed and flipped view: unequal channel counts (the roles swap), filters that are not
    square (a flip along the wrong dim shows), strides of 1-3 per dim (phases of different tap
    counts), dilation, a partial block of 32 groups, the vector path (aligned, equal counts)
    and the lane path (a misaligned layout)."""
    match = FWD_DIRECT_NAME.match(kernel["name"])
    dtype, dims, bucket = match["dtype"], int(match["dims"]), int(match["bucket"])
    narrow = (max(1, bucket - 1), max(1, bucket // 2))
    if dims == 2:
        cases = [Case(dtype, 2, (13, 19), 40, bucket, bucket, (3, 5), 1, (1, 2)),
                 Case(dtype, 1, (17, 23), 35, narrow[1], narrow[0], (3, 5), 2, (1, 2)),
                 Case(dtype, 2, (16, 11), 33, bucket, narrow[1], (5, 3), (3, 2), (2, 1), (2, 1)),
                 Case(dtype, 1, (9, 20), 16, bucket, bucket, (7, 7), 1, 3, layout="offset")]  # fmt: skip
    else:
        cases = [Case(dtype, 2, (4, 7, 9), 16, bucket, bucket, (3, 3, 3), (1, 2, 1), 1),
                 Case(dtype, 1, (5, 6, 7), 5, narrow[0], bucket, (2, 3, 3), (2, 1, 2), (0, 1, 1),
                      (2, 1, 1))]  # fmt: skip
    for case in cases:
        text = ckfmha.conv_explain(case.problem, direction="bwd_data")
        assert "its filter is read from w in place" in text or kernel["name"] not in text, text
        run_bwd_data(case, kernel=kernel["name"])


# The forward fed by the copy engine.
FWD_TMA_NAME = re.compile(
    r"^conv_fwd_(?P<dtype>fp16|bf16)_(?P<dims>[23])d_v8__.*_sm90_tma_wgmma_m\d+n(?P<tile_n>\d+)k(?P<tile_k>\d+)_"
)


@pytest.mark.parametrize("kernel", _device_fwd_kernels(FWD_TMA_NAME), ids=lambda k: k["name"])
def test_every_tma_kernel_reads_the_filter_in_place_in_backward_data(
    kernel: dict[str, Any],
) -> None:
    """Backward-data on each TMA forward kernel, which copies the filter's 64-channel runs of
    one flipped tap straight from w: channel counts that leave a partial run and a partial
    tile (runs past the filter's channels read zeros), several chunks a tap, stride-2 phases
    of different tap counts, filters that are not square, dilation, several groups, sliced
    and channels_last layouts; and w off a 16-byte boundary, where the plan copies the
    rearranged filter instead."""
    match = FWD_TMA_NAME.match(kernel["name"])
    dtype, dims, tile_k = match["dtype"], int(match["dims"]), int(match["tile_k"])
    if dims == 2:
        cases = [Case(dtype, 3, (13, 11), 2, 40, 2 * tile_k, (3, 3), 1, 1),
                 Case(dtype, 2, (17, 9), 1, 72, tile_k, (3, 1), (2, 1), (1, 0), layout="slice"),
                 Case(dtype, 1, (20, 19), 3, 136, tile_k, (3, 5), 2, (1, 2),
                      layout="channels_last"),
                 Case(dtype, 2, (14, 14), 1, 288, 4 * tile_k, (1, 1), 1, 0),
                 Case(dtype, 1, (9, 30), 2, 64, tile_k, (3, 3), 1, 2, (1, 2))]  # fmt: skip
    else:
        cases = [Case(dtype, 2, (4, 7, 5), 2, 16, tile_k, (3, 3, 3), 1, 1),
                 Case(dtype, 1, (5, 9, 8), 1, 72, 2 * tile_k, (3, 3, 3), (1, 2, 2), 1,
                      layout="slice")]  # fmt: skip
    for case in cases:
        run_bwd_data(case, kernel=kernel["name"])
    run_bwd_data(cases[0], kernel=kernel["name"], misaligned_w=True)
    # Groups of 8 output channels, 8 to a block-diagonal filter of 64 (conv_tma_pack).
    spatial = (13, 11) if dims == 2 else (4, 7, 5)
    run_bwd_data(Case(dtype, 2, spatial, 16, 24, 8, (3,) * dims, 2, 1), kernel=kernel["name"])


# Groups of 8-32 output channels on the TMA template, several to a block-diagonal filter (from
# 1024 dx positions; below it only a forced TMA kernel packs): packs of 8 and 4, unequal channel counts, strides 1 and 2 (phases of 1-4 taps), dilation,
# 3D, and the channels_last and sliced layouts.
PACKED = [
    Case("bf16", 4, (28, 28), 32, 8, 8, (3, 3), 2, 1),
    Case("bf16", 2, (24, 24), 32, 16, 16, (3, 3), 1, 1, layout="channels_last"),
    Case("fp16", 4, (19, 15), 8, 32, 16, (3, 3), 2, 1, layout="slice"),
    Case("bf16", 8, (17, 9), 16, 24, 8, (5, 3), (1, 2), (2, 1), (1, 2)),
    Case("bf16", 3, (6, 9, 8), 16, 8, 16, (3, 3, 3), (1, 2, 2), 1),
    Case("bf16", 6, (14, 14), 32, 32, 32, (3, 3), 1, 1),  # ResNeXt's last stage: packs of 2
]


@pytest.mark.parametrize("case", PACKED, ids=lambda c: c.label)
def test_backward_data_packs_groups_on_the_tma_kernel(case: Case) -> None:
    dims = len(case.input)
    if not any(FWD_TMA_NAME.match(k["name"])["dtype"] == case.dtype
               and int(FWD_TMA_NAME.match(k["name"])["dims"]) == dims
               for k in _device_fwd_kernels(FWD_TMA_NAME)):  # fmt: skip
        pytest.skip(f"no {case.dtype} {dims}D TMA forward kernel in this build")
    text = ckfmha.conv_explain(case.problem, direction="bwd_data")
    assert "block-diagonal filters" in text, text
    run_bwd_data(case)


def test_select_and_explain_name_the_backward_plans() -> None:
    problem = Case("bf16", 32, (28, 28), 1, 128, 16, (3, 3), 2, 1).problem
    data = ckfmha.conv_explain(problem, direction="bwd_data")
    assert "4 stride phases" in data and "phase 3" in data
    weight = ckfmha.conv_explain(problem, direction="bwd_weight")
    assert "selected" in weight and "split" in weight
    assert ckfmha.conv_select(problem, direction="bwd_weight").startswith("conv_bwd_weight_")


def test_wrong_family_is_refused() -> None:
    forward = ckfmha.conv_select(Case("bf16", 1, (9, 9), 1, 8, 8, (3, 3)).problem)
    x = torch.randn((1, 9, 9, 1, 8), dtype=torch.bfloat16, device="cuda")
    dy = torch.randn((1, 7, 7, 1, 8), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(errors.InvalidArgumentError, match="runs conv_bwd_weight kernels"):
        ckfmha.conv_bwd_weight(x, dy, filter_size=(3, 3), kernel=forward)


def test_dy_shape_is_checked() -> None:
    dy = torch.randn((1, 6, 7, 1, 8), dtype=torch.bfloat16, device="cuda")
    w = torch.randn((1, 8, 3, 3, 8), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(errors.InvalidArgumentError, match=r"dy must be \[N, \*output, G, K\]"):
        ckfmha.conv_bwd_data(dy, w, input_size=(9, 9))
