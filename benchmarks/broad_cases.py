"""The broad benchmark suite's cases, and the FLOP and byte counts their rates are read against.

Shapes models use, beyond the 18-case standard suites (which join them, marked standard, in
bench_broad.py): GQA groups 1, 4 and 8, head counts 12, 24 and 40 (32 and 64 for decode, 16 at d256), head
dims 64, 96, 128, 192x128 and 256, lengths that are not powers of two from 1000 to 20000, causal
and not, a few cases with seqlen_q != seqlen_k, and decode steps (one query row) over 1k-32k keys
at batch 1, 4, 32 and 64. A forward or backward case holds about 16k-32k query tokens
(``TOKENS`` / seqlen), so its time grows with the sequence length but stays in milliseconds.

No torch here: ``tests/docs/test_bench_broad_cpu.py`` checks the coverage and the arithmetic on
a machine without a GPU, and ``bench_broad.py --list`` prints the cases and the run-time
estimate (``estimated_seconds``) without one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

KINDS = ("fwd", "bwd", "decode")
# The FlashAttention convention bench_bwd.py rates the backward by: 2.5x the forward's FLOPs.
BWD_FLOPS_FACTOR = 2.5
ELEMENT_BYTES = {"bf16": 2, "fp16": 2}
# Query tokens per forward/backward case: batch = round(TOKENS / seqlen_q), 20k-28k tokens for
# the lengths below (the unequal-length cases set their batch: 17k-25k), so the work per case
# grows with the length alone.
TOKENS = 24576


@dataclass(frozen=True)
class BroadCase:
    """One timed problem. q is [batch, nhead_q, seqlen_q, hdim], k [batch, nhead_k, seqlen_k,
    hdim], v [batch, nhead_k, seqlen_k, hdim_v]. A causal mask with seqlen_q != seqlen_k is
    aligned bottom-right (the last query sees every key: a chunk of new tokens at the end of a
    sequence, the FlashAttention convention); with equal lengths both alignments agree."""

    kind: str  # "fwd" | "bwd" | "decode"
    batch: int
    nhead_q: int
    nhead_k: int
    seqlen_q: int
    seqlen_k: int
    hdim: int
    hdim_v: int
    causal: bool
    dtype: str = "bf16"
    standard: bool = False  # one of bench_fwd.py's / bench_bwd.py's 18 standard cases

    @property
    def group(self) -> int:
        """Query heads per K/V head."""
        return self.nhead_q // self.nhead_k

    @property
    def causal_alignment(self) -> str:
        return "bottom_right" if self.causal and self.seqlen_q != self.seqlen_k else "top_left"

    @property
    def tokens(self) -> int:
        """Query tokens for fwd/bwd; K/V tokens read for decode."""
        return self.batch * (self.seqlen_k if self.kind == "decode" else self.seqlen_q)

    @property
    def hdim_label(self) -> str:
        return f"d{self.hdim}" if self.hdim == self.hdim_v else f"d{self.hdim}x{self.hdim_v}"

    @property
    def label(self) -> str:
        heads = f"h{self.nhead_q}" if self.group == 1 else f"h{self.nhead_q}/{self.nhead_k}"
        lengths = (f"s{self.seqlen_q}" if self.seqlen_q == self.seqlen_k
                   else f"q{self.seqlen_q} k{self.seqlen_k}")  # fmt: skip
        return (f"b{self.batch} {heads} {lengths} {self.hdim_label}"
                f"{' causal' if self.causal else ''}")  # fmt: skip

    @property
    def flops(self) -> float:
        """FlashAttention convention: 2 GEMMs over the visible (query, key) pairs, 2 * pairs *
        (hdim + hdim_v) per head (4 * sq * sk * d unmasked), 2.5x that for the backward."""
        fwd = (2.0 * self.batch * self.nhead_q
               * visible_pairs(self.seqlen_q, self.seqlen_k, self.causal)
               * (self.hdim + self.hdim_v))  # fmt: skip
        return BWD_FLOPS_FACTOR * fwd if self.kind == "bwd" else fwd

    @property
    def bytes_moved(self) -> int:
        """What an attention call must move at least once: Q and K/V read, O written (the
        decode rates' denominator; bench_decode.py's convention)."""
        per_row = (self.hdim + self.hdim_v) * ELEMENT_BYTES[self.dtype]
        return per_row * self.batch * (self.nhead_q * self.seqlen_q
                                       + self.nhead_k * self.seqlen_k)  # fmt: skip

    @property
    def key(self) -> tuple[object, ...]:
        """The problem, whatever the standard flag: two cases with one key are duplicates."""
        return (self.kind, self.batch, self.nhead_q, self.nhead_k, self.seqlen_q, self.seqlen_k,
                self.hdim, self.hdim_v, self.causal, self.dtype)  # fmt: skip


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool) -> float:
    """(query, key) pairs a mask leaves visible, per batch and head. Causal with equal lengths:
    half the square (the convention the standard suites use); causal with unequal lengths,
    aligned bottom-right: counted exactly, query row i seeing keys [0, i + seqlen_k - seqlen_q]."""
    if not causal:
        return float(seqlen_q * seqlen_k)
    if seqlen_q == seqlen_k:
        return seqlen_q * seqlen_k / 2
    if seqlen_q < seqlen_k:
        # Row i sees i + 1 + (sk - sq) keys, never more than sk.
        return float(seqlen_q * (seqlen_k - seqlen_q) + seqlen_q * (seqlen_q + 1) // 2)
    # The first sq - sk rows see no key; the last sk rows see 1 .. sk keys.
    return float(seqlen_k * (seqlen_k + 1) // 2)


class Shape(NamedTuple):
    """A model's attention heads, and the sequence lengths its cases take (causal and not)."""

    nhead_q: int
    nhead_k: int
    hdim: int
    hdim_v: int
    seqlens: tuple[int, ...]


