"""Differentiable attention and cache operations over torch tensors.

    import ckfmha.torch
    o = ckfmha.torch.attention(q, k, v, causal=True)       # q, k, v require grad
    o.sum().backward()                                      # dq, dk, dv via ckfmha's backward

Each function calls one ``torch.ops.ckfmha`` custom op, so ``torch.compile(fullgraph=True)``
traces it without a graph break and AOTAutograd traces its backward.
"""

from __future__ import annotations

from typing import Any

import torch

from ckfmha import _dtypes
from ckfmha.errors import InvalidArgumentError
from ckfmha.fp8_attention import out_dtype_of, q_quant_of
from ckfmha.fp8_kv import KV_QUANT_NONE
from ckfmha.torch import attention_ops, autograd, cache_ops, eager  # noqa: F401  (the ops)
from ckfmha.torch.autograd import FP8_KV_HAS_NO_BACKWARD, is_fp8_kv

# A scale: a number, or a device fp32 tensor of 1 or nhead_k values (nhead_q for q_scale), or,
# with fp8 queries, of one value per 128-token block of each head (3-D: per-block scales).
Scale = float | torch.Tensor | None


def _records_gradient(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd would record this call: the gradient Function is applied only then
    (its apply costs host time even when nothing needs a gradient)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _window(window: tuple[int, int] | None) -> list[int] | None:
    return None if window is None else [int(window[0]), int(window[1])]


def _fp32(t: torch.Tensor | None) -> torch.Tensor | None:
    """Sinks and ALiBi slopes are fp32 for the kernels; the cast is differentiable, so a
    bf16 sink parameter gets its gradient in bf16."""
    return None if t is None else t.to(torch.float32).contiguous()


def _scale_args(k_scale: Scale, v_scale: Scale) -> tuple[Any, Any, Any, Any]:
    """(k_scale, v_scale, k_scale_value, v_scale_value) as the ops take them: tensors apart
    from numbers."""
    tensors = [s if isinstance(s, torch.Tensor) else None for s in (k_scale, v_scale)]
    values = [None if s is None or isinstance(s, torch.Tensor) else float(s)
              for s in (k_scale, v_scale)]  # fmt: skip
    return tensors[0], tensors[1], values[0], values[1]


FP8_QUERIES_HAVE_NO_BACKWARD = (
    "fp8 queries (float8_e4m3fn q) are for inference: ckfmha has no backward for them. Run the "
    "call under torch.no_grad() (or detach the inputs), or pass q, k and v in fp16/bf16 to get "
    "gradients"
)


def _is_fp8_query(q: torch.Tensor, q_dtype: str | None) -> bool:
    """Whether q holds e4m3: float8_e4m3fn, or codes declared by q_dtype."""
    if q_dtype is not None and _dtypes.dtype_code(q_dtype) == _dtypes.FP8_E4M3:
        return True
    return q.dtype == getattr(torch, "float8_e4m3fn", None)


def _fp8_query_args(inputs: tuple, q_dtype: str | None, q_scale: Scale, out_dtype: Any,
                    kv_dtype: str | None, k_scale: Scale, v_scale: Scale) -> tuple:  # fmt: skip
    """The fp8 ops' ``Q_QUANT_SCHEMA`` and ``KV_QUANT_SCHEMA`` arguments; refused up front when
    a gradient is wanted of ``inputs`` (the tensors of the call: the ops have no autograd)."""
    if torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (*inputs, q_scale, k_scale,
                                                                  v_scale)
    ):  # fmt: skip
        raise InvalidArgumentError(FP8_QUERIES_HAVE_NO_BACKWARD, 1)
    if isinstance(out_dtype, str):
        out_dtype = {_dtypes.FP16: torch.float16, _dtypes.BF16: torch.bfloat16}.get(
            _dtypes.dtype_code(out_dtype), out_dtype)
    q_tensor = q_scale if isinstance(q_scale, torch.Tensor) else None
    q_value = None if q_scale is None or q_tensor is not None else float(q_scale)
    return (q_dtype, q_tensor, q_value, out_dtype, kv_dtype, *_scale_args(k_scale, v_scale))


