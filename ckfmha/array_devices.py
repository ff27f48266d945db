"""Where each array of a call lives, and the rule that they share one device.

A kernel runs on one GPU and dereferences every pointer it is given there: an array on another
GPU or in host memory is read as garbage or faults. The runners call ``check_devices`` before
they read or stage anything. Data tensors (q, k, v, outputs, bias, caches, gradients) are all on
one CUDA device, or all on the host (NumPy, staged to the current device and copied back).
Small host arrays (metadata, ALiBi slopes, sinks, RoPE tables) are staged like NumPy arrays; on
a GPU they must be on the data's one. The data's device need not be the current one: the
runners run the call there (``ckfmha.device_scope.on_device``) and restore the caller's device.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ckfmha._device import pointer_device
from ckfmha._memory import DeviceArray
from ckfmha.errors import InvalidArgumentError

HOST = "cpu"

# DLPack device types (the DLPack ABI): the host, CUDA memory, pinned host, managed memory.
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


def array_device(obj: Any) -> str | None:
    """ "cpu", "cuda:N", or None when an array does not say (a raw int, an unknown object,
    or a CUDA Array Interface pointer without a CUDA device to ask)."""
    if isinstance(obj, (np.ndarray, list, tuple, np.generic)):
        return HOST
    if isinstance(obj, DeviceArray):
        return f"cuda:{obj.device}"
    if type(obj).__module__.startswith("torch") and hasattr(obj, "device"):
        device = obj.device
        return f"cuda:{device.index or 0}" if device.type == "cuda" else str(device.type)
    if hasattr(obj, "__dlpack_device__"):
        kind, index = (int(x) for x in obj.__dlpack_device__())
        if kind in (_DL_CPU, _DL_CUDA_HOST):
            return HOST
        if kind in (_DL_CUDA, _DL_CUDA_MANAGED):
            return f"cuda:{index}"
        return f"DLPack device type {kind}"
    interface = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(interface, dict):
        device = pointer_device(int(interface["data"][0] or 0))
        if device is None:
            return None
        return HOST if device < 0 else f"cuda:{device}"
    return None


def check_devices(
    data: Iterable[tuple[str, Any]], small: Iterable[tuple[str, Any]] = ()
) -> int | None:
    """The CUDA device index of the call's data (None: all on the host), after checking that
    the ``data`` arrays share one device and that the ``small`` ones are on the host or on that
    device. (name, array) pairs; None arrays are skipped. The device may be any one, current or
    not: the runners make it current for the call (``ckfmha.device_scope.on_device``)."""
    placed = [(name, array_device(obj)) for name, obj in data if obj is not None]
    known = {device for _, device in placed if device is not None}
    if len(known) > 1:
        listing = ", ".join(
            f"{name} is on {device or 'an unknown device'}" for name, device in placed
        )
        raise InvalidArgumentError(
            f"arrays are on different devices: {listing}; pass them all on one CUDA device "
            "(or all as NumPy arrays, which are staged to the current one)",
            1,
        )
    data_device = next(iter(known), None)
    if data_device is not None and data_device != HOST and not data_device.startswith("cuda:"):
        raise InvalidArgumentError(
            f"{placed[0][0]} is on {data_device}; ckfmha reads CUDA or host arrays", 1
        )
    for name, obj in small:
        device = array_device(obj) if obj is not None else None
        if device is None or device == HOST or device == data_device:
            continue
        first = next(n for n, d in placed if d == data_device) if data_device else None
        where = f"{first} is on {data_device}" if first else "the data is on the host"
        raise InvalidArgumentError(
            f"{name} is on {device} but {where}; pass {name} on the "
            "data's device, or as a host array (staged)",
            1,
        )
    if data_device is None or data_device == HOST:
        return None
    return int(data_device.split(":")[1])
