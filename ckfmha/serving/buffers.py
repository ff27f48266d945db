"""Device memory a serving wrapper owns across steps: the int32 metadata every plan() rewrites in
place, and the split-KV workspace.

A captured CUDA graph holds the addresses its kernels read, so the metadata lives at fixed
addresses for the wrapper's lifetime: one allocation sized by the constructor's bounds, laid
out as

    seqlens_k [max_batch] | kv_indptr [max_batch + 1] | cu_seqlens_q [max_batch + 1]
    | kv_indices [max_pages]

(each segment starting on a 16-byte boundary). plan() fills a host copy of that layout and
queues one copy of its used prefix on the stream the graph replays on, so a replay still in
flight there reads the old step's metadata to the end and the next one reads the new step's.
The views handed to fwd_paged carry no stream of their own: a recorded stream would make
every run() on another stream (a capture's) wait on the host, which capture forbids.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckfmha._device import current_device
from ckfmha._interop import resolve_stream
from ckfmha._memory import DeviceArray, device_ptr, empty, synchronize
from ckfmha.device_scope import on_device
from ckfmha.serving.page_tables import StepPages

# int32 entries per 16 bytes: segments start on 16-byte boundaries.
_SEGMENT_ALIGN = 4
# The smallest workspace allocated: a split plan's partials start 256-byte aligned anyway.
_MIN_WORKSPACE_BYTES = 256


def _aligned(count: int) -> int:
    return -(-count // _SEGMENT_ALIGN) * _SEGMENT_ALIGN


@dataclass(frozen=True)
class MetadataViews:
    """Views of the owned metadata for one batch size, as fwd_paged takes them."""

    seqlens_k: DeviceArray  # [batch]
    kv_indptr: DeviceArray  # [batch + 1]
    cu_seqlens_q: DeviceArray  # [batch + 1]
    kv_indices: DeviceArray  # [max_pages]: kernels bound each kv_indptr range by it


def resolve_device(device: int | None) -> int:
    """The CUDA device a wrapper lives on: ``device``, or the current one."""
    return current_device() if device is None else int(device)


def plan_stream(stream: Any, device: int) -> int:
    """The handle plan() queues its copy on: ``stream``; without one, the stream run() and a
    replay would use by default: torch's current stream of ``device`` once torch has set up
    CUDA, else CuPy's current one once CuPy is loaded, else the legacy default stream (0)."""
    if stream is not None:
        return resolve_stream(stream, "device", None, device)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        from ckfmha._torch_fast import current_stream_handle

        return current_stream_handle(torch.device("cuda", device))
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with on_device(device):
            return int(cupy.cuda.get_current_stream().ptr)
    return 0


class StepBuffers:
    """The metadata and workspace of one wrapper on one device, allocated once (the
    workspace grows when a plan needs more)."""

    def __init__(self, max_batch: int, max_pages: int, device: int) -> None:
        self.device = device
        self.max_pages = max_pages
        self._indptr_at = _aligned(max_batch)
        self._cu_q_at = self._indptr_at + _aligned(max_batch + 1)
        self._indices_at = self._cu_q_at + _aligned(max_batch + 1)
        with on_device(device):
            self._memory = empty((self._indices_at + max_pages,), "int32")
        self._host = np.zeros(self._memory.shape, dtype=np.int32)
        self._views: dict[int, MetadataViews] = {}
        self.workspace: DeviceArray | None = None

    def _view(self, at: int, shape: tuple[int, ...]) -> DeviceArray:
        return device_ptr(
            self._memory.ptr + 4 * at, shape, "int32", device=self.device, owner=self._memory
        )

    def views(self, batch: int) -> MetadataViews:
        """The same views for every plan of ``batch`` sequences."""
        views = self._views.get(batch)
        if views is None:
            views = MetadataViews(
                seqlens_k=self._view(0, (batch,)),
                kv_indptr=self._view(self._indptr_at, (batch + 1,)),
                cu_seqlens_q=self._view(self._cu_q_at, (batch + 1,)),
                kv_indices=self._view(self._indices_at, (self.max_pages,)),
            )
            self._views[batch] = views
        return views

    def upload(self, pages: StepPages, cu_seqlens_q: np.ndarray | None, stream: int) -> None:
        """Queues the step's metadata on ``stream`` (values already checked to fit int32 and
        the bounds). The host copy is reused at once: pageable memory is consumed before the
        copy call returns."""
        batch = pages.batch
        host = self._host
        host[:batch] = pages.seqlens_k
        host[self._indptr_at : self._indptr_at + batch + 1] = pages.kv_indptr
        if cu_seqlens_q is not None:
            host[self._cu_q_at : self._cu_q_at + batch + 1] = cu_seqlens_q
        end = self._indices_at + pages.pages_used
        host[self._indices_at : end] = pages.kv_indices
        with on_device(self.device):
            self._view(0, (end,)).copy_from_host(host[:end], stream=stream)

    def workspace_for(self, nbytes: int, stream: int) -> DeviceArray:
        """A workspace of at least ``nbytes``: the current one, or a larger one replacing it
        once ``stream`` has finished with it."""
        workspace = self.workspace
        if workspace is None or workspace.shape[0] < nbytes:
            if workspace is not None:
                synchronize(stream)
            with on_device(self.device):
                workspace = empty((max(nbytes, _MIN_WORKSPACE_BYTES),), "uint8")
            self.workspace = workspace
        return workspace
