"""ckfmha.torch.conv2d / conv3d and the ``torch.ops.ckfmha`` conv ops.

Without a GPU: the ops' schemas and fake implementations (FakeTensorMode over fake CUDA
tensors, opcheck and autograd over meta tensors), the backward asking only for the gradients
wanted, torch.compile tracing forward and backward ops in one graph, argument errors raised
before any device work, and the layout views between torch's [N, G*C, *spatial] tensors and
ckfmha's [N, *spatial, G, C] checked against torch's conv through the float64 NumPy reference.

With a GPU (marked ``gpu``): the forward and the gradients of input, weight and bias against
torch's float64 conv and autograd on the CPU over the same fresh random values (the seed is
in every failure message), opcheck on CUDA tensors and a torch.compile(fullgraph=True) step.

Error bounds, per element, are those of tests/conv/test_conv_fwd_gpu.py: |got - ref| <=
u * |ref| + 2^-14 * S, u the output type's unit roundoff, S the sum of the absolute products
the element reduces (its fp32 sum is off by far less than 2^-14 * S). S is the same float64
conv over absolute values: conv(|x|, |w|) for y; for dx the gradient of conv(x, |w|) by x
given |dy| (a sum of |dy| * |w| over K and the taps); for dw the gradient of conv(|x|, w) by w
given |dy| (a sum of |dy| * |x| over the batch and the output positions); for the bias the sum
of |dy|. With a bias y is rounded twice (the kernel's output, then torch's add): u * |conv|
joins the bound.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import ckfmha
import ckfmha.torch
from ckfmha import reference_conv
from ckfmha.conv_problem import per_dim
from ckfmha.torch import conv_ops

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
ACCUMULATION = 2.0**-14
OPS = ("conv_fwd", "conv_bwd_data", "conv_bwd_weight")


@dataclass(frozen=True)
class Case:
    dtype: str
    batch: int
    in_channels: int
    out_channels: int
    groups: int
    input: tuple[int, ...]
    filter: tuple[int, ...]
    stride: int | tuple[int, ...] = 1
    padding: int | tuple[int, ...] | str = 0
    dilation: int | tuple[int, ...] = 1
    # The input's memory format: channels_last is read in place, NCHW takes the one copy.
    channels_last: bool = True
    bias: bool = False

    @property
    def dims(self) -> int:
        return len(self.input)

    @property
    def memory_format(self) -> Any:
        return torch.channels_last if self.dims == 2 else torch.channels_last_3d

    @property
    def x_shape(self) -> tuple[int, ...]:
        return (self.batch, self.in_channels, *self.input)

    @property
    def w_shape(self) -> tuple[int, ...]:
        return (self.out_channels, self.in_channels // self.groups, *self.filter)

    @property
    def geometry(self) -> dict[str, Any]:
        return {"stride": self.stride, "padding": self.padding, "dilation": self.dilation,
                "groups": self.groups}  # fmt: skip

    def conv(self, *args: Any) -> Any:
        """ckfmha.torch.conv2d or conv3d over this case's geometry."""
        function = ckfmha.torch.conv2d if self.dims == 2 else ckfmha.torch.conv3d
        return function(*args, **self.geometry)

    def torch_conv(self, *args: Any) -> Any:
        """torch.nn.functional.conv2d or conv3d over this case's geometry."""
        function = F.conv2d if self.dims == 2 else F.conv3d
        return function(*args, **self.geometry)

    @property
    def label(self) -> str:
        dims = "x".join(map(str, self.input))
        taps = "x".join(map(str, self.filter))
        layout = "cl" if self.channels_last else "nchw"
        return (f"{self.dtype}-n{self.batch}-{dims}-{self.in_channels}to{self.out_channels}"
                f"-g{self.groups}-f{taps}-s{self.stride}-p{self.padding}-d{self.dilation}"
                f"-{layout}{'-bias' if self.bias else ''}")  # fmt: skip


