cimport ckfmha as capi
from ckfmha._torch_calls cimport CachedCall


cdef class CachedBackward(CachedCall):
    cdef capi.ckfmha_bwd_problem problem
    cdef tuple dq_shape
    cdef tuple dk_shape
    cdef tuple dv_shape
    cdef object dtype


cdef size_t workspace_words(size_t workspace_bytes)
cdef object fast_key(do, q, k, v, o, lse, bias, causal, causal_alignment, window, scale,
                     softcap, deterministic, layout)
cdef object varlen_fast_key(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k, causal, causal_alignment, window, scale, softcap,
                            deterministic)
cdef object run_cached(object key, do, q, k, v, o, lse, bias, cu_seqlens_q=*, cu_seqlens_k=*)
cdef int remember(object key, capi.ckfmha_bwd_problem* problem, int device, tuple dq_shape,
                  tuple dk_shape, tuple dv_shape) except -1
