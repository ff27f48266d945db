# cython: language_level=3
"""Reads pointer, shape, strides and dtype out of any array a caller can pass.

Supported: ckfmha DeviceArray, DLPack producers on a CUDA device (torch, CuPy,
JAX), objects with ``__cuda_array_interface__`` (numba, CuPy, torch), and host
arrays (NumPy, or any CPU DLPack producer), which are staged to the device with
one copy. Strides always come out in elements.
"""

from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_SetName
from libc.stdint cimport uintptr_t

from ckfmha._dlpack cimport (
    DLManagedTensor,
    DLManagedTensorVersioned,
    DLPACK_FLAG_BITMASK_READ_ONLY,
    DLTensor,
    kDLBfloat,
    kDLInt,
    kDLUInt,
    kDLCPU,
    kDLCUDA,
    kDLCUDAManaged,
    kDLFloat,
    kDLFloat8_e4m3fn,
)
from ckfmha._memory cimport DeviceArray

import numpy as np

from ckfmha import _dtypes
from ckfmha._device import pointer_device
from ckfmha._memory import contiguous_strides, from_host, synchronize
from ckfmha.aliasing import Region
from ckfmha._streams import protocol_stream, same_stream
from ckfmha.errors import InvalidArgumentError


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)


cdef class ArrayView:
    """One array as the C API sees it. Keeps its source alive until it is dropped."""

    def __cinit__(self):
        self._legacy = NULL
        self._versioned = NULL
        self.device = -1

    def __dealloc__(self):
        # We renamed the capsule when consuming it, so releasing the producer's
        # tensor is our job now.
        if self._legacy != NULL and self._legacy.deleter != NULL:
            self._legacy.deleter(self._legacy)
        if self._versioned != NULL and self._versioned.deleter != NULL:
            self._versioned.deleter(self._versioned)

    @property
    def is_staged(self) -> bool:
        return self.protocol == "numpy"

    @property
    def dtype_name(self) -> str:
        return _dtypes.NAMES[self.dtype]

    @property
    def itemsize(self) -> int:
        return _dtypes.ITEMSIZE[self.dtype]

    def region(self, str name) -> Region:
        """The memory this view covers, for the aliasing checks."""
        return Region(name, self.ptr, self.shape, self.strides, _dtypes.ITEMSIZE[self.dtype],
                      self.device)


def as_view(obj, stream=0, dtype=None, str name="array", int ndim=4, allowed=None,
            bint writable=False) -> ArrayView:
    """Adapt ``obj`` for the C API on ``stream``.

    ``dtype`` overrides what the array reports (needed when the CUDA Array
    Interface shows bf16 as an anonymous 2-byte type, and to read uint8 arrays of
    any kind as e4m3 codes). ``allowed`` lists the accepted ckfmha dtype codes;
    ``writable`` rejects read-only outputs.
    """
    cdef ArrayView view
    override = None if dtype is None else _dtypes.dtype_code(dtype)
    if isinstance(obj, DeviceArray):
        view = _from_device_array(<DeviceArray>obj, stream)
    elif isinstance(obj, np.ndarray):
        if writable:
            raise _invalid(f"{name}: a NumPy output cannot be written by the GPU; "
                           "pass device memory as out=, or let fwd allocate it")
        view = _from_host(obj, override, name, allowed)
    elif _is_torch_cuda(obj) and _torch_on_stream(obj, stream):
        view = _from_torch(obj, name)
    elif isinstance(obj, int):
        raise _invalid(f"{name}: a raw device pointer needs its shape and dtype: wrap it as "
                       "ckfmha.device_ptr(ptr, shape, dtype, strides)")
    elif hasattr(obj, "__dlpack_device__") and hasattr(obj, "__dlpack__"):
        device_type = int(obj.__dlpack_device__()[0])
        if device_type == kDLCPU:
            if writable:
                raise _invalid(f"{name}: a host output cannot be written by the GPU")
            view = _from_host(_host_numpy(obj, name), override, name, allowed)
        elif device_type in (kDLCUDA, kDLCUDAManaged):
            view = _from_dlpack(obj, stream, name, writable)
        elif hasattr(obj, "__cuda_array_interface__"):
            view = _from_cai(obj, stream, override, name, writable)
        else:
            raise _invalid(f"{name}: DLPack device type {device_type} is neither CPU nor CUDA")
    elif hasattr(obj, "__cuda_array_interface__"):
        view = _from_cai(obj, stream, override, name, writable)
    else:
        raise _invalid(
            f"{name}: cannot read a {type(obj).__module__}.{type(obj).__name__}; pass a CUDA "
            "array (DLPack or __cuda_array_interface__), a NumPy array, or ckfmha.device_ptr(...)"
        )
    view.source = obj
    if override is not None and view.dtype != override:
        # NumPy, CuPy and torch before float8 have no e4m3 type: their uint8 arrays hold codes.
        codes = view.dtype == _dtypes.UINT8 and override == _dtypes.FP8_E4M3
        if not codes and (_dtypes.ITEMSIZE[view.dtype] != _dtypes.ITEMSIZE[override]
                          or view.protocol != "cai"):
            raise _invalid(f"{name}: dtype={_dtypes.NAMES[override]} given, but the array "
                           f"holds {_dtypes.NAMES[view.dtype]}")
        view.dtype = override
    if 0 in view.shape:
        # An empty array's strides describe no memory (torch keeps an expanded tensor's zero
        # strides when it is empty): every check and launch sees contiguous ones.
        view.strides = contiguous_strides(view.shape)
    _check(view, name, ndim, allowed)
    return view