CASES = [
    # groups 1, 4 and 32, depthwise (and a channel multiplier of 2), 12 and 40 channels.
    Case("fp16", 2, 12, 40, 1, (13, 11), (3, 3), 1, 1),
    Case("bf16", 2, 40, 12, 4, (15, 9), (3, 3), 2, 1, channels_last=False),
    Case("bf16", 2, 64, 128, 32, (17, 13), (3, 3), 1, 2, 2),
    Case("fp16", 3, 24, 24, 24, (11, 13), (5, 5), 2, 2),
    Case("bf16", 1, 12, 24, 12, (9, 7), (3, 3), 1, 1, channels_last=False, bias=True),
    # Per-dim geometry: a 1x7 filter, strided along H only; 'same' with dilation 2.
    Case("bf16", 2, 12, 40, 4, (7, 9), (1, 7), (2, 1), (0, 3)),
    Case("fp16", 2, 40, 12, 1, (9, 10), (3, 3), 1, "same", 2, bias=True),
    # A stride larger than the filter: some input positions take no gradient (exactly 0).
    Case("bf16", 2, 16, 12, 4, (11, 10), (1, 1), 3, 1),
    # 3D: dense, grouped with per-dim stride and dilation, depthwise strided, groups 32.
    Case("bf16", 2, 12, 40, 1, (5, 7, 6), (3, 3, 3), 1, 1),
    Case("fp16", 1, 40, 12, 4, (7, 9, 5), (3, 3, 3), (1, 2, 2), 1, (2, 1, 1),
         channels_last=False, bias=True),
    Case("bf16", 2, 32, 32, 32, (5, 6, 7), (3, 3, 3), 2, 1),
    Case("bf16", 1, 64, 64, 32, (4, 7, 7), (3, 3, 3), 1, 2, 2),
]


def _meta(shape: tuple[int, ...], dtype: Any = torch.bfloat16, grad: bool = False) -> Any:
    return torch.empty(shape, dtype=dtype, device="meta", requires_grad=grad)


def _case_tensors(case: Case, device: str, grad: bool = False) -> tuple[Any, Any, Any]:
    """Uninitialised (x, w, bias or None) of the case's shapes on ``device``."""
    dtype = DTYPES[case.dtype]
    x = torch.empty(case.x_shape, dtype=dtype, device=device)
    if case.channels_last:
        x = x.to(memory_format=case.memory_format)
    w = torch.empty(case.w_shape, dtype=dtype, device=device)
    b = torch.empty(case.out_channels, dtype=dtype, device=device) if case.bias else None
    if grad:
        for t in (x, w, b):
            if t is not None:
                t.requires_grad_()
    return x, w, b


def _torch_output_shape(case: Case) -> tuple[int, ...]:
    x = torch.empty(case.x_shape, device="meta")
    return tuple(case.torch_conv(x, torch.empty(case.w_shape, device="meta")).shape)


# ---- without a GPU: the ops and their fake implementations ----


@pytest.mark.parametrize("name", OPS)
def test_every_op_is_registered_and_writes_no_input(name: str) -> None:
    schema = str(getattr(torch.ops.ckfmha, name).default._schema)
    assert schema.startswith(f"ckfmha::{name}(")
    assert "!" not in schema


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_fake_output_has_torchs_shape_in_channels_last(case: Case) -> None:
    with FakeTensorMode():
        x, w, b = _case_tensors(case, "cuda")
        y = case.conv(x, w, b)
        assert tuple(y.shape) == _torch_output_shape(case)
        assert y.dtype == DTYPES[case.dtype] and y.device.type == "cuda"
        assert y.is_contiguous(memory_format=case.memory_format)


def test_fake_backward_ops_give_the_operands_shapes() -> None:
    with FakeTensorMode():
        x = torch.empty((2, 9, 11, 4, 8), dtype=torch.float16, device="cuda")
        w = torch.empty((4, 6, 3, 5, 8), dtype=torch.float16, device="cuda")
        y = torch.ops.ckfmha.conv_fwd(x, w, [2, 1], [1, 2], [1, 2])
        assert tuple(y.shape) == (2, 5, 7, 4, 6) and y.is_contiguous()
        dx = torch.ops.ckfmha.conv_bwd_data(y, w, [9, 11], [2, 1], [1, 2], [1, 2])
        assert tuple(dx.shape) == tuple(x.shape) and dx.is_contiguous()
        dw = torch.ops.ckfmha.conv_bwd_weight(x, y, [3, 5], [2, 1], [1, 2], [1, 2])
        assert tuple(dw.shape) == tuple(w.shape) and dw.is_contiguous()
        assert dx.dtype == dw.dtype == torch.float16


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_meta_autograd_gives_every_gradient_its_input_shape(case: Case) -> None:
    x, w, b = _case_tensors(case, "meta", grad=True)
    case.conv(x, w, b).sum().backward()
    for t in (x, w, b):
        if t is not None:
            assert t.grad is not None and t.grad.shape == t.shape and t.grad.dtype == t.dtype


