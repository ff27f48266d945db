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

from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memset

import sys

cimport ckfmha as capi

# Entries kept before the cache starts over: each distinct shape and option set of a process
# is one entry.
cdef int _CAPACITY = 256
cdef dict _cache = {}
cdef object _tensor_type = None
cdef object _plain_dtypes = None
cdef object _lse_dtype = None
cdef object _workspace_dtype = None
cdef object _raw_stream = None


cdef class CachedForward:
    pass


cdef bint _torch_ready():
    """Whether torch is imported (a torch tensor reached us), caching what the path needs."""
    global _tensor_type, _plain_dtypes, _lse_dtype, _workspace_dtype, _raw_stream
    if _tensor_type is not None:
        return True
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if _raw_stream is None:
        return False
    _plain_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    _lse_dtype = torch.float32
    _workspace_dtype = torch.uint8
    _tensor_type = torch.Tensor
    return True


cdef tuple _spec(t):
    return (t.shape, t.stride(), t.dtype, t.device)


cdef object fast_key(q, k, v, out, lse_out, bias, causal, causal_alignment, window, scale,
                     softcap, return_lse, layout, num_splits):
    """The cache key of a call that may take the fast path, else None. A bias must be a
    torch tensor on the GPU: the full path then reads it where it lies, with the strides the
    key holds (a host bias is staged through a copy of other strides)."""
    if not _torch_ready():
        return None
    T = _tensor_type
    if type(q) is not T or type(k) is not T or type(v) is not T:
        return None
    if (out is not None and type(out) is not T) or (lse_out is not None and
                                                    type(lse_out) is not T):
        return None
    if not q.is_cuda or q.dtype not in _plain_dtypes:
        return None
    if bias is not None and (type(bias) is not T or not bias.is_cuda):
        return None
    if window is not None and type(window) is not tuple:
        if type(window) is not list:
            return None
        window = tuple(window)  # the torch ops pass [left, right]
    key = (_spec(q), _spec(k), _spec(v), None if out is None else _spec(out),
           None if lse_out is None else _spec(lse_out), None if bias is None else _spec(bias),
           causal, causal_alignment, window, scale, softcap, bool(return_lse), layout,
           num_splits)
    try:
        hash(key)
    except TypeError:
        return None
    return key


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
    if len(_cache) >= _CAPACITY:
        _cache.clear()
    _cache[key] = entry
    return 0


cdef bint _overlap(uintptr_t a, int64_t a_span, uintptr_t b, int64_t b_span):
    return a_span > 0 and b_span > 0 and a < b + <uintptr_t>b_span and b < a + <uintptr_t>a_span


cdef object run_cached(object key, q, k, v, out, lse_out, bias):
    """The call's results through its cached problem, or None when it must take the full path
    (no entry, another current device, caller outputs that may overlap the inputs, a failed
    run)."""
    cdef CachedForward entry = _cache.get(key)
    if entry is None:
        return None
    cdef int current = -1
    if capi.ckfmha_current_device(&current) != capi.CKFMHA_SUCCESS or current != entry.device:
        return None
    cdef capi.ckfmha_fwd_args args
    memset(&args, 0, sizeof(args))
    args.q = <const void*><uintptr_t>q.data_ptr()
    args.k = <const void*><uintptr_t>k.data_ptr()
    args.v = <const void*><uintptr_t>v.data_ptr()
    if bias is not None:
        args.bias = <const void*><uintptr_t>bias.data_ptr()
    device = q.device
    torch_empty = sys.modules["torch"].empty
    o = torch_empty(entry.o_shape, dtype=entry.o_dtype, device=device) if out is None else out
    args.o = <void*><uintptr_t>o.data_ptr()
    lse = None
    if entry.lse_shape is not None:
        lse = (torch_empty(entry.lse_shape, dtype=_lse_dtype, device=device)
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
        workspace = torch_empty((workspace_bytes,), dtype=_workspace_dtype, device=device)
        args.workspace = <void*><uintptr_t>workspace.data_ptr()
        args.workspace_bytes = workspace_bytes
    cdef uintptr_t stream = <uintptr_t>_raw_stream(entry.device)
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
