"""Seeded fuzz of the input checks, without a GPU.

Each draw makes random shapes and metadata (offsets, page tables, lengths, strided views); half
the draws are valid, the other half corrupted in one chosen way. Valid draws must pass the
checks; each corrupted draw must raise InvalidArgumentError naming the corrupted array. The
pure checks run on every draw; a share of the draws also goes through the runners on stand-in
device pointers (host metadata is checked before it is staged, so on a machine without a GPU a
valid call stops at NoDeviceError and an invalid one at the check).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import ckfmha
from ckfmha import errors
from ckfmha.aliasing import Region, check_no_overlap
from ckfmha.metadata_checks import (
    check_append_pages,
    check_block_table,
    check_kv_indptr,
    check_varlen,
)

SEED = 20240607
DRAWS_PER_KIND = 400
RUNNER_DRAWS_PER_KIND = 60

no_gpu = pytest.mark.skipif(
    ckfmha.device_count() > 0, reason="runner draws use stand-in pointers a GPU would dereference"
)


@dataclass
class Draw:
    """One fuzz case: the checks to call, and how the error of a corrupted draw begins (the
    corrupted array's name; None for a valid draw)."""

    check: Callable[[], Any]
    blame: str | None
    runner: Callable[[], Any] | None = None


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _corrupt_offsets(rng: np.random.Generator, offsets: np.ndarray) -> np.ndarray:
    """The offsets made to decrease somewhere (or start below 0)."""
    bad = offsets.copy()
    if bad.size < 3:
        bad[-1] = -1 - int(rng.integers(0, 3))  # a decrease from offsets[0] = 0
        return bad
    i = int(rng.integers(1, bad.size - 1))
    bad[i] = bad[i + 1] + 1 + int(rng.integers(0, 4))
    return bad


# ---- group-mode offsets ----


def _varlen_draw(rng: np.random.Generator, valid: bool) -> Draw:
    batch = int(rng.integers(0, 7))
    lens_q = rng.integers(0, 40, batch)
    lens_k = rng.integers(0, 40, batch)
    cu_q, cu_k = _offsets(lens_q), _offsets(lens_k)
    total_q = int(cu_q[-1]) + int(rng.integers(0, 4))
    total_k = int(cu_k[-1]) + int(rng.integers(0, 4))
    max_q = int(lens_q.max(initial=0)) + int(rng.integers(0, 3))
    max_k = int(lens_k.max(initial=0)) + int(rng.integers(0, 3))
    corrupted = None
    if not valid:
        choices = ["cu_seqlens_q", "cu_seqlens_k", "past_q", "past_k"]
        if lens_q.max(initial=0) > 0:
            choices.append("max_seqlen_q")
        if lens_k.max(initial=0) > 0:
            choices.append("max_seqlen_k")
        how = choices[int(rng.integers(len(choices)))]
        if how == "cu_seqlens_q" and batch > 0:
            cu_q, corrupted = _corrupt_offsets(rng, cu_q), "cu_seqlens_q"
        elif how == "cu_seqlens_k" and batch > 0:
            cu_k, corrupted = _corrupt_offsets(rng, cu_k), "cu_seqlens_k"
        elif how == "past_q" or (how == "cu_seqlens_q" and batch == 0):
            cu_q = cu_q.copy()
            cu_q[-1] = total_q + 1 + int(rng.integers(0, 5))
            corrupted = "cu_seqlens_q"
        elif how == "past_k" or how == "cu_seqlens_k":
            cu_k = cu_k.copy()
            cu_k[-1] = total_k + 1 + int(rng.integers(0, 5))
            corrupted = "cu_seqlens_k"
        elif how == "max_seqlen_q":
            max_q, corrupted = int(lens_q.max()) - 1, "max_seqlen_q"
        else:
            max_k, corrupted = int(lens_k.max()) - 1, "max_seqlen_k"

    def check() -> None:
        check_varlen(
            cu_q, cu_k, total_q=total_q, total_k=total_k, max_seqlen_q=max_q, max_seqlen_k=max_k
        )

    def runner() -> None:
        heads, hdim = 2, 64
        q = ckfmha.device_ptr(0x10000000, (total_q, heads, hdim))
        k = ckfmha.device_ptr(0x20000000, (total_k, heads, hdim))
        v = ckfmha.device_ptr(0x30000000, (total_k, heads, hdim))
        out = ckfmha.device_ptr(0x40000000, (total_q, heads, hdim))
        ckfmha.fwd_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k, out=out)

    return Draw(check, corrupted, runner)


# ---- vLLM block tables ----


