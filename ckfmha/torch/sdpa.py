"""``ckfmha.torch.sdpa``: the calling convention of ``F.scaled_dot_product_attention``.

    from ckfmha.torch import sdpa
    o = sdpa(q, k, v, is_causal=True)     # was F.scaled_dot_product_attention(q, k, v, ...)

Masks map onto the kernels' features: ``is_causal`` is the top-left causal mask (SDPA's
``tril`` of an L x S matrix), a boolean ``attn_mask`` becomes an additive bias (-inf where it
is False) and a float one is the bias itself, broadcasting as SDPA broadcasts it.
"""

from __future__ import annotations

import math

import torch

import ckfmha
from ckfmha.torch.functional import attention
from ckfmha.torch.masks import additive_bias


def _as_bias(attn_mask: torch.Tensor, q: torch.Tensor, seqlen_k: int) -> torch.Tensor:
    """The additive bias [b or 1, h or 1, L or 1, S] an SDPA mask stands for."""
    if attn_mask.dim() > 4:
        raise ckfmha.InvalidArgumentError(
            f"attn_mask must have at most 4 dims, got shape {tuple(attn_mask.shape)}", 1)
    mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
    if mask.dtype not in (torch.bool, q.dtype):
        raise ckfmha.InvalidArgumentError(
            f"attn_mask must be bool or {q.dtype} like the query, got {mask.dtype}", 1)
    return additive_bias(mask, q.dtype, seqlen_k)


def sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` computed by ckfmha, differentiable.

    query [N, H, L, E] (or [N, L, E]), key [N, H_k, S, E], value [N, H_k, S, E_v]; H_k must
    equal H unless ``enable_gqa`` (then H is a multiple of H_k). ``attn_mask`` is bool (True
    = attend) or an additive mask of query's dtype, broadcastable to [N, H, L, S]; a float
    mask that requires grad gets its gradient. ``dropout_p`` applies whenever it is > 0, as
    in SDPA (modules pass 0 in eval mode). Returns [N, H, L, E_v].

    One difference: a query row that the mask hides from every key gives 0 here where the
    math backend gives NaN. Dtypes, head dims and sizes the kernels lack raise
    ckfmha.UnsupportedError naming what is supported.
    """
    if attn_mask is not None and is_causal:
        raise ckfmha.InvalidArgumentError("pass attn_mask or is_causal, not both (as in SDPA)", 1)
    squeeze = query.dim() == 3
    if squeeze:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    if not query.dim() == key.dim() == value.dim() == 4:
        raise ckfmha.InvalidArgumentError(
            f"query, key and value must be 3-D or 4-D [N, H, L, E], got shapes "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}", 1)
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads and not enable_gqa:
        raise ckfmha.InvalidArgumentError(
            f"query has {heads} heads and key {kv_heads}: pass enable_gqa=True for grouped "
            "query attention", 1)  # fmt: skip
    bias = None if attn_mask is None else _as_bias(attn_mask, query, key.shape[2])
    o = attention(
        query, key, value, causal=is_causal, bias=bias, dropout_p=dropout_p,
        scale=1.0 / math.sqrt(query.shape[-1]) if scale is None else scale,
    )  # fmt: skip
    return o.squeeze(1) if squeeze else o