def _ckfmha_ops(gm: torch.fx.GraphModule) -> list[str]:
    """The ckfmha ops a traced graph calls, in order."""
    return [n.target._opname for n in gm.graph.nodes
            if n.op == "call_function" and getattr(n.target, "namespace", "") == "ckfmha"]


def _traced_ops(wants: tuple[bool, bool]) -> list[str]:
    """The ckfmha ops a traced step runs when x and w want a gradient as ``wants`` says."""
    x = _meta((2, 16, 7, 9), grad=wants[0])
    w = _meta((12, 4, 3, 3), grad=wants[1])

    def step(x: Any, w: Any) -> Any:
        y = ckfmha.torch.conv2d(x, w, padding=1, groups=4)
        leaves = [t for t in (x, w) if t.requires_grad]
        return torch.autograd.grad(y.float().square().sum(), leaves)

    return _ckfmha_ops(make_fx(step, tracing_mode="fake")(x, w))


@pytest.mark.parametrize(
    ("wants", "ops"),
    [((True, False), ["conv_fwd", "conv_bwd_data"]),
     ((False, True), ["conv_fwd", "conv_bwd_weight"]),
     ((True, True), ["conv_fwd", "conv_bwd_data", "conv_bwd_weight"])],
)
def test_backward_runs_only_the_gradients_asked_for(wants: tuple[bool, bool],
                                                    ops: list[str]) -> None:  # fmt: skip
    assert _traced_ops(wants) == ops


def test_opcheck_on_meta_tensors() -> None:
    # The meta kernel is the fake one: this checks schemas, autograd registration and
    # dynamic-shape tracing, not values (the GPU test runs opcheck on real tensors).
    x, w = _meta((2, 7, 9, 4, 8), grad=True), _meta((4, 6, 3, 3, 8), grad=True)
    geometry = ([1, 2], [1, 1], [2, 1])
    dy = _meta((2, 3, 5, 4, 6))
    torch.library.opcheck(torch.ops.ckfmha.conv_fwd.default, (x, w, *geometry))
    torch.library.opcheck(torch.ops.ckfmha.conv_bwd_data.default,
                          (dy, w.detach(), [7, 9], *geometry))  # fmt: skip
    torch.library.opcheck(torch.ops.ckfmha.conv_bwd_weight.default,
                          (x.detach(), dy, [3, 3], *geometry))  # fmt: skip


def test_compile_traces_forward_and_backward_ops_in_one_graph() -> None:
    graphs: dict[str, Any] = {}

    def keep(kind: str) -> Any:
        def compiler(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
            graphs[kind] = gm
            return make_boxed_func(gm.forward)

        return compiler

    backend = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))
    x, w, b = _meta((2, 8, 5, 7, 6), torch.float16, True), _meta(
        (12, 4, 3, 3, 3), torch.float16, True), _meta((12,), torch.float16, True)  # fmt: skip

    def block(x: Any, w: Any, b: Any) -> Any:
        return torch.relu(ckfmha.torch.conv3d(x, w, b, stride=(1, 2, 2), padding=1, groups=2))

    y = torch.compile(block, fullgraph=True, backend=backend)(x, w, b)
    y.sum().backward()
    assert tuple(y.shape) == (2, 12, 5, 4, 3) and b.grad is not None
    assert _ckfmha_ops(graphs["forward"]) == ["conv_fwd"]
    assert sorted(_ckfmha_ops(graphs["backward"])) == ["conv_bwd_data", "conv_bwd_weight"]


# ---- without a GPU: argument errors, before anything is copied or launched ----

X, W = (2, 16, 9, 11), (12, 4, 3, 3)  # 4 groups of 4 input and 3 output channels


