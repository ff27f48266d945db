"""torch.autograd integration: attention whose backward runs ckfmha's backward kernels.

    import ckfmha.torch
    o = ckfmha.torch.attention(q, k, v, causal=True)       # q, k, v require grad
    o.sum().backward()                                      # dq, dk, dv via ckfmha.bwd

Importing this module imports torch; ``import ckfmha`` alone never does.
"""

from __future__ import annotations

from typing import Any

import torch

import ckfmha

__all__ = ["AttentionFunction", "VarlenAttentionFunction", "attention", "attention_varlen"]


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
        options: dict[str, Any],
        deterministic: bool,
    ) -> torch.Tensor:
        # DLPack refuses tensors that require grad; the kernels need only the data.
        q, k, v = q.detach(), k.detach(), v.detach()
        o, lse = ckfmha.fwd(q, k, v, return_lse=True, **options)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = options
        ctx.deterministic = deterministic
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, o, lse = (t.detach() for t in ctx.saved_tensors)
        dq, dk, dv = ckfmha.bwd(
            _grad_ready(do.detach()), q, k, v, o, lse, deterministic=ctx.deterministic, **ctx.options
        )
        return dq, dk, dv, None, None


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
        options: dict[str, Any],
        deterministic: bool,
    ) -> torch.Tensor:
        q, k, v = q.detach(), k.detach(), v.detach()
        o, lse = ckfmha.fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, return_lse=True, **options)
        ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k)
        ctx.options = options
        ctx.deterministic = deterministic
        return o

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, o, lse, cu_q, cu_k = (t.detach() for t in ctx.saved_tensors)
        dq, dk, dv = ckfmha.bwd_varlen(
            _grad_ready(do.detach()), q, k, v, o, lse, cu_q, cu_k, deterministic=ctx.deterministic,
            **ctx.options,
        )  # fmt: skip
        return dq, dk, dv, None, None, None, None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int, int] | None = None,
    scale: float | None = None,
    layout: str = "bhsd",
    deterministic: bool = False,
) -> torch.Tensor:
    """Differentiable ``ckfmha.fwd``: arguments as there, gradients for q, k and v."""
    options = {"causal": causal, "causal_alignment": causal_alignment, "window": window,
               "scale": scale, "layout": layout}  # fmt: skip
    return AttentionFunction.apply(q, k, v, options, deterministic)


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
    deterministic: bool = False,
) -> torch.Tensor:
    """Differentiable ``ckfmha.fwd_varlen``: arguments as there, gradients for q, k and v."""
    options = {"max_seqlen_q": max_seqlen_q, "max_seqlen_k": max_seqlen_k, "causal": causal,
               "causal_alignment": causal_alignment, "window": window, "scale": scale}  # fmt: skip
    return VarlenAttentionFunction.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, options,
                                         deterministic)  # fmt: skip