# Forward: every head dim meets short (1000-2900), middle (4097-7000) and long (12000-20000)
# lengths; each head count its GQA groups (12 heads: 1 and 4; 24 and 40: 1, 4 and 8).
FWD_SHAPES = (
    Shape(12, 12, 64, 64, (1000, 4097, 20000)),  # BERT-base, GPT-2 small
    Shape(24, 6, 64, 64, (1536, 7000)),
    Shape(24, 3, 64, 64, (2900, 12000)),
    Shape(24, 24, 96, 96, (1000, 4097)),  # Phi-3-mini's head dim
    Shape(40, 10, 96, 96, (2900, 12000)),
    Shape(12, 12, 128, 128, (1536, 7000)),
    Shape(40, 40, 128, 128, (1000, 4097, 20000)),  # Llama-2-13B
    Shape(12, 3, 128, 128, (2900, 12000)),
    Shape(40, 5, 128, 128, (1536, 7000, 20000)),
    Shape(24, 3, 128, 128, (1000, 4097)),
    Shape(24, 24, 192, 128, (1536, 7000)),  # MLA prefill (DeepSeek-V2/V3): 192 QK, 128 V
    Shape(40, 40, 192, 128, (2900, 12000)),
    Shape(12, 12, 256, 256, (1000, 4097)),  # Gemma's head dim
    Shape(24, 6, 256, 256, (2900, 7000)),
    Shape(24, 3, 256, 256, (1536, 12000)),
)
# Backward: the same shapes, fewer lengths (a backward case costs about 3.5 forward ones).
BWD_SHAPES = (
    Shape(12, 12, 64, 64, (1000, 12000)),
    Shape(24, 6, 64, 64, (4097,)),
    Shape(24, 3, 64, 64, (1536,)),
    Shape(24, 24, 96, 96, (2900,)),
    Shape(40, 10, 96, 96, (7000,)),
    Shape(40, 40, 128, 128, (1536, 20000)),
    Shape(12, 3, 128, 128, (4097,)),
    Shape(40, 5, 128, 128, (1000, 7000)),
    Shape(24, 3, 128, 128, (12000,)),
    Shape(24, 24, 192, 128, (2900,)),
    Shape(40, 40, 192, 128, (7000,)),
    Shape(12, 12, 256, 256, (1536,)),
    Shape(24, 6, 256, 256, (4097,)),
    Shape(24, 3, 256, 256, (1000,)),
)


