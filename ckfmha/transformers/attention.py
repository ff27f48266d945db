"""The attention function registered with transformers: one transformers attention call
mapped onto ``ckfmha.torch.attention`` options and run."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

import ckfmha
import ckfmha.torch
from ckfmha.torch.masks import keys_contiguous
from ckfmha.transformers.masks import (
    _ALL_KEYS,
    _layer_visibility,
    _mask_plan,
)
from ckfmha.transformers.routing import _record_attention_reached


@dataclass(frozen=True, eq=False)
class KernelOptions:
    """The keyword arguments of ``ckfmha.torch.attention`` for one transformers call."""

    causal: bool = False
    causal_alignment: str = "top_left"
    window: tuple[int, int] | None = None
    scale: float | None = None
    softcap: float = 0.0
    bias: torch.Tensor | None = None
    sink: torch.Tensor | None = None
    dropout_p: float = 0.0

    def as_kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def kernel_options(
    attention_mask: torch.Tensor | None,
    *,
    seqlen_q: int,
    seqlen_k: int,
    dtype: torch.dtype,
    is_causal: bool = True,
    scaling: float | None = None,
    dropout_p: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sink: torch.Tensor | None = None,
    position_bias: torch.Tensor | None = None,
) -> KernelOptions:
    """Map one transformers attention call onto ``ckfmha.torch.attention`` options.

    ``attention_mask`` is what the model passes: None (the layer's own pattern, queries
    aligned with the last keys), or a 4-D bool (True = attend) or additive float mask
    [batch or 1, heads or 1, seqlen_q, seqlen_k]. ``dtype`` is the queries' dtype (a bias
    is made in it)."""
    native = _layer_visibility(is_causal, sliding_window, seqlen_q, seqlen_k, "bottom_right")
    visibility, bias = native, None
    if attention_mask is not None:
        if attention_mask.dim() != 4 or tuple(attention_mask.shape[-2:]) != (seqlen_q, seqlen_k):
            raise ValueError(
                f"attention mask of shape {tuple(attention_mask.shape)} does not cover "
                f"[batch, heads, {seqlen_q}, {seqlen_k}] queries x keys"
            )
        candidates = [native]
        if is_causal and seqlen_q != seqlen_k:
            # A static cache's prefill: rows see keys from the first slot, later slots empty.
            candidates.append(
                _layer_visibility(is_causal, sliding_window, seqlen_q, seqlen_k, "top_left")
            )
        if native != _ALL_KEYS:
            candidates.append(_ALL_KEYS)
        visibility, bias = _mask_plan(attention_mask, candidates, seqlen_q, seqlen_k, dtype)
    if position_bias is not None:
        position_bias = position_bias.to(dtype)
        bias = keys_contiguous(position_bias if bias is None else bias + position_bias)
    return KernelOptions(
        causal=visibility.causal,
        causal_alignment=visibility.causal_alignment,
        window=visibility.window,
        scale=scaling,
        softcap=float(softcap or 0.0),
        bias=bias,
        sink=sink,
        dropout_p=float(dropout_p),
    )


def ckfmha_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    is_causal: bool | None = None,
    position_bias: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function convention: query [batch, heads_q, seq_q, head_dim],
    key/value [batch, heads_kv, seq_k, head_dim] -> ([batch, seq_q, heads_q, head_dim_v]
    contiguous, None). See the ``ckfmha.transformers`` docstring for what maps to what."""
    layer = type(module).__name__
    if kwargs.get("output_attentions"):
        raise ckfmha.UnsupportedError(
            f"{layer}: ckfmha attention does not return attention weights "
            "(output_attentions=True); use attn_implementation='eager' for them"
        )
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise ckfmha.UnsupportedError(
            f"{layer}: ckfmha attention takes tensor masks, not {type(attention_mask).__name__}"
        )
    _record_attention_reached(getattr(module, "config", None))
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    options = kernel_options(
        attention_mask,
        seqlen_q=query.shape[2],
        seqlen_k=key.shape[2],
        dtype=query.dtype,
        is_causal=causal,
        scaling=scaling,
        dropout_p=dropout if module.training else 0.0,
        sliding_window=sliding_window,
        softcap=softcap,
        sink=s_aux,
        position_bias=position_bias,
    )
    # The [b, h, s, d] tensors transformers passes are usually views of [b, s, h, d] memory,
    # and [b, s, h, d] is the output it wants: run in that layout, no copies either way.
    try:
        out = ckfmha.torch.attention(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
            layout="bshd", **options.as_kwargs(),
        )  # fmt: skip
    except ckfmha.UnsupportedError as err:
        raise ckfmha.UnsupportedError(
            f"{layer} (head_dim {query.shape[-1]}, {query.dtype}): {err}; "
            "use attn_implementation='sdpa' for this model"
        ) from err
    return out.contiguous(), None
