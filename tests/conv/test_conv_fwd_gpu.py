"""Grouped convolution on the GPU against the float64 reference (ckfmha.reference_conv).

Shapes come from a hand-picked list (the layers of ResNeXt, ConvNeXt, MobileNet and video
models, first layers with 3 input channels, reductions of several thousand products) and a
seeded random draw over groups (1, 2, 4, 32, depthwise), channels per group (1 to 256, output
channels not multiples of 8 among them), strides 1 to 3, paddings 0 to 3 and dilations 1 and
2 per dim, filters 1x1 to 7x7, 1x7 and 3x3x3, odd spatial sizes and batches 1 to 8. The shapes
are the same every run; the values are fresh (the seed is in every failure message). Arrays
come dense, cut from larger tensors (batch and spatial strides free, outputs too), with a
channel offset that misaligns the pointers and the position stride (narrower channel loads),
and as torch channels_last tensors viewed as [N, *spatial, G, C]. Outputs are poisoned with
NaN first; around a cut-out output every other element must stay NaN.

Error bound, per output element: |y - ref| <= u * |ref| + 2^-14 * S, S = sum of |x| * |w| over
the element's reduction (the reference applied to |x| and |w|). The fp16/bf16 products are
exact in fp32; the fp32 sum of n = taps * C of them is off by at most n * 2^-24 * S, and by
about sqrt(n) * 2^-24 * S for products of random sign, which 2^-14 * S covers with a wide
margin at the largest n here (6912); the result is rounded once to the output type, which adds
at most u * |ref| (u = 2^-8 for bf16, 2^-11 for fp16) beside a share of the first term.
Where every tap reads padding (S = 0) the output must be exactly 0.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from support.device_kernels import runs_on

import ckfmha
from ckfmha import errors
from ckfmha.conv_problem import ConvProblem
from ckfmha.reference_conv import conv_fwd as reference_conv_fwd

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
ACCUMULATION = 2.0**-14
NAME = re.compile(r"^conv_fwd_(?P<dtype>fp16|bf16)_(?P<dims>[23])d_v(?P<vector>\d+)__")
# Direct kernels: groups of at most `bucket` input and output channels.
DIRECT_NAME = re.compile(
    r"^conv_fwd_(?P<dtype>fp16|bf16)_(?P<dims>[23])d_v1_c(?P<bucket>\d+)__"
)
# Reference work per case, in multiply-adds: keeps the float64 reference to a fraction of a
# second.
MAX_REFERENCE_MACS = 4e7


@dataclass(frozen=True)
class Case:
    dtype: str
    batch: int
    input: tuple[int, ...]
    groups: int
    c: int
    k: int
    filter: tuple[int, ...]
    stride: tuple[int, ...] | int = 1
    padding: tuple[int, ...] | int = 0
    dilation: tuple[int, ...] | int = 1
    # "dense", "slice" (x and out cut from larger tensors), "offset" (x at a channel offset
    # that misaligns the pointer and the position stride) or "channels_last" (a torch
    # channels_last tensor viewed as [N, *spatial, G, C]).
    layout: str = "dense"

    @property
    def problem(self) -> ConvProblem:
        return ConvProblem(self.batch, self.input, self.groups, self.c, self.k, self.filter,
                           self.stride, self.padding, self.dilation, self.dtype)  # fmt: skip

    @property
    def macs(self) -> float:
        return self.problem.flops() / 2

    @property
    def label(self) -> str:
        dims = "x".join(map(str, self.input))
        taps = "x".join(map(str, self.filter))
        return (f"{self.dtype}-n{self.batch}-{dims}-g{self.groups}c{self.c}k{self.k}-f{taps}"
                f"-s{self.stride}-p{self.padding}-d{self.dilation}-{self.layout}")  # fmt: skip


CASES = [
    # ResNeXt-50 32x4d grouped 3x3 layers, stage by stage.
    Case("bf16", 2, (56, 56), 32, 4, 4, (3, 3), 1, 1),
    Case("bf16", 2, (28, 28), 32, 8, 8, (3, 3), 2, 1),
    Case("bf16", 2, (14, 14), 32, 16, 16, (3, 3), 1, 1, layout="channels_last"),
    Case("bf16", 2, (7, 7), 32, 32, 32, (3, 3), 1, 1),
    # ConvNeXt and MobileNet depthwise layers.
    Case("bf16", 2, (14, 14), 96, 1, 1, (7, 7), 1, 3),
    Case("bf16", 1, (33, 17), 24, 1, 1, (3, 3), 2, 1, layout="channels_last"),
    Case("fp16", 2, (13, 13), 32, 1, 1, (5, 5), 1, 2),
    # First layers: three input channels, strided 7x7.
    Case("bf16", 2, (33, 17), 1, 3, 16, (7, 7), 2, 3),
    Case("fp16", 1, (56, 56), 1, 3, 24, (7, 7), 2, 3),
    # Dense layers: pointwise, 3x3, separable 1x7 / 7x1, output channels not multiples of 8.
    Case("fp16", 4, (7, 7), 1, 256, 40, (1, 1)),
    Case("bf16", 1, (14, 14), 1, 64, 64, (3, 3), 1, 1, layout="slice"),
    Case("bf16", 3, (13, 13), 4, 8, 12, (1, 7), 1, (0, 3)),
    Case("bf16", 2, (17, 9), 2, 24, 72, (7, 1), (2, 1), (3, 0)),
    Case("fp16", 2, (12, 11), 2, 128, 24, (3, 3), (1, 2), (2, 1), (2, 1)),
    # Per-dim strides, paddings and dilations, and a filter that reads only padding somewhere.
    Case("bf16", 5, (13, 7), 2, 16, 16, (3, 5), (3, 2), (3, 0), (2, 1)),
    Case("bf16", 1, (2, 2), 1, 8, 8, (1, 1), 1, 3),
    # Reductions of several thousand products (taps * C = 4608, 6272, 6912).
    Case("bf16", 1, (14, 14), 1, 512, 72, (3, 3), 1, 1),
    Case("fp16", 1, (9, 9), 1, 128, 40, (7, 7), 1, 3),
    # 3D: video models' grouped 3x3x3, a temporal-only filter, depthwise, a long reduction.
    Case("bf16", 2, (5, 7, 9), 2, 16, 24, (3, 3, 3), (1, 2, 2), 1),
    Case("bf16", 1, (4, 13, 13), 8, 8, 8, (3, 3, 3), 1, 1, layout="channels_last"),
    Case("bf16", 2, (7, 5, 5), 1, 32, 12, (3, 1, 1), (2, 1, 1), (1, 0, 0), (2, 1, 1)),
    Case("bf16", 1, (6, 6, 6), 1, 256, 16, (3, 3, 3), 1, 1),
    Case("bf16", 2, (5, 6, 7), 16, 1, 1, (3, 3, 3), 1, 1, layout="slice"),
    # Pointers and position strides that 16 bytes do not divide.
    Case("bf16", 2, (9, 9), 2, 64, 64, (3, 3), 1, 1, layout="offset"),
    Case("fp16", 1, (7, 7), 4, 8, 16, (3, 3), 1, 1, layout="offset"),
    Case("bf16", 1, (4, 5, 6), 1, 16, 8, (3, 3, 3), 1, 1, layout="offset"),
    Case("bf16", 2, (9, 11), 4, 24, 24, (3, 3), 1, 1, layout="slice"),
]


def _draw_cases(count: int, seed: int = 2026_11_27) -> list[Case]:
    """Seeded random shapes: the same list every run, kept to what the reference checks fast."""
    rng = np.random.default_rng(seed)
    channels = (1, 3, 4, 8, 16, 24, 64, 72, 128, 256)
    outputs = (1, 3, 4, 8, 12, 16, 24, 40, 64, 72, 128, 256)
    filters = {2: ((1, 1), (3, 3), (5, 5), (7, 7), (1, 7), (7, 1), (3, 5)),
               3: ((1, 1, 1), (3, 3, 3), (1, 3, 3), (3, 1, 1))}  # fmt: skip
    sizes = {2: (1, 2, 5, 7, 13, 17, 33, 56), 3: (1, 3, 5, 8, 9)}
    cases: list[Case] = []
    while len(cases) < count:
        dims = 3 if rng.random() < 0.25 else 2
        depthwise = rng.random() < 0.15
        groups = int(rng.choice((8, 24, 96))) if depthwise else int(rng.choice((1, 2, 4, 32)))
        c = 1 if depthwise else int(rng.choice(channels))
        k = 1 if depthwise else int(rng.choice(outputs))
        taps = filters[dims][rng.integers(len(filters[dims]))]
        case = Case(
            dtype="fp16" if rng.random() < 0.3 else "bf16",
            batch=int(rng.integers(1, 9)),
            input=tuple(int(rng.choice(sizes[dims])) for _ in range(dims)),
            groups=groups, c=c, k=k, filter=taps,
            stride=tuple(int(rng.choice((1, 1, 2, 3))) for _ in range(dims)),
            padding=tuple(int(rng.integers(0, 4)) for _ in range(dims)),
            dilation=tuple(int(rng.choice((1, 1, 2))) for _ in range(dims)),
            layout=str(rng.choice(("dense", "dense", "slice", "offset", "channels_last"))),
        )  # fmt: skip
        if min(case.problem.output) >= 1 and case.macs <= MAX_REFERENCE_MACS:
            cases.append(case)
    return cases


DRAWN = _draw_cases(40)


# ---- inputs and the check ----


def torch_dtype(name: str) -> Any:
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def f64(t: Any) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


class Inputs:
    """Fresh random tensors; the seed names the draw in failure messages."""

    def __init__(self) -> None:
        self.seed = secrets.randbits(62)
        self.generator = torch.Generator().manual_seed(self.seed)

    def normal(self, shape: tuple[int, ...], dtype: str) -> Any:
        t = torch.randn(shape, generator=self.generator, dtype=torch.float32)
        return t.to("cuda", torch_dtype(dtype))


def make_x(case: Case, inputs: Inputs) -> Any:
    """x [N, *spatial, G, C] in the case's layout, filled with fresh values."""
    n, g, c, spatial = case.batch, case.groups, case.c, case.input
    if case.layout == "channels_last":
        nchw = inputs.normal((n, g * c, *spatial), case.dtype)
        fmt = torch.channels_last if len(spatial) == 2 else torch.channels_last_3d
        nchw = nchw.contiguous(memory_format=fmt)
        order = (0, *range(2, 2 + len(spatial)), 1)
        x = nchw.permute(order).unflatten(-1, (g, c))
        assert x.data_ptr() == nchw.data_ptr()  # a view, no copy
        return x
    if case.layout == "slice":
        big = inputs.normal((n + 1, *(s + 3 for s in spatial), g * c), case.dtype)
        index = (slice(1, None), *(slice(2, 2 + s) for s in spatial))
        return big[index].unflatten(-1, (g, c))
    if case.layout == "offset":
        big = inputs.normal((n, *spatial, g * c + 5), case.dtype)
        return big[..., 3 : 3 + g * c].unflatten(-1, (g, c))
    return inputs.normal((n, *spatial, g, c), case.dtype)


