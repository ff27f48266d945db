"""Float64 NumPy reference for appending to a KV cache with rotary position embeddings.

The definitions the kernels are tested against, written for clarity: plain loops over
sequences and tokens, the rotation as the pair formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
    k_cache: np.ndarray  # float64, the input cache's shape (BSHD or paged [pages, page, h, d])
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
) -> AppendResult:
    """What ``ckfmha.append_kv`` computes, for BSHD caches (paged: [pages, page_size, h, d]).

    Token t of sequence b goes to position p = cache_seqlens[b] + t: row p of cache b, or row
    p % page_size of page block_table[b, p // page_size]. A token whose position is outside
    the cache, whose page number is outside the pages, or (with RoPE) whose position has no
    cos/sin row is skipped and reported in ``overflow``; so is a query without an angle row
    (its row of the result keeps q's values).
    """
    k_out = np.array(k_cache, dtype=np.float64)
    v_out = np.array(v_cache, dtype=np.float64)
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
            k_out[slab, row] = key
            v_out[slab, row] = v_new[b, t]
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
