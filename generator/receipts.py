"""Named kernel sets ("receipts"): which signatures to build and which tiles to use."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .signature import FwdSignature

DTYPES = ("fp16", "bf16")
HDIMS = (64, 128)
MASKS = ("none", "causal")


@dataclass(frozen=True)
class Receipt:
    name: str
    description: str
    signatures: tuple[FwdSignature, ...]
    # False: only each table's default (first) tile; True: every tile listed for the hdim.
    all_tiles: bool


def _fwd(dtype: str, hdim: int, mask: str, lse: bool = True) -> FwdSignature:
    return FwdSignature(dtype=dtype, mode="batch", hdim_q=hdim, hdim_v=hdim, mask=mask, lse=lse)


def _default_signatures(lse_options: Iterable[bool]) -> tuple[FwdSignature, ...]:
    return tuple(
        _fwd(dtype, hdim, mask, lse)
        for dtype, hdim, mask, lse in itertools.product(DTYPES, HDIMS, MASKS, lse_options)
    )


RECEIPTS: dict[str, Receipt] = {
    receipt.name: receipt
    for receipt in (
        Receipt(
            name="ci",
            description="four kernels per arch covering both dtypes, head dims and masks",
            signatures=(
                _fwd("fp16", 64, "none"),
                _fwd("fp16", 128, "causal"),
                _fwd("bf16", 64, "causal"),
                _fwd("bf16", 128, "none"),
            ),
            all_tiles=False,
        ),
        Receipt(
            name="default",
            description="{fp16,bf16} x hdim {64,128} x mask {none,causal}, with LSE, default tile",
            signatures=_default_signatures((True,)),
            all_tiles=False,
        ),
        Receipt(
            name="full",
            description="default plus no-LSE variants and every alternative tile",
            signatures=_default_signatures((True, False)),
            all_tiles=True,
        ),
    )
}


def get_receipt(name: str) -> Receipt:
    try:
        return RECEIPTS[name.strip()]
    except KeyError:
        raise ValueError(
            f"unknown kernel set {name!r}; known sets: {', '.join(RECEIPTS)}"
        ) from None


def compile_filter(pattern: str | None) -> re.Pattern[str] | None:
    """A regex searched (not fully matched) in kernel names, so 'bf16.*causal' works."""
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid kernel filter regex {pattern!r}: {exc}") from None
