"""Grouped convolution as torch.library custom ops with autograd, and ``conv2d``/``conv3d``
with the calling convention of ``torch.nn.functional``.

    import ckfmha.torch
    y = ckfmha.torch.conv2d(x, w, padding=1, groups=32)   # x [N, G*C, H, W], w [G*K, C, 3, 3]
    y.sum().backward()                                     # dx and dw from ckfmha's backward

The ops ``torch.ops.ckfmha.conv_fwd`` / ``conv_bwd_data`` / ``conv_bwd_weight`` take ckfmha's
layouts: x [N, *spatial, G, C], w [G, K, *filter, C], y [N, *output, G, K]. Their outputs are
freshly allocated and contiguous in those shapes, which the fake implementations state
exactly, so torch.compile and export trace them (AOTAutograd traces the backward ops too).
``conv2d`` and ``conv3d`` see torch's [N, G*C, *spatial] tensors as those layouts: a
channels_last tensor is the grouped input viewed without a copy, and a channels_last weight's
memory order [G*K, *filter, C] is ckfmha's [G, K, *filter, C].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import ckfmha
from ckfmha.conv_problem import per_dim
from ckfmha.errors import InvalidArgumentError
from ckfmha.reference_conv import output_size

_DTYPES = (torch.float16, torch.bfloat16)
# The memory format whose order is ckfmha's layout, by spatial dim count.
_CHANNELS_LAST = {2: torch.channels_last, 3: torch.channels_last_3d}
_GEOMETRY = "int[] stride, int[] padding, int[] dilation"

IntOrTuple = int | Sequence[int]


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)


def _output_extents(input_size: Sequence, filter_size: Sequence, stride: Sequence[int],
                    padding: Sequence[int], dilation: Sequence[int]) -> list:  # fmt: skip
    """Output extent per spatial dim (SymInts while tracing with dynamic shapes); a filter
    that does not fit the padded input is refused here rather than as a negative size."""
    extents = [output_size(*dim) for dim in zip(input_size, filter_size, stride, padding,
                                                dilation)]  # fmt: skip
    if any(extent < 1 for extent in extents):
        raise _invalid(
            f"the filter {tuple(filter_size)} with dilation {tuple(dilation)} does not fit the "
            f"input {tuple(input_size)} padded by {tuple(padding)} (output size "
            f"{tuple(extents)}): pad more, or use a smaller filter or dilation")
    return extents


def _check_grouped(x: torch.Tensor, w: torch.Tensor) -> None:
    """x [N, *spatial, G, C] and w [G, K, *filter, C] agree on rank, groups and channels."""
    if x.dim() not in (5, 6) or w.dim() != x.dim():
        raise _invalid(f"x {tuple(x.shape)} and w {tuple(w.shape)}: [N, *spatial, G, C] and "
                       "[G, K, *filter, C] with 2 or 3 spatial dims")  # fmt: skip
    if w.shape[0] != x.shape[-2] or w.shape[-1] != x.shape[-1]:
        raise _invalid(f"w {tuple(w.shape)} does not match x {tuple(x.shape)}: w is "
                       "[G, K, *filter, C] with x's G and C")  # fmt: skip


def channels_dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` [.., G, K] with each position's groups and channels dense, as the kernels read
    dy: upstream gradients may come with any strides (expanded zeros, NCHW-contiguous)."""
    groups, channels = t.shape[-2], t.shape[-1]
    if (channels > 1 and t.stride(-1) != 1) or (groups > 1 and t.stride(-2) != channels):
        return t.contiguous()
    return t


def _refuse_host_tensors(op: str) -> None:
    """A CPU kernel for ``op`` that says what it needs, instead of torch's generic 'could not
    run with arguments from the CPU backend'."""

    def refuse(*args: object, **kwargs: object) -> torch.Tensor:
        raise _invalid(f"torch.ops.{op.replace('::', '.')} runs on CUDA tensors; got CPU "
                       "tensors (move them with .cuda(), or use ckfmha.reference_conv for a "
                       "CPU result)")  # fmt: skip

    torch.library.impl(op, "CPU")(refuse)


# ---- the ops, over ckfmha's layouts ----
# Each CUDA implementation allocates its output itself with new_empty, the fake
# implementation's call, so the two agree on strides by construction.

