"""Float64 NumPy reference for appending to a KV cache with rotary position embeddings.

The definitions the kernels are tested against, written for clarity: plain loops over
sequences and tokens, the rotation as the pair formula. fp8 caches (``fp8_scales``) hold the
e4m3 codes of each written row divided by its head's scale, computed as the kernels are
specified to (``quantize_row``), so that the codes can be compared bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ckfmha.fp8 import encode_e4m3

ELEMENT_DTYPES = ("fp16", "bf16")


def round_to_dtype(x: npt.ArrayLike, dtype: str) -> np.ndarray:
    """``x`` rounded to fp16 or bf16 (nearest even), as float64. bf16 goes through fp32, as
    the kernels' fp32 arithmetic does."""
    values = np.asarray(x, dtype=np.float64)
    if dtype == "fp16":
        return values.astype(np.float16).astype(np.float64)
    if dtype != "bf16":
        raise ValueError(f"dtype must be one of {ELEMENT_DTYPES}, got {dtype!r}")
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    # Round to nearest even on the 16 dropped bits; NaN never reaches the reference.
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def quantize_row(x: npt.ArrayLike, scale: npt.ArrayLike, dtype: str) -> np.ndarray:
    """The e4m3 codes an fp8 append writes for ``x`` [heads, hdim] (float64, e.g. rotated):
    x rounded to ``dtype``, divided by ``scale`` (a number or one per head) in fp32 (IEEE
    division, correctly rounded), then rounded to nearest even and saturated at +-448."""
    rounded = round_to_dtype(x, dtype).astype(np.float32)
    per_head = np.asarray(scale, dtype=np.float32).reshape(-1, 1)
    return encode_e4m3(np.divide(rounded, per_head, dtype=np.float32))


def rotate(
    x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool
) -> np.ndarray:
    """Rotary embedding of rows ``x`` [tokens, heads, hdim] at ``positions`` [tokens].

    cos/sin are [max_pos, rotary_dim / 2]. A pair (a, b) becomes (a cos - b sin,
    a sin + b cos) with entry i of the position's row: interleaved pairs columns
    (2i, 2i + 1) (GPT-J), otherwise (i, i + rotary_dim / 2) (GPT-NeoX). Columns at
    or past rotary_dim are unchanged.
    """
    out = np.array(x, dtype=np.float64)
    half = cos.shape[1]
    c = np.asarray(cos, dtype=np.float64)[positions][:, None, :]
    s = np.asarray(sin, dtype=np.float64)[positions][:, None, :]
    if interleaved:
        a, b = out[..., 0 : 2 * half : 2].copy(), out[..., 1 : 2 * half : 2].copy()
        out[..., 0 : 2 * half : 2] = a * c - b * s
        out[..., 1 : 2 * half : 2] = a * s + b * c
    else:
        a, b = out[..., :half].copy(), out[..., half : 2 * half].copy()
        out[..., :half] = a * c - b * s
        out[..., half : 2 * half] = a * s + b * c
    return out


@dataclass
class AppendResult:
    # float64 (uint8 e4m3 codes for fp8 caches), the input cache's shape (BSHD or paged
    # [pages, page, h, d])
    k_cache: np.ndarray
    v_cache: np.ndarray
    q: np.ndarray | None  # rotated q (float64) when q was given
    overflow: bool  # some token was not written (position, page or angle row out of range)


def append_kv_reference(
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    k_new: np.ndarray,
    v_new: np.ndarray,
    cache_seqlens: np.ndarray,
    *,
    cos: np.ndarray | None = None,
    sin: np.ndarray | None = None,
    rotary_interleaved: bool = False,
    q: np.ndarray | None = None,
    block_table: np.ndarray | None = None,
    fp8_scales: tuple[npt.ArrayLike, npt.ArrayLike] | None = None,
    dtype: str = "fp16",
) -> AppendResult:
    """What ``ckfmha.append_kv`` computes, for BSHD caches (paged: [pages, page_size, h, d]).

    Token t of sequence b goes to position p = cache_seqlens[b] + t: row p of cache b, or row
    p % page_size of page block_table[b, p // page_size]. A token whose position is outside
    the cache, whose page number is outside the pages, or (with RoPE) whose position has no
    cos/sin row is skipped and reported in ``overflow``; so is a query without an angle row
    (its row of the result keeps q's values).

    fp8 caches: with ``fp8_scales`` (k_scale, v_scale: numbers or one per K/V head) the caches
    are uint8 e4m3 codes and each written row is ``quantize_row`` of the (rotated) key or the
    value in ``dtype`` (the new tokens' fp16 or bf16).
    """
    fp8 = fp8_scales is not None
    cache_dtype = np.uint8 if fp8 else np.float64
    k_out = np.array(k_cache, dtype=cache_dtype)
    v_out = np.array(v_cache, dtype=cache_dtype)
    k_new = np.asarray(k_new, dtype=np.float64)
    v_new = np.asarray(v_new, dtype=np.float64)
    batch, seqlen_new = k_new.shape[:2]
    rope = cos is not None
    max_pos = cos.shape[0] if rope else None
    overflow = False
    if block_table is None:
        capacity = k_cache.shape[1]
    else:
        page_size, num_pages = k_cache.shape[1], k_cache.shape[0]
        capacity = block_table.shape[1] * page_size
    for b in range(batch):
        length = int(cache_seqlens[b])
        for t in range(seqlen_new):
            pos = length + t
            if pos < 0 or pos >= capacity or (rope and pos >= max_pos):
                overflow = True
                continue
            if block_table is None:
                slab, row = b, pos
            else:
                slab, row = int(block_table[b, pos // page_size]), pos % page_size
                if not 0 <= slab < num_pages:
                    overflow = True
                    continue
            key = k_new[b, t]
            if rope:
                key = rotate(key[None], np.array([pos]), cos, sin, rotary_interleaved)[0]
            value = v_new[b, t]
            if fp8:
                key = quantize_row(key, fp8_scales[0], dtype)
                value = quantize_row(value, fp8_scales[1], dtype)
            k_out[slab, row] = key
            v_out[slab, row] = value
    q_out = None
    if q is not None:
        q_out = np.array(q, dtype=np.float64)
        for b in range(batch):
            positions = int(cache_seqlens[b]) + np.arange(q.shape[1])
            valid = (positions >= 0) & (positions < max_pos)
            overflow |= not valid.all()
            q_out[b, valid] = rotate(q_out[b, valid], positions[valid], cos, sin,
                                     rotary_interleaved)
    return AppendResult(k_out, v_out, q_out, overflow)


def rope_tables(max_pos: int, rotary_dim: int, base: float = 10000.0) -> tuple[np.ndarray, ...]:
    """The usual angle tables: entry i of row p is p * base^(-2i / rotary_dim) (float64)."""
    inv_freq = base ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    angles = np.outer(np.arange(max_pos, dtype=np.float64), inv_freq)
    return np.cos(angles), np.sin(angles)