cdef int _check(ArrayView view, str name, int ndim, allowed) except -1:
    if len(view.shape) != ndim:
        raise _invalid(f"{name} must be {ndim}-D, got shape {view.shape}")
    if allowed is not None and view.dtype not in allowed:
        names = " or ".join(_dtypes.NAMES[code] for code in allowed)
        raise _invalid(f"{name} must be {names}, got {_dtypes.NAMES[view.dtype]}")
    if ndim and view.shape[-1] > 1 and view.strides[-1] != 1:
        raise _invalid(f"{name}: the last dimension must be contiguous (stride 1), got strides "
                       f"{view.strides} in elements")
    if any(stride < 0 for stride in view.strides):
        raise _invalid(f"{name}: negative strides are not supported, got {view.strides}")
    return 0


cdef ArrayView _from_device_array(DeviceArray array, stream):
    cdef ArrayView view = ArrayView.__new__(ArrayView)
    if array.stream is not None and not same_stream(array.stream, stream):
        synchronize(array.stream)
    view.ptr = array._ptr
    view.shape = array.shape
    view.strides = array.strides
    view.dtype = array._dtype
    view.device = array.device
    view.protocol = "device"
    view._keepalive = array
    return view


def _host_numpy(obj, str name):
    """A host DLPack producer as NumPy (a torch CPU tensor, ...), or why it cannot be staged."""
    try:
        return np.from_dlpack(obj)
    except (BufferError, TypeError, ValueError, RuntimeError) as why:
        raise _invalid(f"{name} is a host array NumPy cannot read ({why}); pass it on the GPU, "
                       "like the other arrays") from None


cdef ArrayView _from_host(host, override, str name, allowed):
    host = np.asarray(host)
    code = override
    if code is None:
        try:
            code = _dtypes.dtype_code(host.dtype)
        except InvalidArgumentError:
            if allowed is not None and _dtypes.BF16 not in allowed:
                names = " or ".join(_dtypes.NAMES[c] for c in allowed)
                raise _invalid(f"{name}: NumPy dtype {host.dtype} is not {names}") from None
            raise _invalid(f"{name}: NumPy dtype {host.dtype} is not fp16, bf16 or fp32 (bf16 "
                           "needs ml_dtypes, or pass uint16 bits with dtype='bf16')") from None
    if host.dtype.itemsize != _dtypes.ITEMSIZE[code]:
        raise _invalid(f"{name}: NumPy dtype {host.dtype} cannot hold {_dtypes.NAMES[code]}")
    # Checked before staging: a wrong dtype should not cost a device copy.
    if allowed is not None and code not in allowed:
        names = " or ".join(_dtypes.NAMES[c] for c in allowed)
        raise _invalid(f"{name}: NumPy dtype {host.dtype} is not {names}")
    staged = from_host(np.ascontiguousarray(host), _dtypes.NAMES[code])
    cdef ArrayView view = ArrayView.__new__(ArrayView)
    view.ptr = (<DeviceArray>staged)._ptr
    view.shape = staged.shape
    view.strides = staged.strides
    view.dtype = code
    view.device = (<DeviceArray>staged).device
    view.protocol = "numpy"
    view._keepalive = staged
    return view


# torch tensors that the kernel reads or writes on torch's current stream are
# read through their attributes: torch's __dlpack__ builds stream and event
# objects in Python on every call, tens of microseconds over q, k, v and the
# output, which short kernels cannot hide. A tensor used on another stream
# takes the DLPack path, whose contract orders that stream after the tensor's
# pending work.
cdef bint _is_torch_cuda(obj):
    return type(obj).__module__.startswith("torch") and getattr(obj, "is_cuda", False) is True


cdef bint _torch_on_stream(obj, stream):
    from ckfmha._torch_fast import current_stream_handle

    return same_stream(current_stream_handle(obj.device), stream)


cdef ArrayView _from_torch(obj, str name):
    from ckfmha._torch_fast import DTYPE_CODES

    cdef ArrayView view = ArrayView.__new__(ArrayView)
    code = DTYPE_CODES.get(obj.dtype)
    if code is None:
        raise _invalid(f"{name}: torch dtype {obj.dtype} is not fp16, bf16, fp32 or (K/V) "
                       "float8_e4m3fn")
    view.dtype = code
    view.shape = tuple(obj.shape)
    view.strides = tuple(obj.stride())
    view.ptr = <uintptr_t>obj.data_ptr()
    view.device = obj.device.index
    view.protocol = "torch"
    view._keepalive = obj
    return view