torch.library.define("ckfmha::conv_fwd", f"(Tensor x, Tensor w, {_GEOMETRY}) -> Tensor")
torch.library.define(
    "ckfmha::conv_bwd_data",
    f"(Tensor dy, Tensor w, SymInt[] input_size, {_GEOMETRY}) -> Tensor",
)
torch.library.define(
    "ckfmha::conv_bwd_weight",
    f"(Tensor x, Tensor dy, SymInt[] filter_size, {_GEOMETRY}) -> Tensor",
)


def _y_shape(x: torch.Tensor, w: torch.Tensor, stride: Sequence[int], padding: Sequence[int],
             dilation: Sequence[int]) -> tuple:  # fmt: skip
    dims = x.dim() - 3
    output = _output_extents(x.shape[1:1 + dims], w.shape[2:2 + dims], stride, padding,
                             dilation)  # fmt: skip
    return (x.shape[0], *output, w.shape[0], w.shape[1])


@torch.library.register_fake("ckfmha::conv_fwd")
def _conv_fwd_fake(x: torch.Tensor, w: torch.Tensor, stride: list[int], padding: list[int],
                   dilation: list[int]) -> torch.Tensor:  # fmt: skip
    _check_grouped(x, w)
    return x.new_empty(_y_shape(x, w, stride, padding, dilation))


@torch.library.impl("ckfmha::conv_fwd", "CUDA")
def _conv_fwd_cuda(x: torch.Tensor, w: torch.Tensor, stride: list[int], padding: list[int],
                   dilation: list[int]) -> torch.Tensor:  # fmt: skip
    _check_grouped(x, w)
    y = x.new_empty(_y_shape(x, w, stride, padding, dilation))
    ckfmha.conv_fwd(x, w, stride=stride, padding=padding, dilation=dilation, out=y)
    return y


@torch.library.register_fake("ckfmha::conv_bwd_data")
def _conv_bwd_data_fake(dy: torch.Tensor, w: torch.Tensor, input_size: list[int],
                        stride: list[int], padding: list[int],
                        dilation: list[int]) -> torch.Tensor:  # fmt: skip
    return dy.new_empty((dy.shape[0], *input_size, w.shape[0], w.shape[-1]))


@torch.library.impl("ckfmha::conv_bwd_data", "CUDA")
def _conv_bwd_data_cuda(dy: torch.Tensor, w: torch.Tensor, input_size: list[int],
                        stride: list[int], padding: list[int],
                        dilation: list[int]) -> torch.Tensor:  # fmt: skip
    dx = dy.new_empty((dy.shape[0], *input_size, w.shape[0], w.shape[-1]))
    ckfmha.conv_bwd_data(dy, w, input_size=tuple(input_size), stride=stride, padding=padding,
                         dilation=dilation, out=dx)  # fmt: skip
    return dx


@torch.library.register_fake("ckfmha::conv_bwd_weight")
def _conv_bwd_weight_fake(x: torch.Tensor, dy: torch.Tensor, filter_size: list[int],
                          stride: list[int], padding: list[int],
                          dilation: list[int]) -> torch.Tensor:  # fmt: skip
    return x.new_empty((x.shape[-2], dy.shape[-1], *filter_size, x.shape[-1]))


@torch.library.impl("ckfmha::conv_bwd_weight", "CUDA")
def _conv_bwd_weight_cuda(x: torch.Tensor, dy: torch.Tensor, filter_size: list[int],
                          stride: list[int], padding: list[int],
                          dilation: list[int]) -> torch.Tensor:  # fmt: skip
    dw = x.new_empty((x.shape[-2], dy.shape[-1], *filter_size, x.shape[-1]))
    # An empty batch gives zeros: ckfmha writes them.
    ckfmha.conv_bwd_weight(x, dy, filter_size=tuple(filter_size), stride=stride,
                           padding=padding, dilation=dilation, out=dw)  # fmt: skip
    return dw


for _op in ("ckfmha::conv_fwd", "ckfmha::conv_bwd_data", "ckfmha::conv_bwd_weight"):
    _refuse_host_tensors(_op)


# ---- autograd: dx = conv_bwd_data(dy, w), dw = conv_bwd_weight(x, dy) ----


