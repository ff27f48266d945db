"""Out-of-range device metadata on the GPU: one bad call per case, then the error report.

Each case builds fresh random bf16 inputs on the GPU (GQA: 8 query heads over 2 K/V heads, head
dim 128) and makes ONE call whose device metadata (int32 CUDA tensors, ``validate=False``, so
nothing is checked on the host) is out of range for exactly one sequence. That call must not
raise: the kernels skip the sequence (or read its out-of-range page as zeros, or drop the
appended token) and record the error in the device's mapped error record. Then, by ``--mode``:

- ``check``: ``ckfmha.check_errors()`` raises DeviceMetadataError naming the kind (a fragment of
  the message in cpp/src/device_errors.cpp) and "sequence <the bad one>"; a second
  ``check_errors()`` is quiet (the record was cleared).
- ``next_call``: after ``torch.cuda.synchronize()`` the next (correct) call of the family raises
  that DeviceMetadataError before it launches, and the same correct call repeated succeeds.

In both modes the outputs of the bad call's valid sequences must match the float64 reference
(NaN-poisoned outputs, relative L2 error), and a correct call of the same family afterwards
matches the reference: had a kernel read or written outside its arrays, the context would be
lost or the outputs garbage. Under compute-sanitizer (tests/validation/test_sanitizer_gpu.py)
the bad calls must also show no access outside any allocation.

``--valid-draws N --seed S`` adds N seeded valid random draws (fwd batch and varlen, fwd_paged
decode, bwd batch; GQA, odd lengths, 12/24/40 query heads, fp16/bf16, causal or not) against the
reference, restricted to problems the registered kernels serve (nothing compiled on first
use); each must also leave the error record clear (valid device metadata reports nothing).

Run from the checkout with the repo root and tests/ on PYTHONPATH:
``python -m support.device_metadata_cases CASE... [--mode check|next_call]`` (``all``: every
case); prints "<case> ok" per case, then "device-metadata cases: N run, N passed" (and "valid
draws: N run, N passed"); exits non-zero when anything failed.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import ckfmha
from ckfmha.reference import (
    paged_attention_reference,
    varlen_attention_reference,
)
from ckfmha.reference_appendkv import append_kv_reference
from ckfmha.reference_bwd import varlen_attention_backward_reference
from support.gpu_inputs import (
    REL_L2_TOL,
    Inputs,
    assert_close,
    assert_grad_close,
    drain_device_errors,
    f64,
    i32,
    nan_like,
    torch,
)
from support.valid_draws import run_valid_draws

# ckfmha_status CKFMHA_ERROR_DEVICE_METADATA (cpp/include/ckfmha/ckfmha.h).
DEVICE_METADATA_STATUS = 8
H, HK, D = 8, 2, 128
PAGE = 16
SEQUENCE_NAMED = re.compile(r"sequence (\d+):")

# Message fragments of cpp/src/device_errors.cpp, one per kind of record slot.
SEQUENCE_RANGE = "cu_seqlens_q/k range outside the packed tensors"
PAGE_ID = "a block_table/kv_indices page id outside [0, num_pages)"
KEY_COUNT_SEQLENS = "seqlens_k outside [0, what its pages hold]"
KEY_COUNT_INDPTR = "kv_indptr range outside kv_indices"
APPEND_POSITION = "append_kv: a new token's cache position, page or RoPE row was out of range"

# Paged caches of POOL pages of PAGE keys. Three sequences of 53, 64 and 37 keys; row 2's last
# entry lies past its 37 keys (3 pages), so it is never read and may hold anything.
POOL = 16
TABLE = ((3, 9, 0, 14), (7, 1, 12, 5), (11, 2, 15, -7))
LENS_K = (53, 64, 37)
# The same pages as SGLang's flat kv_indices with kv_indptr.
KV_INDICES = (3, 9, 0, 14, 7, 1, 12, 5, 11, 2, 15)
KV_INDPTR = (0, 4, 8, 11)
# Packed queries of three sequences (5, 7 and 8 tokens) and packed keys (9, 21 and 10).
CU_Q = (0, 5, 12, 20)
CU_K = (0, 9, 30, 40)
MAX_Q, MAX_K = 8, 21


# ---- helpers ----



def _decode_reference(q: Any, k_cache: Any, v_cache: Any, pages: Sequence[int], n: int,
                      b: int, **options: Any) -> np.ndarray:
    """Sequence b of a paged decode step (q [batch, hq, sq, d]) in float64."""
    ref, _ = paged_attention_reference(f64(q[b : b + 1]), f64(k_cache), f64(v_cache),
                                       block_table=np.array([pages]), seqlens_k=np.array([n]),
                                       **options)  # fmt: skip
    return ref[0]


def _varlen_reference(q: Any, k: Any, v: Any, cu_q: Sequence[int], cu_k: Sequence[int],
                      b: int, **options: Any) -> np.ndarray:
    """Sequence b of a packed (varlen) forward in float64: [its queries, hq, d]."""
    q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
    ref, _ = varlen_attention_reference(f64(q[q0:q1]), f64(k[k0:k1]), f64(v[k0:k1]),
                                        [0, q1 - q0], [0, k1 - k0], **options)  # fmt: skip
    return ref


# ---- the families: a bad call (returning the check of its valid sequences) and a correct one


PAGED_OPTIONS = {"causal": True, "causal_alignment": "bottom_right"}


def paged_decode(inputs: Inputs, table: Sequence[Sequence[int]] = TABLE,
                 lens: Sequence[int] = LENS_K, bad: int | None = None, *, num_splits: int = 0,
                 zero_pages: bool = False, validate: bool = False) -> Callable[[], None]:
    """A decode step (one query per sequence) over a block table; returns the check of every
    sequence but ``bad`` (whose output must be finite with ``zero_pages``: an out-of-range
    page is read as zeros)."""
    batch = len(table)
    q = inputs.rand(batch, H, 1, D)
    k_cache, v_cache = inputs.rand(POOL, PAGE, HK, D), inputs.rand(POOL, PAGE, HK, D)
    out = nan_like(q)
    ckfmha.fwd_paged(q, k_cache, v_cache, block_table=i32(table), seqlens_k=i32(lens),
                     num_splits=num_splits, out=out, validate=validate, **PAGED_OPTIONS)

    def check() -> None:
        torch.cuda.synchronize()
        pairs = [(f64(out[b]), _decode_reference(q, k_cache, v_cache, table[b], lens[b], b,
                                                 **PAGED_OPTIONS))
                 for b in range(batch) if b != bad]  # fmt: skip
        assert_close(pairs, REL_L2_TOL["bf16"], f"fwd_paged (block table) sequences != {bad}")
        if zero_pages and bad is not None:
            assert torch.isfinite(out[bad]).all(), "a page read as zeros must give finite O"

    return check


def correct_paged(inputs: Inputs, num_splits: int = 0) -> None:
    paged_decode(inputs, num_splits=num_splits, validate=True)()


def paged_indptr(inputs: Inputs, indptr: Sequence[int] = KV_INDPTR, bad: int | None = None, *,
                 validate: bool = False) -> Callable[[], None]:
    """Two queries per sequence over SGLang's kv_indices/kv_indptr with seqlens_k."""
    batch = len(indptr) - 1
    q = inputs.rand(batch, H, 2, D)
    k_cache, v_cache = inputs.rand(POOL, PAGE, HK, D), inputs.rand(POOL, PAGE, HK, D)
    out = nan_like(q)
    ckfmha.fwd_paged(q, k_cache, v_cache, kv_indices=i32(KV_INDICES), kv_indptr=i32(indptr),
                     seqlens_k=i32(LENS_K), out=out, validate=validate, **PAGED_OPTIONS)

    def check() -> None:
        torch.cuda.synchronize()
        pairs = []
        for b in range(batch):
            if b != bad:
                pages = KV_INDICES[indptr[b] : indptr[b + 1]]
                ref = _decode_reference(q, k_cache, v_cache, pages, LENS_K[b], b,
                                        **PAGED_OPTIONS)  # fmt: skip
                pairs.append((f64(out[b]), ref))
        assert_close(pairs, REL_L2_TOL["bf16"], f"fwd_paged (kv_indptr) sequences != {bad}")

    return check


