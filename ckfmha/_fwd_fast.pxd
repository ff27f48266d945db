cimport ckfmha as capi
from ckfmha._torch_calls cimport CachedCall


cdef class CachedForward(CachedCall):
    cdef capi.ckfmha_fwd_problem problem
    cdef tuple o_shape
    cdef object o_dtype
    # None when the call returns no LSE.
    cdef tuple lse_shape


cdef object fast_key(q, k, v, out, lse_out, bias, causal, causal_alignment, window, scale,
                     softcap, return_lse, layout, num_splits)
cdef object varlen_fast_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            skip_min_seqlen_q, causal, causal_alignment, window, scale,
                            softcap, return_lse, num_splits)
cdef object run_cached(object key, q, k, v, out, lse_out, bias, cu_seqlens_q=*,
                       cu_seqlens_k=*)
cdef int remember(object key, capi.ckfmha_fwd_problem* problem, int device, tuple o_shape,
                  tuple lse_shape) except -1
