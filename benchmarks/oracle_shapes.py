"""Problems for the selection oracle (oracle.py): shapes drawn to cover what models use.

Forward and backward problems take 8-64 query heads with GQA groups of 1, 2, 4 and 8, lengths
from 64 to 32k drawn log-uniformly (mostly not powers of two, a few with seqlen_q != seqlen_k),
head dims 64, 96, 128, 192x128 and 256, no mask or a causal one, and a batch that keeps the
work per problem bounded. Decode problems take one query token per sequence, batch 1-256 and
256-128k keys. Varlen problems pack sequences of their own lengths (group mode): prefill
batches whose lengths scatter around a mean of 64-16k tokens, and decode batches of one query
token per sequence over keys that differ per sequence; group mode has d64 and d128 kernels.
Draws are seeded, so a list is the same on every machine.

Problems are broad_cases.BroadCase values (its label, group and FLOP count apply), or
VarlenCase values for varlen. Whole head
counts and a band of lengths are held out (``held_out``): a model trained on the
rest is judged on shapes it has not seen, not on random neighbours of its training shapes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from broad_cases import BroadCase

KINDS = ("fwd", "decode", "varlen", "bwd")
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
# Varlen: the head dims group mode has kernels for, and how far a sequence's length strays from
# its batch's mean (the standard deviation of its log).
VARLEN_HDIMS = ((64, 64), (128, 128))
VARLEN_SPREAD = 0.8
MAX_VARLEN_LENGTH = 32768


@dataclass(frozen=True)
class VarlenCase:
    """A group-mode forward problem: sequence b has seqlens_q[b] queries and seqlens_k[b] keys,
    packed into q [total_q, nhead_q, hdim] and k, v [total_k, nhead_k, hdim / hdim_v]. A causal
    mask aligns top-left (its sequences have as many queries as keys)."""

    nhead_q: int
    nhead_k: int
    seqlens_q: tuple[int, ...]
    seqlens_k: tuple[int, ...]
    hdim: int
    hdim_v: int
    causal: bool
    dtype: str = DTYPE
    kind: str = "varlen"

    @property
    def batch(self) -> int:
        return len(self.seqlens_q)

    @property
    def group(self) -> int:
        return self.nhead_q // self.nhead_k

    @property
    def seqlen_q(self) -> int:
        """The longest sequence's queries (the dispatcher's max_seqlen_q)."""
        return max(self.seqlens_q)

    @property
    def seqlen_k(self) -> int:
        return max(self.seqlens_k)

    @property
    def total_q(self) -> int:
        return sum(self.seqlens_q)

    @property
    def total_k(self) -> int:
        return sum(self.seqlens_k)

    @property
    def causal_alignment(self) -> str:
        return "top_left"

    @property
    def label(self) -> str:
        heads = f"h{self.nhead_q}" + (f"/{self.nhead_k}" if self.group > 1 else "")
        return (f"b{self.batch} {heads} q{self.total_q}/max{self.seqlen_q} "
                f"k{self.total_k}/max{self.seqlen_k} d{self.hdim}"
                f"{' causal' if self.causal else ''}")  # fmt: skip


Problem = BroadCase | VarlenCase


def held_out(problem: Problem) -> bool:
    """Whether `problem` is kept out of training: its head count or its key length."""
    low, high = HELD_OUT_KEYS
    return problem.nhead_q in HELD_OUT_HEADS or low <= problem.seqlen_k < high


def mask_options(problem: Problem) -> dict[str, Any]:
    """The mask as ckfmha.fwd/bwd take it (causal masks with unequal lengths align
    bottom-right, BroadCase's convention)."""
    if not problem.causal:
        return {}
    return {"causal": True, "causal_alignment": problem.causal_alignment}


def problem_fields(problem: Problem) -> dict[str, Any]:
    """The dispatcher's problem fields (Dispatcher.explain / explain_bwd keywords); a varlen
    problem adds mode "group", its token counts and its sequences' lengths (seqlens_q/k, which
    ckfmha.tuning makes the packed inputs from)."""
    fields = {"batch": problem.batch, "nhead_q": problem.nhead_q, "nhead_k": problem.nhead_k,
              "seqlen_q": problem.seqlen_q, "seqlen_k": problem.seqlen_k, "hdim": problem.hdim,
              "hdim_v": problem.hdim_v, "dtype": problem.dtype, **mask_options(problem)}  # fmt: skip
    if isinstance(problem, VarlenCase):
        fields.update(mode="group", total_q=problem.total_q, total_k=problem.total_k,
                      seqlens_q=list(problem.seqlens_q), seqlens_k=list(problem.seqlens_k))  # fmt: skip
    return fields


def problem_record(problem: Problem) -> dict[str, Any]:
    """The problem's CSV columns."""
    varlen = isinstance(problem, VarlenCase)
    return {"kind": problem.kind, "held_out": held_out(problem), "dtype": problem.dtype,
            "mode": "group" if varlen else "batch", "batch": problem.batch,
            "nhead_q": problem.nhead_q, "nhead_k": problem.nhead_k, "group": problem.group,
            "seqlen_q": problem.seqlen_q, "seqlen_k": problem.seqlen_k,
            "total_q": problem.total_q if varlen else problem.batch * problem.seqlen_q,
            "total_k": problem.total_k if varlen else problem.batch * problem.seqlen_k,
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


def _scattered(rng: random.Random, batch: int, mean: float) -> tuple[int, ...]:
    """`batch` lengths whose logs scatter around log(mean) by VARLEN_SPREAD."""
    return tuple(max(1, min(MAX_VARLEN_LENGTH, round(mean * math.exp(rng.gauss(0, VARLEN_SPREAD)))))
                 for _ in range(batch))  # fmt: skip


def _varlen(rng: random.Random) -> VarlenCase:
    nhead_q, nhead_k = _heads(rng)
    hdim, hdim_v = rng.choice(VARLEN_HDIMS)
    if rng.random() < 0.3:  # a decode step over a batch of cached sequences
        batch = _log_uniform(rng, 1, 128)
        seqlens_k = _scattered(rng, batch, _log_uniform(rng, 256, 16384))
        while len(seqlens_k) > 1 and 4 * sum(seqlens_k) * nhead_k * hdim > MAX_DECODE_KV_BYTES:
            seqlens_k = seqlens_k[:-1]
        return VarlenCase(nhead_q, nhead_k, (1,) * len(seqlens_k), seqlens_k, hdim, hdim_v,
                          False)  # fmt: skip
    seqlens = _scattered(rng, _log_uniform(rng, 2, 64), _log_uniform(rng, 64, 16384))
    while len(seqlens) > 1 and sum(n * n for n in seqlens) * nhead_q > MAX_PAIRS:
        seqlens = seqlens[:-1]
    return VarlenCase(nhead_q, nhead_k, seqlens, seqlens, hdim, hdim_v, rng.random() < 0.5)


def draw(kind: str, count: int, seed: int = 0) -> list[Problem]:
    """`count` distinct problems of `kind`, the same for the same seed."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
    rng = random.Random(f"{kind}:{seed}")
    found: dict[Problem, None] = {}
    while len(found) < count:
        if kind == "varlen":
            problem: Problem = _varlen(rng)
        else:
            problem = _decode(rng) if kind == "decode" else _prefill(rng, kind)
        found[problem] = None
    return list(found)