@pytest.mark.parametrize(
    ("shapes", "options", "message"),
    [
        ({"input": (2, 16, 9)}, {}, r"takes input \[N, C_in, H, W\] \(4 dims\), got \(2, 16, 9\)"),
        ({"weight": (12, 4, 3, 3, 3)}, {}, r"takes weight \[C_out, C_in / groups, kH, kW\]"),
        ({"input": (2, 15, 9, 11), "weight": (12, 5, 3, 3)}, {},
         r"groups=4 must divide the input channels \(15\)"),
        ({"weight": (10, 4, 3, 3)}, {}, r"and the output channels \(10\)"),
        ({"weight": (12, 8, 3, 3)}, {}, "expected 4 channels per group"),
        ({"bias": (6,)}, {}, r"bias has shape \(6,\); expected \(12,\)"),
        ({}, {"groups": 0}, "groups is 0; accepted: an integer >= 1"),
        ({}, {"stride": 0}, "stride is 0; accepted: an integer >= 1"),
        ({}, {"dilation": (1, 2, 1)}, "dilation is"),
        ({}, {"padding": -1}, "padding is -1"),
        ({}, {"padding": "full"}, "supported: an integer, one per spatial dim, 'valid' or 'same'"),
        ({}, {"padding": "same", "stride": 2}, "padding='same' with filter"),
        ({"weight": (12, 4, 4, 4)}, {"padding": "same"}, "even in every dim"),
        ({"weight": (12, 4, 11, 3)}, {}, r"does not fit the input \(9, 11\)"),
    ],
)
def test_bad_arguments_name_the_problem(shapes: dict, options: dict, message: str) -> None:
    # Meta tensors: nothing could run, so each error comes from the checks.
    input, weight = _meta(shapes.get("input", X)), _meta(shapes.get("weight", W))
    bias = _meta(shapes["bias"]) if "bias" in shapes else None
    kwargs = {"groups": 4, **options}
    with pytest.raises(ckfmha.InvalidArgumentError, match=message):
        ckfmha.torch.conv2d(input, weight, bias, **kwargs)


@pytest.mark.parametrize(
    ("dtypes", "message"),
    [
        ((torch.float32, torch.float32, None),
         "input is torch.float32; supported: torch.float16 and torch.bfloat16"),
        ((torch.bfloat16, torch.float16, None),
         "share one dtype and device; got input torch.bfloat16 on meta, weight torch.float16"),
        ((torch.float16, torch.float16, torch.float32), "bias is torch.float32; supported"),
    ],
)
def test_dtypes_are_fp16_or_bf16_and_shared(dtypes: tuple, message: str) -> None:
    x_dtype, w_dtype, b_dtype = dtypes
    bias = None if b_dtype is None else _meta((12,), b_dtype)
    with pytest.raises(ckfmha.InvalidArgumentError, match=message):
        ckfmha.torch.conv2d(_meta(X, x_dtype), _meta(W, w_dtype), bias, groups=4)


def test_host_tensors_are_refused_naming_cuda() -> None:
    x, w = torch.randn(X).half(), torch.randn(W).half()
    with pytest.raises(ckfmha.InvalidArgumentError, match="conv2d runs on CUDA tensors; got "
                                                          "input on cpu"):  # fmt: skip
        ckfmha.torch.conv2d(x, w, groups=4)
    with pytest.raises(ckfmha.InvalidArgumentError, match="conv3d takes input"):
        ckfmha.torch.conv3d(x, w, groups=4)
    x5 = torch.randn(2, 9, 11, 4, 4).half()
    w5 = torch.randn(4, 3, 3, 3, 4).half()
    with pytest.raises(ckfmha.InvalidArgumentError,
                       match="torch.ops.ckfmha.conv_fwd runs on CUDA tensors"):  # fmt: skip
        torch.ops.ckfmha.conv_fwd(x5, w5, [1, 1], [1, 1], [1, 1])


def test_ops_refuse_mismatched_layouts_while_tracing() -> None:
    with FakeTensorMode():
        x = torch.empty((2, 9, 11, 4, 8), dtype=torch.float16, device="cuda")
        w = torch.empty((2, 6, 3, 3, 8), dtype=torch.float16, device="cuda")
        with pytest.raises(ckfmha.InvalidArgumentError, match="with x's G and C"):
            torch.ops.ckfmha.conv_fwd(x, w, [1, 1], [0, 0], [1, 1])


def test_padding_strings_resolve_to_symmetric_padding() -> None:
    assert conv_ops.resolve_padding("same", (3, 5), (1, 1), (2, 1)) == (2, 2)
    assert conv_ops.resolve_padding("same", (3, 1, 7), (1, 1, 1), (1, 1, 1)) == (1, 0, 3)
    assert conv_ops.resolve_padding("valid", (3, 3), (2, 2), (1, 1)) == (0, 0)
    assert conv_ops.resolve_padding((1, 2), (3, 3), (2, 2), (1, 1)) == (1, 2)
    # An even filter with dilation 2 spans an even number of taps: padded equally.
    assert conv_ops.resolve_padding("same", (2, 3), (1, 1), (2, 1)) == (1, 1)


