# cython: language_level=3
"""Device memory owned (or borrowed) by ckfmha, exported through CAI v3 and DLPack."""

from cpython.pycapsule cimport (
    PyCapsule_GetPointer,
    PyCapsule_IsValid,
    PyCapsule_New,
)
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

cimport ckfmha as capi
from ckfmha._dlpack cimport (
    DLManagedTensor,
    DLManagedTensorVersioned,
    DLTensor,
    kDLBfloat,
    kDLInt,
    kDLUInt,
    kDLCUDA,
    kDLFloat,
    kDLFloat8_e4m3fn,
)
from ckfmha._status cimport check

import numpy as np

from ckfmha import _dtypes
from ckfmha._streams import protocol_stream, same_stream, stream_handle
from ckfmha.errors import InvalidArgumentError


def contiguous_strides(shape) -> tuple:
    """Row-major strides, in elements, of ``shape``."""
    strides = []
    step = 1
    for extent in reversed(tuple(shape)):
        strides.append(step)
        step *= max(int(extent), 1)
    return tuple(reversed(strides))


def _checked_shape(shape) -> tuple:
    dims = tuple(int(extent) for extent in shape)
    if any(extent < 0 for extent in dims):
        raise InvalidArgumentError(f"shape must not be negative, got {dims}", 1)
    return dims


