"""Differentiable attention and cache operations over torch tensors.

    import ckfmha.torch
    o = ckfmha.torch.attention(q, k, v, causal=True)       # q, k, v require grad
    o.sum().backward()                                      # dq, dk, dv via ckfmha's backward

Each function calls one ``torch.ops.ckfmha`` custom op, so ``torch.compile(fullgraph=True)``
traces it without a graph break and AOTAutograd traces its backward.
"""

from __future__ import annotations

import torch

from ckfmha.torch import attention_ops, autograd, cache_ops  # noqa: F401  (register the ops)


def _window(window: tuple[int, int] | None) -> list[int] | None:
    return None if window is None else [int(window[0]), int(window[1])]


def _fp32(t: torch.Tensor | None) -> torch.Tensor | None:
    """Sinks and ALiBi slopes are fp32 for the kernels; the cast is differentiable, so a
    bf16 sink parameter gets its gradient in bf16."""
    return None if t is None else t.to(torch.float32).contiguous()


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
    """
    o, lse, _ = torch.ops.ckfmha.fwd(
        q, k, v, bias, _fp32(alibi_slopes), _fp32(sink), causal, causal_alignment,
        _window(window), scale, float(softcap), float(dropout_p), dropout_seed, layout,
        deterministic,
    )  # fmt: skip
    return (o, lse) if return_lse else o


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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Differentiable ``ckfmha.fwd_varlen`` over packed sequences (q [total_q, nhead_q, d],
    int32 ``cu_seqlens`` tensors); features and gradients as in ``attention``, the bias
    [batch, nhead_q, max_seqlen_q, max_seqlen_k] (or broadcasting). ``return_lse`` adds the
    LSE [nhead_q, total_q]."""
    o, lse, _ = torch.ops.ckfmha.fwd_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), bias,
        _fp32(alibi_slopes), _fp32(sink), causal, causal_alignment, _window(window), scale,
        float(softcap), float(dropout_p), dropout_seed, deterministic,
    )  # fmt: skip
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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``ckfmha.fwd_paged`` as a custom op (inference: no gradient); metadata as int32
    tensors. Pass ``max_seqlen_k`` with device metadata so the call reads nothing back."""
    o, lse = torch.ops.ckfmha.fwd_paged(
        q, k_cache, v_cache, block_table, seqlens_k, kv_indices, kv_indptr, cu_seqlens_q,
        max_seqlen_q, max_seqlen_k, causal, causal_alignment, _window(window), scale,
        float(softcap), layout, page_layout, int(num_splits),
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
) -> torch.Tensor | None:
    """``ckfmha.append_kv`` as a custom op that writes the caches in place; returns the
    rotated q (a new tensor) when ``q`` is given, else None."""
    rotated = torch.ops.ckfmha.append_kv(
        k_cache, v_cache, k_new, v_new, cache_seqlens, cos, sin, rotary_interleaved, q,
        block_table, cache_layout, page_layout,
    )  # fmt: skip
    return rotated if q is not None else None
