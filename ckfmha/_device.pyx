# cython: language_level=3
"""Devices and the library version, through the C API (no CUDA runtime linked here)."""

from libc.stdint cimport uintptr_t

cimport ckfmha as capi
from ckfmha._status cimport check

from ckfmha.errors import CudaError, NoDeviceError


def device_count() -> int:
    """Number of usable CUDA devices; 0 without a GPU or driver (never raises for that)."""
    cdef int count = 0
    cdef int status
    with nogil:
        status = capi.ckfmha_device_count(&count)
    try:
        check(status)
    except (NoDeviceError, CudaError):
        return 0
    return count


def current_device() -> int:
    """The CUDA device the calling thread launches on."""
    cdef int device = 0
    check(capi.ckfmha_current_device(&device))
    return device


def set_device(device) -> None:
    """Makes ``device`` current for the calling thread (cudaSetDevice); InvalidArgumentError
    naming the valid range when it does not exist."""
    cdef int index = int(device)
    check(capi.ckfmha_set_device(index))


def pointer_device(ptr) -> object:
    """The CUDA device whose memory ``ptr`` points into, -1 for host memory CUDA does not know,
    or None when CUDA cannot say (no device or driver, or a pointer it rejects)."""
    cdef int device = -1
    cdef uintptr_t address = <uintptr_t>int(ptr)
    cdef int status
    with nogil:
        status = capi.ckfmha_pointer_device(<const void*>address, &device)
    return device if status == capi.CKFMHA_SUCCESS else None


def device_arch(device=None) -> int:
    """Compute capability as 10*major+minor (90 for H100) of ``device`` or the current one."""
    cdef int arch = 0
    cdef int index = current_device() if device is None else int(device)
    check(capi.ckfmha_device_arch(index, &arch))
    return arch


def version() -> tuple:
    """Version of the loaded libckfmha as (major, minor, patch)."""
    cdef int major = 0, minor = 0, patch = 0
    check(capi.ckfmha_version(&major, &minor, &patch))
    return (major, minor, patch)


def header_version() -> tuple:
    """Version of the ckfmha.h this extension was compiled against."""
    return (capi.CKFMHA_VERSION_MAJOR, capi.CKFMHA_VERSION_MINOR, capi.CKFMHA_VERSION_PATCH)
