"""Paged K/V plans (fwd_pagedkv, batch_prefill, then fwd_splitkv_combine) on the GPU against the
float64 reference.

Every registered paged kernel is forced by name over page sizes 1, 16, 64 and 1024, its page
layout (linear, or vLLM's vectorized one: the same keys re-laid out), both table layouts (vLLM block tables with seqlens_k; SGLang kv_indices + kv_indptr, with and without
seqlens_k), pages scattered by a random permutation of the page ids, partially filled last
pages, zero-length sequences, GQA, every mask its kernel serves in both alignments, both query
layouts, and forced and automatic split counts. Table entries past a sequence's pages hold ids
far outside the cache, so reading one faults. Outputs are poisoned with NaN first; inputs are
fresh random values per case.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from support.device_kernels import device_kernels
from support.gpu_compare import Inputs, compare, f64, torch_dtype
from support.kernel_cases import mask_options

import ckfmha
from ckfmha.reference import paged_attention_reference, varlen_attention_reference

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

# Never a valid page id: a kernel reading a table entry past a sequence's pages faults.
UNUSED_PAGE = 2**30


DECODE_KERNELS = device_kernels("fwd_pagedkv")
PREFILL_KERNELS = device_kernels("batch_prefill")


@dataclass
class PagedCache:
    """Caches [num_pages, page_size, hk, d] and both descriptions of their page tables."""

    k: Any
    v: Any
    pages: list[np.ndarray]  # page ids of each sequence, in key order
    lens_k: np.ndarray
    block_table: np.ndarray  # [batch, max_pages + 2], unused entries UNUSED_PAGE
    kv_indices: np.ndarray  # flat, with two unused entries at the end
    kv_indptr: np.ndarray

    def table_args(self, table: str) -> dict[str, Any]:
        """Keyword arguments of fwd_paged for `table`: "block_table", "kv_indptr" (with
        seqlens_k) or "kv_indptr_full" (without: every key of the pages)."""
        lens = torch.from_numpy(self.lens_k).cuda()
        if table == "block_table":
            return {"block_table": torch.from_numpy(self.block_table).cuda(), "seqlens_k": lens}
        args = {"kv_indices": torch.from_numpy(self.kv_indices).cuda(),
                "kv_indptr": torch.from_numpy(self.kv_indptr).cuda()}
        if table == "kv_indptr":
            args["seqlens_k"] = lens
        return args

    def cache_args(self, page_layout: str) -> dict[str, Any]:
        """The caches as fwd_paged's k_cache, v_cache and page_layout: the linear tensors, or
        the same keys in vLLM's vectorized layout (K [pages, hk, d / 8, page_size, 8], V
        [pages, hk, d, page_size])."""
        if page_layout == "linear":
            return {"k_cache": self.k, "v_cache": self.v}
        k, v = ckfmha.to_vectorized_pages(self.k, self.v)
        return {"k_cache": k, "v_cache": v, "page_layout": page_layout}

    def reference_args(self, table: str) -> dict[str, Any]:
        if table == "block_table":
            return {"block_table": self.block_table, "seqlens_k": self.lens_k}
        args = {"kv_indices": self.kv_indices, "kv_indptr": self.kv_indptr}
        if table == "kv_indptr":
            args["seqlens_k"] = self.lens_k
        return args


def _paged_cache(inputs: Inputs, lens_k: list[int], page_size: int, hk: int, d: int,
                 dtype: Any, seed: int) -> PagedCache:
    rng = np.random.default_rng(seed)
    counts = [-(-n // page_size) for n in lens_k]
    # Spare pages that no sequence owns: random values the kernel must never mix in.
    num_pages = sum(counts) + 3
    ids = rng.permutation(num_pages).astype(np.int32)
    pages, start = [], 0
    for count in counts:
        pages.append(ids[start : start + count])
        start += count
    width = max(counts + [1]) + 2
    table = np.full((len(lens_k), width), UNUSED_PAGE, dtype=np.int32)
    for b, p in enumerate(pages):
        table[b, : p.size] = p
    indices = np.concatenate(pages + [np.full(2, UNUSED_PAGE, np.int32)]).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return PagedCache(
        k=inputs.normal((num_pages, page_size, hk, d), dtype),
        v=inputs.normal((num_pages, page_size, hk, d), dtype),
        pages=pages, lens_k=np.asarray(lens_k, dtype=np.int32), block_table=table,
        kv_indices=indices, kv_indptr=indptr,
    )


def _mask_options(kernel: dict[str, Any], index: int) -> dict[str, Any]:
    return mask_options(kernel, index, ("bottom_right", "top_left"))


# (sq, lens_k, (hq, hk), page_size, table, num_splits): decode rows 1..8 with GQA groups of 4
# and 8, MHA and MQA, zero-length and one-key sequences, last pages partly filled, a page per
# key and pages longer than the sequences, more splits than key tiles, and a query block longer
# than one packed tile. "kv_indptr_full" sequences fill their pages exactly.
DECODE_CASES = [
    (1, [1000, 0, 37, 64], (8, 2), 16, "block_table", 0),
    (4, [517, 3000], (32, 8), 1, "kv_indptr", 3),
    (8, [4100, 65, 1], (32, 8), 64, "block_table", 7),
    (1, [2000, 1, 1025], (4, 1), 1024, "kv_indptr", 2),
    (3, [320, 128, 0], (4, 4), 64, "kv_indptr_full", 0),
    (2, [63, 0], (6, 6), 16, "block_table", 1),
    (5, [100, 250], (4, 2), 1, "block_table", 9),
    (17, [300, 129], (4, 2), 16, "kv_indptr", 2),
    (1, [16, 4096], (8, 1), 1024, "kv_indptr_full", 5),
]
# Ragged queries over paged keys: empty query blocks, prefills longer than their cached keys
# and the reverse, a zero-length key sequence.
PREFILL_LENS_Q = [0, 1, 8, 300, 3, 64]
PREFILL_LENS_K = [5, 1, 2000, 300, 0, 200]
PREFILL_CASES = [
    (16, "block_table", 0),
    (1, "kv_indptr", 3),
    (64, "kv_indptr", 7),
    (1024, "block_table", 2),
    (16, "kv_indptr_full", 1),
]


def _run_decode(kernel: dict[str, Any] | None, index: int, case: tuple[Any, ...],
                inputs: Inputs, dtype_name: str, d: int, page_layout: str = "linear") -> None:
    sq, lens_k, (hq, hk), page_size, table, num_splits = case
    if table == "kv_indptr_full":
        lens_k = [-(-n // page_size) * page_size for n in lens_k]
    dtype = torch_dtype(dtype_name)
    layout = ["bhsd", "bshd"][index % 2]
    batch = len(lens_k)
    cache = _paged_cache(inputs, lens_k, page_size, hk, d, dtype, seed=index)
    q_shape = (batch, sq, hq, d) if layout == "bshd" else (batch, hq, sq, d)
    q = inputs.normal(q_shape, dtype)
    out = torch.full(q_shape, float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((batch, hq, sq), float("nan"), device="cuda", dtype=torch.float32)
    options = _mask_options(kernel or {"mask": "causal"}, index)
    if kernel is not None and kernel["softcap"]:
        options["softcap"] = 2.5
    scale = 1.0 / math.sqrt(d) * (0.75 if index % 2 else 1.0)
    if kernel is not None:
        page_layout = kernel["page_layout"]
    ckfmha.fwd_paged(q, **cache.cache_args(page_layout), **cache.table_args(table), scale=scale,
                     layout=layout, return_lse=True, out=out, lse_out=lse,
                     num_splits=num_splits, kernel=None if kernel is None else kernel["name"],
                     **options)
    torch.cuda.synchronize()
    ref, ref_lse = paged_attention_reference(
        f64(q), f64(cache.k), f64(cache.v), **cache.reference_args(table), layout=layout,
        scale=scale, **options)
    what = f"{case} {layout} {page_layout} {options}"
    compare(kernel or {"dtype": dtype_name}, out, lse, ref, ref_lse, what)


def _run_prefill(kernel: dict[str, Any], index: int, case: tuple[Any, ...],
                 inputs: Inputs) -> None:
    page_size, table, num_splits = case
    dtype = torch_dtype(kernel["dtype"])
    d = kernel["hdim_q"]
    hq, hk = [(8, 2), (3, 3)][index % 2]
    lens_q = np.roll(PREFILL_LENS_Q, index)
    lens_k = list(np.roll(PREFILL_LENS_K, index))
    if table == "kv_indptr_full":
        lens_k = [-(-n // page_size) * page_size for n in lens_k]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    total_q = int(cu_q[-1])
    cache = _paged_cache(inputs, lens_k, page_size, hk, d, dtype, seed=100 + index)
    q = inputs.normal((total_q, hq, d), dtype)
    out = torch.full((total_q, hq, d), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((hq, total_q), float("nan"), device="cuda", dtype=torch.float32)
    options = _mask_options(kernel, index)
    if kernel["softcap"]:
        options["softcap"] = 2.5
    ckfmha.fwd_paged(q, **cache.cache_args(kernel["page_layout"]), **cache.table_args(table),
                     cu_seqlens_q=torch.from_numpy(cu_q).cuda(), max_seqlen_q=int(lens_q.max()),
                     return_lse=True, out=out, lse_out=lse, num_splits=num_splits,
                     kernel=kernel["name"], **options)
    torch.cuda.synchronize()
    ref, ref_lse = paged_attention_reference(
        f64(q), f64(cache.k), f64(cache.v), **cache.reference_args(table), cu_seqlens_q=cu_q,
        **options)
    compare(kernel, out, lse, ref, ref_lse, f"prefill {case} {options}")


@pytest.mark.parametrize("kernel", DECODE_KERNELS, ids=[k["name"] for k in DECODE_KERNELS])
def test_paged_decode_kernel_matches_reference(kernel: dict[str, Any]) -> None:
    inputs = Inputs(zlib.crc32(kernel["name"].encode()))
    for index, case in enumerate(DECODE_CASES):
        _run_decode(kernel, index, case, inputs, kernel["dtype"], kernel["hdim_q"])


@pytest.mark.parametrize("kernel", PREFILL_KERNELS, ids=[k["name"] for k in PREFILL_KERNELS])
def test_batch_prefill_kernel_matches_reference(kernel: dict[str, Any]) -> None:
    inputs = Inputs(zlib.crc32(kernel["name"].encode()))
    for index, case in enumerate(PREFILL_CASES):
        _run_prefill(kernel, index, case, inputs)


@pytest.mark.parametrize("sq", [1, 2, 4, 8])
@pytest.mark.parametrize("page_size", [1, 16, 64, 1024])
@pytest.mark.parametrize("page_layout", ["linear", "vectorized"])
def test_automatic_paged_decode_plan(sq: int, page_size: int, page_layout: str) -> None:
    """No kernel forced: the dispatcher picks the paged kernel (and tile) and the split count."""
    causal = [k for k in DECODE_KERNELS if k["mask"] != "none" and not k["softcap"]
              and k["page_layout"] == page_layout]
    if not causal:
        pytest.skip(f"library built without masked {page_layout} fwd_pagedkv kernels")
    kernel = causal[0]
    problem = ckfmha.FwdProblem(batch=3, nhead_q=32, nhead_k=8, seqlen_q=sq, seqlen_k=3000,
                                hdim=kernel["hdim_q"], dtype=kernel["dtype"], lse=True,
                                causal=True, causal_alignment="bottom_right",
                                paged_kv="block_table", page_size=page_size,
                                page_layout=page_layout)
    explanation = ckfmha.Dispatcher().explain(problem)
    assert "plan: split-KV, fwd_pagedkv_" in explanation, explanation
    inputs = Inputs(sq * 7919 + page_size)
    case = (sq, [3000, 1, 1234], (32, 8), page_size, "block_table", 0)
    _run_decode(None, 0, case, inputs, kernel["dtype"], kernel["hdim_q"], page_layout)


def test_page_offsets_past_2_31_elements() -> None:
    """Pages whose element offsets pass 2^31 (a 4.6 GB cache per tensor): 64-bit addressing."""
    candidates = [k for k in DECODE_KERNELS
                  if k["hdim_q"] == 128 and not k["softcap"] and k["page_layout"] == "linear"]
    if not candidates:
        pytest.skip("library built without d128 fwd_pagedkv kernels")
    kernel = candidates[0]
    dtype = torch_dtype(kernel["dtype"])
    page_size, hk, hq, d = 16, 8, 32, 128
    num_pages = 2**31 // (page_size * hk * d) + 9000
    free, _ = torch.cuda.mem_get_info()
    if 2 * num_pages * page_size * hk * d * 2 > free - (2 << 30):
        pytest.skip("not enough device memory for two 4.6 GB caches")
    inputs = Inputs(31)
    k_cache = torch.empty((num_pages, page_size, hk, d), device="cuda", dtype=dtype)
    v_cache = torch.empty_like(k_cache)
    lens_k = [700, 333]
    # Sequence 0 on the last pages (offsets past 2^31), sequence 1 straddling the boundary.
    boundary = 2**31 // (page_size * hk * d)
    pages = [np.arange(num_pages - 44, num_pages, dtype=np.int32),
             np.arange(boundary - 10, boundary + 11, dtype=np.int32)]
    keys, values = [], []
    for p, n in zip(pages, lens_k):
        k_seq = inputs.normal((p.size * page_size, hk, d), dtype)
        v_seq = inputs.normal((p.size * page_size, hk, d), dtype)
        index = torch.from_numpy(p.astype(np.int64)).cuda()
        k_cache[index] = k_seq.view(p.size, page_size, hk, d)
        v_cache[index] = v_seq.view(p.size, page_size, hk, d)
        keys.append(f64(k_seq)[:n])
        values.append(f64(v_seq)[:n])
    table = np.full((2, 44), UNUSED_PAGE, dtype=np.int32)
    for b, p in enumerate(pages):
        table[b, : p.size] = p
    q = inputs.normal((2, hq, 2, d), dtype)
    out = torch.full((2, hq, 2, d), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((2, hq, 2), float("nan"), device="cuda", dtype=torch.float32)
    options = _mask_options(kernel, 0)
    ckfmha.fwd_paged(q, k_cache, v_cache, block_table=torch.from_numpy(table).cuda(),
                     seqlens_k=torch.tensor(lens_k, dtype=torch.int32, device="cuda"),
                     return_lse=True, out=out, lse_out=lse, kernel=kernel["name"], **options)
    torch.cuda.synchronize()
    cu_k = np.array([0, lens_k[0], sum(lens_k)])
    q_tokens = f64(q).transpose(0, 2, 1, 3).reshape(4, hq, d)
    ref, ref_lse = varlen_attention_reference(q_tokens, np.concatenate(keys),
                                              np.concatenate(values), np.array([0, 2, 4]), cu_k,
                                              **options)
    ref = ref.reshape(2, 2, hq, d).transpose(0, 2, 1, 3)
    ref_lse = ref_lse.reshape(hq, 2, 2).transpose(1, 0, 2)
    compare(kernel, out, lse, ref, ref_lse, "offsets past 2^31")
