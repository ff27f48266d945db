"""Float64 attention written in torch, so autograd gives the reference gradients of every
input (q, k, v, bias, sinks) for the torch-integration GPU tests."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ckfmha.reference import dropout_keep, philox_dropout_randval, window_mask


def keep_mask(seed: int, p: float, batch: int, heads: int, seqlen_q: int, seqlen_k: int,
              device: Any) -> Any:  # fmt: skip
    """The dropout keep mask ckfmha's kernels draw for (seed, offset 0), as a bool tensor."""
    import torch

    randval = philox_dropout_randval(seed, 0, batch, heads, seqlen_q, seqlen_k)
    return torch.from_numpy(dropout_keep(randval, p)).to(device)


def attention_f64(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
    bias: Any = None,
    alibi_slopes: Any = None,
    sink: Any = None,
    dropout_p: float = 0.0,
    keep: Any = None,
) -> Any:
    """softmax(mask(bias + cap(scale q k^T)) [+ sink column]) v in float64, [b, h, s, d]
    layout, GQA by repeating K/V heads; a fully masked row gives 0 (the kernels' convention)."""
    import torch

    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    seqlen_q, seqlen_k = q.shape[2], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.to(torch.float64)
    if alibi_slopes is not None:
        rows = torch.arange(seqlen_q, device=q.device)[:, None]
        cols = torch.arange(seqlen_k, device=q.device)[None, :]
        distance = (rows + seqlen_k - seqlen_q - cols).abs().to(torch.float64)
        scores = scores - alibi_slopes.to(torch.float64)[None, :, None, None] * distance
    if causal or window is not None:
        left, right = (-1, 0) if causal else window
        visible = torch.from_numpy(np.asarray(window_mask(seqlen_q, seqlen_k, left, right,
                                                          causal_alignment))).to(q.device)
        scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        column = sink.to(torch.float64)[None, :, None, None].expand(*scores.shape[:3], 1)
        scores = torch.cat([scores, column], dim=-1)
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - row_max)
    total = weights.sum(dim=-1, keepdim=True)
    probs = weights / torch.where(total > 0, total, torch.ones_like(total))
    if sink is not None:
        probs = probs[..., :-1]
    if keep is not None:
        probs = torch.where(keep, probs / (1.0 - dropout_p), torch.zeros_like(probs))
    return torch.einsum("bhqk,bhkd->bhqd", probs, v)