def _fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, features: tuple,
                   layout: str, q_dtype: str | None, q_scale: Scale, out_dtype: Any,
                   kv_dtype: str | None, k_scale: Scale,
                   v_scale: Scale) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``attention`` over fp8 queries: the inference op."""
    fp8_args = _fp8_query_args((q, k, v, *features[:3]), q_dtype, q_scale, out_dtype, kv_dtype,
                               k_scale, v_scale)  # fmt: skip
    return torch.ops.ckfmha.fwd_fp8(q, k, v, *features, layout, *fp8_args)


def _refuse_fp8_gradients(k: torch.Tensor, kv_dtype: str | None,
                          inputs: tuple[torch.Tensor | None, ...]) -> None:  # fmt: skip
    """fp8 K/V has no backward: say so at the call rather than at backward()."""
    if not is_fp8_kv(k, kv_dtype) or not torch.is_grad_enabled():
        return
    if any(t is not None and t.requires_grad for t in inputs):
        raise InvalidArgumentError(FP8_KV_HAS_NO_BACKWARD, 1)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
    bias: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sink: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: int | None = None,
    layout: str = "bhsd",
    deterministic: bool = False,
    return_lse: bool = False,
    kv_dtype: str | None = None,
    k_scale: Scale = None,
    v_scale: Scale = None,
    q_dtype: str | None = None,
    q_scale: Scale = None,
    out_dtype: torch.dtype | str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Differentiable ``ckfmha.fwd``: arguments as there.

    Gradients reach q, k, v (GQA/MQA: summed over the query heads that share a K/V head), an
    elementwise ``bias`` (which may broadcast over batch, heads or query rows; its gradient is
    summed over those axes) and ``sink`` ([nhead_q], any float dtype). With ``dropout_p`` > 0
    each call draws a fresh Philox seed from torch's CPU generator (so ``torch.manual_seed``
    reproduces it) unless ``dropout_seed`` is given; the backward replays the same stream.
    ``deterministic`` (or ``torch.use_deterministic_algorithms(True)``) makes the backward
    bit-reproducible. ``return_lse`` also returns the fp32 LSE [batch, nhead_q, seqlen_q],
    which takes no gradient.

    fp8 K/V (float8_e4m3fn k and v, or uint8 codes with ``kv_dtype="fp8_e4m3"``; ``k_scale``
    and ``v_scale`` numbers or fp32 tensors of 1 or nhead_k values) as in ``ckfmha.fwd``, for
    inference: with gradients enabled and an input that requires one, InvalidArgumentError.
    fp8 queries (float8_e4m3fn q, or uint8 codes with ``q_dtype="fp8_e4m3"``, over fp8 K/V;
    ``q_scale`` as ``k_scale`` but of 1 or nhead_q values; ``out_dtype`` fp16 or bf16, the
    default) run ``torch.ops.ckfmha.fwd_fp8``, likewise for inference only. Their per-block
    scales pass through as they are: ``q_scale``, ``k_scale`` and ``v_scale`` all 3-D fp32
    tensors [batch, heads, ceil(seqlen / 128)], checked by ``ckfmha.fwd``.
    """
    if _is_fp8_query(q, q_dtype):
        features = (bias, _fp32(alibi_slopes), _fp32(sink), causal, causal_alignment,
                    _window(window), scale, float(softcap), float(dropout_p))  # fmt: skip
        o, lse = _fp8_attention(q, k, v, features, layout, q_dtype, q_scale, out_dtype,
                                kv_dtype, k_scale, v_scale)  # fmt: skip
        return (o, lse) if return_lse else o
    if q_scale is not None or out_dtype is not None:
        # The differentiable op has no place for them: refused (or, an out_dtype equal to q's,
        # accepted) as ckfmha.fwd would.
        code = _dtypes.dtype_code(q.dtype)
        q_quant_of(code, code, code, q_scale_given=q_scale is not None)
        out_dtype_of(code, KV_QUANT_NONE, out_dtype)
    _refuse_fp8_gradients(k, kv_dtype, (q, k, v, bias, sink))
    inputs = (q, k, v, bias, _fp32(alibi_slopes), _fp32(sink), causal, causal_alignment,
              _window(window), scale, float(softcap), float(dropout_p), dropout_seed, layout,
              deterministic, kv_dtype, *_scale_args(k_scale, v_scale))  # fmt: skip
    o, lse, _ = _apply(autograd.AttentionEager, autograd.Attention, attention_ops.run_fwd,
                       torch.ops.ckfmha.fwd, inputs, 3, alibi_slopes)  # fmt: skip
    return (o, lse) if return_lse else o


