# cython: language_level=3
# fp8 (e4m3) K/V for the forward runners (fwd, fwd_varlen, fwd_paged) and appends (append_kv),
# and fp8 queries for fwd and fwd_varlen: the views of q, k and v, and the scales written into
# the C problem and args (numbers, per-tensor or per-head arrays, or per-block arrays).

cimport ckfmha as capi

from ckfmha._arrays cimport ArrayView


cdef tuple attention_views(q, k, v, handle, dtype, kv_dtype, int q_ndim, int k_ndim,
                           int v_ndim, str k_name, str v_name, q_dtype=*)


cdef class KvScales:
    # The device scale arrays' views, alive until the launch is queued.
    cdef list views
    # Their memory, for the output-overlap checks.
    cdef readonly list regions
    # What resolve() read: the numbers, or the device arrays and whether they hold one value
    # per K/V head (then a device q_scale holds one per query head).
    cdef float k_value
    cdef float v_value
    cdef bint per_head
    cdef const float* k_ptr
    cdef const float* v_ptr

    cdef ArrayView _view(self, scale, handle, str name, int nhead_k, str heads=*, str head=*)
    cdef int apply(self, capi.ckfmha_fwd_problem* problem, capi.ckfmha_fwd_args* args,
                   int kv_quant, k_scale, v_scale, handle, int nhead_k) except -1
    cdef int apply_query(self, capi.ckfmha_fwd_problem* problem, capi.ckfmha_fwd_args* args,
                         int q_quant, q_scale, handle, int nhead_q) except -1
    cdef int resolve(self, k_scale, v_scale, handle, int nhead_k) except -1
    cdef ArrayView _block_view(self, scale, handle, str name)
    cdef int apply_blocks(self, capi.ckfmha_fwd_problem* problem, capi.ckfmha_fwd_args* args,
                          int kv_quant, int q_quant, q_scale, k_scale, v_scale, handle,
                          str seqlen_q_name, str seqlen_k_name) except -1
    cdef int apply_append(self, capi.ckfmha_appendkv_problem* problem,
                          capi.ckfmha_appendkv_args* args, int cache_quant, k_scale, v_scale,
                          handle, int nhead_k) except -1