def correct_indptr(inputs: Inputs) -> None:
    paged_indptr(inputs, validate=True)()


def batch_prefill(inputs: Inputs, cu_q: Sequence[int] = CU_Q, bad: int | None = None, *,
                  max_seqlen_q: int = MAX_Q, validate: bool = False) -> Callable[[], None]:
    """Packed queries (cu_seqlens_q) over the block table: fwd_paged's batch prefill."""
    q = inputs.rand(CU_Q[-1], H, D)
    k_cache, v_cache = inputs.rand(POOL, PAGE, HK, D), inputs.rand(POOL, PAGE, HK, D)
    out = nan_like(q)
    ckfmha.fwd_paged(q, k_cache, v_cache, block_table=i32(TABLE), seqlens_k=i32(LENS_K),
                     cu_seqlens_q=i32(cu_q), max_seqlen_q=max_seqlen_q, out=out,
                     validate=validate, **PAGED_OPTIONS)  # fmt: skip

    def check() -> None:
        torch.cuda.synchronize()
        pairs = []
        for b in range(len(cu_q) - 1):
            if b != bad:
                q0, q1 = cu_q[b], cu_q[b + 1]
                ref, _ = paged_attention_reference(
                    f64(q[q0:q1]), f64(k_cache), f64(v_cache), block_table=np.array([TABLE[b]]),
                    seqlens_k=np.array([LENS_K[b]]), cu_seqlens_q=[0, q1 - q0], **PAGED_OPTIONS)
                pairs.append((f64(out[q0:q1]), ref))
        assert_close(pairs, REL_L2_TOL["bf16"], f"fwd_paged (batch prefill) sequences != {bad}")

    return check