class UnequalLengths(NamedTuple):
    """A case with seqlen_q != seqlen_k."""

    kind: str
    batch: int
    shape: Shape  # its seqlens: (seqlen_q, seqlen_k)
    causal: bool


UNEQUAL_LENGTHS = (
    # Chunked prefill: a chunk of new queries against the keys before it and its own.
    UnequalLengths("fwd", 6, Shape(40, 5, 128, 128, (2900, 12000)), True),
    UnequalLengths("fwd", 16, Shape(24, 6, 64, 64, (1536, 7000)), True),
    UnequalLengths("bwd", 8, Shape(24, 6, 64, 64, (2900, 7000)), True),
    # Cross-attention (encoder-decoder): more queries than keys, no mask.
    UnequalLengths("fwd", 16, Shape(12, 12, 64, 64, (1536, 1000)), False),
    UnequalLengths("bwd", 16, Shape(12, 12, 64, 64, (1536, 1000)), False),
)

# Decode (seqlen_q 1, no mask) at d128: every (query heads, group, batch) below, the key count
# taken in turn from the batch's lengths so that batch x keys stays within 12k-262k tokens and
# the largest K/V cache (64 K/V heads, batch 32, 7000 keys: 7.3 GB) fits beside its peers'.
DECODE_HEADS = (32, 64)
DECODE_GROUPS = (1, 4, 8)
DECODE_SEQLENS = {
    1: (32768, 20000, 12000),
    4: (16384, 7000, 12000),
    32: (4097, 7000, 2900),
    64: (4096, 1536, 1000),
}
DECODE_HDIM = 128
# Decode at the other head dims models use: (nhead_q, nhead_k, hdim, batch, seqlen_k).
DECODE_OTHER_HDIMS = (
    (32, 8, 64, 64, 4096),
    (16, 8, 256, 32, 4097),  # Gemma-2-9B
)

# --quick: this many cases of each kind, spread over its broad (non-standard) cases.
QUICK_COUNTS = {"fwd": 6, "bwd": 5, "decode": 4}


def batch_for(seqlen_q: int) -> int:
    return max(1, round(TOKENS / seqlen_q))


def _shape_cases(kind: str, shapes: Iterable[Shape], dtype: str) -> list[BroadCase]:
    return [BroadCase(kind, batch_for(s), shape.nhead_q, shape.nhead_k, s, s, shape.hdim,
                      shape.hdim_v, causal, dtype)
            for shape in shapes for s in shape.seqlens for causal in (False, True)]


def decode_cases(dtype: str = "bf16") -> list[BroadCase]:
    cases = []
    for h, nhead_q in enumerate(DECODE_HEADS):
        for g, group in enumerate(DECODE_GROUPS):
            for batch, seqlens in DECODE_SEQLENS.items():
                seqlen_k = seqlens[(h + g) % len(seqlens)]
                cases.append(BroadCase("decode", batch, nhead_q, nhead_q // group, 1, seqlen_k,
                                       DECODE_HDIM, DECODE_HDIM, False, dtype))  # fmt: skip
    cases += [BroadCase("decode", batch, hq, hk, 1, sk, d, d, False, dtype)
              for hq, hk, d, batch, sk in DECODE_OTHER_HDIMS]  # fmt: skip
    return cases


def broad_cases(dtype: str = "bf16") -> list[BroadCase]:
    """The suite's own cases (the standard ones not among them), by kind: fwd, bwd, decode."""
    unequal = [BroadCase(u.kind, u.batch, u.shape.nhead_q, u.shape.nhead_k, *u.shape.seqlens,
                         u.shape.hdim, u.shape.hdim_v, u.causal, dtype)
               for u in UNEQUAL_LENGTHS]
    return [
        *_shape_cases("fwd", FWD_SHAPES, dtype),
        *(c for c in unequal if c.kind == "fwd"),
        *_shape_cases("bwd", BWD_SHAPES, dtype),
        *(c for c in unequal if c.kind == "bwd"),
        *decode_cases(dtype),
    ]


