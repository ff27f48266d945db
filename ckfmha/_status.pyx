# cython: language_level=3
"""Turns ckfmha C status codes into Python exceptions.

Every binding calls the C function (under ``nogil`` where it may block) and
passes the returned status to ``check``, so the mapping lives only here.
"""

cimport ckfmha as capi

from ckfmha.errors import (
    BufferTooSmallError,
    CkfmhaError,
    CudaError,
    DeviceMetadataError,
    InternalError,
    InvalidArgumentError,
    NoDeviceError,
    NotFoundError,
    UnsupportedError,
)

_ERROR_CLASSES = {
    capi.CKFMHA_ERROR_INVALID_ARGUMENT: InvalidArgumentError,
    capi.CKFMHA_ERROR_UNSUPPORTED: UnsupportedError,
    capi.CKFMHA_ERROR_CUDA: CudaError,
    capi.CKFMHA_ERROR_NO_DEVICE: NoDeviceError,
    capi.CKFMHA_ERROR_BUFFER_TOO_SMALL: BufferTooSmallError,
    capi.CKFMHA_ERROR_NOT_FOUND: NotFoundError,
    capi.CKFMHA_ERROR_INTERNAL: InternalError,
    capi.CKFMHA_ERROR_DEVICE_METADATA: DeviceMetadataError,
}


def status_name(int status) -> str:
    """The C name of a status code, e.g. ``CKFMHA_ERROR_UNSUPPORTED``."""
    cdef const char* name = capi.ckfmha_status_name(status)
    return name.decode("utf-8", "replace") if name != NULL else f"status {status}"


def error_for_status(int status, str message=None) -> CkfmhaError:
    """The exception a status code maps to; the message defaults to ckfmha_last_error()."""
    if message is None:
        message = last_error() or status_name(status)
    cls = _ERROR_CLASSES.get(status, CkfmhaError)
    return cls(message, status)


def last_error() -> str:
    """The calling thread's last error message from the C library."""
    cdef const char* msg = capi.ckfmha_last_error()
    return msg.decode("utf-8", "replace") if msg != NULL else ""


cdef int check(int status) except -1:
    if status == capi.CKFMHA_SUCCESS:
        return 0
    raise error_for_status(status)


def raise_for_status(int status) -> None:
    """Raise the exception for a non-zero status; Python twin of the cdef ``check``."""
    check(status)