cdef class DeviceArray:
    """A strided array in CUDA device memory.

    ``DeviceArray(shape, dtype)`` allocates contiguous memory with
    ckfmha_device_malloc and frees it when the last reference goes. Views made by
    ``device_ptr`` borrow memory owned by someone else. Any CUDA library can take
    either through ``__cuda_array_interface__`` or ``__dlpack__`` without a copy.
    """

    def __cinit__(self):
        self._ptr = 0
        self._owns = False
        self.shape = ()
        self.strides = ()
        self.stream = None

    def __init__(self, shape, dtype="fp16"):
        cdef void* ptr = NULL
        cdef int device = 0
        self.shape = _checked_shape(shape)
        self.strides = contiguous_strides(self.shape)
        self._dtype = _dtypes.dtype_code(dtype)
        cdef size_t nbytes = self._span_bytes()
        check(capi.ckfmha_current_device(&device))
        if nbytes:
            with nogil:
                status = capi.ckfmha_device_malloc(&ptr, nbytes)
            check(status)
        self._ptr = <uintptr_t>ptr
        self._owns = True
        self.device = device
        # cudaMalloc'd memory is ready for every stream: nothing to wait for.
        self.stream = None

    def __dealloc__(self):
        if self._owns and self._ptr:
            # Errors cannot be raised from a destructor; a failing free means the
            # context is already gone, and the memory with it.
            capi.ckfmha_device_free(<void*>self._ptr)
            self._ptr = 0

    cdef size_t _span_bytes(self):
        """Bytes from the first element to one past the last one the strides reach."""
        if any(extent == 0 for extent in self.shape):
            return 0
        last = sum((extent - 1) * stride for extent, stride in zip(self.shape, self.strides))
        return <size_t>((last + 1) * _dtypes.ITEMSIZE[self._dtype])

    @property
    def ptr(self) -> int:
        return <object>self._ptr

    @property
    def dtype(self) -> str:
        return _dtypes.NAMES[self._dtype]

    @property
    def dtype_code(self) -> int:
        return self._dtype

    @property
    def itemsize(self) -> int:
        return _dtypes.ITEMSIZE[self._dtype]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        count = 1
        for extent in self.shape:
            count *= extent
        return count

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def owns_memory(self) -> bool:
        return bool(self._owns)

    def is_contiguous(self) -> bool:
        return self.size == 0 or all(
            extent == 1 or stride == expected
            for extent, stride, expected in zip(
                self.shape, self.strides, contiguous_strides(self.shape)
            )
        )

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"DeviceArray(shape={self.shape}, dtype={self.dtype!r}, strides={self.strides}, "
            f"ptr={self._ptr:#x}, device={self.device}, owns_memory={bool(self._owns)})"
        )

    # ---- CUDA Array Interface v3 ----

    @property
    def __cuda_array_interface__(self) -> dict:
        itemsize = self.itemsize
        typestr = _dtypes.typestr(self._dtype)
        return {
            "shape": self.shape,
            "typestr": typestr,
            "descr": [("", typestr)],
            "data": (self.ptr, False),
            "strides": None
            if self.is_contiguous()
            else tuple(stride * itemsize for stride in self.strides),
            "version": 3,
            "stream": None if self.stream is None else protocol_stream(self.stream),
        }

    # ---- DLPack ----

    def __dlpack_device__(self) -> tuple:
        return (kDLCUDA, self.device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device) != (kDLCUDA, self.device):
            raise BufferError(f"DeviceArray lives on CUDA device {self.device}; cannot export "
                              f"to device {tuple(dl_device)}")
        if copy:
            raise BufferError("DeviceArray exports zero-copy only (copy=True requested)")
        self._order_before(stream)
        if max_version is not None and tuple(max_version)[0] >= 1:
            return _export_versioned(self)
        return _export_legacy(self)

    def _order_before(self, consumer_stream):
        # Without the CUDA runtime there is no event to make the consumer's stream
        # wait on ours, so the host waits instead; only when the streams differ.
        if self.stream is None or consumer_stream == -1:
            return
        consumer = stream_handle(consumer_stream)
        if not same_stream(consumer, self.stream):
            synchronize(self.stream)

    # ---- host copies ----

    def copy_to_host(self) -> np.ndarray:
        """A NumPy copy (bf16 needs ml_dtypes; e4m3 is ml_dtypes.float8_e4m3fn, or its uint8
        codes without it). Blocks until the copy finishes."""
        host_dtype = _dtypes.numpy_dtype(self._dtype)
        self._order_before(0)
        cdef size_t nbytes = self._span_bytes()
        span = np.empty(nbytes // self.itemsize, dtype=host_dtype)
        cdef uintptr_t dst = <uintptr_t>span.ctypes.data
        if nbytes:
            with nogil:
                status = capi.ckfmha_memcpy_to_host(<void*>dst, <const void*>self._ptr, nbytes)
            check(status)
        if self.is_contiguous():
            return span.reshape(self.shape)
        view = np.lib.stride_tricks.as_strided(
            span, self.shape, tuple(s * self.itemsize for s in self.strides)
        )
        return np.array(view)

    def copy_from_host(self, array, stream=None) -> None:
        """Fill a contiguous DeviceArray from a host array of the same shape and dtype.

        Without ``stream`` the copy is done when this returns. With one (an int handle or a
        stream object: torch, CuPy, ``__cuda_stream__``) it is queued on that stream after
        the work already there, so a kernel still reading this memory on it finishes first;
        consumers on other streams wait for it (``stream`` is recorded as the last write).
        A host array in pageable memory (NumPy's) is consumed before this returns and may be
        reused at once; one in page-locked memory must stay unchanged until the stream has
        reached the copy.
        """
        cdef uintptr_t handle = 0
        if stream is not None:
            handle = <uintptr_t>stream_handle(stream)
        host = np.ascontiguousarray(array)
        if tuple(host.shape) != self.shape:
            raise InvalidArgumentError(f"shape {host.shape} does not match {self.shape}", 1)
        # Same-size integer arrays pass as raw bits (bf16 without ml_dtypes).
        if host.dtype.itemsize != self.itemsize or (
            host.dtype.kind in "fV" and _dtypes.dtype_code(host.dtype) != self._dtype
        ):
            raise InvalidArgumentError(f"dtype {host.dtype} does not match {self.dtype}", 1)
        if not self.is_contiguous():
            raise InvalidArgumentError("copy_from_host needs a contiguous DeviceArray", 1)
        cdef size_t nbytes = host.nbytes
        cdef uintptr_t src = <uintptr_t>host.ctypes.data
        if not nbytes:
            return
        if stream is None:
            with nogil:
                status = capi.ckfmha_memcpy_to_device(<void*>self._ptr, <const void*>src,
                                                      nbytes)
            check(status)
            return
        with nogil:
            status = capi.ckfmha_memcpy_to_device_async(
                <void*>self._ptr, <const void*>src, nbytes, <capi.ckfmha_stream_t>handle)
        check(status)
        self.stream = <object>handle


def device_ptr(ptr, shape, dtype="fp16", strides=None, *, device=0, owner=None) -> DeviceArray:
    """Wrap a raw device pointer (an int) as a non-owning DeviceArray.

    ``strides`` are in elements (default contiguous). ``owner`` is kept alive as
    long as the view, for memory owned by another object; otherwise the caller
    must keep the memory valid.
    """
    cdef DeviceArray view = DeviceArray.__new__(DeviceArray)
    address = int(ptr)
    if address < 0:
        raise InvalidArgumentError(f"device pointer must be >= 0, got {address}", 1)
    view.shape = _checked_shape(shape)
    view.strides = (
        contiguous_strides(view.shape) if strides is None else tuple(int(s) for s in strides)
    )
    if len(view.strides) != len(view.shape):
        raise InvalidArgumentError(f"strides {view.strides} do not match shape {view.shape}", 1)
    view._dtype = _dtypes.dtype_code(dtype)
    view._ptr = <uintptr_t>address
    view._owns = False
    view._base = owner
    view.device = int(device)
    return view


def empty(shape, dtype="fp16") -> DeviceArray:
    """Uninitialised contiguous device memory."""
    return DeviceArray(shape, dtype)


def from_host(array, dtype=None) -> DeviceArray:
    """Copy a NumPy array (fp16, bf16 via ml_dtypes, or fp32) to new device memory.

    ``dtype`` reinterprets the bytes, e.g. uint16 bit patterns as "bf16", or uint8 e4m3 codes
    as "fp8_e4m3".
    """
    host = np.ascontiguousarray(array)
    result = DeviceArray(host.shape, host.dtype if dtype is None else dtype)
    result.copy_from_host(host)
    return result


def synchronize(stream=None) -> None:
    """Block until all work issued on ``stream`` (default: legacy default stream) finished."""
    cdef uintptr_t handle = <uintptr_t>stream_handle(stream)
    with nogil:
        status = capi.ckfmha_stream_synchronize(<capi.ckfmha_stream_t>handle)
    check(status)


def check_errors(device=None, synchronize=True) -> None:
    """Raise ``DeviceMetadataError`` if kernels on ``device`` (default: the current one) met
    out-of-range device metadata (``cu_seqlens``, page ids, key counts) since the last check.

    Every call checks this itself before it launches, without waiting, so it reports kernels
    that have finished by then; this one first waits for all work on the device
    (``synchronize=False``: no wait). The record is cleared once raised.
    """
    cdef int index = -1 if device is None else int(device)
    cdef int wait = 1 if synchronize else 0
    with nogil:
        status = capi.ckfmha_check_device_errors(index, wait)
    check(status)


# ---- DLPack export ----
# One malloc holds the managed tensor followed by its shape and strides, so the
# deleter frees everything at once. manager_ctx owns a reference to the array.

cdef int _fill_tensor(DLTensor* tensor, DeviceArray array, int64_t* dims) except -1:
    cdef int ndim = len(array.shape)
    cdef int i
    tensor.data = <void*>array._ptr
    tensor.device.device_type = kDLCUDA
    tensor.device.device_id = array.device
    tensor.ndim = ndim
    tensor.dtype.code = {_dtypes.BF16: kDLBfloat, _dtypes.INT32: kDLInt,
                         _dtypes.UINT8: kDLUInt,
                         _dtypes.FP8_E4M3: kDLFloat8_e4m3fn}.get(array._dtype, kDLFloat)
    tensor.dtype.bits = 8 * _dtypes.ITEMSIZE[array._dtype]
    tensor.dtype.lanes = 1
    tensor.shape = dims
    tensor.strides = dims + ndim
    tensor.byte_offset = 0
    for i in range(ndim):
        dims[i] = array.shape[i]
        dims[ndim + i] = array.strides[i]
    return 0


cdef void _delete_legacy(DLManagedTensor* managed) noexcept nogil:
    with gil:
        Py_DECREF(<object>managed.manager_ctx)
    free(managed)


cdef void _delete_versioned(DLManagedTensorVersioned* managed) noexcept nogil:
    with gil:
        Py_DECREF(<object>managed.manager_ctx)
    free(managed)


cdef void _capsule_legacy(object capsule) noexcept:
    # A consumer renames the capsule when it takes ownership; only an unconsumed
    # capsule still owns the tensor.
    if PyCapsule_IsValid(capsule, b"dltensor"):
        managed = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
        managed.deleter(managed)


cdef void _capsule_versioned(object capsule) noexcept:
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        managed = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        managed.deleter(managed)


cdef object _export_legacy(DeviceArray array):
    cdef int ndim = len(array.shape)
    cdef size_t head = sizeof(DLManagedTensor)
    cdef DLManagedTensor* managed = <DLManagedTensor*>malloc(head + 2 * ndim * sizeof(int64_t))
    if managed == NULL:
        raise MemoryError()
    memset(managed, 0, head)
    _fill_tensor(&managed.dl_tensor, array, <int64_t*>((<char*>managed) + head))
    Py_INCREF(array)
    managed.manager_ctx = <void*>array
    managed.deleter = _delete_legacy
    return PyCapsule_New(managed, b"dltensor", _capsule_legacy)


cdef object _export_versioned(DeviceArray array):
    cdef int ndim = len(array.shape)
    cdef size_t head = sizeof(DLManagedTensorVersioned)
    cdef DLManagedTensorVersioned* managed = <DLManagedTensorVersioned*>malloc(
        head + 2 * ndim * sizeof(int64_t))
    if managed == NULL:
        raise MemoryError()
    memset(managed, 0, head)
    managed.version.major = 1
    managed.version.minor = 0
    _fill_tensor(&managed.dl_tensor, array, <int64_t*>((<char*>managed) + head))
    Py_INCREF(array)
    managed.manager_ctx = <void*>array
    managed.deleter = _delete_versioned
    return PyCapsule_New(managed, b"dltensor_versioned", _capsule_versioned)