# ---- without a GPU: torch's layouts as ckfmha's ----


def test_channels_last_input_is_viewed_without_a_copy() -> None:
    x = torch.randn(2, 12, 5, 7).to(memory_format=torch.channels_last)
    grouped = conv_ops.to_grouped_input(x, 4)
    assert tuple(grouped.shape) == (2, 5, 7, 4, 3) and grouped.data_ptr() == x.data_ptr()
    assert grouped.stride()[-2:] == (3, 1)
    # A batch and spatial slice keeps its channels dense: still a view.
    sliced = x[1:, :, 1:4, ::2]
    assert conv_ops.to_grouped_input(sliced, 4).data_ptr() == sliced.data_ptr()
    for n, h, w, g, c in ((0, 0, 0, 0, 0), (1, 4, 6, 3, 2), (1, 2, 3, 1, 1)):
        assert grouped[n, h, w, g, c] == x[n, g * 3 + c, h, w]
    assert torch.equal(conv_ops.from_grouped_output(grouped), x)


def test_other_inputs_take_one_channels_last_copy() -> None:
    for x in (torch.randn(2, 12, 5, 7), torch.randn(2, 24, 5, 7)[:, ::2],
              torch.randn(1, 8, 3, 4, 5)):  # fmt: skip
        groups = 4
        grouped = conv_ops.to_grouped_input(x, groups)
        assert grouped.data_ptr() != x.data_ptr() and grouped.stride(-1) == 1
        assert grouped.stride(-2) == x.shape[1] // groups
        back = conv_ops.from_grouped_output(grouped)
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        assert torch.equal(back, x) and back.is_contiguous(memory_format=fmt)


def test_weight_memory_order_is_ckfmhas_layout() -> None:
    w = torch.randn(12, 5, 3, 2)  # 4 groups of 3 output channels, 5 input channels each
    grouped = conv_ops.to_grouped_weight(w, 4)
    assert tuple(grouped.shape) == (4, 3, 3, 2, 5) and grouped.is_contiguous()
    for g, k, i, j, c in ((0, 0, 0, 0, 0), (3, 2, 2, 1, 4), (1, 2, 0, 1, 3)):
        assert grouped[g, k, i, j, c] == w[g * 3 + k, c, i, j]
    channels_last = w.to(memory_format=torch.channels_last)
    assert conv_ops.to_grouped_weight(channels_last, 4).data_ptr() == channels_last.data_ptr()
    w3 = torch.randn(8, 2, 3, 1, 2).to(memory_format=torch.channels_last_3d)
    assert conv_ops.to_grouped_weight(w3, 2).data_ptr() == w3.data_ptr()


def test_upstream_gradients_are_made_channels_dense_only_when_needed() -> None:
    dense = torch.randn(2, 5, 7, 4, 3)
    assert conv_ops.channels_dense(dense) is dense
    sliced = torch.randn(3, 5, 9, 4, 3)[1:, :, ::2]
    assert conv_ops.channels_dense(sliced) is sliced
    expanded = torch.ones(()).expand(2, 5, 7, 4, 3)
    assert conv_ops.channels_dense(expanded).is_contiguous()
    nchw = torch.randn(2, 12, 5, 7)
    dy = conv_ops.channels_dense(nchw.movedim(1, -1).unflatten(-1, (4, 3)))
    assert dy.stride()[-2:] == (3, 1)


@pytest.mark.parametrize("case", [c for c in CASES if c.batch * c.in_channels <= 64],
                         ids=lambda c: c.label)  # fmt: skip
