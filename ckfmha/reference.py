"""Float64 NumPy reference for attention, the ground truth the GPU tests compare against."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt


def causal_mask(
    seqlen_q: int, seqlen_k: int, alignment: Literal["top_left", "bottom_right"] = "top_left"
) -> npt.NDArray[np.bool_]:
    """[seqlen_q, seqlen_k] True where query i may attend to key j.

    top_left: j <= i. bottom_right: j <= i + seqlen_k - seqlen_q, so the last query
    sees every key; with seqlen_q > seqlen_k the first rows see nothing.
    """
    return window_mask(seqlen_q, seqlen_k, -1, 0, alignment)


def window_mask(
    seqlen_q: int,
    seqlen_k: int,
    left: int,
    right: int,
    alignment: Literal["top_left", "bottom_right"] = "top_left",
) -> npt.NDArray[np.bool_]:
    """[seqlen_q, seqlen_k] True where key j lies in query i's window.

    With off = 0 (top_left) or seqlen_k - seqlen_q (bottom_right), key j is visible
    iff (left < 0 or j >= i + off - left) and (right < 0 or j <= i + off + right);
    causal is the window (-1, 0).
    """
    if alignment not in ("top_left", "bottom_right"):
        raise ValueError(
            f"causal_alignment must be 'top_left' or 'bottom_right', got {alignment!r}"
        )
    offset = 0 if alignment == "top_left" else seqlen_k - seqlen_q
    rows = np.arange(seqlen_q)[:, None]
    cols = np.arange(seqlen_k)[None, :]
    visible = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if left >= 0:
        visible &= cols >= rows + offset - left
    if right >= 0:
        visible &= cols <= rows + offset + right
    return visible


def alibi_bias(
    slopes: npt.ArrayLike, batch: int, seqlen_q: int, seqlen_k: int
) -> npt.NDArray[np.float64]:
    """[b, h, sq, sk] ALiBi bias -slope * |i + sk - sq - j| from slopes [h] or [b, h]."""
    s = np.asarray(slopes, dtype=np.float64)
    s = np.broadcast_to(s if s.ndim == 2 else s[None, :], (batch, s.shape[-1]))
    distance = np.abs(
        np.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q - np.arange(seqlen_k)[None, :]
    )
    return -s[:, :, None, None] * distance[None, None]


def attention_reference(
    q: npt.ArrayLike,
    k: npt.ArrayLike,
    v: npt.ArrayLike,
    *,
    causal: bool = False,
    causal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    window: tuple[int, int] | None = None,
    scale: float | None = None,
    softcap: float = 0.0,
    bias: npt.ArrayLike | None = None,
    alibi_slopes: npt.ArrayLike | None = None,
    sink: npt.ArrayLike | None = None,
    dropout_p: float = 0.0,
    dropout_keep: npt.ArrayLike | None = None,
    layout: Literal["bhsd", "bshd"] = "bhsd",
    v_col_major: bool = False,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Attention in float64; returns (o, lse).

    q [b, hq, sq, d], k [b, hk, sk, d], v [b, hk, sk, dv] (or bshd; with
    v_col_major v is [b, hk, dv, sk]); hq must be a multiple of hk, query head h
    reading kv head h // (hq // hk). Logits are scale * q.k, soft-capped as
    softcap * tanh(logit / softcap) when softcap > 0, plus ``bias`` (broadcast to
    [b, hq, sq, sk]) or ALiBi; masked logits (causal, or window (left, right)
    with -1 unbounded) are -inf. ``sink`` [hq] adds exp(sink) to each softmax
    denominator. ``dropout_keep`` (bool [b, hq, sq, sk]) zeroes dropped
    probabilities and scales kept ones by 1/(1 - dropout_p); the LSE is that of
    the undropped softmax. A row with no visible key (and no sink) gets o = 0
    and lse = -inf, never NaN; with a sink, o = 0 and lse = sink.
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    if causal and window is not None:
        raise ValueError("pass causal or window, not both")
    arrays = [np.asarray(x).astype(np.float64) for x in (q, k, v)]
    if any(x.ndim != 4 for x in arrays):
        raise ValueError("q, k and v must be 4-D")
    if v_col_major:
        arrays[2] = arrays[2].transpose(0, 1, 3, 2)
        if layout == "bshd":
            arrays[2] = arrays[2].transpose(0, 2, 1, 3)
    if layout == "bshd":
        arrays = [x.transpose(0, 2, 1, 3) for x in arrays]
    q64, k64, v64 = arrays
    batch, nhead_q, seqlen_q, hdim = q64.shape
    nhead_k, seqlen_k = k64.shape[1], k64.shape[2]
    if k64.shape[0] != batch or v64.shape[0] != batch:
        raise ValueError("q, k and v must have the same batch size")
    if k64.shape[3] != hdim or v64.shape[1:3] != (nhead_k, seqlen_k):
        raise ValueError(f"incompatible shapes q {q64.shape}, k {k64.shape}, v {v64.shape}")
    if nhead_k == 0 or nhead_q % nhead_k:
        raise ValueError(f"nhead_q={nhead_q} must be a multiple of nhead_k={nhead_k}")
    group = nhead_q // nhead_k
    k64 = np.repeat(k64, group, axis=1)
    v64 = np.repeat(v64, group, axis=1)
    if scale is None:
        scale = 1.0 / np.sqrt(hdim) if hdim else 1.0

    scores = np.einsum("bhqd,bhkd->bhqk", q64, k64) * scale
    if softcap > 0:
        scores = softcap * np.tanh(scores / softcap)
    if bias is not None:
        scores = scores + np.broadcast_to(np.asarray(bias, dtype=np.float64), scores.shape)
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, batch, seqlen_q, seqlen_k)
    if causal:
        scores = np.where(causal_mask(seqlen_q, seqlen_k, causal_alignment), scores, -np.inf)
    elif window is not None:
        left, right = window
        visible_keys = window_mask(seqlen_q, seqlen_k, left, right, causal_alignment)
        scores = np.where(visible_keys, scores, -np.inf)

    row_max = scores.max(axis=-1, keepdims=True, initial=-np.inf)
    if sink is not None:
        sink64 = np.asarray(sink, dtype=np.float64).reshape(1, nhead_q, 1, 1)
        row_max = np.maximum(row_max, sink64)
    # A fully masked row has max -inf; shifting by 0 instead keeps exp() at exactly 0.
    shift = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.exp(scores - shift)
    row_sum = weights.sum(axis=-1, keepdims=True)
    if sink is not None:
        row_sum = row_sum + np.exp(sink64 - shift)
    visible = row_sum > 0
    if dropout_keep is not None:
        keep = np.broadcast_to(np.asarray(dropout_keep, dtype=bool), weights.shape)
        weights = np.where(keep, weights / (1.0 - dropout_p), 0.0)
    out = np.einsum("bhqk,bhkd->bhqd", weights, v64) / np.where(visible, row_sum, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.where(visible, np.log(np.where(visible, row_sum, 1.0)) + shift, -np.inf)
    if layout == "bshd":
        out = out.transpose(0, 2, 1, 3)
    return np.ascontiguousarray(out), lse[..., 0]


def varlen_attention_reference(
    q: npt.ArrayLike,
    k: npt.ArrayLike,
    v: npt.ArrayLike,
    cu_seqlens_q: npt.ArrayLike,
    cu_seqlens_k: npt.ArrayLike,
    *,
    skip_min_seqlen_q: int = 0,
    bias: npt.ArrayLike | None = None,
    alibi_slopes: npt.ArrayLike | None = None,
    dropout_keep: npt.ArrayLike | None = None,
    v_col_major: bool = False,
    **options: Any,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Group (varlen) mode: q [total_q, hq, d], k/v [total_k, hk, d] packed by offsets.

    Sequence b owns query tokens cu_seqlens_q[b] .. cu_seqlens_q[b+1] and key
    tokens likewise; each is attended on its own with positions local to it.
    ``bias`` (broadcastable to [b, hq, max_sq, max_sk]) and ``dropout_keep``
    ([b, hq, max_sq, max_sk]) are indexed locally; ``alibi_slopes`` is [hq] or
    [b, hq]; with ``v_col_major`` v is [hk, dv, total_k]. Other options as in
    ``attention_reference`` (layout excepted). Returns o [total_q, hq, dv] and
    lse [hq, total_q]; sequences shorter than skip_min_seqlen_q are skipped and
    keep NaN in both, so callers can check that a kernel left them untouched.
    """
    if "layout" in options:
        raise ValueError("varlen_attention_reference is token-major; it takes no layout")
    q64, k64, v64 = (np.asarray(x).astype(np.float64) for x in (q, k, v))
    if q64.ndim != 3 or k64.ndim != 3 or v64.ndim != 3:
        raise ValueError("q, k and v must be 3-D (tokens, heads, head dim)")
    if v_col_major:
        v64 = v64.transpose(2, 0, 1)
    cu_q = np.asarray(cu_seqlens_q, dtype=np.int64)
    cu_k = np.asarray(cu_seqlens_k, dtype=np.int64)
    if cu_q.ndim != 1 or cu_q.shape != cu_k.shape or cu_q.size < 2:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must both hold batch + 1 offsets")
    if np.any(np.diff(cu_q) < 0) or np.any(np.diff(cu_k) < 0):
        raise ValueError("cu_seqlens must be non-decreasing")
    total_q, nhead_q = q64.shape[:2]
    out = np.full((total_q, nhead_q, v64.shape[2]), np.nan)
    lse = np.full((nhead_q, total_q), np.nan)
    bias64 = None
    if bias is not None:
        bias64 = np.asarray(bias, dtype=np.float64)
        if bias64.ndim > 4:
            raise ValueError(f"bias must have at most 4 axes, got shape {bias64.shape}")
        bias64 = bias64.reshape((1,) * (4 - bias64.ndim) + bias64.shape)
    slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, dtype=np.float64)
    keep = None if dropout_keep is None else np.asarray(dropout_keep, dtype=bool)
    for b in range(cu_q.size - 1):
        q0, q1, k0, k1 = (int(x) for x in (cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]))
        seqlen_q, seqlen_k = q1 - q0, k1 - k0
        if seqlen_q == 0 or seqlen_q < skip_min_seqlen_q:
            continue
        local = dict(options)
        if bias64 is not None:
            # A size-1 axis broadcasts; slicing it keeps it size 1.
            local["bias"] = bias64[b if bias64.shape[0] > 1 else 0][None, :, :seqlen_q, :seqlen_k]
        if slopes is not None:
            local["alibi_slopes"] = slopes[b] if slopes.ndim == 2 else slopes
        if keep is not None:
            local["dropout_keep"] = keep[b : b + 1, :, :seqlen_q, :seqlen_k]
        o_b, lse_b = attention_reference(
            q64[None, q0:q1], k64[None, k0:k1], v64[None, k0:k1], layout="bshd", **local
        )
        out[q0:q1] = o_b[0]
        lse[:, q0:q1] = lse_b[0]
    return out, lse


