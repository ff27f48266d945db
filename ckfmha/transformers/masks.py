"""Masks: the patterns the kernels apply without a bias (causal, sliding window, all keys),
how a transformers mask maps onto one of them or onto an additive bias, and the mask
function registered with transformers, which asks for no mask where the pattern suffices."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers.masking_utils import (
    bidirectional_mask_function,
    causal_mask_function,
    eager_mask,
    prepare_padding_mask,
    sdpa_mask,
)
from transformers.utils.import_utils import is_tracing

from ckfmha.torch.masks import additive_bias
from ckfmha.transformers.routing import _attention_routed

# Attribute under which a mask tensor keeps what the attention function learned about it:
# every layer of one kind receives the same mask object, and learning it costs a device sync.
_MASK_MEMO = "_ckfmha_plans"


@dataclass(frozen=True)
class _Visibility:
    """Which keys a query sees, in a form the kernels take without a bias."""

    causal: bool = False
    causal_alignment: str = "bottom_right"
    window: tuple[int, int] | None = None

    def visible_keys(self, seqlen_q: int, seqlen_k: int, device: torch.device) -> torch.Tensor:
        """bool [seqlen_q, seqlen_k]: the keys each query row sees under this pattern."""
        offset = seqlen_k - seqlen_q if self.causal_alignment == "bottom_right" else 0
        rows = torch.arange(seqlen_q, device=device)[:, None] + offset
        cols = torch.arange(seqlen_k, device=device)[None, :]
        left, right = (-1, 0) if self.causal else (self.window or (-1, -1))
        visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
        if left >= 0:
            visible &= cols >= rows - left
        if right >= 0:
            visible &= cols <= rows + right
        return visible


_ALL_KEYS = _Visibility()


def _layer_visibility(
    is_causal: bool, sliding_window: int | None, seqlen_q: int, seqlen_k: int, alignment: str
) -> _Visibility:
    """The pattern a layer has without a mask. transformers' causal sliding window lets
    position p see keys p - W + 1 .. p (masking_utils.sliding_window_overlay: kv_idx > q_idx
    - sliding_window), its bidirectional one keys within distance W (sliding_window_
    bidirectional_overlay: abs(q_idx - kv_idx) <= sliding_window). A window that excludes no
    key is left out, so the plain causal kernels run."""
    if is_causal:
        # Bottom-right, the last query row sees keys seqlen_k - W .. seqlen_k - 1, and the
        # other rows fewer: the window excludes a key only when seqlen_k > W.
        if sliding_window is not None and seqlen_k > sliding_window:
            return _Visibility(window=(sliding_window - 1, 0), causal_alignment=alignment)
        return _Visibility(causal=True, causal_alignment=alignment)
    if sliding_window is not None and seqlen_k - 1 > sliding_window:
        return _Visibility(window=(sliding_window, sliding_window), causal_alignment=alignment)
    return _ALL_KEYS


@dataclass(frozen=True)
class _MaskMatch:
    """What a mask was found to equal: a pattern exactly, a pattern and one set of visible
    keys per sequence (a padded batch: ``keys_seen``, the keys any query row sees), or
    neither; and whether every query row equals the first."""

    exact: _Visibility | None
    padded: _Visibility | None
    keys_seen: torch.Tensor
    rows_equal: bool


def _matching_visibility(
    mask: torch.Tensor, candidates: list[_Visibility], seqlen_q: int, seqlen_k: int
) -> _MaskMatch:
    """Compare the mask with each candidate pattern, alone and restricted to the keys the
    mask lets any query row of its sequence see. A float mask counts as a pattern only if
    each entry is 0 or the most negative value (eager masks, -inf). One device sync."""
    if mask.dtype == torch.bool:
        visible = mask
        pure = torch.ones((), dtype=torch.bool, device=mask.device)
    else:
        visible = mask == 0
        pure = (visible | (mask <= torch.finfo(mask.dtype).min)).all()
    # A key no row sees under the pattern is hidden by the pattern too, so hiding it in the
    # padding as well changes nothing: the union over rows is the padding where one exists.
    keys_seen = visible.any(dim=-2, keepdim=True)
    checks = [pure, (mask == mask[..., :1, :]).all()]
    for candidate in candidates:
        expected = candidate.visible_keys(seqlen_q, seqlen_k, mask.device)
        checks.append((visible == expected).all())
        checks.append((visible == (expected & keys_seen)).all())
    found = torch.stack(checks).tolist()
    is_pure, rows_equal = bool(found[0]), bool(found[1])
    exact = [c for c, hit in zip(candidates, found[2::2], strict=True) if hit]
    padded = [c for c, hit in zip(candidates, found[3::2], strict=True) if hit]
    return _MaskMatch(
        exact=exact[0] if is_pure and exact else None,
        padded=padded[0] if is_pure and padded else None,
        keys_seen=keys_seen,
        rows_equal=rows_equal,
    )


def _mask_plan(
    mask: torch.Tensor, candidates: list[_Visibility], seqlen_q: int, seqlen_k: int,
    dtype: torch.dtype,
) -> tuple[_Visibility, torch.Tensor | None]:  # fmt: skip
    """The pattern and the additive bias (or None) that together apply the mask, in order of
    preference: a pattern the mask equals, with no bias; a pattern with one bias row per
    sequence ([.., 1, seqlen_k], the Hopper kernels read it once a key tile rather than
    once a score) for a padded batch under a causal or window mask, or under none where
    every query row equals the first; else all keys with the whole mask as the bias. A mask
    that takes a gradient keeps its full bias. Remembered on the mask object (keyed by its
    version and the question) so the layers after the first that share it skip the device
    sync. Inference tensors have no version counter (nor are they changed in place between
    a model's layers). While tracing, the mask is used as a bias."""
    if is_tracing(mask):
        return _ALL_KEYS, additive_bias(mask, dtype)
    version = None if mask.is_inference() else mask._version
    key = (version, seqlen_q, seqlen_k, dtype, tuple(candidates))
    memo: dict[Any, Any] = getattr(mask, _MASK_MEMO, None) or {}
    if key not in memo:
        memo[key] = _plan_from_match(
            mask, _matching_visibility(mask, candidates, seqlen_q, seqlen_k), dtype
        )
        setattr(mask, _MASK_MEMO, memo)
    return memo[key]


def _plan_from_match(
    mask: torch.Tensor, match: _MaskMatch, dtype: torch.dtype
) -> tuple[_Visibility, torch.Tensor | None]:
    """The plan of ``_mask_plan`` from what the mask was found to equal. A mask that takes a
    gradient stays whole, so that its gradient reaches every entry."""
    if match.exact is not None:
        return match.exact, None
    if mask.requires_grad:
        return _ALL_KEYS, additive_bias(mask, dtype)
    if match.padded is not None:
        return match.padded, additive_bias(match.keys_seen, dtype)
    if match.rows_equal:
        return _ALL_KEYS, additive_bias(mask[..., :1, :], dtype)
    return _ALL_KEYS, additive_bias(mask, dtype)


def mask_is_native(
    *,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor,
    kv_offset: int,
    mask_function: Callable[..., Any],
    attention_mask: torch.Tensor | None,
    local_size: int | None = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    sliding_window: int | None = None,
    chunk_size: int | None = None,
) -> bool:
    """Whether a mask transformers asks for is the pattern the attention function applies
    without one (causal aligned bottom-right, all keys for bidirectional masks), so that no
    mask need be built. ``local_size`` is the window or chunk size of sliding-window and
    chunked masks; ``sliding_window`` / ``chunk_size`` come from the model config and say
    which of the two it is. Such masks count as native only where they exclude no key
    beyond causality, so this holds even for a model that does not pass its window to the
    attention function."""
    if mask_function is bidirectional_mask_function:
        if not allow_is_bidirectional_skip:
            return False
    elif mask_function is causal_mask_function or local_size is not None:
        if not allow_is_causal_skip or isinstance(q_offset, torch.Tensor):
            return False
        # The kernels align a causal mask to the last keys: the queries must be them.
        if q_offset + q_length != kv_offset + kv_length:
            return False
        if mask_function is not causal_mask_function:
            sliding = local_size == sliding_window and local_size != chunk_size
            # A window of W excludes nothing while the keys span at most W positions; a
            # chunk of C while every position lies in the first chunk.
            span = kv_length if sliding else kv_offset + kv_length
            if local_size is None or span > local_size:
                return False
    else:
        return False  # overlays (packed sequences, image tokens, custom functions)
    if attention_mask is None:
        return True
    if is_tracing(attention_mask):
        return False
    padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    return bool(padding[:, kv_offset : kv_offset + kv_length].all())


def ckfmha_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Callable[..., Any] = causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    config: Any = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """transformers' mask-function convention (masking_utils.AttentionMaskInterface): None
    where ``mask_is_native`` holds, else the 4-D bool mask sdpa would get (True = attend).
    For a model whose attention does not (yet) reach ckfmha, the float mask eager gets."""
    # The mask's geometry, in the names both functions take.
    where: dict[str, Any] = {
        "q_length": q_length, "kv_length": kv_length, "q_offset": q_offset,
        "kv_offset": kv_offset, "mask_function": mask_function,
        "attention_mask": attention_mask, "local_size": local_size,
    }  # fmt: skip
    if not _attention_routed(config):
        return eager_mask(
            batch_size=batch_size, **where,
            allow_is_bidirectional_skip=allow_is_bidirectional_skip, **kwargs,
        )  # fmt: skip
    if mask_is_native(
        **where,
        allow_is_causal_skip=allow_is_causal_skip,
        allow_is_bidirectional_skip=allow_is_bidirectional_skip,
        sliding_window=getattr(config, "sliding_window", None),
        chunk_size=getattr(config, "attention_chunk_size", None),
    ):
        return None
    return sdpa_mask(
        batch_size=batch_size, **where, allow_is_causal_skip=False,
        allow_is_bidirectional_skip=False, **kwargs,
    )  # fmt: skip
