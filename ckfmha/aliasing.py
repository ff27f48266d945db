"""Outputs must not share memory with inputs: a kernel that writes o while it reads q (out=q)
reads its own results.

A view's byte extent comes from its pointer, shape, strides and item size; views whose extents
are disjoint cannot share a byte. Views whose extents meet (two interleaved views of one buffer,
such as dq, dk and dv of a packed dqkv tensor) are compared element by element with NumPy's
exact solver, on pointer-only NumPy views that never read the memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ckfmha.errors import InvalidArgumentError

# Work bound of NumPy's exact overlap solver; past it two views count as overlapping.
_MAX_WORK = 1 << 16
# numpy.exceptions holds it since NumPy 1.25; the top-level name went in 2.0.
_TooHardError = getattr(np, "exceptions", np).TooHardError


def byte_extent(
    ptr: int, shape: Sequence[int], strides: Sequence[int], itemsize: int
) -> tuple[int, int]:
    """[first byte, one past the last byte] a strided view touches (strides in elements);
    (ptr, ptr) when it has no elements."""
    low = high = 0
    for extent, stride in zip(shape, strides):
        if extent == 0:
            return (ptr, ptr)
        reach = (extent - 1) * stride
        if reach < 0:
            low += reach
        else:
            high += reach
    return (ptr + low * itemsize, ptr + (high + 1) * itemsize)


@dataclass(frozen=True)
class Region:
    """The memory of one named array: device pointer, shape, strides in elements, item size
    and CUDA device (-1: unknown)."""

    name: str
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    itemsize: int
    device: int = -1

    @cached_property
    def extent(self) -> tuple[int, int]:
        return byte_extent(self.ptr, self.shape, self.strides, self.itemsize)

    def same_view(self, other: Region) -> bool:
        return (self.ptr, self.shape, self.strides, self.itemsize) == (
            other.ptr,
            other.shape,
            other.strides,
            other.itemsize,
        )


class _PointerOnly:
    """An __array_interface__ over memory NumPy must never read: np.shares_memory only looks
    at pointers, shapes and strides."""

    def __init__(self, region: Region) -> None:
        self.__array_interface__ = {
            "shape": region.shape,
            "typestr": f"|V{region.itemsize}",
            "data": (region.ptr, True),
            "strides": tuple(int(s) * region.itemsize for s in region.strides),
            "version": 3,
        }


def overlaps(a: Region, b: Region) -> bool:
    """Whether two views share at least one byte (views on different devices never do)."""
    if a.device >= 0 and b.device >= 0 and a.device != b.device:
        return False
    (a0, a1), (b0, b1) = a.extent, b.extent
    if a0 == a1 or b0 == b1 or a1 <= b0 or b1 <= a0:
        return False
    if a.ptr == 0 or b.ptr == 0:
        return True  # NumPy cannot describe a NULL view; the extents meet
    try:
        return bool(
            np.shares_memory(
                np.asarray(_PointerOnly(a)), np.asarray(_PointerOnly(b)), max_work=_MAX_WORK
            )
        )
    except _TooHardError:
        return True


def check_no_overlap(
    outputs: Iterable[Region], inputs: Iterable[Region], in_place: Iterable[tuple[str, str]] = ()
) -> None:
    """InvalidArgumentError naming both arrays when an output shares memory with an input or
    with another output. ``in_place`` lists (output, input) names that may be the same view
    (an in-place operation by design), though not a partial overlap."""
    outs = [r for r in outputs if r is not None]
    ins = [r for r in inputs if r is not None]
    allowed = set(in_place)
    for i, out in enumerate(outs):
        others = [(r, "input") for r in ins] + [(r, "output") for r in outs[i + 1 :]]
        for other, role in others:
            if (out.name, other.name) in allowed and out.same_view(other):
                continue
            if overlaps(out, other):
                raise InvalidArgumentError(
                    f"{out.name} overlaps the {role} {other.name} (bytes {_span(out)} and "
                    f"{_span(other)}): the kernel would read or write memory it also writes; "
                    f"pass a separate {out.name}",
                    1,
                )


def _span(region: Region) -> str:
    first, end = region.extent
    return f"{first:#x}..{end:#x}"