def test_grouped_views_and_the_reference_give_torchs_conv_and_gradients(case: Case) -> None:
    """The float64 NumPy reference over the grouped views equals torch's conv: the mapping the
    ops rely on, and the arguments the backward passes (x's spatial extents to bwd_data, w's
    filter to bwd_weight), checked without a GPU."""
    generator = torch.Generator().manual_seed(secrets.randbits(62))
    x = torch.randn(case.x_shape, dtype=torch.float64, generator=generator, requires_grad=True)
    w = torch.randn(case.w_shape, dtype=torch.float64, generator=generator, requires_grad=True)
    y = case.torch_conv(x, w)
    dy = torch.randn(y.shape, dtype=torch.float64, generator=generator)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    strides = per_dim("stride", case.stride, case.dims, 1)
    dilations = per_dim("dilation", case.dilation, case.dims, 1)
    padding = conv_ops.resolve_padding(case.padding, case.filter, strides, dilations)
    geometry = {"stride": strides, "padding": padding, "dilation": dilations}
    x5, w5 = (conv_ops.to_grouped_input(x.detach(), case.groups).numpy(),
              conv_ops.to_grouped_weight(w.detach(), case.groups).numpy())  # fmt: skip
    dy5 = conv_ops.to_grouped_input(dy, case.groups).numpy()

    def ungrouped(array: np.ndarray) -> Any:
        return conv_ops.from_grouped_output(torch.from_numpy(array))

    y5 = reference_conv.conv_fwd(x5, w5, **geometry)
    torch.testing.assert_close(ungrouped(y5), y.detach(), rtol=1e-12, atol=1e-12)
    dx5 = reference_conv.conv_bwd_data(dy5, w5, x5.shape[1:-2], **geometry)
    torch.testing.assert_close(ungrouped(dx5), dx, rtol=1e-12, atol=1e-12)
    dw5 = reference_conv.conv_bwd_weight(x5, dy5, w5.shape[2:-1], **geometry)
    # dw5 [G, K, *filter, C] is torch's [G*K, C, *filter] weight in channels_last order.
    dw_torch = torch.from_numpy(dw5).flatten(0, 1).movedim(-1, 1)
    torch.testing.assert_close(dw_torch, dw, rtol=1e-12, atol=1e-12)


# ---- on the GPU: values against float64 ----


class Inputs:
    """Fresh random CUDA tensors; the seed names the draw in failure messages."""

    def __init__(self) -> None:
        self.seed = secrets.randbits(62)
        self.generator = torch.Generator().manual_seed(self.seed)

    def normal(self, shape: tuple[int, ...], dtype: str, memory_format: Any = None) -> Any:
        t = torch.randn(shape, generator=self.generator, dtype=torch.float32)
        t = t.to("cuda", DTYPES[dtype])
        return t if memory_format is None else t.contiguous(memory_format=memory_format)


def _f64(t: Any) -> Any:
    return t.detach().to("cpu", torch.float64)


def assert_within(got: Any, ref: Any, bound: Any, what: str) -> None:
    got = _f64(got)
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)}, reference {tuple(ref.shape)}"
    assert torch.isfinite(got).all(), f"{what}: not finite"
    error = (got - ref).abs()
    excess = error - bound
    worst = np.unravel_index(int(torch.argmax(excess)), tuple(excess.shape))
    assert excess[worst] <= 0, (
        f"{what}: |got - ref| = {error[worst]:.4g} at {tuple(map(int, worst))} (got "
        f"{got[worst]:.6g}, ref {ref[worst]:.6g}, bound {bound[worst]:.4g}); max error "
        f"{error.max():.4g}"
    )


def check_against_float64(case: Case, leaves: dict[str, Any], y: Any, dy: Any,
                          grads: dict[str, Any], what: str) -> None:  # fmt: skip
    """y and the gradients ``grads`` (by leaf name: x, w, b) of a call over ``leaves`` given the
    upstream gradient dy, against torch's float64 conv and autograd on the CPU."""
    x, w = (_f64(leaves[n]).requires_grad_() for n in ("x", "w"))
    b = _f64(leaves["b"]).requires_grad_() if leaves.get("b") is not None else None
    dy64 = _f64(dy)
    u = UNIT_ROUNDOFF[case.dtype]
    conv = case.torch_conv(x, w)
    ref = conv if b is None else conv + b.view(1, -1, *(1,) * case.dims)
    magnitude = case.torch_conv(x.detach().abs(), w.detach().abs())
    rounding = u * ref.detach().abs() + (0 if b is None else u * conv.detach().abs())
    assert_within(y, ref.detach(), rounding + ACCUMULATION * magnitude, f"{what} y")
    references = dict(zip(("x", "w", "b"), torch.autograd.grad(
        ref, [t for t in (x, w, b) if t is not None], dy64)))  # fmt: skip
    sums = {
        "x": torch.autograd.grad(case.torch_conv(x, w.detach().abs()), x, dy64.abs())[0],
        "w": torch.autograd.grad(case.torch_conv(x.detach().abs(), w), w, dy64.abs())[0],
        "b": dy64.abs().sum(dim=[d for d in range(dy64.dim()) if d != 1]),
    }
    for name, grad in grads.items():
        reference = references[name]
        bound = u * reference.abs() + ACCUMULATION * sums[name]
        assert_within(grad, reference, bound, f"{what} d{name}")