def _setup_conv_fwd(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, w, stride, padding, dilation = inputs
    ctx.geometry = (stride, padding, dilation)
    ctx.input_size, ctx.filter_size = list(x.shape[1:-2]), list(w.shape[2:-1])
    # Each gradient reads the other operand only: keep x alive for dw, w for dx.
    want_dx, want_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    ctx.save_for_backward(x if want_dw else None, w if want_dx else None)


def _backward_conv_fwd(ctx: Any, grad_y: torch.Tensor) -> tuple:
    x, w = ctx.saved_tensors
    dy = channels_dense(grad_y)
    dx = dw = None
    if ctx.needs_input_grad[0]:
        dx = torch.ops.ckfmha.conv_bwd_data(dy, w, ctx.input_size, *ctx.geometry)
    if ctx.needs_input_grad[1]:
        dw = torch.ops.ckfmha.conv_bwd_weight(x, dy, ctx.filter_size, *ctx.geometry)
    return dx, dw, None, None, None


torch.library.register_autograd("ckfmha::conv_fwd", _backward_conv_fwd,
                                setup_context=_setup_conv_fwd)  # fmt: skip


# ---- torch's layouts <-> ckfmha's ----


def to_grouped_input(x: torch.Tensor, groups: int) -> torch.Tensor:
    """x [N, G*C, *spatial] as ckfmha's [N, *spatial, G, C]: a view when its channels are
    dense (channels_last, or a batch or spatial slice of it), else a view of one channels_last
    copy. ``clone(memory_format=...)`` makes the copy as ``contiguous(memory_format=...)``
    would, and also traces over fake CUDA tensors in a torch built without CUDA."""
    if x.shape[1] > 1 and x.stride(1) != 1:
        x = x.clone(memory_format=_CHANNELS_LAST[x.dim() - 2])
    return x.movedim(1, -1).unflatten(-1, (groups, x.shape[1] // groups))


def to_grouped_weight(w: torch.Tensor, groups: int) -> torch.Tensor:
    """w [G*K, C, *filter] as ckfmha's dense [G, K, *filter, C]: a view of a channels_last
    weight, else of one channels_last copy."""
    ordered = w.movedim(1, -1)
    if not ordered.is_contiguous():
        ordered = w.clone(memory_format=_CHANNELS_LAST[w.dim() - 2]).movedim(1, -1)
    return ordered.unflatten(0, (groups, w.shape[0] // groups))


def from_grouped_output(y: torch.Tensor) -> torch.Tensor:
    """ckfmha's y [N, *output, G, K] as torch's [N, G*K, *output], a view: a dense y is a
    channels_last (channels_last_3d) tensor."""
    return y.flatten(-2).movedim(-1, 1)


# ---- conv2d / conv3d ----


def _check_tensors(name: str, dims: int, input: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor | None, groups: int) -> None:  # fmt: skip
    """Everything the call can refuse from shapes, dtypes and devices, before any copy."""
    spatial, taps = ("D, H, W", "kD, kH, kW") if dims == 3 else ("H, W", "kH, kW")
    if not isinstance(input, torch.Tensor) or input.dim() != dims + 2:
        shape = tuple(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__
        raise _invalid(f"{name} takes input [N, C_in, {spatial}] ({dims + 2} dims), got {shape}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != dims + 2:
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise _invalid(f"{name} takes weight [C_out, C_in / groups, {taps}] ({dims + 2} dims), "
                       f"got {shape}")
    tensors = {"input": input, "weight": weight}
    if bias is not None:
        tensors["bias"] = bias
    for arg, t in tensors.items():
        if t.dtype not in _DTYPES:
            raise _invalid(f"{name}: {arg} is {t.dtype}; supported: torch.float16 and "
                           "torch.bfloat16 (fp32 accumulation)")  # fmt: skip
        # Meta tensors propagate shapes (nothing runs); a real tensor must be on CUDA.
        if t.device.type not in ("cuda", "meta"):
            raise _invalid(f"{name} runs on CUDA tensors; got {arg} on {t.device} (move the "
                           "tensors with .cuda(), or use torch.nn.functional on the CPU)")
    if any(t.dtype != input.dtype or t.device != input.device for t in tensors.values()):
        given = ", ".join(f"{arg} {t.dtype} on {t.device}" for arg, t in tensors.items())
        raise _invalid(f"{name}: input, weight and bias share one dtype and device; got {given}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise _invalid(f"{name}: groups is {groups!r}; accepted: an integer >= 1")
    in_channels, out_channels = input.shape[1], weight.shape[0]
    if in_channels % groups or out_channels % groups:
        raise _invalid(f"{name}: groups={groups} must divide the input channels "
                       f"({in_channels}) and the output channels ({out_channels})")
    if weight.shape[1] != in_channels // groups:
        raise _invalid(f"{name}: weight {tuple(weight.shape)} is [C_out, C_in / groups, ...]: "
                       f"expected {in_channels // groups} channels per group for input "
                       f"{tuple(input.shape)} and groups={groups}, got {weight.shape[1]}")
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise _invalid(f"{name}: bias has shape {tuple(bias.shape)}; expected ({out_channels},),"
                       " one value per output channel")


def resolve_padding(padding: IntOrTuple | str, filter_size: Sequence[int],
                    stride: Sequence[int], dilation: Sequence[int]) -> tuple[int, ...]:  # fmt: skip
    """Zero padding per spatial dim. ckfmha pads both sides of a dim equally, so 'same' needs
    stride 1 and an even dilation * (filter - 1) in every dim (odd filters)."""
    dims = len(filter_size)
    if not isinstance(padding, str):
        return per_dim("padding", padding, dims, 0)
    if padding == "valid":
        return (0,) * dims
    if padding != "same":
        raise _invalid(f"padding={padding!r}; supported: an integer, one per spatial dim, "
                       "'valid' or 'same'")  # fmt: skip
    spans = [d * (f - 1) for f, d in zip(filter_size, dilation)]
    if any(s != 1 for s in stride) or any(span % 2 for span in spans):
        raise _invalid(
            f"padding='same' with filter {tuple(filter_size)}, stride {tuple(stride)} and "
            f"dilation {tuple(dilation)}: supported with stride 1 and dilation * (filter - 1) "
            "even in every dim, as ckfmha pads both sides equally; pad the input with "
            "torch.nn.functional.pad and pass padding=0 otherwise")
    return tuple(span // 2 for span in spans)


def _conv(name: str, dims: int, input: torch.Tensor, weight: torch.Tensor,
          bias: torch.Tensor | None, stride: IntOrTuple, padding: IntOrTuple | str,
          dilation: IntOrTuple, groups: int) -> torch.Tensor:  # fmt: skip
    _check_tensors(name, dims, input, weight, bias, groups)
    filter_size = tuple(weight.shape[2:])
    strides = per_dim("stride", stride, dims, 1)
    dilations = per_dim("dilation", dilation, dims, 1)
    paddings = resolve_padding(padding, filter_size, strides, dilations)
    _output_extents(input.shape[2:], filter_size, strides, paddings, dilations)
    y = torch.ops.ckfmha.conv_fwd(to_grouped_input(input, groups),
                                  to_grouped_weight(weight, groups), list(strides),
                                  list(paddings), list(dilations))  # fmt: skip
    y = from_grouped_output(y)
    return y if bias is None else y + bias.view(1, -1, *(1,) * dims)


def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           stride: IntOrTuple = 1, padding: IntOrTuple | str = 0, dilation: IntOrTuple = 1,
           groups: int = 1) -> torch.Tensor:  # fmt: skip
    """``torch.nn.functional.conv2d`` on ckfmha's kernels: input [N, C_in, H, W], weight
    [C_out, C_in / groups, kH, kW], returns [N, C_out, OH, OW] in channels_last memory format.

    fp16 or bf16 CUDA tensors, fp32 accumulation. A channels_last input and weight are read
    in place; others are copied to channels_last once. ``stride``, ``padding`` and
    ``dilation`` are an int or one per dim; ``padding`` may be 'valid', or 'same' with stride
    1 and odd filters (ckfmha pads both sides equally). ``bias`` [C_out] is not fused: torch
    adds it to the kernel's output (one more elementwise pass), and its gradient flows
    through torch. Gradients reach input and weight through ``torch.ops.ckfmha.conv_bwd_data``
    and ``conv_bwd_weight``, only those asked for. Raises InvalidArgumentError (a ValueError)
    naming the problem before any copy or launch.
    """
    return _conv("conv2d", 2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           stride: IntOrTuple = 1, padding: IntOrTuple | str = 0, dilation: IntOrTuple = 1,
           groups: int = 1) -> torch.Tensor:  # fmt: skip
    """``torch.nn.functional.conv3d`` on ckfmha's kernels: input [N, C_in, D, H, W], weight
    [C_out, C_in / groups, kD, kH, kW], returns [N, C_out, OD, OH, OW] in channels_last_3d
    memory format; everything else as in ``conv2d``."""
    return _conv("conv3d", 3, input, weight, bias, stride, padding, dilation, groups)