def correct_prefill(inputs: Inputs) -> None:
    batch_prefill(inputs, validate=True)()


def varlen_fwd(inputs: Inputs, cu_q: Sequence[int] = CU_Q, cu_k: Sequence[int] = CU_K,
               bad: int | None = None, *, max_seqlen_q: int = MAX_Q,
               max_seqlen_k: int = MAX_K, validate: bool = False) -> Callable[[], None]:
    q = inputs.rand(CU_Q[-1], H, D)
    k, v = inputs.rand(CU_K[-1], HK, D), inputs.rand(CU_K[-1], HK, D)
    out = nan_like(q)
    ckfmha.fwd_varlen(q, k, v, i32(cu_q), i32(cu_k), max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k, causal=True, out=out, validate=validate)

    def check() -> None:
        torch.cuda.synchronize()
        pairs = [(f64(out[cu_q[b] : cu_q[b + 1]]),
                  _varlen_reference(q, k, v, cu_q, cu_k, b, causal=True))
                 for b in range(len(cu_q) - 1) if b != bad]  # fmt: skip
        assert_close(pairs, REL_L2_TOL["bf16"], f"fwd_varlen sequences != {bad}")

    return check


def correct_varlen(inputs: Inputs) -> None:
    varlen_fwd(inputs, validate=True)()


def varlen_bwd(inputs: Inputs, cu_k: Sequence[int] = CU_K, bad: int | None = None, *,
               validate: bool = False) -> Callable[[], None]:
    """bwd_varlen; O and LSE come from the float64 reference of the valid offsets (rounded as
    the forward would store them), so a backward error is never a forward one."""
    q, do = inputs.rand(CU_Q[-1], H, D), inputs.rand(CU_Q[-1], H, D)
    k, v = inputs.rand(CU_K[-1], HK, D), inputs.rand(CU_K[-1], HK, D)
    ref = varlen_attention_backward_reference(f64(q), f64(k), f64(v), f64(do), CU_Q, CU_K,
                                              causal=True)
    o = torch.from_numpy(ref.o).to("cuda", torch.bfloat16)
    lse = torch.from_numpy(np.ascontiguousarray(ref.lse)).to("cuda", torch.float32)
    dq, dk, dv = nan_like(q), nan_like(k), nan_like(v)
    ckfmha.bwd_varlen(do, q, k, v, o, lse, i32(CU_Q), i32(cu_k), max_seqlen_q=MAX_Q,
                      max_seqlen_k=MAX_K, causal=True, dq_out=dq, dk_out=dk, dv_out=dv,
                      validate=validate)  # fmt: skip

    def check() -> None:
        torch.cuda.synchronize()
        # The valid sequences' query rows (dq) and key rows (dk, dv).
        rows_q = [r for b in range(3) if b != bad for r in range(CU_Q[b], CU_Q[b + 1])]
        rows_k = [r for b in range(3) if b != bad for r in range(CU_K[b], CU_K[b + 1])]
        for name, got, want, rows in (("dq", dq, ref.dq, rows_q), ("dk", dk, ref.dk, rows_k),
                                      ("dv", dv, ref.dv, rows_k)):
            assert_grad_close(f64(got)[rows], want[rows], "bf16",
                              f"bwd_varlen {name} of sequences != {bad}")

    return check


def correct_bwd(inputs: Inputs) -> None:
    varlen_bwd(inputs, validate=True)()


APPEND_TABLE = ((0, 1, 2), (3, 4, 5))
APPEND_POOL = 8
APPEND_LENS = (5, 30)
APPEND_NEW = 4


