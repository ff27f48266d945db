"""Float64 NumPy reference for attention, the ground truth the GPU tests compare against."""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt


def causal_mask(
    seqlen_q: int, seqlen_k: int, alignment: Literal["top_left", "bottom_right"] = "top_left"
) -> npt.NDArray[np.bool_]:
    """[seqlen_q, seqlen_k] True where query i may attend to key j.

    top_left: j <= i. bottom_right: j <= i + seqlen_k - seqlen_q, so the last query
    sees every key; with seqlen_q > seqlen_k the first rows see nothing.
    """
    if alignment not in ("top_left", "bottom_right"):
        raise ValueError(
            f"causal_alignment must be 'top_left' or 'bottom_right', got {alignment!r}"
        )
    offset = 0 if alignment == "top_left" else seqlen_k - seqlen_q
    rows = np.arange(seqlen_q)[:, None]
    cols = np.arange(seqlen_k)[None, :]
    return cols <= rows + offset


def attention_reference(
    q: npt.ArrayLike,
    k: npt.ArrayLike,
    v: npt.ArrayLike,
    *,
    causal: bool = False,
    causal_alignment: Literal["top_left", "bottom_right"] = "top_left",
    scale: float | None = None,
    layout: Literal["bhsd", "bshd"] = "bhsd",
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """softmax(scale * q k^T, masked) v in float64; returns (o, lse).

    q [b, hq, sq, d], k [b, hk, sk, d], v [b, hk, sk, dv] (or bshd); hq must be a
    multiple of hk, query head h reading kv head h // (hq // hk). o has q's
    layout with head dim dv; lse is [b, hq, sq] (natural log of the row's sum of
    exp(scaled scores)). A row with no visible key gets o = 0 and lse = -inf,
    never NaN. Accepts any float dtype NumPy can cast (bf16 via ml_dtypes).
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    arrays = [np.asarray(x).astype(np.float64) for x in (q, k, v)]
    if any(x.ndim != 4 for x in arrays):
        raise ValueError("q, k and v must be 4-D")
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
    if causal:
        scores = np.where(causal_mask(seqlen_q, seqlen_k, causal_alignment), scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True, initial=-np.inf)
    # A fully masked row has max -inf; shifting by 0 instead keeps exp() at exactly 0.
    shift = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.exp(scores - shift)
    row_sum = weights.sum(axis=-1, keepdims=True)
    visible = row_sum > 0
    out = np.einsum("bhqk,bhkd->bhqd", weights, v64) / np.where(visible, row_sum, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.where(visible, np.log(np.where(visible, row_sum, 1.0)) + shift, -np.inf)
    if layout == "bshd":
        out = out.transpose(0, 2, 1, 3)
    return np.ascontiguousarray(out), lse[..., 0]
