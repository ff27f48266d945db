# cython: language_level=3
# DLPack ABI (v0.8 legacy tensor and v1 versioned tensor), declared from the
# published specification. The structs are defined here rather than taken from
# dlpack.h so building ckfmha needs no extra header; their layout is fixed by
# the DLPack ABI.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef enum:
    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLCUDAManaged = 13

cdef enum:
    kDLInt = 0
    kDLUInt = 1
    kDLFloat = 2
    kDLBfloat = 4
    # DLPack 1.1's fp8 codes; torch exports float8_e4m3fn with this one (bits 8).
    kDLFloat8_e4m3fn = 10

cdef enum:
    DLPACK_FLAG_BITMASK_READ_ONLY = 1

ctypedef struct DLDevice:
    int32_t device_type
    int32_t device_id

ctypedef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

ctypedef struct DLTensor:
    void* data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t* shape
    int64_t* strides
    uint64_t byte_offset

ctypedef struct DLManagedTensor:
    DLTensor dl_tensor
    void* manager_ctx
    void (*deleter)(DLManagedTensor*) noexcept nogil

ctypedef struct DLPackVersion:
    uint32_t major
    uint32_t minor

ctypedef struct DLManagedTensorVersioned:
    DLPackVersion version
    void* manager_ctx
    void (*deleter)(DLManagedTensorVersioned*) noexcept nogil
    uint64_t flags
    DLTensor dl_tensor