def append_paged(inputs: Inputs, table: Sequence[Sequence[int]] = APPEND_TABLE, *,
                 validate: bool = False) -> Callable[[], None]:
    """4 new tokens per sequence into a paged cache (no RoPE: an exact copy); the caches must
    then equal the reference exactly: tokens on valid pages written, all else unchanged."""
    k_cache = inputs.rand(APPEND_POOL, PAGE, HK, D)
    v_cache = inputs.rand(APPEND_POOL, PAGE, HK, D)
    k_new = inputs.rand(len(table), APPEND_NEW, HK, D)
    v_new = inputs.rand(len(table), APPEND_NEW, HK, D)
    ref = append_kv_reference(f64(k_cache), f64(v_cache), f64(k_new), f64(v_new),
                              np.array(APPEND_LENS), block_table=np.array(table))
    ckfmha.append_kv(k_cache, v_cache, k_new, v_new, i32(APPEND_LENS), block_table=i32(table),
                     validate=validate)

    def check() -> None:
        torch.cuda.synchronize()
        for name, got, want in (("k_cache", k_cache, ref.k_cache),
                                ("v_cache", v_cache, ref.v_cache)):
            mismatched = int(np.count_nonzero(f64(got) != want))
            assert mismatched == 0, f"append_kv: {mismatched} values of {name} differ"

    return check


def correct_append(inputs: Inputs) -> None:
    append_paged(inputs, validate=True)()


# ---- the cases ----


def _with(rows: Sequence[Sequence[int]], b: int, i: int, value: int) -> list[list[int]]:
    table = [list(row) for row in rows]
    table[b][i] = value
    return table


def _replace(values: Sequence[int], i: int, value: int) -> list[int]:
    changed = list(values)
    changed[i] = value
    return changed


@dataclass(frozen=True)
class Case:
    name: str
    fragment: str  # of the DeviceMetadataError's message
    sequence: int | None  # the bad sequence the message names (None: append_kv names none)
    bad: Callable[[Inputs], Callable[[], None]]  # the bad call; returns the valid outputs' check
    correct: Callable[[Inputs], None]  # a correct call of the family, checked


CASES: dict[str, Case] = {
    case.name: case
    for case in (
        # Sequence 1 uses all 4 of its pages: its third is page POOL, one past the pool.
        Case("paged_page_past_pool", PAGE_ID, 1,
             lambda inp: paged_decode(inp, _with(TABLE, 1, 2, POOL), bad=1, zero_pages=True),
             correct_paged),
        Case("paged_negative_page", PAGE_ID, 2,
             lambda inp: paged_decode(inp, _with(TABLE, 2, 1, -1), bad=2, zero_pages=True),
             correct_paged),
        # 65 keys, where the 4 pages of row 0 hold 64.
        Case("paged_seqlens_over_table", KEY_COUNT_SEQLENS, 0,
             lambda inp: paged_decode(inp, lens=_replace(LENS_K, 0, 65), bad=0),
             correct_paged),
        # The split-KV plan (split stage, then combine) with 3 splits: sequence 0's 53 keys
        # reach its fourth page, POOL + 7.
        Case("paged_split_page_past_pool", PAGE_ID, 0,
             lambda inp: paged_decode(inp, _with(TABLE, 0, 3, POOL + 7), bad=0, num_splits=3,
                                      zero_pages=True),
             lambda inp: correct_paged(inp, num_splits=3)),
        # Sequence 2's pages are kv_indices[8:13], past the 11 entries.
        Case("paged_kv_indptr_past_indices", KEY_COUNT_INDPTR, 2,
             lambda inp: paged_indptr(inp, _replace(KV_INDPTR, 3, len(KV_INDICES) + 2), bad=2),
             correct_indptr),
        # Sequence 2's keys 30..41 of 40.
        Case("varlen_cu_seqlens_k_past_total", SEQUENCE_RANGE, 2,
             lambda inp: varlen_fwd(inp, cu_k=_replace(CU_K, 3, CU_K[-1] + 1), bad=2),
             correct_varlen),
        # Sequence 0's queries 6..5: decreasing; sequences 1 and 2 are whole.
        Case("varlen_decreasing_cu_seqlens_q", SEQUENCE_RANGE, 0,
             lambda inp: varlen_fwd(inp, cu_q=_replace(CU_Q, 0, 6), bad=0),
             correct_varlen),
        # Sequence 1 has 21 keys, max_seqlen_k says 20.
        Case("varlen_longer_than_max_seqlen_k", SEQUENCE_RANGE, 1,
             lambda inp: varlen_fwd(inp, max_seqlen_k=MAX_K - 1, bad=1),
             correct_varlen),
        Case("bwd_varlen_cu_seqlens_k_past_total", SEQUENCE_RANGE, 2,
             lambda inp: varlen_bwd(inp, cu_k=_replace(CU_K, 3, CU_K[-1] + 1), bad=2),
             correct_bwd),
        # Sequence 2's queries 12..21 of 20 (max_seqlen_q 9 admits the length itself).
        Case("prefill_cu_seqlens_q_past_total", SEQUENCE_RANGE, 2,
             lambda inp: batch_prefill(inp, _replace(CU_Q, 3, CU_Q[-1] + 1), bad=2,
                                       max_seqlen_q=MAX_Q + 1),
             correct_prefill),
        # Sequence 1 appends at 30..33: 30 and 31 on its second page (4), 32 and 33 on its
        # third, page APPEND_POOL + 1: those two are dropped, all else is written.
        Case("append_kv_page_out_of_range", APPEND_POSITION, None,
             lambda inp: append_paged(inp, _with(APPEND_TABLE, 1, 2, APPEND_POOL + 1)),
             correct_append),
    )
}
MODES = ("check", "next_call")


