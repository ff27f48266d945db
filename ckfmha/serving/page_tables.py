"""One step's host page tables, checked and reduced to the form the serving wrappers keep on
the device: each sequence's key count, kv_indptr offsets, and the page ids its keys use.

A vLLM block table [batch, max_pages_per_seq] and SGLang's kv_indptr + kv_indices describe the
same thing; keeping only the second on the device means a step copies the page ids its
sequences use (sum over b of ceil(seqlens_k[b] / page_size)), not a table row of the longest
sequence's capacity per sequence, and the views a captured graph reads keep one shape whichever
form the caller plans with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ckfmha.errors import InvalidArgumentError
from ckfmha.host_metadata import host_values
from ckfmha.metadata_checks import as_int64, check_block_table, check_kv_indptr, check_offsets

IntArray = npt.NDArray[np.int64]

# Page ids are int32: without the caches' page count, only negative ids can be told apart.
_INT32_MAX = 2**31 - 1


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)


@dataclass(frozen=True)
class StepPages:
    """Sequence b's keys are the first seqlens_k[b] tokens of pages
    kv_indices[kv_indptr[b] : kv_indptr[b + 1]], in order."""

    seqlens_k: IntArray  # [batch]
    kv_indptr: IntArray  # [batch + 1], from 0
    kv_indices: IntArray  # [kv_indptr[-1]]

    @property
    def batch(self) -> int:
        return int(self.seqlens_k.size)

    @property
    def pages_used(self) -> int:
        return int(self.kv_indices.size)


def host_ints(obj: Any, name: str, ndim: int) -> IntArray:
    """``obj`` as int64 host values of ``ndim`` axes, or why it cannot be planned with."""
    values = host_values(obj)
    if values is None:
        raise _invalid(
            f"{name} must be host metadata (NumPy, a list, a CPU tensor): plan() checks it "
            f"and copies it into the device buffers the wrapper owns; got "
            f"{type(obj).__module__}.{type(obj).__name__}"
        )
    if values.ndim != ndim:
        raise _invalid(f"{name} must be {ndim}-D, got shape {tuple(values.shape)}")
    if values.size and not np.issubdtype(values.dtype, np.integer):
        raise _invalid(f"{name} must hold integers, got {values.dtype}")
    return as_int64(values)


def step_pages(
    *,
    block_table: Any,
    seqlens_k: Any,
    kv_indptr: Any,
    kv_indices: Any,
    page_size: int,
    num_pages: int | None,
) -> StepPages:
    """The pages of a vLLM block table with seqlens_k, or of SGLang's kv_indptr + kv_indices
    (seqlens_k optional: default every key of the pages), after the checks fwd_paged runs on
    host metadata (lengths fit their pages; page ids in [0, num_pages))."""
    indptr_form = kv_indices is not None or kv_indptr is not None
    if indptr_form == (block_table is not None):
        raise _invalid(
            "pass block_table (vLLM) or kv_indices with kv_indptr (SGLang), not both and not "
            "neither"
        )
    if indptr_form and (kv_indices is None or kv_indptr is None):
        raise _invalid("kv_indices and kv_indptr go together")
    if block_table is not None and seqlens_k is None:
        raise _invalid("block_table needs seqlens_k (the key count of each sequence)")
    pool = _INT32_MAX if num_pages is None else int(num_pages)
    lengths = None if seqlens_k is None else host_ints(seqlens_k, "seqlens_k", 1)
    if indptr_form:
        indptr = host_ints(kv_indptr, "kv_indptr", 1)
        indices = host_ints(kv_indices, "kv_indices", 1)
        return _from_indptr(indptr, indices, lengths, page_size, pool)
    assert lengths is not None
    return _from_block_table(host_ints(block_table, "block_table", 2), lengths, page_size, pool)


def _from_block_table(
    table: IntArray, lengths: IntArray, page_size: int, num_pages: int
) -> StepPages:
    batch, table_pages = table.shape
    if lengths.shape != (batch,):
        raise _invalid(
            f"seqlens_k must hold one length per block_table row ({batch}), got shape "
            f"{tuple(lengths.shape)}"
        )
    check_block_table(
        table,
        lengths,
        batch=batch,
        table_pages=table_pages,
        page_size=page_size,
        num_pages=num_pages,
    )
    counts = -(-lengths // page_size)
    used = np.arange(table_pages)[None, :] < counts[:, None]
    indptr = np.concatenate([[0], np.cumsum(counts)])
    return StepPages(seqlens_k=lengths, kv_indptr=indptr, kv_indices=table[used])


def _from_indptr(
    indptr: IntArray,
    indices: IntArray,
    lengths: IntArray | None,
    page_size: int,
    num_pages: int,
) -> StepPages:
    if indptr.size < 1:
        raise _invalid("kv_indptr must hold batch + 1 >= 1 offsets, got none")
    batch = indptr.size - 1
    if lengths is not None and lengths.shape != (batch,):
        raise _invalid(
            f"seqlens_k must hold one length per sequence (kv_indptr has {batch}), got shape "
            f"{tuple(lengths.shape)}"
        )
    check_kv_indptr(
        indptr,
        indices,
        lengths,
        indices_count=indices.size,
        page_size=page_size,
        num_pages=num_pages,
    )
    pages = check_offsets(indptr, "kv_indptr", indices.size, "kv_indices", "page ids")
    return StepPages(
        seqlens_k=pages * page_size if lengths is None else lengths,
        kv_indptr=indptr,
        kv_indices=indices[: int(indptr[-1])],
    )
