# cython: language_level=3
# Array-shape and problem-setup helpers of the forward runner that the paged and backward
# runners share.

cimport ckfmha as capi
from libc.stdint cimport int64_t

from ckfmha._arrays cimport ArrayView

cdef tuple _bhsd(tuple shape, int layout)
cdef tuple _bhs_strides(ArrayView view, int layout)
cdef tuple _in_layout(int batch, int heads, int seqlen, int hdim, int layout)
cdef int _set_strides(int64_t* dst, tuple strides) except -1
cdef tuple _qkv_views(q, k, v, handle, dtype, int ndim)
cdef int _init_problem(capi.ckfmha_fwd_problem* problem, int dtype, int layout, batch,
                       nhead_q, nhead_k, seqlen_q, seqlen_k, hdim_q, hdim_v,
                       str seqlen_q_name=*, str seqlen_k_name=*) except -1
cdef int _set_scalars(capi.ckfmha_fwd_problem* problem, causal, causal_alignment, window,
                      scale, softcap, dropout_p, num_splits) except -1
cdef int _set_tensors(capi.ckfmha_fwd_args* args, ArrayView qv, ArrayView kv, ArrayView vv,
                      ArrayView ov, ArrayView lv) except -1
cdef object _run(capi.ckfmha_fwd_problem* problem, capi.ckfmha_fwd_args* args, kernel, handle,
                 str kind, like, ArrayView workspace=*)
cdef int _offset_count(obj, str name) except -1
cdef ArrayView _offsets(obj, handle, str name, int count)
cdef int _check_outputs(out, lse_out, ArrayView ov, ArrayView lv, list inputs) except -1
cdef int _check_offsets(meta, total_q, total_k, max_seqlen_q, max_seqlen_k) except -1
cdef int _validate_offsets(meta, ArrayView cqv, ArrayView ckv, handle, total_q, total_k,
                           max_seqlen_q, max_seqlen_k) except -1