def _gpu_leaves(case: Case, inputs: Inputs) -> dict[str, Any]:
    fmt = case.memory_format if case.channels_last else torch.contiguous_format
    leaves = {"x": inputs.normal(case.x_shape, case.dtype, fmt),
              "w": inputs.normal(case.w_shape, case.dtype)}  # fmt: skip
    if case.bias:
        leaves["b"] = inputs.normal((case.out_channels,), case.dtype)
    return {name: t.requires_grad_() for name, t in leaves.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_forward_and_gradients_match_float64(case: Case) -> None:
    inputs = Inputs()
    leaves = _gpu_leaves(case, inputs)
    y = case.conv(*leaves.values())
    assert y.is_contiguous(memory_format=case.memory_format)
    # The upstream gradient in the other memory format than x: NCHW-contiguous dy takes the
    # backward's copy, channels_last dy is read in place.
    dy_format = torch.contiguous_format if case.channels_last else case.memory_format
    dy = inputs.normal(tuple(y.shape), case.dtype, dy_format)
    grads = dict(zip(leaves, torch.autograd.grad(y, list(leaves.values()), dy)))
    torch.cuda.synchronize()
    for name, grad in grads.items():
        assert grad.shape == leaves[name].shape and grad.dtype == leaves[name].dtype
    check_against_float64(case, leaves, y, dy, grads, f"{case.label} seed {inputs.seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("wanted", ["x", "w"])
def test_one_gradient_alone(wanted: str) -> None:
    case = Case("bf16", 2, 40, 12, 4, (13, 9), (3, 3), 2, 1)
    inputs = Inputs()
    leaves = _gpu_leaves(case, inputs)
    leaves["x" if wanted == "w" else "w"].requires_grad_(False)
    y = case.conv(leaves["x"], leaves["w"])
    dy = inputs.normal(tuple(y.shape), case.dtype)
    (grad,) = torch.autograd.grad(y, leaves[wanted], dy)
    torch.cuda.synchronize()
    check_against_float64(case, leaves, y, dy, {wanted: grad},
                          f"{case.label} d{wanted} alone seed {inputs.seed}")  # fmt: skip


@pytest.mark.gpu
def test_compile_fullgraph_step_matches_float64() -> None:
    case = Case("bf16", 2, 32, 64, 4, (14, 14), (3, 3), 1, 1, bias=True)
    inputs = Inputs()
    leaves = _gpu_leaves(case, inputs)
    compiled = torch.compile(lambda x, w, b: case.conv(x, w, b), fullgraph=True)
    y = compiled(*leaves.values())
    dy = inputs.normal(tuple(y.shape), case.dtype, case.memory_format)
    grads = dict(zip(leaves, torch.autograd.grad(y, list(leaves.values()), dy)))
    torch.cuda.synchronize()
    check_against_float64(case, leaves, y, dy, grads, f"compiled seed {inputs.seed}")


@pytest.mark.gpu
def test_opcheck_on_cuda_tensors() -> None:
    inputs = Inputs()
    x = inputs.normal((2, 9, 11, 4, 8), "fp16").requires_grad_()
    w = inputs.normal((4, 12, 3, 3, 8), "fp16").requires_grad_()
    dy = inputs.normal((2, 5, 11, 4, 12), "fp16")
    geometry = ([2, 1], [1, 1], [1, 1])
    torch.library.opcheck(torch.ops.ckfmha.conv_fwd.default, (x, w, *geometry))
    torch.library.opcheck(torch.ops.ckfmha.conv_bwd_data.default,
                          (dy, w.detach(), [9, 11], *geometry))  # fmt: skip
    torch.library.opcheck(torch.ops.ckfmha.conv_bwd_weight.default,
                          (x.detach(), dy, [3, 3], *geometry))  # fmt: skip