def make_out(case: Case) -> tuple[Any, Any]:
    """(out poisoned with NaN, the tensor it lives in): cut from a larger one for "slice"."""
    shape = case.problem.y_shape
    dtype = torch_dtype(case.dtype)
    if case.layout != "slice":
        out = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
        return out, out
    n, *spatial, g, k = shape
    big = torch.full((n + 1, *(s + 2 for s in spatial), g * k + 8), float("nan"), dtype=dtype,
                     device="cuda")  # fmt: skip
    index = (slice(0, n), *(slice(1, 1 + s) for s in spatial), slice(8, 8 + g * k))
    return big[index].unflatten(-1, (g, k)), big


def assert_conv_close(y: Any, x: Any, w: Any, case: Case, what: str) -> None:
    x64, w64 = f64(x), f64(w)
    geometry = {"stride": case.stride, "padding": case.padding, "dilation": case.dilation}
    ref = reference_conv_fwd(x64, w64, **geometry)
    magnitude = reference_conv_fwd(np.abs(x64), np.abs(w64), **geometry)
    got = f64(y) if hasattr(y, "detach") else np.asarray(y, dtype=np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, reference {ref.shape}"
    assert not np.isnan(got).any(), f"{what}: NaN left in the output (unwritten positions)"
    bound = UNIT_ROUNDOFF[case.dtype] * np.abs(ref) + ACCUMULATION * magnitude
    error = np.abs(got - ref)
    excess = error - bound
    worst = np.unravel_index(int(np.argmax(excess)), excess.shape)
    assert excess[worst] <= 0, (
        f"{what}: |y - ref| = {error[worst]:.4g} at {tuple(map(int, worst))} (y {got[worst]:.6g}, "
        f"ref {ref[worst]:.6g}, bound {bound[worst]:.4g}); max error {error.max():.4g}"
    )


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
    if whole is not out:
        outside = torch.ones_like(whole, dtype=torch.bool)
        outside[(slice(0, case.batch), *(slice(1, 1 + s) for s in case.problem.output),
                 slice(8, 8 + case.groups * case.k))] = False  # fmt: skip
        assert whole[outside].isnan().all(), f"{what}: wrote outside out"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_conv_fwd_cases(case: Case) -> None:
    run_case(case)


@pytest.mark.parametrize("case", DRAWN, ids=lambda c: c.label)
def test_conv_fwd_drawn(case: Case) -> None:
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
            if k["family"] == "conv_fwd" and runs_on(k, arch) and NAME.match(k["name"])]  # fmt: skip


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
