"""Paged-KV attention and the KV-cache append as torch.library custom ops (inference only).

``torch.ops.ckfmha.fwd_paged`` reads a paged cache (vLLM block tables or SGLang
kv_indptr/kv_indices); ``torch.ops.ckfmha.append_kv`` writes new keys and values into the
cache in place (declared as mutating ``k_cache`` and ``v_cache``, so torch.compile orders it
before later reads) and returns the rotated queries. Both take fp8 (e4m3) caches with their
scales (``KV_QUANT_SCHEMA``).
"""

from __future__ import annotations

import torch

import ckfmha
from ckfmha.torch.attention_ops import KV_QUANT_SCHEMA, kv_quant_options, refuse_host_tensors

torch.library.define(
    "ckfmha::fwd_paged",
    "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? block_table, Tensor? seqlens_k, "
    "Tensor? kv_indices, Tensor? kv_indptr, Tensor? cu_seqlens_q, int? max_seqlen_q, "
    "int? max_seqlen_k, bool causal, str causal_alignment, int[]? window, float? scale, "
    f"float softcap, str layout, str page_layout, int num_splits, {KV_QUANT_SCHEMA}) "
    "-> (Tensor out, Tensor lse)",
)


@torch.library.impl("ckfmha::fwd_paged", "CUDA")
def _fwd_paged_cuda(q, k_cache, v_cache, block_table, seqlens_k, kv_indices, kv_indptr,
                    cu_seqlens_q, max_seqlen_q, max_seqlen_k, causal, causal_alignment, window,
                    scale, softcap, layout, page_layout, num_splits, kv_dtype=None,
                    k_scale=None, v_scale=None, k_scale_value=None,
                    v_scale_value=None):  # fmt: skip
    return ckfmha.fwd_paged(
        q, k_cache, v_cache, block_table=block_table, seqlens_k=seqlens_k,
        kv_indices=kv_indices, kv_indptr=kv_indptr, cu_seqlens_q=cu_seqlens_q,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=causal,
        causal_alignment=causal_alignment,
        window=None if window is None else (int(window[0]), int(window[1])), scale=scale,
        softcap=softcap, return_lse=True, layout=layout, page_layout=page_layout,
        num_splits=num_splits,
        **kv_quant_options(kv_dtype, k_scale, v_scale, k_scale_value, v_scale_value),
    )  # fmt: skip


@torch.library.register_fake("ckfmha::fwd_paged")
def _fwd_paged_fake(q, k_cache, v_cache, block_table, seqlens_k, kv_indices, kv_indptr,
                    cu_seqlens_q, max_seqlen_q, max_seqlen_k, causal, causal_alignment, window,
                    scale, softcap, layout, page_layout, num_splits, kv_dtype=None,
                    k_scale=None, v_scale=None, k_scale_value=None,
                    v_scale_value=None):  # fmt: skip
    # The value head dim is the last axis of a linear v_cache [pages, page_size, heads, d]
    # and the third of a vectorized one [pages, heads, d, page_size].
    hdim_v = v_cache.shape[2] if page_layout == "vectorized" else v_cache.shape[-1]
    if cu_seqlens_q is not None:
        total_q, heads, _ = q.shape
        return q.new_empty((total_q, heads, hdim_v)), q.new_empty(
            (heads, total_q), dtype=torch.float32)
    batch, a, b, _ = q.shape
    heads, seqlen_q = (a, b) if layout == "bhsd" else (b, a)
    o_shape = (batch, heads, seqlen_q, hdim_v) if layout == "bhsd" else (
        batch, seqlen_q, heads, hdim_v)
    return q.new_empty(o_shape), q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)


torch.library.define(
    "ckfmha::append_kv",
    "(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k_new, Tensor v_new, "
    "Tensor cache_seqlens, Tensor? cos, Tensor? sin, bool rotary_interleaved, Tensor? q, "
    "Tensor? block_table, str cache_layout, str page_layout, "
    f"{KV_QUANT_SCHEMA}) -> Tensor",
)


@torch.library.impl("ckfmha::append_kv", "CUDA")
def _append_kv_cuda(k_cache, v_cache, k_new, v_new, cache_seqlens, cos, sin,
                    rotary_interleaved, q, block_table, cache_layout, page_layout,
                    kv_dtype=None, k_scale=None, v_scale=None, k_scale_value=None,
                    v_scale_value=None):  # fmt: skip
    rotated = ckfmha.append_kv(
        k_cache, v_cache, k_new, v_new, cache_seqlens, cos=cos, sin=sin,
        rotary_interleaved=rotary_interleaved, q=q, block_table=block_table,
        cache_layout=cache_layout, page_layout=page_layout,
        **kv_quant_options(kv_dtype, k_scale, v_scale, k_scale_value, v_scale_value),
    )  # fmt: skip
    # The schema returns a tensor either way: without q, an empty one.
    return k_new.new_empty((0,)) if rotated is None else rotated


@torch.library.register_fake("ckfmha::append_kv")
def _append_kv_fake(k_cache, v_cache, k_new, v_new, cache_seqlens, cos, sin,
                    rotary_interleaved, q, block_table, cache_layout, page_layout,
                    kv_dtype=None, k_scale=None, v_scale=None, k_scale_value=None,
                    v_scale_value=None):  # fmt: skip
    return k_new.new_empty((0,)) if q is None else q.new_empty(q.shape)


for _op in ("ckfmha::fwd_paged", "ckfmha::append_kv"):
    refuse_host_tensors(_op)
