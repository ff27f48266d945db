"""Runs a call on the GPU its arrays live on, whatever device the caller has current.

The C API launches, allocates and stages on the calling thread's current CUDA device. A call
whose arrays are all on cuda:N therefore makes cuda:N current for its duration and gives the
caller back the device it had, also when the call raises. Host (NumPy) data has no device of
its own and is staged to the current one: nothing is switched for it.
"""

from __future__ import annotations

from types import TracebackType

from ckfmha._device import current_device, set_device
from ckfmha.errors import CudaError, NoDeviceError


class on_device:
    """``with on_device(index):`` runs its body with CUDA device ``index`` current.

    ``index`` None (host data) switches nothing and queries nothing. Otherwise the current
    device is read once; when it already is ``index`` that int compare is the whole cost,
    else ``index`` is made current and the previous device restored on exit (after an
    exception too). When CUDA cannot say which device is current (no device or driver),
    nothing is switched either: the call then fails where it needs the device, as before.
    """

    __slots__ = ("_index", "_previous")

    def __init__(self, index: int | None) -> None:
        self._index = index
        self._previous: int | None = None

    def __enter__(self) -> None:
        index = self._index
        if index is None:
            return
        try:
            current = current_device()
        except (NoDeviceError, CudaError):
            return
        if current != index:
            set_device(index)
            self._previous = current

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        previous = self._previous
        if previous is not None:
            self._previous = None
            set_device(previous)
