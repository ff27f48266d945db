"""CUDA stream handles from the many ways libraries spell a stream."""

from __future__ import annotations

from typing import Any

# CUDA's special handles: 0 and 1 both mean the legacy default stream, 2 the
# per-thread default stream. The interop protocols use 1 because 0 is ambiguous.
LEGACY_DEFAULT = 1
PER_THREAD_DEFAULT = 2


def stream_handle(stream: Any) -> int:
    """The cudaStream_t value of ``stream`` as an int (0 is the legacy default stream).

    Accepts None, an int handle, or an object with ``__cuda_stream__()`` (the
    CUDA stream protocol), ``.cuda_stream`` (torch) or ``.ptr`` (CuPy).
    """
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError("stream must be an int handle or a stream object, not bool")
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"stream handle must be >= 0, got {stream}")
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        value = protocol() if callable(protocol) else protocol
        # The protocol returns (version, handle).
        return int(value[1]) if isinstance(value, tuple) else int(value)
    for attribute in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attribute, None)
        if value is not None:
            return int(value)
    raise TypeError(
        f"cannot get a CUDA stream from {type(stream).__name__}: pass an int handle or an "
        "object with __cuda_stream__, .cuda_stream or .ptr"
    )


def stream_device(stream: Any) -> int | None:
    """The CUDA device ``stream`` belongs to when the object says so cheaply (torch's
    ``.device``, CuPy's ``.device_id``); None for int handles and objects that do not say."""
    device = getattr(stream, "device", None)
    if device is not None and getattr(device, "type", None) == "cuda":
        index = getattr(device, "index", None)
        return int(index) if index is not None else None
    device_id = getattr(stream, "device_id", None)
    return device_id if isinstance(device_id, int) and not isinstance(device_id, bool) else None


def same_stream(a: int, b: int) -> bool:
    """Whether two handles name the same stream (0 and 1 are both the legacy default)."""
    legacy = {0, LEGACY_DEFAULT}
    return a == b or (a in legacy and b in legacy)


def protocol_stream(handle: int) -> int:
    """The handle as the DLPack / CUDA Array Interface protocols spell it (never 0)."""
    return LEGACY_DEFAULT if handle == 0 else handle
