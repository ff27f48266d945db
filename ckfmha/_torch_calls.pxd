# What the per-call fast paths (_fwd_fast, _bwd_fast) share: torch's handles, the parts of a
# call's key, and the bounded cache of checked problems.

cdef class TorchHandles:
    cdef readonly object tensor
    cdef readonly object empty
    cdef readonly object raw_stream
    cdef readonly object float16
    cdef readonly object bfloat16
    cdef readonly object float32
    cdef readonly object uint8
    cdef readonly object int32


cdef TorchHandles torch_handles()
cdef bint cuda_tensor(TorchHandles torch, t)
cdef bint tensor_or_none(TorchHandles torch, t)
cdef tuple spec(t)
cdef object spec_or_none(t)
cdef object window_key(window)
cdef object hashable(tuple key)


cdef class CachedCall:
    # The device the call ran on, current when it was checked.
    cdef int device


cdef class CallCache:
    cdef dict entries
    cdef CachedCall here(self, key)
    cdef int put(self, key, CachedCall entry) except -1
