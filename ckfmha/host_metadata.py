"""Integer metadata as the checks in ckfmha.metadata_checks see it: host arrays as the caller
gave them, device arrays copied back only when the caller asks for validation.

Host metadata is always checked (it is on the host already, before it is staged). Device
metadata is checked the same way when ``validate=True`` is passed to the runner, or
``CKFMHA_VALIDATE=1`` is set in the environment: it is then copied to the host after the call's
stream has finished its pending work (so the call waits for the GPU). Otherwise the kernels
bound it and report what they met (``DeviceMetadataError``, see ``ckfmha.check_errors``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ckfmha import _dtypes
from ckfmha._memory import DeviceArray, device_ptr, synchronize

_DL_CPU = 1  # DLPack device type of host memory


def validation_requested(validate: bool | None) -> bool:
    """``validate`` when given, else whether CKFMHA_VALIDATE=1 is set."""
    if validate is None:
        return os.environ.get("CKFMHA_VALIDATE", "") == "1"
    return bool(validate)


def host_values(obj: Any) -> np.ndarray | None:
    """Metadata the caller gave on the host (NumPy, a list or tuple, a host DLPack producer
    such as a CPU torch tensor), else None."""
    if obj is None or isinstance(obj, DeviceArray):
        return None
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, (list, tuple)):
        return np.asarray(obj)
    if hasattr(obj, "__dlpack_device__") and int(obj.__dlpack_device__()[0]) == _DL_CPU:
        try:
            return np.from_dlpack(obj)
        except (BufferError, TypeError, ValueError, RuntimeError):
            return None  # staging reports what is wrong with it
    return None


def device_values(view: Any, stream: int) -> np.ndarray:
    """A host copy of the device metadata an ArrayView points at, once ``stream`` (which may
    still be writing it) has finished."""
    synchronize(stream)
    array = device_ptr(
        view.ptr, view.shape, _dtypes.NAMES[view.dtype], view.strides, device=max(view.device, 0)
    )
    return array.copy_to_host()


class MetadataValues:
    """The host values of one call's metadata arrays, by name: host arrays at once, device
    arrays (once their views exist) when validating."""

    def __init__(self, validate: bool | None) -> None:
        self.validate = validation_requested(validate)
        self.values: dict[str, np.ndarray | None] = {}
        self.copied = False

    def given(self, name: str, obj: Any) -> np.ndarray | None:
        """Records (and returns) the host values of a metadata argument, None when it is on
        the device."""
        values = host_values(obj)
        self.values[name] = values
        return values

    def fetch(self, name: str, view: Any, stream: int) -> None:
        """Copies a device array's values back when validating (host ones are known)."""
        if view is None or not self.validate or self.values.get(name) is not None:
            return
        if view.is_staged:
            return
        self.values[name] = device_values(view, stream)
        self.copied = True

    def get(self, name: str) -> np.ndarray | None:
        return self.values.get(name)
