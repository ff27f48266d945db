# cython: language_level=3
"""The per-call fast path of ``ckfmha.fwd`` over torch tensors.

A call whose arrays and options equal an earlier successful call's (shapes, strides, dtypes
and devices of q, k, v, the outputs and an elementwise bias; mask, scale, soft-cap, LSE,
layout, split count) has nothing new to check but its pointers: the earlier call's C
problem, already validated, is reused, and only the data pointers, the stream, the outputs
and the split-KV workspace are new. That skips the Python argument handling (views, device
and dtype checks, fp8 and feature options), which costs more than the C planning and the
launches for small problems such as decode steps.

Calls with anything else (NumPy, CuPy or JAX arrays, a bias not on the GPU, ALiBi, sinks,
dropout, fp8, a forced kernel or an explicit stream, a device other than the current one)
take the full path, as does a call here whose C run fails: the full path then reports the
error (or compiles a kernel a changed selection mode needs).
"""

from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.string cimport memset

cimport ckfmha as capi
from ckfmha._torch_calls cimport (
    CallCache,
    TorchHandles,
    cuda_tensor,
    hashable,
    spec,
    spec_or_none,
    tensor_or_none,
    torch_handles,
    window_key,
)

cdef CallCache _cache = CallCache()


cdef class CachedForward(CachedCall):
    pass


cdef object fast_key(q, k, v, out, lse_out, bias, causal, causal_alignment, window, scale,
                     softcap, return_lse, layout, num_splits):
    """The cache key of a call that may take the fast path, else None. A bias must be a
    torch tensor on the GPU: the full path then reads it where it lies, with the strides the
    key holds (a host bias is staged through a copy of other strides)."""
    cdef TorchHandles torch = torch_handles()
    if torch is None:
        return None
    if not cuda_tensor(torch, q) or type(k) is not torch.tensor or type(v) is not torch.tensor:
        return None
    if not tensor_or_none(torch, out) or not tensor_or_none(torch, lse_out):
        return None
    if q.dtype is not torch.float16 and q.dtype is not torch.bfloat16 and \
            q.dtype is not torch.float32:
        return None
    if bias is not None and not cuda_tensor(torch, bias):
        return None
    window = window_key(window)
    if window is False:
        return None
    return hashable((spec(q), spec(k), spec(v), spec_or_none(out), spec_or_none(lse_out),
                     spec_or_none(bias), causal, causal_alignment, window, scale, softcap,
                     bool(return_lse), layout, num_splits))


cdef object varlen_fast_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            skip_min_seqlen_q, causal, causal_alignment, window, scale,
                            softcap, return_lse, num_splits):
    """The cache key of a group-mode call that may take the fast path, else None: its offsets
    int32 torch tensors on the GPU (the kernels read them, so only their pointers are new
    each call), no caller outputs, no bias (the full path checks them against the lengths)."""
    cdef TorchHandles torch = torch_handles()
    if torch is None:
        return None
    if not cuda_tensor(torch, q) or type(k) is not torch.tensor or type(v) is not torch.tensor:
        return None
    if q.dtype is not torch.float16 and q.dtype is not torch.bfloat16 and \
            q.dtype is not torch.float32:
        return None
    if not cuda_tensor(torch, cu_seqlens_q) or not cuda_tensor(torch, cu_seqlens_k):
        return None
    if cu_seqlens_q.dtype is not torch.int32 or cu_seqlens_k.dtype is not torch.int32:
        return None
    window = window_key(window)
    if window is False:
        return None
    # q's spec leads, as in fast_key (remember reads the output dtype there).
    return hashable((spec(q), spec(k), spec(v), spec(cu_seqlens_q), spec(cu_seqlens_k),
                     max_seqlen_q, max_seqlen_k, skip_min_seqlen_q, causal, causal_alignment,
                     window, scale, softcap, bool(return_lse), num_splits, "varlen"))


cdef int64_t _span(t):
    """Bytes from t's first element to one past its last (torch strides are never negative)."""
    cdef int64_t last = 0
    for size, stride in zip(t.shape, t.stride()):
        if size == 0:
            return 0
        last += (size - 1) * stride
    return (last + 1) * t.element_size()


