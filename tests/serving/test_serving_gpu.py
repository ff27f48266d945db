"""Serving wrappers on the GPU: plan, capture run() in a torch CUDA graph, then step after step
re-plan with new lengths (growing and shrinking within the bounds) and new pages (a fresh
permutation of the pool each step), replay, and compare with the float64 reference.

Each step's plan() is queued while the previous replay is held in flight behind a GPU sleep,
so a metadata copy that were not ordered on the replay stream would corrupt that replay.
Outputs are poisoned with NaN before every replay; q is fresh random values per step.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from support.cuda_graphs import capture
from support.gpu_compare import Inputs, compare, f64, torch_dtype

import ckfmha
from ckfmha.reference import paged_attention_reference
from ckfmha.serving import BatchDecode, BatchPrefill

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

D = 128
MAX_SEQLEN_K = 700
# Key counts per step: sequences grow, shrink, empty and refill within MAX_SEQLEN_K.
DECODE_STEPS = [[700, 1, 333, 64], [5, 699, 0, 129], [650, 650, 17, 700], [1, 2, 3, 4]]
# dtype, page table, (hq, hk), page_size, seqlen_q, layout. "kv_indptr_full": SGLang tables
# without seqlens_k (every key of the pages).
DECODE_CASES = [
    ("bf16", "block_table", (32, 8), 16, 1, "bhsd"),
    ("fp16", "kv_indptr", (32, 8), 64, 4, "bshd"),
    ("bf16", "kv_indptr_full", (8, 1), 64, 1, "bshd"),
    ("fp16", "block_table", (8, 1), 16, 4, "bhsd"),
]
MAX_SEQLEN_Q = 64
MAX_TOTAL_Q = 160
# (queries, keys) per sequence and step; empty query blocks and keys, a full max_total_q step.
PREFILL_STEPS = [
    ([64, 1, 30], [100, 1, 30]),
    ([0, 50, 64], [5, 600, 64]),
    ([10, 10, 10], [700, 10, 300]),
    ([64, 64, 32], [64, 500, 32]),
]
PREFILL_CASES = [("bf16", "block_table", (8, 2), 16), ("fp16", "kv_indptr", (32, 8), 64)]


@dataclass
class Step:
    """One step's page tables: plan() arguments and the reference's."""

    lens_k: list[int]
    tables: dict[str, np.ndarray]


def _step(rng: np.random.Generator, lens_k: list[int], page_size: int, pool: int,
          form: str) -> Step:
    if form == "kv_indptr_full":
        whole = MAX_SEQLEN_K // page_size * page_size
        lens_k = [min(-(-n // page_size) * page_size, whole) for n in lens_k]
    counts = [-(-n // page_size) for n in lens_k]
    ids = rng.permutation(pool).astype(np.int32)
    pages = np.split(ids[: sum(counts)], np.cumsum(counts)[:-1])
    lens = np.asarray(lens_k, np.int32)
    if form == "block_table":
        # The width changes from step to step; entries past a sequence's pages are never read.
        width = max(counts) + int(rng.integers(0, 3))
        table = np.full((len(lens_k), max(width, 1)), -1, np.int32)
        for b, p in enumerate(pages):
            table[b, : p.size] = p
        return Step(lens_k, {"block_table": table, "seqlens_k": lens})
    tables = {
        "kv_indptr": np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
        "kv_indices": np.concatenate(pages + [np.full(2, -1, np.int32)]),
    }
    if form == "kv_indptr":
        tables["seqlens_k"] = lens
    return Step(lens_k, tables)


def _pool(batch: int, page_size: int) -> int:
    # Spare pages no sequence owns hold values the kernels must never mix in.
    return batch * -(-MAX_SEQLEN_K // page_size) + 5


def _hold_stream() -> None:
    """Keeps the current stream busy for a few milliseconds, so that work queued next is still
    pending when the host goes on."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(20_000_000)


def _replay_steps(graph: Any, wrapper: Any, steps: list[Step], options: dict[str, Any],
                  q: Any, q_steps: list[Any], outputs: tuple[Any, Any]) -> list[tuple[Any, Any]]:
    """Replays ``graph`` once per step (step 0 already planned), planning step i + 1 while
    replay i is in flight; the outputs of each replay."""
    key = wrapper.capture_key
    results = []
    for i in range(len(steps)):
        q.copy_(q_steps[i])
        for t in outputs:
            t.fill_(float("nan"))
        _hold_stream()
        graph.replay()
        results.append(tuple(t.clone() for t in outputs))
        if i + 1 < len(steps):
            wrapper.plan(**steps[i + 1].tables, **options)
            assert wrapper.capture_key == key, "a plan within the bounds changed the capture"
    torch.cuda.synchronize()
    return results


def _case_id(case: tuple[Any, ...]) -> str:
    """e.g. bf16-block_table-h32x8-p16-q1-bhsd: dtype, table, heads, page size, queries."""
    dtype, table, (hq, hk), page_size, *rest = case
    return "-".join([dtype, table, f"h{hq}x{hk}", f"p{page_size}"] +
                    ([f"q{rest[0]}", rest[1]] if rest else []))


