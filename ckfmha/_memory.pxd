# cython: language_level=3
# DeviceArray: device memory with the interop protocols other libraries consume.

from libc.stdint cimport uintptr_t


cdef class DeviceArray:
    cdef uintptr_t _ptr
    cdef readonly tuple shape
    # Strides in elements (the C API's unit), unlike NumPy's bytes.
    cdef readonly tuple strides
    cdef int _dtype
    cdef readonly int device
    cdef bint _owns
    # Keeps whatever really owns the memory alive for non-owning views.
    cdef object _base
    # Stream the last write was issued on; consumers on another stream wait for it.
    cdef public object stream

    cdef size_t _span_bytes(self)
