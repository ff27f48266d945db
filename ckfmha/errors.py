"""Exceptions raised by ckfmha; each C status code maps to one class (see _status.pyx)."""

from __future__ import annotations


class CkfmhaError(Exception):
    """Base class of every error reported by the ckfmha C library.

    ``status`` holds the C status code (``ckfmha_status``) that produced it.
    """

    def __init__(self, message: str, status: int = 7) -> None:
        super().__init__(message)
        self.status = status


class InvalidArgumentError(CkfmhaError, ValueError):
    """Malformed problem or arguments: shapes, strides, dtypes, pointers."""


class UnsupportedError(CkfmhaError, NotImplementedError):
    """Well-formed problem that no compiled kernel covers (head dim, dtype, arch...).

    A NotImplementedError because the request is valid, only not implemented by
    any kernel in the registry; building one with ``ckfmha.jit`` may fix it.
    """


class DeviceMetadataError(InvalidArgumentError):
    """An earlier call's kernels met device metadata (``cu_seqlens``, page ids, key counts)
    that pointed outside the buffers. They read and wrote nothing there, but the outputs of
    the sequences named in the message are undefined. Raised by the next call on that device
    or by ``ckfmha.check_errors()``; the record is then clear, so the process goes on."""


class CudaError(CkfmhaError, RuntimeError):
    """A CUDA runtime call failed (launch failure, out of memory, bad pointer)."""


class NoDeviceError(CkfmhaError, RuntimeError):
    """No usable CUDA device (no GPU, no driver, or the driver is too old)."""


class BufferTooSmallError(CkfmhaError):
    """A caller-provided output buffer was too small; the message gives the size."""


class NotFoundError(CkfmhaError, LookupError):
    """A named kernel or a kernel module was not found."""


class InternalError(CkfmhaError, RuntimeError):
    """A bug in ckfmha: please report it with the message."""