@pytest.mark.parametrize("case", DECODE_CASES, ids=_case_id)
def test_decode_graph_replays_new_lengths_and_pages(case: tuple[Any, ...]) -> None:
    dtype_name, form, (hq, hk), page_size, sq, layout = case
    dtype = torch_dtype(dtype_name)
    inputs = Inputs(zlib.crc32(repr(case).encode()))
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    batch = len(DECODE_STEPS[0])
    pool = _pool(batch, page_size)
    k_cache = inputs.normal((pool, page_size, hk, D), dtype)
    v_cache = inputs.normal((pool, page_size, hk, D), dtype)
    q_shape = (batch, sq, hq, D) if layout == "bshd" else (batch, hq, sq, D)
    q = inputs.normal(q_shape, dtype)
    q_steps = [inputs.normal(q_shape, dtype) for _ in DECODE_STEPS]
    out = torch.empty(q_shape, device="cuda", dtype=dtype)
    lse = torch.empty((batch, hq, sq), device="cuda", dtype=torch.float32)
    steps = [_step(rng, lens, page_size, pool, form) for lens in DECODE_STEPS]
    options = {"nhead_q": hq, "nhead_k": hk, "head_dim": D, "page_size": page_size,
               "dtype": dtype_name, "seqlen_q": sq, "layout": layout,
               "scale": 0.9 / math.sqrt(D), "num_pages": pool}  # fmt: skip

    decode = BatchDecode(max_batch=batch + 2, max_pages=pool, max_seqlen_k=MAX_SEQLEN_K)
    decode.plan(**steps[0].tables, **options)
    graph = capture(lambda: decode.run(q, k_cache, v_cache, out=out, lse_out=lse))
    results = _replay_steps(graph, decode, steps, options, q, q_steps, (out, lse))

    k64, v64 = f64(k_cache), f64(v_cache)
    for i, (step, (got, got_lse)) in enumerate(zip(steps, results)):
        ref, ref_lse = paged_attention_reference(
            f64(q_steps[i]), k64, v64, **step.tables, layout=layout, causal=True,
            causal_alignment="bottom_right", scale=options["scale"],
        )  # fmt: skip
        what = f"step {i} lens {step.lens_k} {case} ({decode.workspace_bytes} workspace bytes)"
        rel = compare({"dtype": dtype_name}, got, got_lse, ref, ref_lse, what)
        print(f"decode replay {what}: relative L2 error {rel:.2e}")


@pytest.mark.parametrize("case", PREFILL_CASES, ids=_case_id)
def test_prefill_graph_replays_new_queries_lengths_and_pages(case: tuple[Any, ...]) -> None:
    dtype_name, form, (hq, hk), page_size = case
    dtype = torch_dtype(dtype_name)
    inputs = Inputs(zlib.crc32(repr(case).encode()))
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    batch = len(PREFILL_STEPS[0][0])
    pool = _pool(batch, page_size)
    k_cache = inputs.normal((pool, page_size, hk, D), dtype)
    v_cache = inputs.normal((pool, page_size, hk, D), dtype)
    # Rows past a step's tokens (and past max_total_q) must be neither read nor written.
    rows = MAX_TOTAL_Q + 3
    q = inputs.normal((rows, hq, D), dtype)
    q_steps = [inputs.normal((rows, hq, D), dtype) for _ in PREFILL_STEPS]
    out = torch.empty((rows, hq, D), device="cuda", dtype=dtype)
    lse = torch.empty((hq, rows), device="cuda", dtype=torch.float32)
    steps, offsets = [], []
    for lens_q, lens_k in PREFILL_STEPS:
        step = _step(rng, lens_k, page_size, pool, form)
        cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
        step.tables["cu_seqlens_q"] = cu_q
        steps.append(step)
        offsets.append(cu_q)
    options = {"nhead_q": hq, "nhead_k": hk, "head_dim": D, "page_size": page_size,
               "dtype": dtype_name, "num_pages": pool}  # fmt: skip

    prefill = BatchPrefill(max_batch=batch, max_pages=pool, max_seqlen_k=MAX_SEQLEN_K,
                           max_seqlen_q=MAX_SEQLEN_Q, max_total_q=MAX_TOTAL_Q)  # fmt: skip
    prefill.plan(**steps[0].tables, **options)
    graph = capture(lambda: prefill.run(q, k_cache, v_cache, out=out, lse_out=lse))
    results = _replay_steps(graph, prefill, steps, options, q, q_steps, (out, lse))

    k64, v64 = f64(k_cache), f64(v_cache)
    for i, (step, cu_q, (got, got_lse)) in enumerate(zip(steps, offsets, results)):
        tokens = int(cu_q[-1])
        ref, ref_lse = paged_attention_reference(
            f64(q_steps[i][:tokens]), k64, v64, **step.tables, causal=True,
            causal_alignment="bottom_right",
        )  # fmt: skip
        what = f"step {i} {PREFILL_STEPS[i]} {case} ({prefill.kernel}, {prefill.workspace_bytes} B)"
        rel = compare({"dtype": dtype_name}, got[:tokens], got_lse[:, :tokens], ref, ref_lse, what)
        print(f"prefill replay {what}: relative L2 error {rel:.2e}")
        assert got[tokens:].isnan().all() and got_lse[:, tokens:].isnan().all(), what


