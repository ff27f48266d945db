"""Results of the same kind as the inputs: torch in -> torch out, CuPy -> CuPy, and so on.

Frameworks are imported only when the caller's array already comes from them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ckfmha import _dtypes
from ckfmha._memory import DeviceArray, synchronize
from ckfmha._streams import stream_device, stream_handle
from ckfmha.errors import InvalidArgumentError


def array_kind(array: Any) -> str:
    """Where an array comes from: numpy, torch, cupy, jax, or device (anything else)."""
    if isinstance(array, np.ndarray):
        return "numpy"
    root = type(array).__module__.split(".")[0]
    if root == "torch":
        return "torch"
    if root == "cupy":
        return "cupy"
    if root in ("jax", "jaxlib"):
        return "jax"
    if isinstance(array, DeviceArray):
        return "device"
    if hasattr(array, "__dlpack_device__") and not hasattr(array, "__cuda_array_interface__"):
        device_type = array.__dlpack_device__()[0]
        return "numpy" if int(device_type) == 1 else "device"
    return "device"


def default_stream(kind: str, array: Any) -> int:
    """The stream the framework of ``array`` is currently issuing work on, on ``array``'s
    device (not the caller's current one): torch's current stream of the tensor's device;
    CuPy's current stream, read inside the call's device scope (``on_device``), where the
    arrays' device is current; else 0, the legacy default stream of that device."""
    if kind == "torch":
        from ckfmha._torch_fast import current_stream_handle

        return current_stream_handle(array.device)
    if kind == "cupy":
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    return 0


def allocate(kind: str, like: Any, shape: tuple[int, ...], dtype: int) -> Any:
    """Uninitialised device memory for an output, allocated the framework's way when it can.

    torch's caching allocator avoids a cudaMalloc (and its implicit sync) per
    call; other kinds get a DeviceArray that is converted after the launch.
    """
    if kind == "torch":
        import torch

        torch_dtype = {
            _dtypes.FP16: torch.float16,
            _dtypes.BF16: torch.bfloat16,
            _dtypes.FP32: torch.float32,
            _dtypes.INT32: torch.int32,
            _dtypes.UINT8: torch.uint8,
        }[dtype]
        return torch.empty(shape, dtype=torch_dtype, device=like.device)
    return DeviceArray(shape, _dtypes.NAMES[dtype])


def finish(kind: str, result: Any, stream: int) -> Any:
    """Convert an output allocated by ``allocate`` to the caller's kind."""
    if isinstance(result, DeviceArray):
        # Consumers on other streams must wait for the kernel that wrote it.
        result.stream = stream
        if kind == "numpy":
            synchronize(stream)
            return result.copy_to_host()
        if kind == "cupy":
            import cupy

            return cupy.from_dlpack(result)
        if kind == "jax":
            import jax.dlpack

            return jax.dlpack.from_dlpack(result)
    return result


def resolve_stream(stream: Any, kind: str, array: Any, device: int | None = None) -> int:
    """The handle a call launches on: ``stream``, or without one ``default_stream``. ``device``
    is the arrays' CUDA device (None: host data); a stream object that says it belongs to
    another device raises InvalidArgumentError naming both (an int handle cannot be asked
    cheaply: it must be a stream of the arrays' device)."""
    if stream is None:
        return default_stream(kind, array)
    if device is not None:
        owner = stream_device(stream)
        if owner is not None and owner != device:
            raise InvalidArgumentError(
                f"stream is on cuda:{owner} but the arrays are on cuda:{device}; pass a stream "
                f"of cuda:{device}, or none for the current stream of cuda:{device}",
                1,
            )
    return stream_handle(stream)