cdef int remember(object key, capi.ckfmha_fwd_problem* problem, int device, tuple o_shape,
                  tuple lse_shape) except -1:
    """Keeps a successful full-path call's problem for later calls with the same key."""
    cdef CachedForward entry = CachedForward()
    entry.problem = problem[0]
    entry.device = device
    entry.o_shape = o_shape
    entry.o_dtype = key[0][2]  # q's dtype, which the output has (no fp8 here)
    entry.lse_shape = lse_shape
    _cache.put(key, entry)
    return 0


cdef bint _overlap(uintptr_t a, int64_t a_span, uintptr_t b, int64_t b_span):
    return a_span > 0 and b_span > 0 and a < b + <uintptr_t>b_span and b < a + <uintptr_t>a_span


cdef object run_cached(object key, q, k, v, out, lse_out, bias, cu_seqlens_q=None,
                       cu_seqlens_k=None):
    """The call's results through its cached problem, or None when it must take the full path
    (no entry, another current device, caller outputs that may overlap the inputs, a failed
    run). Group-mode calls pass their offsets."""
    cdef CachedForward entry = _cache.here(key)
    if entry is None:
        return None
    cdef capi.ckfmha_fwd_args args
    memset(&args, 0, sizeof(args))
    args.q = <const void*><uintptr_t>q.data_ptr()
    args.k = <const void*><uintptr_t>k.data_ptr()
    args.v = <const void*><uintptr_t>v.data_ptr()
    if bias is not None:
        args.bias = <const void*><uintptr_t>bias.data_ptr()
    if cu_seqlens_q is not None:
        args.cu_seqlens_q = <const int32_t*><uintptr_t>cu_seqlens_q.data_ptr()
        args.cu_seqlens_k = <const int32_t*><uintptr_t>cu_seqlens_k.data_ptr()
    device = q.device
    cdef TorchHandles torch = torch_handles()
    torch_empty = torch.empty
    o = torch_empty(entry.o_shape, dtype=entry.o_dtype, device=device) if out is None else out
    args.o = <void*><uintptr_t>o.data_ptr()
    lse = None
    if entry.lse_shape is not None:
        lse = (torch_empty(entry.lse_shape, dtype=torch.float32, device=device)
               if lse_out is None else lse_out)
        args.lse = <float*><uintptr_t>lse.data_ptr()
    if out is not None or lse_out is not None:
        # Caller outputs: whenever spans meet, the full path's exact check decides.
        inputs = [(<uintptr_t>args.q, _span(q)), (<uintptr_t>args.k, _span(k)),
                  (<uintptr_t>args.v, _span(v))]
        if bias is not None:
            inputs.append((<uintptr_t>args.bias, _span(bias)))
        o_span = _span(o)
        lse_span = _span(lse) if lse is not None else 0
        for start, span in inputs:
            if (_overlap(<uintptr_t>args.o, o_span, start, span) or
                    _overlap(<uintptr_t>args.lse, lse_span, start, span)):
                return None
        if _overlap(<uintptr_t>args.o, o_span, <uintptr_t>args.lse, lse_span):
            return None
    cdef size_t workspace_bytes = 0
    if capi.ckfmha_fwd_workspace_size(&entry.problem, -1, NULL,
                                      &workspace_bytes) != capi.CKFMHA_SUCCESS:
        return None
    workspace = None
    if workspace_bytes > 0:
        workspace = torch_empty((workspace_bytes,), dtype=torch.uint8, device=device)
        args.workspace = <void*><uintptr_t>workspace.data_ptr()
        args.workspace_bytes = workspace_bytes
    cdef uintptr_t stream = <uintptr_t>torch.raw_stream(entry.device)
    cdef int status
    with nogil:
        status = capi.ckfmha_fwd_run(&entry.problem, &args, NULL, <capi.ckfmha_stream_t>stream)
    if status != capi.CKFMHA_SUCCESS:
        return None
    return o if lse is None else (o, lse)


def cached_calls() -> int:
    """How many distinct calls the fast path holds (diagnostics and tests)."""
    return len(_cache)


def clear() -> None:
    """Forgets every cached call: the next call of each takes the full path."""
    _cache.clear()