class StandardCase(Protocol):
    """bench_fwd.Case and bench_bwd.Case: MHA, seqlen_q == seqlen_k."""

    batch: int
    heads: int
    seqlen: int
    hdim: int
    causal: bool


def from_standard(kind: str, case: StandardCase, dtype: str) -> BroadCase:
    return BroadCase(kind, case.batch, case.heads, case.heads, case.seqlen, case.seqlen,
                     case.hdim, case.hdim, case.causal, dtype, standard=True)  # fmt: skip


def suite(standard_fwd: Sequence[StandardCase], standard_bwd: Sequence[StandardCase],
          dtype: str = "bf16") -> list[BroadCase]:  # fmt: skip
    """Every case by kind, each kind's standard cases first; a broad case that repeats a
    standard one is dropped (the standard one stays)."""
    standard = [from_standard("fwd", c, dtype) for c in standard_fwd]
    standard += [from_standard("bwd", c, dtype) for c in standard_bwd]
    seen = {c.key for c in standard}
    own = [c for c in broad_cases(dtype) if c.key not in seen]
    return [c for kind in KINDS for c in (*standard, *own) if c.kind == kind]


def quick_cases(dtype: str = "bf16") -> list[BroadCase]:
    """A smoke-run subset: QUICK_COUNTS cases of each kind, the middle one of each of that
    many equal slices of its broad cases (which the tables order by head dim, so every head
    dim, both masks and several groups and lengths come up)."""
    picked = []
    for kind in KINDS:
        cases = [c for c in broad_cases(dtype) if c.kind == kind]
        n = QUICK_COUNTS[kind]
        picked += [cases[int((i + 0.5) * len(cases) / n)] for i in range(n)]
    return picked


def select(cases: Iterable[BroadCase], kinds: Iterable[str]) -> list[BroadCase]:
    wanted = set(kinds)
    return [c for c in cases if c.kind in wanted]


# The run-time estimate. Assumed H100 rates, rounded from the standard suites' measured ones
# (README, bf16): ckfmha and cuDNN near 500 TFLOP/s forward and 380 backward, torch's flash
# near 290 and 230; causal cases at 0.8x; decode at 2.5 TB/s of its bytes_moved (HBM3 copies
# near 3 TB/s); a call never under CALL_FLOOR_S (launch and Python host time). Each case adds
# CASE_OVERHEAD_S: inputs, cuDNN's plan for a new shape, the forward a backward needs, the
# spot check. The run adds RUN_OVERHEAD_S (the matmul rate, the copy bandwidth, start-up).
# Kernels compiled on first use are not counted (fill the cache first; see bench_broad.py).
ESTIMATE_RATES = {
    "fwd": {"ckfmha": 500e12, "torch_flash": 290e12, "torch_cudnn": 500e12},
    "bwd": {"ckfmha": 380e12, "torch_flash": 230e12, "torch_cudnn": 380e12},
    "decode": {"ckfmha": 2.5e12, "torch_flash": 2.5e12, "torch_cudnn": 2.5e12},
}
CAUSAL_RATE_FACTOR = 0.8
CALL_FLOOR_S = 30e-6
CASE_OVERHEAD_S = {"fwd": 0.5, "bwd": 0.8, "decode": 0.3}
RUN_OVERHEAD_S = 15.0


def estimated_seconds(case: BroadCase, calls: int) -> float:
    """Seconds one case takes with `calls` timed-or-warm-up calls per implementation."""
    work = case.bytes_moved if case.kind == "decode" else case.flops
    factor = CAUSAL_RATE_FACTOR if case.causal else 1.0
    per_call = sum(max(CALL_FLOOR_S, work / (rate * factor))
                   for rate in ESTIMATE_RATES[case.kind].values())  # fmt: skip
    return CASE_OVERHEAD_S[case.kind] + calls * per_call


def estimated_run_seconds(cases: Iterable[BroadCase], calls: int) -> float:
    return RUN_OVERHEAD_S + math.fsum(estimated_seconds(c, calls) for c in cases)