def _small_decode(dtype_name: str = "bf16", max_seqlen_k: int = 32768) -> dict[str, Any]:
    """A planned two-sequence decode step over long keys (a split plan) and its arrays."""
    dtype = torch_dtype(dtype_name)
    inputs = Inputs(7)
    page_size, hq, hk, batch = 16, 32, 8, 2
    lens = [max_seqlen_k, max_seqlen_k // 3]
    counts = [-(-n // page_size) for n in lens]
    pool = sum(counts) + 3
    table = np.arange(sum(counts), dtype=np.int32)[::-1].copy()
    indptr = np.array([0, counts[0], sum(counts)], np.int32)
    decode = BatchDecode(max_batch=batch, max_pages=pool, max_seqlen_k=max_seqlen_k)
    options = {"nhead_q": hq, "nhead_k": hk, "head_dim": D, "page_size": page_size,
               "dtype": dtype_name, "num_pages": pool}  # fmt: skip
    decode.plan(kv_indptr=indptr, kv_indices=table, seqlens_k=lens, **options)
    return {
        "decode": decode, "q": inputs.normal((batch, hq, 1, D), dtype),
        "k": inputs.normal((pool, page_size, hk, D), dtype),
        "v": inputs.normal((pool, page_size, hk, D), dtype),
        "out": torch.empty((batch, hq, 1, D), device="cuda", dtype=dtype),
        "lse": torch.empty((batch, hq, 1), device="cuda", dtype=torch.float32),
        "tables": {"kv_indptr": indptr, "kv_indices": table, "seqlens_k": np.array(lens)},
    }  # fmt: skip


def test_run_with_outputs_allocates_nothing() -> None:
    s = _small_decode()
    decode = s["decode"]
    assert decode.workspace_bytes > 0, "expected a split plan (it needs a workspace)"
    told = re.search(r"num_splits=(\d+)", decode.explain())
    assert told is not None and int(told[1]) > 1, decode.explain()

    def run() -> Any:
        return decode.run(s["q"], s["k"], s["v"], out=s["out"], lse_out=s["lse"])

    run()  # first-use setup
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(5):
        assert run()[0] is s["out"]
    assert torch.cuda.memory_allocated() == before
    # A capture in torch's default (global) mode fails on any allocation or host wait.
    graph = capture(run)
    s["out"].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref, ref_lse = paged_attention_reference(
        f64(s["q"]), f64(s["k"]), f64(s["v"]), **s["tables"], causal=True,
        causal_alignment="bottom_right",
    )  # fmt: skip
    compare({"dtype": "bf16"}, s["out"], s["lse"], ref, ref_lse, "split decode replay")


def test_run_checks_its_arrays_against_the_plan() -> None:
    s = _small_decode(max_seqlen_k=256)
    decode, q, k, v = s["decode"], s["q"], s["k"], s["v"]
    with pytest.raises(ckfmha.InvalidArgumentError, match=r"q has shape \(2, 32, 2, 128\)"):
        decode.run(torch.cat([q, q], dim=2), k, v)
    with pytest.raises(ckfmha.InvalidArgumentError, match="q is torch.float16, but the plan is"):
        decode.run(q.half(), k.half(), v.half())
    wide_pages = torch.empty((k.shape[0], 32, 8, D), device="cuda", dtype=k.dtype)
    with pytest.raises(ckfmha.InvalidArgumentError, match="the caches hold pages of 32 keys"):
        decode.run(q, wide_pages, wide_pages)
    with pytest.raises(ckfmha.InvalidArgumentError, match=r"plan checked page ids against"):
        decode.run(q, k[:-4], v[:-4])
    o = decode.run(q, k, v)  # without out: allocated like fwd_paged's
    assert o.shape == q.shape and o.dtype == q.dtype


def test_fwd_paged_takes_the_callers_workspace() -> None:
    s = _small_decode()
    args = {"causal": True, "causal_alignment": "bottom_right", "num_splits": 4,
            **{name: torch.from_numpy(np.asarray(t, np.int32)).cuda()
               for name, t in s["tables"].items()}}  # fmt: skip
    expected = ckfmha.fwd_paged(s["q"], s["k"], s["v"], **args)
    with pytest.raises(ckfmha.BufferTooSmallError,
                       match=r"workspace holds 16 bytes; this problem's split-KV plan needs"):
        ckfmha.fwd_paged(s["q"], s["k"], s["v"], workspace=ckfmha.empty((16,), "uint8"), **args)
    for workspace in (ckfmha.empty((1 << 22,), "uint8"),
                      torch.empty(1 << 22, device="cuda", dtype=torch.uint8)):
        got = ckfmha.fwd_paged(s["q"], s["k"], s["v"], workspace=workspace, **args)
        assert torch.equal(got, expected)
