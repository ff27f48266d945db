"""Autograd for the forward ops: their backward is the matching backward op.

Registered with torch.library.register_autograd, so the gradient is traced by torch.compile
(AOTAutograd sees ``ckfmha.bwd`` as one more op) and eager autograd alike, for callers of the
ops themselves; ``ckfmha.torch.attention`` and ``attention_varlen`` apply the same gradients
through the ``Attention`` and ``AttentionVarlen`` Functions, which cost less host time, and
in plain eager code through ``AttentionEager`` and ``AttentionVarlenEager``, which call the
ops' implementations without the dispatcher (``ckfmha.torch.eager``). Gradients flow to
q, k, v, an elementwise bias (summed over the axes it broadcasts along) and the sinks; the
ALiBi slopes, offsets and scalars get none. The LSE and rng_state outputs are not
differentiable: the backward kernels take no LSE gradient. fp8 K/V (inference only) has no
backward: asking for a gradient through such a call raises InvalidArgumentError.
"""

from __future__ import annotations

from typing import Any

import torch

import ckfmha
from ckfmha import _dtypes
from ckfmha.errors import InvalidArgumentError
from ckfmha.torch import attention_ops, eager

# The forward ops' inputs in schema order: the backward returns one gradient (or None) each.
_FWD_INPUTS = ("q", "k", "v", "bias", "alibi_slopes", "sink", "causal", "causal_alignment",
               "window", "scale", "softcap", "dropout_p", "dropout_seed", "layout",
               "deterministic", "kv_dtype", "k_scale", "v_scale", "k_scale_value",
               "v_scale_value")  # fmt: skip
_VARLEN_INPUTS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                  "max_seqlen_k", "bias", "alibi_slopes", "sink", "causal", "causal_alignment",
                  "window", "scale", "softcap", "dropout_p", "dropout_seed",
                  "deterministic")  # fmt: skip
_OPTIONS = ("causal", "causal_alignment", "window", "scale", "softcap", "dropout_p")


