# cython: language_level=3
"""What the per-call fast paths of ``ckfmha.fwd`` and ``ckfmha.bwd`` share.

A fast path keys a call by its torch tensors' shapes, strides, dtypes and devices and its
options, and keeps the C problem an earlier call with that key had checked. This module holds
torch's handles (looked up once torch is imported: ckfmha never imports torch itself), the
pieces of a key, and the bounded cache of checked problems.
"""

import sys

cimport ckfmha as capi

# Entries a cache keeps before it starts over: each distinct shape and option set of a
# process is one entry.
cdef int _CAPACITY = 256
cdef TorchHandles _handles = None


cdef class TorchHandles:
    """torch.Tensor, torch.empty, the raw current-stream getter and the dtypes the paths
    compare against."""
    pass


cdef TorchHandles torch_handles():
    """torch's handles, or None while torch is not imported (no torch tensor can have reached
    ckfmha then) or lacks the raw stream getter (the paths then stay off)."""
    global _handles
    if _handles is not None:
        return _handles
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw_stream is None:
        return None
    cdef TorchHandles handles = TorchHandles()
    handles.tensor = torch.Tensor
    handles.empty = torch.empty
    handles.raw_stream = raw_stream
    handles.float16 = torch.float16
    handles.bfloat16 = torch.bfloat16
    handles.float32 = torch.float32
    handles.uint8 = torch.uint8
    handles.int32 = torch.int32
    _handles = handles
    return handles


cdef bint cuda_tensor(TorchHandles torch, t):
    """t is a plain torch.Tensor (no subclass) on a CUDA device."""
    return type(t) is torch.tensor and t.is_cuda


cdef bint tensor_or_none(TorchHandles torch, t):
    return t is None or type(t) is torch.tensor


cdef tuple spec(t):
    return (t.shape, t.stride(), t.dtype, t.device)


cdef object spec_or_none(t):
    return None if t is None else spec(t)


cdef object window_key(window):
    """The window as a key part: None or a tuple (the torch ops pass [left, right]); False
    for anything else, which keeps the call off the fast path."""
    if window is None or type(window) is tuple:
        return window
    if type(window) is list:
        return tuple(window)
    return False


cdef object hashable(tuple key):
    """key, or None if an option in it cannot be hashed."""
    try:
        hash(key)
    except TypeError:
        return None
    return key


cdef class CachedCall:
    """A checked problem of a fast path (its subclasses hold the C problem)."""
    pass


cdef class CallCache:
    """Checked problems by call key, forgotten all at once past the capacity."""

    def __cinit__(self):
        self.entries = {}

    cdef CachedCall here(self, key):
        """The entry for key if its device is the current one, else None (a call on another
        device takes the full path, which makes the arrays' device current)."""
        cdef CachedCall entry = self.entries.get(key)
        if entry is None:
            return None
        cdef int current = -1
        if capi.ckfmha_current_device(&current) != capi.CKFMHA_SUCCESS or current != entry.device:
            return None
        return entry

    cdef int put(self, key, CachedCall entry) except -1:
        if len(self.entries) >= _CAPACITY:
            self.entries.clear()
        self.entries[key] = entry
        return 0

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        self.entries.clear()
