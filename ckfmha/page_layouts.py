"""Re-laying out paged KV caches between vLLM's two page layouts.

Linear pages ("flash" layout): k and v are [num_pages, page_size, nhead_k, hdim].
Vectorized pages (vLLM's older layout, fp16/bf16): k is [num_pages, nhead_k, hdim / 8,
page_size, 8] (each key's channels in chunks of 8, one 16-byte vector) and v is
[num_pages, nhead_k, hdim, page_size] (each channel's keys contiguous). Both functions take
torch tensors, NumPy or CuPy arrays (anything with ``reshape`` and either ``permute`` or
``transpose(axes)``) and return new C-contiguous arrays of the same kind; page ids and block
tables stay valid, since pages keep their index.
"""

from __future__ import annotations

from typing import Any

from ckfmha.errors import InvalidArgumentError

# Channels in one K vector of a vectorized page: 16 bytes of fp16/bf16.
VECTOR_CHANNELS = 8


def _permuted_copy(array: Any, axes: tuple[int, ...]) -> Any:
    """A C-contiguous copy of `array` with its axes in `axes` order."""
    if hasattr(array, "permute"):  # torch
        return array.permute(*axes).contiguous()
    return array.transpose(axes).copy()  # NumPy, CuPy: copy() is C order


def _shape(array: Any, name: str, ndim: int, layout: str) -> tuple[int, ...]:
    shape = tuple(int(n) for n in array.shape)
    if len(shape) != ndim:
        raise InvalidArgumentError(f"{name} must be {ndim}-D {layout}, got shape {shape}")
    return shape


def to_vectorized_pages(k_cache: Any, v_cache: Any) -> tuple[Any, Any]:
    """Linear pages k_cache [num_pages, page_size, nhead_k, hdim] and v_cache [num_pages,
    page_size, nhead_k, hdim_v] as vectorized pages: K [num_pages, nhead_k, hdim / 8,
    page_size, 8] and V [num_pages, nhead_k, hdim_v, page_size]."""
    pages, page_size, heads, hdim = _shape(k_cache, "k_cache", 4,
                                           "[num_pages, page_size, nhead_k, hdim]")
    v_shape = _shape(v_cache, "v_cache", 4, "[num_pages, page_size, nhead_k, hdim_v]")
    if v_shape[:3] != (pages, page_size, heads):
        raise InvalidArgumentError(f"v_cache {v_shape} and k_cache {k_cache.shape} must agree "
                                   "on pages, page size and heads")
    if hdim % VECTOR_CHANNELS:
        raise InvalidArgumentError(f"vectorized pages hold K in chunks of {VECTOR_CHANNELS} "
                                   f"channels; hdim {hdim} is not a multiple of it")
    chunked = k_cache.reshape(pages, page_size, heads, hdim // VECTOR_CHANNELS, VECTOR_CHANNELS)
    return _permuted_copy(chunked, (0, 2, 3, 1, 4)), _permuted_copy(v_cache, (0, 2, 3, 1))


def to_linear_pages(k_cache: Any, v_cache: Any) -> tuple[Any, Any]:
    """Vectorized pages (K [num_pages, nhead_k, hdim / 8, page_size, 8], V [num_pages,
    nhead_k, hdim_v, page_size]) as linear pages [num_pages, page_size, nhead_k, hdim]."""
    pages, heads, chunks, page_size, width = _shape(
        k_cache, "k_cache", 5, "[num_pages, nhead_k, hdim / 8, page_size, 8]")
    v_shape = _shape(v_cache, "v_cache", 4, "[num_pages, nhead_k, hdim_v, page_size]")
    if width != VECTOR_CHANNELS:
        raise InvalidArgumentError(f"k_cache's last axis holds {VECTOR_CHANNELS} channels in "
                                   f"vectorized pages, got {width}")
    if (v_shape[0], v_shape[1], v_shape[3]) != (pages, heads, page_size):
        raise InvalidArgumentError(f"v_cache {v_shape} and k_cache {k_cache.shape} must agree "
                                   "on pages, heads and page size")
    k = _permuted_copy(k_cache, (0, 3, 1, 2, 4)).reshape(pages, page_size, heads,
                                                         chunks * width)
    return k, _permuted_copy(v_cache, (0, 3, 1, 2))