def _block_table_draw(rng: np.random.Generator, valid: bool) -> Draw:
    batch = int(rng.integers(1, 6))
    page_size = int(rng.choice([1, 2, 4, 16]))
    table_pages = int(rng.integers(1, 7))
    num_pages = int(rng.integers(1, 50))
    lens = rng.integers(0, table_pages * page_size + 1, batch).astype(np.int32)
    used = -(-lens // page_size)
    table = rng.integers(0, num_pages, (batch, table_pages)).astype(np.int32)
    for b in range(batch):  # entries past a sequence's pages are padding, never read
        table[b, used[b] :] = rng.choice([-1, num_pages, 10**6])
    corrupted = None
    if not valid:
        rows = np.flatnonzero(used > 0)
        how = ["page", "negative", "length"][int(rng.integers(3))] if rows.size else "length"
        if how == "length":
            b = int(rng.integers(batch))
            lens[b] = table_pages * page_size + 1 + int(rng.integers(0, 8))
            corrupted = "seqlens_k"
        else:
            b = int(rng.choice(rows))
            j = int(rng.integers(used[b]))
            table[b, j] = (
                num_pages + int(rng.integers(0, 5))
                if how == "page"
                else -1 - int(rng.integers(0, 5))
            )
            corrupted = "block_table"

    def check() -> None:
        check_block_table(
            table,
            lens,
            batch=batch,
            table_pages=table_pages,
            page_size=page_size,
            num_pages=num_pages,
        )

    def runner() -> None:
        heads, hdim = 2, 128
        cache = (num_pages, page_size, heads, hdim)
        q = ckfmha.device_ptr(0x10000000, (batch, 4, 1, hdim), "bf16")
        k = ckfmha.device_ptr(0x20000000, cache, "bf16")
        v = ckfmha.device_ptr(0x30000000, cache, "bf16")
        out = ckfmha.device_ptr(0x40000000, (batch, 4, 1, hdim), "bf16")
        ckfmha.fwd_paged(q, k, v, block_table=table, seqlens_k=lens, out=out)

    return Draw(check, corrupted, runner)


# ---- SGLang indptr pages ----


def _indptr_draw(rng: np.random.Generator, valid: bool) -> Draw:
    batch = int(rng.integers(1, 6))
    page_size = int(rng.choice([1, 4, 16]))
    num_pages = int(rng.integers(1, 40))
    pages = rng.integers(0, 5, batch)
    indptr = _offsets(pages)
    indices = rng.integers(0, num_pages, int(indptr[-1]) + int(rng.integers(0, 3)))
    indices[int(indptr[-1]) :] = -7  # past the last sequence: never read
    indices = indices.astype(np.int32)
    lens = pages * page_size - rng.integers(0, page_size, batch).clip(0, pages * page_size)
    lens = np.maximum(lens, 0).astype(np.int32)
    corrupted = None
    if not valid:
        choices = ["decreasing", "past"]
        if indptr[-1] > 0:
            choices += ["page", "negative", "length"]
        how = choices[int(rng.integers(len(choices)))]
        if how == "decreasing":
            indptr, corrupted = _corrupt_offsets(rng, indptr), "kv_indptr"
        elif how == "past":
            indptr = indptr.copy()
            indptr[-1] = indices.size + 1 + int(rng.integers(0, 3))
            corrupted = "kv_indptr"
        elif how == "length":
            b = int(rng.choice(np.flatnonzero(pages > 0)))
            lens[b] = pages[b] * page_size + 1 + int(rng.integers(0, 5))
            corrupted = "seqlens_k"
        else:
            i = int(rng.integers(int(indptr[-1])))
            indices[i] = num_pages + int(rng.integers(0, 3)) if how == "page" else -1
            corrupted = "kv_indices"

    def check() -> None:
        check_kv_indptr(
            indptr,
            indices,
            lens,
            indices_count=indices.size,
            page_size=page_size,
            num_pages=num_pages,
        )

    def runner() -> None:
        heads, hdim = 2, 128
        cache = (num_pages, page_size, heads, hdim)
        q = ckfmha.device_ptr(0x10000000, (batch, 4, 1, hdim), "bf16")
        k = ckfmha.device_ptr(0x20000000, cache, "bf16")
        v = ckfmha.device_ptr(0x30000000, cache, "bf16")
        out = ckfmha.device_ptr(0x40000000, (batch, 4, 1, hdim), "bf16")
        ckfmha.fwd_paged(q, k, v, kv_indices=indices, kv_indptr=indptr, seqlens_k=lens, out=out)

    return Draw(check, corrupted, runner)


# ---- appends into pages ----


def _append_draw(rng: np.random.Generator, valid: bool) -> Draw:
    batch = int(rng.integers(1, 5))
    page_size = int(rng.choice([1, 4, 16]))
    table_pages = int(rng.integers(1, 6))
    num_pages = int(rng.integers(1, 40))
    capacity = table_pages * page_size
    seqlen_new = int(rng.integers(0, capacity + 1))
    starts = rng.integers(0, capacity - seqlen_new + 1, batch).astype(np.int32)
    table = rng.integers(0, num_pages, (batch, table_pages)).astype(np.int32)
    corrupted = None
    if not valid:
        if seqlen_new == 0 or rng.integers(2):
            b = int(rng.integers(batch))
            starts[b] = capacity - seqlen_new + 1 + int(rng.integers(0, 4))
            if rng.integers(4) == 0:
                starts[b] = -1
            corrupted = "cache_seqlens"
        else:
            b = int(rng.integers(batch))
            first, last = starts[b] // page_size, (starts[b] + seqlen_new - 1) // page_size
            table[b, int(rng.integers(first, last + 1))] = rng.choice([-1, num_pages])
            corrupted = "block_table"

    def check() -> None:
        check_append_pages(
            table,
            starts,
            seqlen_new=seqlen_new,
            batch=batch,
            table_pages=table_pages,
            page_size=page_size,
            num_pages=num_pages,
        )

    return Draw(check, corrupted)


# ---- outputs overlapping inputs ----


def _strided(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of `shape` with random padding, axes in a random nesting order."""
    order = rng.permutation(len(shape) - 1)
    strides = [0] * len(shape)
    strides[-1] = 1
    step = shape[-1] + int(rng.integers(0, 3)) * 8
    for axis in order:
        strides[int(axis)] = step
        step *= shape[int(axis)] + int(rng.integers(0, 2))
    return tuple(strides)


def _overlap_draw(rng: np.random.Generator, valid: bool) -> Draw:
    shape = tuple(
        int(n)
        for n in (
            rng.integers(1, 4),
            rng.integers(1, 5),
            rng.integers(1, 33),
            rng.choice([32, 64, 128]),
        )
    )
    itemsize = int(rng.choice([2, 4]))
    base = 1 << 32
    q = Region("q", base, shape, _strided(rng, shape), itemsize)
    k = Region("k", base + (1 << 26), shape, _strided(rng, shape), itemsize)
    v = Region("v", base + (2 << 26), shape, _strided(rng, shape), itemsize)
    out_strides = _strided(rng, shape)
    corrupted = None
    if valid:
        out = Region("out", base + (3 << 26), shape, out_strides, itemsize)
    else:
        victim = [q, k, v][int(rng.integers(3))]
        # Starts inside the victim's first row: both views hold that row's later elements.
        shift = int(rng.integers(0, shape[-1])) * itemsize
        out = Region("out", victim.ptr + shift, shape, out_strides, itemsize)
        corrupted = victim.name

    def check() -> None:
        check_no_overlap([out], [q, k, v])

    return Draw(check, None if corrupted is None else f"out overlaps the input {corrupted} ")


KINDS = {
    "varlen": _varlen_draw,
    "block_table": _block_table_draw,
    "kv_indptr": _indptr_draw,
    "append_pages": _append_draw,
    "overlap": _overlap_draw,
}


def _draws(kind: str, count: int, salt: int) -> list[Draw]:
    rng = np.random.default_rng([SEED, salt, list(KINDS).index(kind)])
    return [KINDS[kind](rng, valid=i % 2 == 0) for i in range(count)]


def _expect(draw: Draw, call: Callable[[], Any], valid_error: type[Exception] | None) -> None:
    if draw.blame is None:
        if valid_error is None:
            call()
        else:
            with pytest.raises(valid_error):
                call()
        return
    with pytest.raises(errors.InvalidArgumentError) as caught:
        call()
    assert str(caught.value).startswith(draw.blame), (draw.blame, str(caught.value))


@pytest.mark.parametrize("kind", list(KINDS))
def test_checks_accept_valid_and_name_corrupted_draws(kind: str) -> None:
    draws = _draws(kind, DRAWS_PER_KIND, salt=0)
    for draw in draws:
        _expect(draw, draw.check, None)
    corrupted = sum(draw.blame is not None for draw in draws)
    assert corrupted == DRAWS_PER_KIND // 2
    print(f"{kind}: {len(draws)} draws, {corrupted} corrupted")


@no_gpu
@pytest.mark.parametrize("kind", ["varlen", "block_table", "kv_indptr"])
def test_runners_reject_corrupted_host_metadata_before_staging(kind: str) -> None:
    draws = _draws(kind, RUNNER_DRAWS_PER_KIND, salt=1)
    for draw in draws:
        assert draw.runner is not None
        _expect(draw, draw.runner, errors.NoDeviceError)
