"""torch.autograd integration: attention whose backward runs ckfmha's backward kernels.

    import ckfmha.torch
    o = ckfmha.torch.attention(q, k, v, causal=True)       # q, k, v require grad
    o.sum().backward()                                      # dq, dk, dv via ckfmha.bwd

An elementwise ``bias`` that requires grad gets its gradient too (the sm80 backward's
dbias, summed over the axes the bias broadcasts along).

Importing this module imports torch; ``import ckfmha`` alone never does.
"""

from __future__ import annotations

from typing import Any

import torch

import ckfmha

__all__ = ["AttentionFunction", "VarlenAttentionFunction", "attention", "attention_varlen"]


def _bias_grad(dbias: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The kernels write the full [batch, nhead_q, seqlen_q, seqlen_k] gradient; a bias that
    broadcasts along an axis gets the sum over it (in fp32, rounded once)."""
    axes = [d for d in range(4) if bias.shape[d] == 1 and dbias.shape[d] != 1]
    if not axes:
        return dbias
    return dbias.float().sum(dim=axes, keepdim=True).to(bias.dtype)


def _grad_ready(t: torch.Tensor) -> torch.Tensor:
    """Upstream gradients may be views with any strides: the kernels need a contiguous head
    dim and 16-byte aligned rows."""
    if t.stride(-1) != 1 or any(s % 8 for s in t.stride()[:-1]) or t.data_ptr() % 16:
        return t.contiguous()
    return t


class AttentionFunction(torch.autograd.Function):
    """Forward through ``ckfmha.fwd`` (keeping the LSE), backward through ``ckfmha.bwd``."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None,
        options: dict[str, Any],
        deterministic: bool,
    ) -> torch.Tensor:
        # DLPack refuses tensors that require grad; the kernels need only the data.
        q, k, v = q.detach(), k.detach(), v.detach()
        bias = None if bias is None else bias.detach()
        o, lse = ckfmha.fwd(q, k, v, bias=bias, return_lse=True, **options)
        ctx.save_for_backward(q, k, v, o, lse, bias)
        ctx.options = options
        ctx.deterministic = deterministic
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, o, lse, bias = (None if t is None else t.detach() for t in ctx.saved_tensors)
        want_dbias = bias is not None and ctx.needs_input_grad[3]
        grads = ckfmha.bwd(
            _grad_ready(do.detach()), q, k, v, o, lse, bias=bias, return_dbias=want_dbias,
            deterministic=ctx.deterministic, **ctx.options,
        )  # fmt: skip
        dbias = _bias_grad(grads[3], bias) if want_dbias else None
        return grads[0], grads[1], grads[2], dbias, None, None


class VarlenAttentionFunction(torch.autograd.Function):
    """``ckfmha.fwd_varlen`` / ``ckfmha.bwd_varlen`` over packed sequences."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        bias: torch.Tensor | None,
        options: dict[str, Any],
        deterministic: bool,
    ) -> torch.Tensor:
        q, k, v = q.detach(), k.detach(), v.detach()
        bias = None if bias is None else bias.detach()
        o, lse = ckfmha.fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, bias=bias,
                                   return_lse=True, **options)  # fmt: skip
        ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, bias)
        ctx.options = options
        ctx.deterministic = deterministic
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, o, lse, cu_q, cu_k, bias = (
            None if t is None else t.detach() for t in ctx.saved_tensors
        )
        want_dbias = bias is not None and ctx.needs_input_grad[5]
        grads = ckfmha.bwd_varlen(
            _grad_ready(do.detach()), q, k, v, o, lse, cu_q, cu_k, bias=bias,
            return_dbias=want_dbias, deterministic=ctx.deterministic, **ctx.options,
        )  # fmt: skip
        dbias = _bias_grad(grads[3], bias) if want_dbias else None
        return grads[0], grads[1], grads[2], None, None, dbias, None, None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int, int] | None = None,
    scale: float | None = None,
    bias: torch.Tensor | None = None,
    layout: str = "bhsd",
    deterministic: bool = False,
) -> torch.Tensor:
    """Differentiable ``ckfmha.fwd``: arguments as there, gradients for q, k, v and an
    elementwise ``bias`` (which may broadcast over batch, heads or query rows)."""
    options = {"causal": causal, "causal_alignment": causal_alignment, "window": window,
               "scale": scale, "layout": layout}  # fmt: skip
    return AttentionFunction.apply(q, k, v, bias, options, deterministic)


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
    bias: torch.Tensor | None = None,
    deterministic: bool = False,
) -> torch.Tensor:
    """Differentiable ``ckfmha.fwd_varlen``: arguments as there, gradients for q, k, v and an
    elementwise ``bias`` [batch, nhead_q, max_seqlen_q, max_seqlen_k] (or broadcasting)."""
    options = {"max_seqlen_q": max_seqlen_q, "max_seqlen_k": max_seqlen_k, "causal": causal,
               "causal_alignment": causal_alignment, "window": window, "scale": scale}  # fmt: skip
    return VarlenAttentionFunction.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, bias, options,
                                         deterministic)  # fmt: skip
