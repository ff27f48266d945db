"""Cheap reads of torch tensors and streams for the per-call path.

Imported only once a torch tensor reaches ckfmha, so torch stays optional.
"""

from __future__ import annotations

from typing import Any

import torch

from ckfmha import _dtypes

DTYPE_CODES: dict[Any, int] = {
    torch.float16: _dtypes.FP16,
    torch.bfloat16: _dtypes.BF16,
    torch.float32: _dtypes.FP32,
    torch.int32: _dtypes.INT32,
    torch.uint8: _dtypes.UINT8,
}
# fp8 K/V caches; torch has had float8_e4m3fn since 2.1.
if hasattr(torch, "float8_e4m3fn"):
    DTYPE_CODES[torch.float8_e4m3fn] = _dtypes.FP8_E4M3

# torch.cuda.current_stream() builds a Stream object per call; the raw getter
# returns the handle alone. It is private API, so the public one stays the fallback.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream_handle(device: Any) -> int:
    """The cudaStream_t torch is issuing work on for ``device``, as an int."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _raw_stream is not None:
        return int(_raw_stream(index))
    return int(torch.cuda.current_stream(device).cuda_stream)