def _bias_grad(dbias: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The kernels write the full [batch, nhead_q, seqlen_q, seqlen_k] gradient; a bias that
    broadcasts along an axis gets the sum over it (in fp32, rounded once)."""
    axes = [d for d in range(4) if bias.shape[d] == 1 and dbias.shape[d] != 1]
    if not axes:
        return dbias
    return dbias.float().sum(dim=axes, keepdim=True).to(bias.dtype)


def _setup(ctx: Any, names: tuple[str, ...], inputs: tuple, output: tuple,
           grad_names: tuple[str, ...] | None) -> dict[str, Any]:  # fmt: skip
    """Save what the backward needs. ``names`` are the op's inputs in schema order;
    ``grad_names`` the arguments the gradients are returned for (None: the same)."""
    args = dict(zip(names, inputs))
    o, lse, rng_state = output
    ctx.mark_non_differentiable(lse, rng_state)
    ctx.save_for_backward(args["q"], args["k"], args["v"], o, lse, rng_state, args["bias"],
                          args["alibi_slopes"], args["sink"])  # fmt: skip
    ctx.options = {name: args[name] for name in _OPTIONS}
    # torch.use_deterministic_algorithms(True) asks for the deterministic backward too.
    ctx.deterministic = (bool(args["deterministic"])
                         or torch.are_deterministic_algorithms_enabled())  # fmt: skip
    ctx.grad_names = names if grad_names is None else grad_names
    ctx.bias_index = ctx.grad_names.index("bias")
    ctx.sink_index = ctx.grad_names.index("sink")
    return args


def _wants(ctx: Any) -> tuple[bool, bool]:
    bias, sink = ctx.saved_tensors[6], ctx.saved_tensors[8]
    want_dbias = bias is not None and ctx.needs_input_grad[ctx.bias_index]
    want_dsink = sink is not None and ctx.needs_input_grad[ctx.sink_index]
    return want_dbias, want_dsink


def _input_grads(ctx: Any, grads: tuple, want_dbias: bool, want_dsink: bool) -> tuple:
    """One gradient (or None) for each of the arguments the forward was applied to."""
    dq, dk, dv, dbias, dsink = grads
    bias, sink = ctx.saved_tensors[6], ctx.saved_tensors[8]
    by_name: dict[str, Any] = {"q": dq, "k": dk, "v": dv}
    if want_dbias:
        by_name["bias"] = _bias_grad(dbias, bias)
    if want_dsink:
        by_name["sink"] = dsink.to(sink.dtype)
    return tuple(by_name.get(name) for name in ctx.grad_names)


FP8_KV_HAS_NO_BACKWARD = (
    "fp8 K/V (float8_e4m3fn k and v) is for inference: ckfmha has no backward for it. Run the "
    "call under torch.no_grad() (or detach q and the other inputs), or pass k and v in q's "
    "dtype to get gradients"
)


def is_fp8_kv(k: torch.Tensor, kv_dtype: str | None) -> bool:
    """Whether k (and so v) holds e4m3: float8_e4m3fn, or codes declared by kv_dtype."""
    if kv_dtype is not None and _dtypes.dtype_code(kv_dtype) == _dtypes.FP8_E4M3:
        return True
    return k.dtype == getattr(torch, "float8_e4m3fn", None)


def _setup_fwd(ctx: Any, inputs: tuple, output: tuple,
               grad_names: tuple[str, ...] | None = None) -> None:  # fmt: skip
    args = _setup(ctx, _FWD_INPUTS, inputs, output, grad_names)
    ctx.layout = args["layout"]
    ctx.fp8_kv = is_fp8_kv(args["k"], args["kv_dtype"])


def _backward_fwd(ctx: Any, grad_o: torch.Tensor, _grad_lse: Any, _grad_rng: Any) -> tuple:
    if ctx.fp8_kv:
        raise InvalidArgumentError(FP8_KV_HAS_NO_BACKWARD, 1)
    q, k, v, o, lse, rng_state, bias, alibi_slopes, sink = ctx.saved_tensors
    want_dbias, want_dsink = _wants(ctx)
    run = attention_ops.run_bwd if eager.untraced(grad_o, q) else torch.ops.ckfmha.bwd
    grads = run(
        grad_o, q, k, v, o, lse, rng_state, bias, alibi_slopes, sink, **ctx.options,
        layout=ctx.layout, deterministic=ctx.deterministic, want_dbias=want_dbias,
        want_dsink=want_dsink,
    )  # fmt: skip
    return _input_grads(ctx, grads, want_dbias, want_dsink)


def _setup_varlen(ctx: Any, inputs: tuple, output: tuple,
                  grad_names: tuple[str, ...] | None = None) -> None:  # fmt: skip
    args = _setup(ctx, _VARLEN_INPUTS, inputs, output, grad_names)
    ctx.offsets = (args["cu_seqlens_q"], args["cu_seqlens_k"])
    ctx.max_seqlens = (args["max_seqlen_q"], args["max_seqlen_k"])


def _backward_varlen(ctx: Any, grad_o: torch.Tensor, _grad_lse: Any, _grad_rng: Any) -> tuple:
    q, k, v, o, lse, rng_state, bias, alibi_slopes, sink = ctx.saved_tensors
    want_dbias, want_dsink = _wants(ctx)
    cu_q, cu_k = ctx.offsets
    run = attention_ops.run_bwd_varlen if eager.untraced(grad_o, q) else \
        torch.ops.ckfmha.bwd_varlen
    grads = run(
        grad_o, q, k, v, o, lse, rng_state, cu_q, cu_k, *ctx.max_seqlens, bias, alibi_slopes,
        sink, **ctx.options, deterministic=ctx.deterministic, want_dbias=want_dbias,
        want_dsink=want_dsink,
    )  # fmt: skip
    return _input_grads(ctx, grads, want_dbias, want_dsink)


torch.library.register_autograd("ckfmha::fwd", _backward_fwd, setup_context=_setup_fwd)
torch.library.register_autograd("ckfmha::fwd_varlen", _backward_varlen,
                                setup_context=_setup_varlen)  # fmt: skip


# The same gradients as a torch.autograd.Function around each op, which is what
# ckfmha.torch.attention / attention_varlen apply. An op's registered autograd refills its
# defaulted schema arguments in Python on every call that records a gradient
# (torch._library.utils.fill_defaults, quadratic in the arity: about 100 us of host time for
# the 20 arguments of ckfmha::fwd); inside a Function's forward grad mode is off, so the op
# takes its no-grad path. The forward takes ctx itself rather than a setup_context, which
# Function.apply would bind to the forward's signature with inspect on every call (about 30
# us). torch.compile traces a Function like the registered autograd; functorch transforms
# (vmap, grad) need the ops themselves.
def _gradient_function(name: str, op: Any, setup: Any, backward: Any) -> type:
    """A Function applying ``op`` (inputs in its schema order) with ``setup`` saving what
    ``backward`` needs."""

    def forward(ctx: Any, *inputs: Any) -> tuple:
        output = op(*inputs)
        setup(ctx, inputs, output)
        return output

    return _function_type(name, f"torch.ops.{op} with its gradient.", forward, backward)


# The eager route's Functions (``eager.untraced`` calls): the op's implementation called
# directly. The Function is applied to the tensors that take a gradient and one tuple of the
# op's inputs in schema order (the same tensors among them): Function.apply's own cost grows
# with its argument count (on a CPU-only probe, 20 arguments cost 14 us where 6 cost 5). The
# backward's ckfmha call is prepared in the forward, on the caller's thread: the autograd
# engine runs the backward on a thread of its own, where the same Python takes about twice as
# long (NOTES entry 106), so the backward only unpacks, calls and reduces.
_EAGER_GRAD_NAMES = ("q", "k", "v", "bias", "sink", "inputs")


def _wanted(ctx: Any, bias: Any, sink: Any) -> tuple[bool, bool]:
    """Whether the eager Function's bias and sink (arguments 3 and 4) want a gradient."""
    return (bias is not None and ctx.needs_input_grad[3],
            sink is not None and ctx.needs_input_grad[4])  # fmt: skip


def _prepare_fwd(ctx: Any, inputs: tuple, rng_state: Any) -> tuple:
    """(ckfmha.bwd, arguments after the LSE, keyword arguments, dbias wanted, dsink wanted)."""
    bias, alibi_slopes, sink = inputs[3:6]
    want_dbias, want_dsink = _wanted(ctx, bias, sink)
    options = attention_ops.bwd_options(rng_state, bias, alibi_slopes, sink,
                                        *ctx.options.values(), ctx.deterministic, want_dbias,
                                        want_dsink)  # fmt: skip
    options["layout"] = ctx.layout
    return ckfmha.bwd, (), options, want_dbias, want_dsink


def _prepare_varlen(ctx: Any, inputs: tuple, rng_state: Any) -> tuple:
    """(ckfmha.bwd_varlen, the offsets, keyword arguments, dbias wanted, dsink wanted)."""
    bias, alibi_slopes, sink = inputs[7:10]
    want_dbias, want_dsink = _wanted(ctx, bias, sink)
    options = attention_ops.bwd_options(rng_state, bias, alibi_slopes, sink,
                                        *ctx.options.values(), ctx.deterministic, want_dbias,
                                        want_dsink)  # fmt: skip
    options["max_seqlen_q"], options["max_seqlen_k"] = ctx.max_seqlens
    return ckfmha.bwd_varlen, ctx.offsets, options, want_dbias, want_dsink


def _eager_function(name: str, run: Any, setup: Any, prepare: Any, backward: Any) -> type:
    """A Function over (q, k, v, bias, sink, inputs) applying ``run`` to ``inputs`` and
    returning (o, lse). rng_state stays on ctx rather than being an output: each output
    costs the autograd engine a gradient slot, and a CPU tensor among them made it hand
    the node between its CPU and CUDA work queues. Gradients are not materialised: the LSE
    never has one, and zeros for it would cost an allocation and a fill per backward. Where
    something traces the backward (compiled autograd), ``backward`` runs it through the op."""

    def forward(ctx: Any, q: Any, k: Any, v: Any, bias: Any, sink: Any, inputs: tuple) -> tuple:
        ctx.set_materialize_grads(False)
        o, lse, rng_state = run(*inputs)
        setup(ctx, inputs, (o, lse, rng_state), _EAGER_GRAD_NAMES)
        ctx.call = prepare(ctx, inputs, rng_state)
        return o, lse

    def eager_backward(ctx: Any, grad_o: Any, grad_lse: Any) -> tuple:
        if grad_o is None:  # only the LSE was used, and it takes no gradient
            return (None,) * len(_EAGER_GRAD_NAMES)
        q, k, v, o, lse, _, bias, _, sink = ctx.saved_tensors
        if not eager.untraced(grad_o, q):
            return backward(ctx, grad_o, grad_lse, None)
        call, extra, options, want_dbias, want_dsink = ctx.call
        grads = call(attention_ops.grad_ready(grad_o), q, k, v, o, lse, *extra, **options)
        dbias = _bias_grad(grads[3], bias) if want_dbias else None
        dsink = grads[3 + want_dbias].to(sink.dtype) if want_dsink else None
        return grads[0], grads[1], grads[2], dbias, dsink, None

    doc = f"attention_ops.{run.__name__} (the eager route) with its gradient."
    return _function_type(name, doc, forward, eager_backward)


def _function_type(name: str, doc: str, forward: Any, backward: Any) -> type:
    return type(name, (torch.autograd.Function,), {
        "__doc__": doc, "__module__": __name__,
        "forward": staticmethod(forward), "backward": staticmethod(backward),
    })  # fmt: skip


Attention = _gradient_function("Attention", torch.ops.ckfmha.fwd, _setup_fwd, _backward_fwd)
AttentionVarlen = _gradient_function("AttentionVarlen", torch.ops.ckfmha.fwd_varlen,
                                     _setup_varlen, _backward_varlen)  # fmt: skip
AttentionEager = _eager_function("AttentionEager", attention_ops.run_fwd, _setup_fwd,
                                 _prepare_fwd, _backward_fwd)  # fmt: skip
AttentionVarlenEager = _eager_function("AttentionVarlenEager", attention_ops.run_fwd_varlen,
                                       _setup_varlen, _prepare_varlen,
                                       _backward_varlen)  # fmt: skip
