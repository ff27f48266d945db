"""Checks of the integer metadata the runners take: sequence offsets, length bounds, page tables.

The kernels trust these arrays: an offset past a packed tensor, a page id outside the pool or a
length past a table's capacity makes them read or write outside the caller's memory. The
runners run these checks on every host (NumPy, list, CPU) metadata array before staging it to
the device, and on device metadata copied back to the host with ``validate=True`` (or
``CKFMHA_VALIDATE=1``). Each failure is an InvalidArgumentError naming the array, the index and
the bound. Arrays that are not known on the host are passed as None and the checks that need
them are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from ckfmha.errors import InvalidArgumentError

IntArray = npt.NDArray[np.int64]


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)  # CKFMHA_ERROR_INVALID_ARGUMENT


def as_int64(values: npt.ArrayLike) -> IntArray:
    """int64 copy of integer metadata (int32 sums overflow; NumPy int32 arithmetic wraps)."""
    return np.asarray(values).astype(np.int64, copy=False)


def check_offsets(
    offsets: npt.ArrayLike, name: str, total: int, tensor: str, unit: str = "tokens"
) -> IntArray:
    """Lengths of the sequences that ``offsets`` (batch + 1 entries) delimit in a packed
    ``tensor`` of ``total`` rows (``unit``): the offsets start at 0, never decrease and end
    within it."""
    values = as_int64(offsets)
    if values.size == 0:
        return values
    if values[0] != 0:
        raise _invalid(f"{name}[0] = {values[0]}; offsets start at 0")
    lengths = np.diff(values)
    if lengths.size and lengths.min() < 0:
        i = int(np.argmax(lengths < 0)) + 1
        raise _invalid(
            f"{name}[{i}] = {values[i]} is less than {name}[{i - 1}] = "
            f"{values[i - 1]}; offsets must not decrease"
        )
    last = values.size - 1
    if values[last] > total:
        raise _invalid(f"{name}[{last}] = {values[last]} runs past the {total} {unit} of {tensor}")
    return lengths


def check_longest(lengths: IntArray, bound: int, bound_name: str, what: str) -> None:
    """``bound`` (``bound_name``) is at least every sequence's length; ``what(b)`` says where
    sequence b's length comes from."""
    if lengths.size and lengths.max() > bound:
        b = int(np.argmax(lengths > bound))
        raise _invalid(
            f"{bound_name} = {bound} is less than sequence {b}'s length "
            f"{lengths[b]} ({what.format(b=b, b1=b + 1)})"
        )


def check_cu_seqlens(
    cu_seqlens: npt.ArrayLike | None,
    name: str,
    total: int,
    tensor: str,
    max_seqlen: int | None,
    max_name: str,
) -> IntArray | None:
    """Group-mode offsets into a packed tensor and the bound of their lengths; the lengths."""
    if cu_seqlens is None:
        return None
    lengths = check_offsets(cu_seqlens, name, total, tensor)
    if max_seqlen is not None:
        check_longest(lengths, int(max_seqlen), max_name, f"{name}[{{b1}}] - {name}[{{b}}]")
    return lengths


def _first_bad_page(ids: IntArray, used: npt.NDArray[np.bool_], num_pages: int) -> tuple | None:
    bad = used & ((ids < 0) | (ids >= num_pages))
    if not bad.any():
        return None
    return tuple(int(i) for i in np.argwhere(bad)[0])


def _bad_page(name: str, index: tuple, page: int, num_pages: int) -> InvalidArgumentError:
    where = ", ".join(str(i) for i in index)
    return _invalid(
        f"{name}[{where}] = {page} is not a page id in [0, {num_pages}): the caches "
        f"hold {num_pages} pages"
    )


def check_non_negative(lengths: npt.ArrayLike, name: str) -> IntArray:
    values = as_int64(lengths)
    if values.size and values.min() < 0:
        b = int(np.argmax(values < 0))
        raise _invalid(f"{name}[{b}] = {values[b]} is negative; lengths are >= 0")
    return values


def check_lengths(
    lengths: npt.ArrayLike, name: str, capacity: npt.ArrayLike, holds: str
) -> IntArray:
    """Lengths in [0, capacity[b]]; ``holds`` says (with {b} and {b1} = b + 1) what holds
    sequence b's keys."""
    values = check_non_negative(lengths, name)
    limit = np.broadcast_to(as_int64(capacity), values.shape)
    if values.size and (values > limit).any():
        b = int(np.argmax(values > limit))
        raise _invalid(
            f"{name}[{b}] = {values[b]} exceeds the {limit[b]} keys of "
            f"{holds.format(b=b, b1=b + 1)}"
        )
    return values


