"""Re-laying out paged KV caches between vLLM's two page layouts.

Linear pages ("flash" layout): k and v are [num_pages, page_size, nhead_k, hdim].
Vectorized pages (vLLM's older layout, fp16/bf16): k is [num_pages, nhead_k, hdim / 8,
page_size, 8] (each key's channels in chunks of 8, one 16-byte vector) and v is
[num_pages, nhead_k, hdim, page_size] (each channel's keys contiguous). Both functions take
torch tensors, NumPy or CuPy arrays (anything with ``reshape`` and either ``permute`` or
``transpose(axes)``) and return new C-contiguous arrays of the same kind; page ids and block
tables stay valid, since pages keep their index. The shape checks here
(``paged_cache_dims``, ``check_vectorized_k``) are the ones fwd_paged and append_kv apply to
their caches too.
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


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)  # CKFMHA_ERROR_INVALID_ARGUMENT


def _wrong_channels(channels: int) -> InvalidArgumentError:
    return _invalid(f"vectorized pages: k_cache's last axis holds {VECTOR_CHANNELS} channels "
                    f"(one 16-byte vector of fp16/bf16), got {channels}")


def check_vectorized_k(k_shape: tuple[int, ...], k_strides: tuple[int, ...]) -> None:
    """Vectorized K [pages, heads, hdim / 8, page_size, 8] as the kernels read it (strides in
    elements): 8 channels a vector, and each chunk's [page_size, 8] dense (token stride 8), so
    that a key's chunk is one 16-byte vector."""
    if k_shape[4] != VECTOR_CHANNELS:
        raise _wrong_channels(k_shape[4])
    if k_shape[3] > 1 and k_strides[3] != VECTOR_CHANNELS:
        raise _invalid(f"k_cache's [page_size, {VECTOR_CHANNELS}] chunks must be dense "
                       f"(token stride {VECTOR_CHANNELS}), got strides {k_strides}")


def paged_cache_dims(k_shape: tuple[int, ...], v_shape: tuple[int, ...],
                     vectorized: bool) -> tuple[int, int, int, int, int]:
    """(num_pages, page_size, nhead_k, hdim_k, hdim_v) from a paged cache's K and V shapes in
    the linear or the vectorized layout; InvalidArgumentError naming the layout if they do not
    fit it."""
    if not vectorized:
        if len(k_shape) != 4 or len(v_shape) != 4:
            raise _invalid(f"k_cache and v_cache must be 4-D [num_pages, page_size, nhead_k, "
                           f"hdim], got {k_shape} and {v_shape}")
        if v_shape[:3] != k_shape[:3]:
            raise _invalid(f"v_cache {v_shape} and k_cache {k_shape} must agree on pages, page "
                           "size and heads")
        pages, page_size, heads, hdim = k_shape
        return pages, page_size, heads, hdim, v_shape[3]
    if len(k_shape) != 5 or len(v_shape) != 4:
        raise _invalid(f"vectorized pages: k_cache must be 5-D [num_pages, nhead_k, hdim / 8, "
                       f"page_size, 8] and v_cache 4-D [num_pages, nhead_k, hdim, page_size], "
                       f"got {k_shape} and {v_shape}")
    pages, heads, chunks, page_size, channels = k_shape
    if channels != VECTOR_CHANNELS:
        raise _wrong_channels(channels)
    if (v_shape[0], v_shape[1], v_shape[3]) != (pages, heads, page_size):
        raise _invalid(f"v_cache {v_shape} and k_cache {k_shape} must agree on pages, heads and "
                       "page size")
    return pages, page_size, heads, chunks * channels, v_shape[2]


def _dims(k_cache: Any, v_cache: Any, vectorized: bool) -> tuple[int, int, int, int, int]:
    return paged_cache_dims(tuple(int(n) for n in k_cache.shape),
                            tuple(int(n) for n in v_cache.shape), vectorized)


def to_vectorized_pages(k_cache: Any, v_cache: Any) -> tuple[Any, Any]:
    """Linear pages k_cache [num_pages, page_size, nhead_k, hdim] and v_cache [num_pages,
    page_size, nhead_k, hdim_v] as vectorized pages: K [num_pages, nhead_k, hdim / 8,
    page_size, 8] and V [num_pages, nhead_k, hdim_v, page_size]."""
    pages, page_size, heads, hdim, _ = _dims(k_cache, v_cache, vectorized=False)
    if hdim % VECTOR_CHANNELS:
        raise _invalid(f"vectorized pages hold K in chunks of {VECTOR_CHANNELS} channels; hdim "
                       f"{hdim} is not a multiple of it")
    chunked = k_cache.reshape(pages, page_size, heads, hdim // VECTOR_CHANNELS, VECTOR_CHANNELS)
    return _permuted_copy(chunked, (0, 2, 3, 1, 4)), _permuted_copy(v_cache, (0, 2, 3, 1))


def to_linear_pages(k_cache: Any, v_cache: Any) -> tuple[Any, Any]:
    """Vectorized pages (K [num_pages, nhead_k, hdim / 8, page_size, 8], V [num_pages,
    nhead_k, hdim_v, page_size]) as linear pages [num_pages, page_size, nhead_k, hdim]."""
    pages, page_size, heads, hdim, _ = _dims(k_cache, v_cache, vectorized=True)
    k = _permuted_copy(k_cache, (0, 3, 1, 2, 4)).reshape(pages, page_size, heads, hdim)
    return k, _permuted_copy(v_cache, (0, 3, 1, 2))
