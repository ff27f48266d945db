"""Float64 NumPy gradients of attention: the ground truth the GPU backward tests compare against.

The forward is the one ``ckfmha.reference.attention_reference`` defines; for an upstream
gradient dO the backward returns dQ, dK, dV (summed over the query heads that share a K/V
head), the bias gradient (reduced to the bias's own broadcast shape), the sink gradient and
the row sums D = rowsum(dO * O) the kernels' first stage computes.

With P the softmax probabilities (undropped; masked entries 0), keep/(1 - p) the dropout
factor and O = (P * keep/(1-p)) V::

    dV  = (P * keep/(1-p))^T dO
    dP  = (dO V^T) * keep/(1-p)
    D   = rowsum(dO * O) = rowsum(P * dP)
    dS  = P * (dP - D)                 gradient of the logits (after cap, bias and mask)
    dbias = dS                         summed over the axes the bias broadcasts along
    dT  = dS * (1 - tanh^2(t / cap))   through the soft-cap, t = scale * q.k (dT = dS without)
    dQ  = scale * dT K,  dK = scale * dT^T Q
    dsink[h] = -sum_i exp(sink[h] - lse_i) * D_i
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ckfmha.reference import alibi_bias, window_mask

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class AttentionGrads:
    """Gradients of sum(dO * O); shapes follow the inputs (layout included).

    ``dbias`` has the bias's shape (None without a bias), ``dsink`` is [hq] (None without a
    sink), ``delta`` is D = rowsum(dO * O) [b, hq, sq] and ``o``/``lse`` the forward's.
    """

    dq: F64
    dk: F64
    dv: F64
    dbias: F64 | None
    dsink: F64 | None
    delta: F64
    o: F64
    lse: F64


def _reduce_to_shape(grad: F64, shape: tuple[int, ...]) -> F64:
    """Sums a gradient of the broadcast result back onto an operand of ``shape``."""
    lead = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(lead))) if lead else grad
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def attention_backward_reference(
    q: npt.ArrayLike,
    k: npt.ArrayLike,
    v: npt.ArrayLike,
    do: npt.ArrayLike,
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
) -> AttentionGrads:
    """Gradients of attention in float64 for upstream gradient ``do`` (o's shape).

    Arguments as in ``attention_reference`` (row-major V only). Rows with no visible key
    have o = 0 and contribute nothing; their gradients are 0, never NaN.
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    if causal and window is not None:
        raise ValueError("pass causal or window, not both")
    arrays = [np.asarray(x).astype(np.float64) for x in (q, k, v, do)]
    if any(x.ndim != 4 for x in arrays):
        raise ValueError("q, k, v and do must be 4-D")
    if layout == "bshd":
        arrays = [x.transpose(0, 2, 1, 3) for x in arrays]
    q64, k64, v64, do64 = arrays
    batch, nhead_q, seqlen_q, hdim = q64.shape
    nhead_k, seqlen_k, hdim_v = k64.shape[1], k64.shape[2], v64.shape[3]
    if k64.shape[0] != batch or v64.shape[0] != batch:
        raise ValueError("q, k and v must have the same batch size")
    if k64.shape[3] != hdim or v64.shape[1:3] != (nhead_k, seqlen_k):
        raise ValueError(f"incompatible shapes q {q64.shape}, k {k64.shape}, v {v64.shape}")
    if do64.shape != (batch, nhead_q, seqlen_q, hdim_v):
        raise ValueError(f"do has shape {do64.shape}; o's is {(batch, nhead_q, seqlen_q, hdim_v)}")
    if nhead_k == 0 or nhead_q % nhead_k:
        raise ValueError(f"nhead_q={nhead_q} must be a multiple of nhead_k={nhead_k}")
    group = nhead_q // nhead_k
    k_rep = np.repeat(k64, group, axis=1)
    v_rep = np.repeat(v64, group, axis=1)
    if scale is None:
        scale = 1.0 / np.sqrt(hdim) if hdim else 1.0

    # ---- forward, keeping what the backward needs
    t = np.einsum("bhqd,bhkd->bhqk", q64, k_rep) * scale
    capped = np.tanh(t / softcap) if softcap > 0 else None
    logits = softcap * capped if capped is not None else t.copy()
    if bias is not None:
        bias64 = np.asarray(bias, dtype=np.float64)
        logits = logits + np.broadcast_to(bias64, logits.shape)
    if alibi_slopes is not None:
        logits = logits + alibi_bias(alibi_slopes, batch, seqlen_q, seqlen_k)
    if causal:
        window = (-1, 0)
    if window is not None:
        visible_keys = window_mask(seqlen_q, seqlen_k, window[0], window[1], causal_alignment)
        logits = np.where(visible_keys, logits, -np.inf)
    row_max = logits.max(axis=-1, keepdims=True, initial=-np.inf)
    if sink is not None:
        sink64 = np.asarray(sink, dtype=np.float64).reshape(1, nhead_q, 1, 1)
        row_max = np.maximum(row_max, sink64)
    shift = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.exp(logits - shift)
    row_sum = weights.sum(axis=-1, keepdims=True)
    if sink is not None:
        row_sum = row_sum + np.exp(sink64 - shift)
    visible = row_sum > 0
    probs = weights / np.where(visible, row_sum, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.where(visible, np.log(np.where(visible, row_sum, 1.0)) + shift, -np.inf)
    drop_scale: F64 | float = 1.0
    if dropout_keep is not None:
        keep = np.broadcast_to(np.asarray(dropout_keep, dtype=bool), probs.shape)
        drop_scale = np.where(keep, 1.0 / (1.0 - dropout_p), 0.0)
    dropped = probs * drop_scale
    out = np.einsum("bhqk,bhkd->bhqd", dropped, v_rep)

    # ---- backward
    dv_rep = np.einsum("bhqk,bhqd->bhkd", dropped, do64)
    dp = np.einsum("bhqd,bhkd->bhqk", do64, v_rep) * drop_scale
    delta = np.einsum("bhqd,bhqd->bhq", do64, out)
    ds = probs * (dp - delta[..., None])
    dbias = None
    if bias is not None:
        dbias = _reduce_to_shape(ds, np.shape(bias))
    dsink = None
    if sink is not None:
        sink_prob = np.where(visible, np.exp(sink64 - np.where(visible, lse, 0.0)), 0.0)
        dsink = -(sink_prob[..., 0] * delta).sum(axis=(0, 2))
    dt = ds * (1.0 - capped**2) if capped is not None else ds
    dq = np.einsum("bhqk,bhkd->bhqd", dt, k_rep) * scale
    dk_rep = np.einsum("bhqk,bhqd->bhkd", dt, q64) * scale
    dk = dk_rep.reshape(batch, nhead_k, group, seqlen_k, hdim).sum(axis=2)
    dv = dv_rep.reshape(batch, nhead_k, group, seqlen_k, hdim_v).sum(axis=2)
    lse = lse[..., 0]
    if layout == "bshd":
        dq, dk, dv, out = (x.transpose(0, 2, 1, 3) for x in (dq, dk, dv, out))
    contiguous = np.ascontiguousarray
    return AttentionGrads(
        dq=contiguous(dq), dk=contiguous(dk), dv=contiguous(dv), dbias=dbias, dsink=dsink,
        delta=delta, o=contiguous(out), lse=lse,
    )  # fmt: skip


@dataclass(frozen=True)
class VarlenAttentionGrads:
    """Packed gradients: dq [total_q, hq, d], dk [total_k, hk, d], dv [total_k, hk, dv];
    ``dbias`` has the bias's shape (each sequence's gradient in its top-left corner),
    ``delta`` and ``lse`` [hq, total_q]."""

    dq: F64
    dk: F64
    dv: F64
    dbias: F64 | None
    dsink: F64 | None
    delta: F64
    o: F64
    lse: F64


def varlen_attention_backward_reference(
    q: npt.ArrayLike,
    k: npt.ArrayLike,
    v: npt.ArrayLike,
    do: npt.ArrayLike,
    cu_seqlens_q: Sequence[int] | npt.ArrayLike,
    cu_seqlens_k: Sequence[int] | npt.ArrayLike,
    *,
    bias: npt.ArrayLike | None = None,
    alibi_slopes: npt.ArrayLike | None = None,
    dropout_keep: npt.ArrayLike | None = None,
    **options: Any,
) -> VarlenAttentionGrads:
    """Group (varlen) mode gradients: tokens packed as in ``varlen_attention_reference``.

    Each sequence is differentiated on its own with positions local to it; keys of a
    sequence with no queries get zero gradients. ``bias`` broadcastable to [b, hq, max_sq,
    max_sk] and ``dropout_keep`` [b, hq, max_sq, max_sk] are indexed locally.
    """
    if "layout" in options:
        raise ValueError("varlen_attention_backward_reference is token-major; it takes no layout")
    q64, k64, v64, do64 = (np.asarray(x).astype(np.float64) for x in (q, k, v, do))
    if any(x.ndim != 3 for x in (q64, k64, v64, do64)):
        raise ValueError("q, k, v and do must be 3-D (tokens, heads, head dim)")
    cu_q = np.asarray(cu_seqlens_q, dtype=np.int64)
    cu_k = np.asarray(cu_seqlens_k, dtype=np.int64)
    if cu_q.ndim != 1 or cu_q.shape != cu_k.shape or cu_q.size < 2:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must both hold batch + 1 offsets")
    if np.any(np.diff(cu_q) < 0) or np.any(np.diff(cu_k) < 0):
        raise ValueError("cu_seqlens must be non-decreasing")
    batch = cu_q.size - 1
    total_q, nhead_q = q64.shape[:2]
    dq, dk, dv = np.zeros_like(q64), np.zeros_like(k64), np.zeros_like(v64)
    out = np.zeros_like(do64)
    delta = np.zeros((nhead_q, total_q))
    lse = np.full((nhead_q, total_q), -np.inf)
    bias64 = None
    dbias_full = None
    if bias is not None:
        bias64 = np.asarray(bias, dtype=np.float64)
        bias64 = bias64.reshape((1,) * (4 - bias64.ndim) + bias64.shape)
        # One plane per sequence; a batch-broadcast bias sums them at the end.
        dbias_full = np.zeros((batch,) + bias64.shape[1:])
    dsink = None if options.get("sink") is None else np.zeros(nhead_q)
    slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, dtype=np.float64)
    keep = None if dropout_keep is None else np.asarray(dropout_keep, dtype=bool)
    for b in range(batch):
        q0, q1, k0, k1 = (int(x) for x in (cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]))
        seqlen_q, seqlen_k = q1 - q0, k1 - k0
        if seqlen_q == 0:
            continue
        local = dict(options)
        if bias64 is not None:
            local["bias"] = bias64[b if bias64.shape[0] > 1 else 0][None, :, :seqlen_q, :seqlen_k]
        if slopes is not None:
            local["alibi_slopes"] = slopes[b] if slopes.ndim == 2 else slopes
        if keep is not None:
            local["dropout_keep"] = keep[b : b + 1, :, :seqlen_q, :seqlen_k]
        g = attention_backward_reference(
            q64[None, q0:q1], k64[None, k0:k1], v64[None, k0:k1], do64[None, q0:q1],
            layout="bshd", **local,
        )  # fmt: skip
        dq[q0:q1] = g.dq[0]
        dk[k0:k1] += g.dk[0]
        dv[k0:k1] += g.dv[0]
        out[q0:q1] = g.o[0]
        delta[:, q0:q1] = g.delta[0]
        lse[:, q0:q1] = g.lse[0]
        if dbias_full is not None and g.dbias is not None:
            rows, cols = g.dbias.shape[2:]
            dbias_full[b, :, :rows, :cols] = g.dbias[0]
        if dsink is not None and g.dsink is not None:
            dsink += g.dsink
    dbias = None
    if bias64 is not None and dbias_full is not None:
        dbias = dbias_full if bias64.shape[0] > 1 else dbias_full.sum(axis=0, keepdims=True)
    return VarlenAttentionGrads(
        dq=dq, dk=dk, dv=dv, dbias=dbias, dsink=dsink, delta=delta, o=out, lse=lse
    )