def check_block_table(
    block_table: npt.ArrayLike | None,
    seqlens_k: npt.ArrayLike | None,
    *,
    batch: int,
    table_pages: int,
    page_size: int,
    num_pages: int,
    max_seqlen_k: int | None = None,
) -> None:
    """A vLLM block table [batch, table_pages] and its key counts: each length fits its row
    (table_pages x page_size keys) and every entry a sequence's keys use is a page id in
    [0, num_pages). Entries past a sequence's last page are never read, so they may hold
    anything (vLLM pads with -1)."""
    if seqlens_k is None:
        return
    lengths = check_lengths(
        seqlens_k,
        "seqlens_k",
        table_pages * page_size,
        f"block_table row {{b}} ({table_pages} pages of {page_size} keys)",
    )
    if max_seqlen_k is not None:
        check_longest(lengths, int(max_seqlen_k), "max_seqlen_k", "seqlens_k[{b}]")
    if block_table is None:
        return
    ids = as_int64(block_table).reshape(batch, table_pages)
    used = np.arange(table_pages)[None, :] < (-(-lengths // page_size))[:, None]
    bad = _first_bad_page(ids, used, num_pages)
    if bad is not None:
        raise _bad_page("block_table", bad, int(ids[bad]), num_pages)


def check_kv_indptr(
    kv_indptr: npt.ArrayLike | None,
    kv_indices: npt.ArrayLike | None,
    seqlens_k: npt.ArrayLike | None,
    *,
    indices_count: int,
    page_size: int,
    num_pages: int,
    max_seqlen_k: int | None = None,
) -> None:
    """SGLang pages: kv_indptr offsets into kv_indices (``indices_count`` entries) start at 0,
    never decrease and end within it; the ids they cover are page ids in [0, num_pages); the
    optional key counts fit each sequence's pages."""
    if kv_indptr is None:
        if seqlens_k is not None:
            check_non_negative(seqlens_k, "seqlens_k")
        return
    pages = check_offsets(kv_indptr, "kv_indptr", indices_count, "kv_indices", "page ids")
    if seqlens_k is None:
        lengths = pages * page_size
        source = f"kv_indptr[{{b1}}] - kv_indptr[{{b}}] = its pages, x {page_size}"
    else:
        lengths = check_lengths(
            seqlens_k,
            "seqlens_k",
            pages * page_size,
            f"its pages (kv_indptr[{{b1}}] - kv_indptr[{{b}}] pages of {page_size} keys)",
        )
        source = "seqlens_k[{b}]"
    if max_seqlen_k is not None:
        check_longest(lengths, int(max_seqlen_k), "max_seqlen_k", source)
    if kv_indices is None:
        return
    ids = as_int64(kv_indices)
    end = int(as_int64(kv_indptr)[-1]) if np.size(kv_indptr) else 0
    used = np.arange(ids.size) < end
    bad = _first_bad_page(ids, used, num_pages)
    if bad is not None:
        raise _bad_page("kv_indices", bad, int(ids[bad]), num_pages)


def check_append_pages(
    block_table: npt.ArrayLike | None,
    cache_seqlens: npt.ArrayLike | None,
    *,
    seqlen_new: int,
    batch: int,
    table_pages: int,
    page_size: int,
    num_pages: int,
) -> None:
    """A paged append: sequence b's new tokens, at positions cache_seqlens[b] ..
    cache_seqlens[b] + seqlen_new - 1, fit its block-table row, and the entries they land in
    are page ids in [0, num_pages)."""
    if cache_seqlens is None:
        return
    starts = check_non_negative(cache_seqlens, "cache_seqlens")
    capacity = table_pages * page_size
    if starts.size and (starts + seqlen_new > capacity).any():
        b = int(np.argmax(starts + seqlen_new > capacity))
        raise _invalid(
            f"cache_seqlens[{b}] = {starts[b]} + seqlen_new {seqlen_new} exceeds the "
            f"{capacity} tokens of block_table row {b} ({table_pages} pages of "
            f"{page_size})"
        )
    if block_table is None or seqlen_new == 0:
        return
    ids = as_int64(block_table).reshape(batch, table_pages)
    column = np.arange(table_pages)[None, :]
    used = (column >= (starts // page_size)[:, None]) & (
        column <= ((starts + seqlen_new - 1) // page_size)[:, None]
    )
    bad = _first_bad_page(ids, used, num_pages)
    if bad is not None:
        raise _bad_page("block_table", bad, int(ids[bad]), num_pages)


def check_varlen(
    cu_seqlens_q: npt.ArrayLike | None,
    cu_seqlens_k: npt.ArrayLike | None,
    *,
    total_q: int,
    total_k: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
) -> None:
    """Group mode (fwd_varlen, bwd_varlen): both offsets into q and k, and the length
    bounds."""
    check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", total_q, "q", max_seqlen_q, "max_seqlen_q")
    check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", total_k, "k", max_seqlen_k, "max_seqlen_k")


def check_paged(
    values: Mapping[str, npt.ArrayLike | None],
    *,
    indptr: bool,
    batch: int,
    table_pages: int,
    indices_count: int,
    page_size: int,
    num_pages: int,
    total_q: int | None,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
) -> None:
    """fwd_paged: the page table (``indptr``: kv_indptr and kv_indices with optional
    seqlens_k; else block_table with seqlens_k) and, for packed queries (total_q given),
    cu_seqlens_q. ``values`` maps each argument's name to its host values, None where
    unknown."""
    if indptr:
        check_kv_indptr(
            values.get("kv_indptr"),
            values.get("kv_indices"),
            values.get("seqlens_k"),
            indices_count=indices_count,
            page_size=page_size,
            num_pages=num_pages,
            max_seqlen_k=max_seqlen_k,
        )
    else:
        check_block_table(
            values.get("block_table"),
            values.get("seqlens_k"),
            batch=batch,
            table_pages=table_pages,
            page_size=page_size,
            num_pages=num_pages,
            max_seqlen_k=max_seqlen_k,
        )
    if total_q is not None:
        check_cu_seqlens(
            values.get("cu_seqlens_q"), "cu_seqlens_q", total_q, "q", max_seqlen_q, "max_seqlen_q"
        )