def gather_pages(
    cache: npt.ArrayLike, pages: npt.ArrayLike, seqlen_k: int
) -> npt.NDArray[np.float64]:
    """The first seqlen_k keys of a sequence from a page cache [num_pages, page_size, heads, d]
    and its page ids in key order: [seqlen_k, heads, d] in float64."""
    cache64 = np.asarray(cache).astype(np.float64)
    page_size = cache64.shape[1]
    used = -(-seqlen_k // page_size)
    ids = np.asarray(pages, dtype=np.int64)[:used]
    if ids.size < used:
        raise ValueError(f"{seqlen_k} keys need {used} pages, the table lists {ids.size}")
    return cache64[ids].reshape(-1, *cache64.shape[2:])[:seqlen_k]


def paged_attention_reference(
    q: npt.ArrayLike,
    k_cache: npt.ArrayLike,
    v_cache: npt.ArrayLike,
    *,
    block_table: npt.ArrayLike | None = None,
    seqlens_k: npt.ArrayLike | None = None,
    kv_indices: npt.ArrayLike | None = None,
    kv_indptr: npt.ArrayLike | None = None,
    cu_seqlens_q: npt.ArrayLike | None = None,
    layout: Literal["bhsd", "bshd"] = "bhsd",
    **options: Any,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Attention over a paged K/V cache: gathers each sequence's keys, then attends as
    ``attention_reference`` does, positions local to the sequence.

    Caches are [num_pages, page_size, hk, d]. Pages: ``block_table`` [b, max_pages] (vLLM,
    with ``seqlens_k`` [b]) or ``kv_indices`` + ``kv_indptr`` [b + 1] (SGLang; without
    ``seqlens_k`` every key of the pages). Queries: q [b, hq, sq, d] (``layout``) returning o
    like q and lse [b, hq, sq]; or, with ``cu_seqlens_q``, packed q [total_q, hq, d] returning
    o [total_q, hq, dv] and lse [hq, total_q]. ``options`` as in ``attention_reference``.
    """
    if (block_table is None) == (kv_indices is None or kv_indptr is None):
        raise ValueError("pass block_table (with seqlens_k) or kv_indices with kv_indptr")
    page_size = np.asarray(k_cache).shape[1]
    if block_table is not None:
        table = np.asarray(block_table, dtype=np.int64)
        if seqlens_k is None:
            raise ValueError("a block table needs seqlens_k")
        page_lists = list(table)
    else:
        indptr = np.asarray(kv_indptr, dtype=np.int64)
        indices = np.asarray(kv_indices, dtype=np.int64)
        page_lists = [indices[indptr[b] : indptr[b + 1]] for b in range(indptr.size - 1)]
    if seqlens_k is None:
        lens_k = [len(pages) * page_size for pages in page_lists]
    else:
        lens_k = [int(n) for n in np.asarray(seqlens_k)]
    keys = [gather_pages(k_cache, pages, n) for pages, n in zip(page_lists, lens_k)]
    values = [gather_pages(v_cache, pages, n) for pages, n in zip(page_lists, lens_k)]
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int64)
    k_packed = np.concatenate(keys) if keys else np.zeros((0,) + np.shape(k_cache)[2:])
    v_packed = np.concatenate(values) if values else np.zeros((0,) + np.shape(v_cache)[2:])
    if cu_seqlens_q is not None:
        return varlen_attention_reference(q, k_packed, v_packed, cu_seqlens_q, cu_k, **options)
    q64 = np.asarray(q).astype(np.float64)
    if layout == "bhsd":
        q64 = q64.transpose(0, 2, 1, 3)
    batch, seqlen_q = q64.shape[:2]
    cu_q = np.arange(batch + 1, dtype=np.int64) * seqlen_q
    o, lse = varlen_attention_reference(
        q64.reshape(batch * seqlen_q, *q64.shape[2:]), k_packed, v_packed, cu_q, cu_k, **options
    )
    o = o.reshape(batch, seqlen_q, *o.shape[1:])
    lse = lse.reshape(lse.shape[0], batch, seqlen_q).transpose(1, 0, 2)
    return (o.transpose(0, 2, 1, 3) if layout == "bhsd" else o), lse


_PHILOX_M0, _PHILOX_M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_PHILOX_W0, _PHILOX_W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def philox4x32(
    counter: Sequence[npt.ArrayLike], key: tuple[int, int]
) -> list[npt.NDArray[np.uint32]]:
    """Philox4x32-10 of broadcastable uint32 counter words under a (k0, k1) key.

    Returns the four output words. Products of two 32-bit words fit uint64, so
    mulhilo32 is one uint64 multiply split into halves.
    """
    c = [np.asarray(x, dtype=np.uint64) & _MASK32 for x in counter]
    c = list(np.broadcast_arrays(*c))
    k0, k1 = np.uint64(key[0]) & _MASK32, np.uint64(key[1]) & _MASK32
    for _ in range(10):
        p0 = c[0] * _PHILOX_M0
        p1 = c[2] * _PHILOX_M1
        hi0, lo0 = p0 >> _SHIFT32, p0 & _MASK32
        hi1, lo1 = p1 >> _SHIFT32, p1 & _MASK32
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        k0 = (k0 + _PHILOX_W0) & _MASK32
        k1 = (k1 + _PHILOX_W1) & _MASK32
    return [x.astype(np.uint32) for x in c]


def philox_dropout_randval(
    seed: int, offset: int, batch: int, nhead_q: int, seqlen_q: int, seqlen_k: int
) -> npt.NDArray[np.uint8]:
    """The uint8 [b, hq, sq, sk] random bytes dropout uses, as ckfmha.h specifies.

    Element (b, h, i, j) is byte ((j % 64) // 8) * 2 + j % 2 of Philox4x32-10 with key
    (seed_lo, seed_hi ^ offset_hi) and counter ((j // 64) * 4 + (j % 8) // 2, i,
    b * nhead_q + h, offset_lo), the four output words read as 16 little-endian bytes.
    """
    seed, offset = int(seed) & 0xFFFFFFFFFFFFFFFF, int(offset) & 0xFFFFFFFFFFFFFFFF
    key = (seed & 0xFFFFFFFF, (seed >> 32) ^ (offset >> 32))
    calls = -(-seqlen_k // 64) * 4
    heads = np.arange(batch * nhead_q, dtype=np.uint64)[:, None, None]
    rows = np.arange(seqlen_q, dtype=np.uint64)[None, :, None]
    counters = np.arange(calls, dtype=np.uint64)[None, None, :]
    words = philox4x32((counters, rows, heads, offset & 0xFFFFFFFF), key)
    little_endian = np.stack(words, axis=-1).astype("<u4")
    values = little_endian.view(np.uint8).reshape(batch * nhead_q, seqlen_q, calls * 16)
    j = np.arange(seqlen_k)
    picked = values[:, :, (j // 64 * 4 + j % 8 // 2) * 16 + (j % 64 // 8) * 2 + j % 2]
    return np.ascontiguousarray(picked).reshape(batch, nhead_q, seqlen_q, seqlen_k)


def dropout_keep(randval: npt.ArrayLike, p: float) -> npt.NDArray[np.bool_]:
    """Which probabilities survive dropout with probability p: byte >= floor(p * 256)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    return np.asarray(randval, dtype=np.uint8) >= math.floor(p * 256)
