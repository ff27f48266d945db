"""Serving wrappers for paged K/V attention that CUDA graphs can capture.

``BatchDecode`` (a few query tokens per sequence) and ``BatchPrefill`` (ragged query blocks)
take one step's host metadata in ``plan(...)``: key counts and page tables (a vLLM block table,
or SGLang's kv_indptr + kv_indices), checked on the host against the bounds given at
construction and copied into device buffers the wrapper owns, stream-ordered; the kernels and
the split-KV workspace are chosen there too. ``run(q, k_cache, v_cache, out=...)`` then launches
without host synchronisation or allocation, so a graph captured around it replays each later
step after a new ``plan(...)``. Works with any CUDA array kind fwd_paged takes (torch, CuPy,
ckfmha.DeviceArray, ...); no framework is imported here.
"""

from __future__ import annotations

from ckfmha.serving.decode import BatchDecode
from ckfmha.serving.prefill import BatchPrefill

__all__ = ["BatchDecode", "BatchPrefill"]
