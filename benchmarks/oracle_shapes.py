"""Problems for the selection oracle (oracle.py): shapes drawn to cover what models use.

Forward and backward problems take 8-64 query heads with GQA groups of 1, 2, 4 and 8, lengths
from 64 to 32k drawn log-uniformly (mostly not powers of two, a few with seqlen_q != seqlen_k),
head dims 64, 96, 128, 192x128 and 256, no mask or a causal one, and a batch that keeps the
work per problem bounded. Decode problems take one query token per sequence, batch 1-256 and
256-128k keys. Draws are seeded, so a list is the same on every machine.

Problems are broad_cases.BroadCase values (its label, group and FLOP count apply). Whole head
counts and a band of lengths are held out (``held_out``): a model trained on the
rest is judged on shapes it has not seen, not on random neighbours of its training shapes.
"""

from __future__ import annotations

import math
import random
from typing import Any

from broad_cases import BroadCase

KINDS = ("fwd", "decode", "bwd")
HEADS = (8, 12, 16, 24, 32, 40, 64)
GROUPS = (1, 2, 4, 8)
HDIMS = ((64, 64), (96, 96), (128, 128), (192, 128), (256, 256))
# One dtype: fp16 runs the same tiles and templates at the same speed, so it would double the
# timing without adding a choice.
DTYPE = "bf16"
# Held out of training: every problem with these query-head counts or with its key length in
# this band.
HELD_OUT_HEADS = frozenset({12, 40})
HELD_OUT_KEYS = (3000, 5000)
# The batch: at most this many (query, key) pairs over the batch and query heads (and at least
# one sequence, so the longest lengths with many heads go past it), and for decode at most this
# many keys over the batch.
MAX_PAIRS = 1 << 31
MAX_DECODE_KEYS = 1 << 24
# Decode K/V bytes (both tensors, 2-byte elements) stay under this, so the largest fit a GPU.
MAX_DECODE_KV_BYTES = 16 << 30


def held_out(problem: BroadCase) -> bool:
    """Whether `problem` is kept out of training: its head count or its key length."""
    low, high = HELD_OUT_KEYS
    return problem.nhead_q in HELD_OUT_HEADS or low <= problem.seqlen_k < high


def mask_options(problem: BroadCase) -> dict[str, Any]:
    """The mask as ckfmha.fwd/bwd take it (causal masks with unequal lengths align
    bottom-right, BroadCase's convention)."""
    if not problem.causal:
        return {}
    return {"causal": True, "causal_alignment": problem.causal_alignment}


def problem_fields(problem: BroadCase) -> dict[str, Any]:
    """The dispatcher's problem fields (Dispatcher.explain / explain_bwd keywords)."""
    return {"batch": problem.batch, "nhead_q": problem.nhead_q, "nhead_k": problem.nhead_k,
            "seqlen_q": problem.seqlen_q, "seqlen_k": problem.seqlen_k, "hdim": problem.hdim,
            "hdim_v": problem.hdim_v, "dtype": problem.dtype, **mask_options(problem)}  # fmt: skip


def problem_record(problem: BroadCase) -> dict[str, Any]:
    """The problem's CSV columns."""
    return {"kind": problem.kind, "held_out": held_out(problem), "dtype": problem.dtype,
            "batch": problem.batch, "nhead_q": problem.nhead_q, "nhead_k": problem.nhead_k,
            "group": problem.group, "seqlen_q": problem.seqlen_q, "seqlen_k": problem.seqlen_k,
            "hdim": problem.hdim, "hdim_v": problem.hdim_v, "causal": problem.causal}  # fmt: skip


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


def _heads(rng: random.Random) -> tuple[int, int]:
    nhead_q = rng.choice(HEADS)
    group = rng.choice([g for g in GROUPS if nhead_q % g == 0])
    return nhead_q, nhead_q // group


def _prefill(rng: random.Random, kind: str) -> BroadCase:
    nhead_q, nhead_k = _heads(rng)
    hdim, hdim_v = rng.choice(HDIMS)
    seqlen_k = _log_uniform(rng, 64, 32768)
    # One problem in five has its own query length (causal ones align bottom-right).
    seqlen_q = _log_uniform(rng, 64, seqlen_k) if rng.random() < 0.2 else seqlen_k
    batch = max(1, min(64, MAX_PAIRS // (seqlen_q * seqlen_k * nhead_q)))
    batch = rng.randint(max(1, batch // 2), batch)
    return BroadCase(kind, batch, nhead_q, nhead_k, seqlen_q, seqlen_k, hdim, hdim_v,
                     rng.random() < 0.5, DTYPE)  # fmt: skip


def _decode(rng: random.Random) -> BroadCase:
    nhead_q, nhead_k = _heads(rng)
    hdim = rng.choice((64, 128, 128, 256))  # d128 is what most served models use
    seqlen_k = _log_uniform(rng, 256, 131072)
    batch = min(_log_uniform(rng, 1, 256), max(1, MAX_DECODE_KEYS // seqlen_k))
    batch = min(batch, max(1, MAX_DECODE_KV_BYTES // (4 * seqlen_k * nhead_k * hdim)))
    return BroadCase("decode", batch, nhead_q, nhead_k, 1, seqlen_k, hdim, hdim, False,
                     DTYPE)  # fmt: skip


def draw(kind: str, count: int, seed: int = 0) -> list[BroadCase]:
    """`count` distinct problems of `kind`, the same for the same seed."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
    rng = random.Random(f"{kind}:{seed}")
    found: dict[BroadCase, None] = {}
    while len(found) < count:
        problem = _decode(rng) if kind == "decode" else _prefill(rng, kind)
        found[problem] = None
    return list(found)