def _apply(eager_function: Any, function: Any, run: Any, op: Any, inputs: tuple,
           bias_at: int, alibi_slopes: torch.Tensor | None) -> tuple:  # fmt: skip
    """Run a forward op over ``inputs`` (schema order; the bias at ``bias_at``, the sink two
    after it): through its gradient Function when autograd records the call, and by the eager
    route (``eager.untraced``) when nothing traces it. Returns (o, lse, rng_state or None)."""
    q, k, v = inputs[:3]
    bias, sink = inputs[bias_at], inputs[bias_at + 2]
    records = _records_gradient(q, k, v, bias, sink)
    if eager.untraced(q, k, v, bias, sink, alibi_slopes):
        if records:
            return (*eager_function.apply(q, k, v, bias, sink, inputs), None)
        return run(*inputs)
    return function.apply(*inputs) if records else op(*inputs)


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
    bias: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    sink: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: int | None = None,
    deterministic: bool = False,
    return_lse: bool = False,
    q_dtype: str | None = None,
    q_scale: Scale = None,
    out_dtype: torch.dtype | str | None = None,
    kv_dtype: str | None = None,
    k_scale: Scale = None,
    v_scale: Scale = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Differentiable ``ckfmha.fwd_varlen`` over packed sequences (q [total_q, nhead_q, d],
    int32 ``cu_seqlens`` tensors); features and gradients as in ``attention``, the bias
    [batch, nhead_q, max_seqlen_q, max_seqlen_k] (or broadcasting). ``return_lse`` adds the
    LSE [nhead_q, total_q].

    fp8 queries (float8_e4m3fn q, or uint8 codes with ``q_dtype="fp8_e4m3"``, over fp8 K/V)
    with ``q_scale``, ``k_scale``, ``v_scale`` and ``out_dtype`` as in ``attention`` (per-block
    scales [sequences, heads, ceil(max_seqlen / 128)]) run ``torch.ops.ckfmha.fwd_varlen_fp8``,
    for inference only. The fp8 arguments are for fp8 queries only here."""
    if _is_fp8_query(q, q_dtype):
        features = (bias, _fp32(alibi_slopes), _fp32(sink), causal, causal_alignment,
                    _window(window), scale, float(softcap), float(dropout_p))  # fmt: skip
        fp8_args = _fp8_query_args((q, k, v, *features[:3]), q_dtype, q_scale, out_dtype,
                                   kv_dtype, k_scale, v_scale)  # fmt: skip
        o, lse = torch.ops.ckfmha.fwd_varlen_fp8(
            q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), *features,
            *fp8_args,
        )  # fmt: skip
        return (o, lse) if return_lse else o
    given = {"q_scale": q_scale, "out_dtype": out_dtype, "kv_dtype": kv_dtype,
             "k_scale": k_scale, "v_scale": v_scale}  # fmt: skip
    if any(value is not None for value in given.values()):
        named = ", ".join(name for name, value in given.items() if value is not None)
        raise InvalidArgumentError(
            f"{named} given, but q is {q.dtype}: attention_varlen takes fp8 arguments with fp8 "
            "queries only (float8_e4m3fn q, or uint8 codes with q_dtype='fp8_e4m3')", 1)
    inputs = (q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), bias,
              _fp32(alibi_slopes), _fp32(sink), causal, causal_alignment, _window(window),
              scale, float(softcap), float(dropout_p), dropout_seed, deterministic)  # fmt: skip
    o, lse, _ = _apply(autograd.AttentionVarlenEager, autograd.AttentionVarlen,
                       attention_ops.run_fwd_varlen, torch.ops.ckfmha.fwd_varlen, inputs, 7,
                       alibi_slopes)  # fmt: skip
    return (o, lse) if return_lse else o


def fwd_paged(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    block_table: torch.Tensor | None = None,
    seqlens_k: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
    kv_indptr: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
    return_lse: bool = False,
    layout: str = "bhsd",
    page_layout: str = "linear",
    num_splits: int = 0,
    kv_dtype: str | None = None,
    k_scale: Scale = None,
    v_scale: Scale = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``ckfmha.fwd_paged`` as a custom op (inference: no gradient); metadata as int32
    tensors. Pass ``max_seqlen_k`` with device metadata so the call reads nothing back. fp8
    caches (``kv_dtype``, ``k_scale``, ``v_scale``) as in ``ckfmha.fwd_paged``."""
    o, lse = torch.ops.ckfmha.fwd_paged(
        q, k_cache, v_cache, block_table, seqlens_k, kv_indices, kv_indptr, cu_seqlens_q,
        max_seqlen_q, max_seqlen_k, causal, causal_alignment, _window(window), scale,
        float(softcap), layout, page_layout, int(num_splits), kv_dtype,
        *_scale_args(k_scale, v_scale),
    )  # fmt: skip
    return (o, lse) if return_lse else o


def append_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    rotary_interleaved: bool = False,
    q: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    cache_layout: str = "bshd",
    page_layout: str = "linear",
    kv_dtype: str | None = None,
    k_scale: Scale = None,
    v_scale: Scale = None,
) -> torch.Tensor | None:
    """``ckfmha.append_kv`` as a custom op that writes the caches in place; returns the
    rotated q (a new tensor) when ``q`` is given, else None. fp8 caches (``kv_dtype``,
    ``k_scale``, ``v_scale``) as in ``ckfmha.append_kv``."""
    rotated = torch.ops.ckfmha.append_kv(
        k_cache, v_cache, k_new, v_new, cache_seqlens, cos, sin, rotary_interleaved, q,
        block_table, cache_layout, page_layout, kv_dtype, *_scale_args(k_scale, v_scale),
    )  # fmt: skip
    return rotated if q is not None else None
