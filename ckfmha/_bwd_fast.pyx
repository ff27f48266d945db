# cython: language_level=3
"""The per-call fast path of ``ckfmha.bwd`` over torch tensors.

A training step's backward calls ``ckfmha.bwd`` with the same shapes, strides, dtypes and
options step after step. The first such call is checked in full and its validated C problem
kept; a later call with the same key reads its pointers, allocates its gradients and
workspace (torch's caching allocator) and runs. The autograd engine runs the backward on its
own thread, where Python code runs slower than on the caller's (its interpreter state is
cold there), so the argument handling skipped here costs more than it does for the forward.

Calls with anything else take the full path: arrays that are not torch tensors, ALiBi,
sinks, dropout, a bias gradient, caller outputs, a forced kernel, an explicit stream or
dtype, another current device; so does a call here whose C run fails, and the full path then
reports the error.
"""

from libc.stdint cimport int32_t, uintptr_t
from libc.string cimport memset

cimport ckfmha as capi
from ckfmha._torch_calls cimport (
    CallCache,
    TorchHandles,
    cuda_tensor,
    hashable,
    spec,
    spec_or_none,
    torch_handles,
    window_key,
)

cdef CallCache _cache = CallCache()


cdef class CachedBackward(CachedCall):
    pass


cdef size_t workspace_words(size_t workspace_bytes):
    """The fp32 words both paths allocate for a workspace of that many bytes: whole words,
    at least one (an allocation of none would give no pointer)."""
    cdef size_t words = (workspace_bytes + 3) // 4
    return words if words > 0 else 1


cdef object fast_key(do, q, k, v, o, lse, bias, causal, causal_alignment, window, scale,
                     softcap, deterministic, layout):
    """The cache key of a call that may take the fast path, else None. A bias must be a
    torch tensor on the GPU, read where it lies with the strides the key holds."""
    cdef TorchHandles torch = torch_handles()
    if torch is None:
        return None
    cdef object T = torch.tensor
    if (not cuda_tensor(torch, q) or type(do) is not T or type(k) is not T or
            type(v) is not T or type(o) is not T or type(lse) is not T):
        return None
    if (q.dtype is not torch.float16 and q.dtype is not torch.bfloat16) or \
            lse.dtype is not torch.float32:
        return None
    if bias is not None and not cuda_tensor(torch, bias):
        return None
    window = window_key(window)
    if window is False:
        return None
    return hashable((spec(do), spec(q), spec(k), spec(v), spec(o), spec(lse),
                     spec_or_none(bias), causal, causal_alignment, window, scale, softcap,
                     bool(deterministic), layout))


cdef object varlen_fast_key(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k, causal, causal_alignment, window, scale, softcap,
                            deterministic):
    """The cache key of a group-mode call that may take the fast path, else None: its offsets
    int32 torch tensors on the GPU (the kernels read them), no bias."""
    cdef TorchHandles torch = torch_handles()
    if torch is None:
        return None
    if not cuda_tensor(torch, cu_seqlens_q) or not cuda_tensor(torch, cu_seqlens_k):
        return None
    if cu_seqlens_q.dtype is not torch.int32 or cu_seqlens_k.dtype is not torch.int32:
        return None
    key = fast_key(do, q, k, v, o, lse, None, causal, causal_alignment, window, scale, softcap,
                   deterministic, "varlen")
    if key is None:
        return None
    return hashable(key + (spec(cu_seqlens_q), spec(cu_seqlens_k), max_seqlen_q,
                           max_seqlen_k))


cdef int remember(object key, capi.ckfmha_bwd_problem* problem, int device, tuple dq_shape,
                  tuple dk_shape, tuple dv_shape) except -1:
    """Keeps a successful full-path call's problem for later calls with the same key. The
    gradients it allocated were contiguous with these shapes, and so are a cached call's,
    so the problem's gradient strides hold for them."""
    cdef CachedBackward entry = CachedBackward()
    entry.problem = problem[0]
    entry.device = device
    entry.dq_shape = dq_shape
    entry.dk_shape = dk_shape
    entry.dv_shape = dv_shape
    entry.dtype = key[1][2]  # q's dtype, which the gradients have
    _cache.put(key, entry)
    return 0


cdef object run_cached(object key, do, q, k, v, o, lse, bias, cu_seqlens_q=None,
                       cu_seqlens_k=None):
    """(dq, dk, dv) through the call's cached problem, or None when it must take the full
    path (no entry, another current device, a failed run). Group-mode calls pass their
    offsets."""
    cdef CachedBackward entry = _cache.here(key)
    if entry is None:
        return None
    cdef size_t workspace_bytes = 0
    if capi.ckfmha_bwd_workspace_size(&entry.problem, &workspace_bytes) != capi.CKFMHA_SUCCESS:
        return None
    cdef capi.ckfmha_bwd_args args
    memset(&args, 0, sizeof(args))
    args.q = <const void*><uintptr_t>q.data_ptr()
    args.k = <const void*><uintptr_t>k.data_ptr()
    args.v = <const void*><uintptr_t>v.data_ptr()
    args.o = <const void*><uintptr_t>o.data_ptr()
    args.lse = <const float*><uintptr_t>lse.data_ptr()
    args.do_ = <const void*><uintptr_t>do.data_ptr()
    if bias is not None:
        args.bias = <const void*><uintptr_t>bias.data_ptr()
    if cu_seqlens_q is not None:
        args.cu_seqlens_q = <const int32_t*><uintptr_t>cu_seqlens_q.data_ptr()
        args.cu_seqlens_k = <const int32_t*><uintptr_t>cu_seqlens_k.data_ptr()
    device = q.device
    cdef TorchHandles torch = torch_handles()
    torch_empty = torch.empty
    dq = torch_empty(entry.dq_shape, dtype=entry.dtype, device=device)
    dk = torch_empty(entry.dk_shape, dtype=entry.dtype, device=device)
    dv = torch_empty(entry.dv_shape, dtype=entry.dtype, device=device)
    args.dq = <void*><uintptr_t>dq.data_ptr()
    args.dk = <void*><uintptr_t>dk.data_ptr()
    args.dv = <void*><uintptr_t>dv.data_ptr()
    workspace = torch_empty((workspace_words(workspace_bytes),), dtype=torch.float32,
                            device=device)
    args.workspace = <void*><uintptr_t>workspace.data_ptr()
    args.workspace_bytes = workspace_bytes
    cdef uintptr_t stream = <uintptr_t>torch.raw_stream(entry.device)
    cdef int status
    with nogil:
        status = capi.ckfmha_bwd_run(&entry.problem, &args, NULL, <capi.ckfmha_stream_t>stream)
    if status != capi.CKFMHA_SUCCESS:
        return None
    return dq, dk, dv


def cached_calls() -> int:
    """How many distinct calls the fast path holds (diagnostics and tests)."""
    return len(_cache)


def clear() -> None:
    """Forgets every cached call: the next call of each takes the full path."""
    _cache.clear()
