# cython: language_level=3
# Input adapters: any supported array kind -> pointer, shape, element strides, dtype.

from libc.stdint cimport uintptr_t

from ckfmha._dlpack cimport DLManagedTensor, DLManagedTensorVersioned


cdef class ArrayView:
    cdef readonly uintptr_t ptr
    cdef readonly tuple shape
    # In elements, whatever unit the source protocol used.
    cdef readonly tuple strides
    cdef readonly int dtype
    # "numpy" (staged to the device), "device" (DeviceArray), "torch" (read
    # directly), "dlpack", or "cai".
    cdef readonly str protocol
    # CUDA device index of the memory (a staged copy's device for host arrays); -1 unknown.
    cdef readonly int device
    cdef readonly object source
    # Whatever must outlive the kernel: a staged copy, the DLPack producer...
    cdef object _keepalive
    cdef DLManagedTensor* _legacy
    cdef DLManagedTensorVersioned* _versioned