def _check_error(case: Case, error: BaseException) -> None:
    message = str(error)
    assert isinstance(error, ckfmha.DeviceMetadataError), f"{type(error).__name__}: {message}"
    assert isinstance(error, ckfmha.InvalidArgumentError)
    assert error.status == DEVICE_METADATA_STATUS, f"status {error.status}"
    assert case.fragment in message, f"{case.fragment!r} not in {message!r}"
    if case.sequence is not None:
        named = SEQUENCE_NAMED.findall(message)
        assert named == [str(case.sequence)], (
            f"the message must name sequence {case.sequence} alone, names {named}: {message!r}"
        )


def _expect_error(case: Case, call: Callable[[], Any], what: str) -> None:
    try:
        call()
    except ckfmha.DeviceMetadataError as error:
        _check_error(case, error)
        return
    raise AssertionError(f"{what} raised no DeviceMetadataError")


def run_case(case: Case, mode: str, seed: int) -> None:
    inputs = Inputs(seed + zlib.crc32(case.name.encode()))
    ckfmha.check_errors()  # nothing left over from earlier work
    check_valid = case.bad(inputs)  # must not raise: the kernels skip and record
    if mode == "check":
        _expect_error(case, ckfmha.check_errors, "check_errors() after the bad call")
        ckfmha.check_errors()  # the record was cleared
        check_valid()
        case.correct(inputs)
    elif mode == "next_call":
        torch.cuda.synchronize()
        check_valid()
        _expect_error(case, lambda: case.correct(inputs), "the next call after the bad one")
        case.correct(inputs)  # the same call again: the record was cleared
    else:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    ckfmha.check_errors()





# ---- command line ----


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.device_metadata_cases",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("cases", nargs="*", help=f"'all' or some of: {', '.join(CASES)}")
    parser.add_argument("--mode", choices=MODES, default="check")
    parser.add_argument("--valid-draws", type=int, default=0, metavar="N")
    parser.add_argument("--seed", type=int, default=0, metavar="S")
    parser.add_argument("--list", action="store_true", help="print the case names and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(CASES))
        return 0
    names = list(CASES) if "all" in args.cases else list(args.cases)
    unknown = [name for name in names if name not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    if not names and args.valid_draws <= 0:
        parser.error("name cases ('all' for every one) or --valid-draws N")
    if torch is None or not torch.cuda.is_available():
        print("device-metadata cases need torch with a CUDA device", file=sys.stderr)
        return 2
    # Host checks of device metadata would raise before the launch: the kernels' path is the
    # point here (the calls pass validate= explicitly too).
    os.environ.pop("CKFMHA_VALIDATE", None)
    failed = []
    for name in names:
        try:
            run_case(CASES[name], args.mode, args.seed)
        except Exception:  # noqa: BLE001 - every case is reported, then the next one runs
            failed.append(name)
            print(f"{name} FAILED ({args.mode})", flush=True)
            traceback.print_exc()
            drain_device_errors()
        else:
            print(f"{name} ok", flush=True)
    ok = not failed
    if names:
        print(f"device-metadata cases: {len(names)} run, {len(names) - len(failed)} passed"
              + (f" (failed: {', '.join(failed)})" if failed else ""), flush=True)  # fmt: skip
    if args.valid_draws > 0:
        run, passed = run_valid_draws(args.valid_draws, args.seed)
        ok = ok and run == passed == args.valid_draws
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