cdef int _dlpack_dtype(DLTensor* tensor, str name) except -1:
    code, bits, lanes = tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
    if lanes == 1 and code == kDLFloat and bits == 16:
        return _dtypes.FP16
    if lanes == 1 and code == kDLBfloat and bits == 16:
        return _dtypes.BF16
    if lanes == 1 and code == kDLFloat and bits == 32:
        return _dtypes.FP32
    if lanes == 1 and code == kDLInt and bits == 32:
        return _dtypes.INT32
    if lanes == 1 and code == kDLUInt and bits == 8:
        return _dtypes.UINT8
    if lanes == 1 and code == kDLFloat8_e4m3fn and bits == 8:
        return _dtypes.FP8_E4M3
    raise _invalid(f"{name}: DLPack dtype (code={code}, bits={bits}, lanes={lanes}) is not "
                   "fp16, bf16, fp32 or (K/V) float8_e4m3fn")


cdef ArrayView _from_dlpack(obj, stream, str name, bint writable):
    cdef ArrayView view = ArrayView.__new__(ArrayView)
    cdef DLTensor* tensor
    cdef int i
    try:
        # The producer makes `stream` wait for its pending writes (DLPack contract).
        capsule = obj.__dlpack__(stream=protocol_stream(stream))
    except TypeError:
        capsule = obj.__dlpack__()
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        view._versioned = <DLManagedTensorVersioned*>PyCapsule_GetPointer(
            capsule, b"dltensor_versioned")
        PyCapsule_SetName(capsule, b"used_dltensor_versioned")
        tensor = &view._versioned.dl_tensor
        if writable and view._versioned.flags & DLPACK_FLAG_BITMASK_READ_ONLY:
            raise _invalid(f"{name}: the output array is read-only")
    elif PyCapsule_IsValid(capsule, b"dltensor"):
        view._legacy = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
        PyCapsule_SetName(capsule, b"used_dltensor")
        tensor = &view._legacy.dl_tensor
    else:
        raise _invalid(f"{name}: __dlpack__ did not return an unused DLPack capsule")
    if tensor.device.device_type not in (kDLCUDA, kDLCUDAManaged):
        raise _invalid(f"{name}: DLPack tensor is on device type {tensor.device.device_type}, "
                       "not CUDA")
    view.dtype = _dlpack_dtype(tensor, name)
    shape = []
    strides = []
    for i in range(tensor.ndim):
        shape.append(tensor.shape[i])
        if tensor.strides != NULL:
            strides.append(tensor.strides[i])
    view.shape = tuple(shape)
    # DLPack before v1.0 allowed NULL strides for compact row-major tensors.
    view.strides = tuple(strides) if tensor.strides != NULL else contiguous_strides(view.shape)
    view.ptr = <uintptr_t>tensor.data + <uintptr_t>tensor.byte_offset
    view.device = tensor.device.device_id
    view.protocol = "dlpack"
    view._keepalive = obj
    return view


cdef int _cai_dtype(str typestr, override, obj, str name) except -1:
    kind_size = typestr[1:]
    if kind_size == "f2":
        return _dtypes.FP16
    if kind_size == "f4":
        return _dtypes.FP32
    if kind_size == "i4":
        return _dtypes.INT32
    if kind_size == "u1":
        return _dtypes.UINT8
    if kind_size == "V2":
        if override is not None:
            return override
        # bf16 has no typestr letter; the array's own dtype attribute may say more.
        if "bfloat16" in str(getattr(obj, "dtype", "")):
            return _dtypes.BF16
        raise _invalid(f"{name}: __cuda_array_interface__ typestr '{typestr}' is an anonymous "
                       "2-byte type; pass dtype='bf16' or dtype='fp16'")
    raise _invalid(f"{name}: typestr '{typestr}' is not fp16, bf16 or fp32")


cdef ArrayView _from_cai(obj, stream, override, str name, bint writable):
    cdef ArrayView view = ArrayView.__new__(ArrayView)
    interface = obj.__cuda_array_interface__
    if interface.get("mask") is not None:
        raise _invalid(f"{name}: masked CUDA arrays are not supported")
    address, readonly = interface["data"]
    if writable and readonly:
        raise _invalid(f"{name}: the output array is read-only")
    view.dtype = _cai_dtype(interface["typestr"], override, obj, name)
    itemsize = _dtypes.ITEMSIZE[view.dtype]
    view.shape = tuple(int(extent) for extent in interface["shape"])
    byte_strides = interface.get("strides")
    if byte_strides is None:
        view.strides = contiguous_strides(view.shape)
    else:
        if any(int(stride) % itemsize for stride in byte_strides):
            raise _invalid(f"{name}: byte strides {tuple(byte_strides)} are not multiples of "
                           f"the element size {itemsize}")
        view.strides = tuple(int(stride) // itemsize for stride in byte_strides)
    # CAI v3: a producer stream means pending writes there; without events the
    # host waits for it when it is not the stream the kernel runs on.
    producer = interface.get("stream")
    if producer is not None and not same_stream(int(producer), stream):
        synchronize(int(producer))
    view.ptr = <uintptr_t>int(address or 0)
    device = pointer_device(view.ptr) if view.ptr else None
    view.device = -1 if device is None else device
    view.protocol = "cai"
    view._keepalive = obj
    return view
