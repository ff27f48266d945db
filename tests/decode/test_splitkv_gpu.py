"""Split-KV plans (fwd_splitkv + fwd_splitkv_combine) on the GPU against the float64 reference.

Every registered split kernel is forced by name, so the plan runs it and then the combine
stage the dispatcher pairs with it, with forced split counts (1, 2, 3, 7, and more splits than
key tiles), every mask its kernel serves (windows that leave whole splits without a visible
key among them), GQA, odd lengths, both layouts, varlen batches with zero-length sequences,
and decode shapes (seqlen_q 1..8). Every combine kernel is exercised through a split kernel of
its dtype, mode and head dim. Outputs are poisoned with NaN first.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
import pytest
from support.device_kernels import device_kernels
from support.gpu_compare import Inputs, compare, f64, torch_dtype
from support.kernel_cases import mask_options

import ckfmha
from ckfmha.reference import attention_reference, varlen_attention_reference

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None


SPLIT_KERNELS = device_kernels("fwd_splitkv")
COMBINE_KERNELS = device_kernels("fwd_splitkv_combine")

# (sq, sk, (hq, hk), num_splits, batch): decode rows, GQA groups of 4 and 8, MHA and MQA,
# one key, key counts off the 64-key tile, more splits than key tiles (sk 100 = 2 tiles),
# and prefill-shaped problems whose packed rows span several query tiles.
BATCH_CASES = [
    (1, 1000, (8, 2), 2, 2),
    (1, 1000, (8, 2), 1, 2),
    (4, 517, (32, 8), 3, 1),
    (8, 4100, (32, 8), 7, 2),
    (5, 300, (4, 1), 3, 2),
    (17, 100, (4, 2), 9, 2),
    (1, 1, (4, 4), 3, 1),
    (2, 63, (6, 6), 2, 1),
    (300, 257, (4, 2), 2, 1),
    (129, 1000, (2, 1), 7, 1),
]
# Windows: (16, 0) bottom-right at sq 1 leaves only the last of 7 splits a visible key.
VARLEN_Q = [0, 1, 8, 300, 3, 64]
VARLEN_K = [5, 1, 2000, 300, 0, 200]


def _mask_options(kernel: dict[str, Any], index: int) -> dict[str, Any]:
    return mask_options(kernel, index, ("bottom_right", "top_left"))


def _run_batch(kernel: dict[str, Any], index: int, case: tuple[Any, ...], inputs: Inputs,
               forced: bool = True) -> None:
    sq, sk, (hq, hk), num_splits, b = case
    dtype = torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    layout = ["bhsd", "bshd"][index % 2]

    def shape(heads: int, seqlen: int, dim: int) -> tuple[int, ...]:
        return (b, seqlen, heads, dim) if layout == "bshd" else (b, heads, seqlen, dim)

    q = inputs.normal(shape(hq, sq, d), dtype)
    k = inputs.normal(shape(hk, sk, d), dtype)
    v = inputs.normal(shape(hk, sk, dv), dtype)
    out = torch.full(shape(hq, sq, dv), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((b, hq, sq), float("nan"), device="cuda", dtype=torch.float32)
    options = _mask_options(kernel, index)
    if kernel["softcap"]:
        options["softcap"] = 2.5
    scale = 1.0 / math.sqrt(d) * (0.75 if index % 2 else 1.0)
    ckfmha.fwd(q, k, v, scale=scale, return_lse=True, layout=layout, out=out, lse_out=lse,
               kernel=kernel["name"] if forced else None, num_splits=num_splits, **options)
    torch.cuda.synchronize()
    ref, ref_lse = attention_reference(f64(q), f64(k), f64(v), scale=scale, layout=layout,
                                       **options)
    compare(kernel, out, lse, ref, ref_lse, f"{case} {layout} {options}")


def _run_group(kernel: dict[str, Any], index: int, num_splits: int, inputs: Inputs) -> None:
    dtype = torch_dtype(kernel["dtype"])
    d, dv = kernel["hdim_q"], kernel["hdim_v"]
    hq, hk = [(8, 2), (3, 3)][index % 2]
    lens_q = np.roll(VARLEN_Q, index)
    lens_k = np.roll(VARLEN_K, index)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = inputs.normal((int(cu_q[-1]), hq, d), dtype)
    k = inputs.normal((int(cu_k[-1]), hk, d), dtype)
    v = inputs.normal((int(cu_k[-1]), hk, dv), dtype)
    out = torch.full((int(cu_q[-1]), hq, dv), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((hq, int(cu_q[-1])), float("nan"), device="cuda", dtype=torch.float32)
    options = _mask_options(kernel, index)
    if kernel["softcap"]:
        options["softcap"] = 2.5
    skip_min = 2 if index % 2 else 0
    ckfmha.fwd_varlen(q, k, v, torch.from_numpy(cu_q).cuda(), torch.from_numpy(cu_k).cuda(),
                      max_seqlen_q=int(lens_q.max()), max_seqlen_k=int(lens_k.max()),
                      skip_min_seqlen_q=skip_min, return_lse=True, out=out, lse_out=lse,
                      kernel=kernel["name"], num_splits=num_splits, **options)
    torch.cuda.synchronize()
    ref, ref_lse = varlen_attention_reference(f64(q), f64(k), f64(v), cu_q, cu_k,
                                              skip_min_seqlen_q=skip_min, **options)
    compare(kernel, out, lse, ref, ref_lse, f"varlen {index} splits {num_splits} {options}")


@pytest.mark.parametrize("kernel", SPLIT_KERNELS, ids=[k["name"] for k in SPLIT_KERNELS])
def test_split_kernel_matches_reference(kernel: dict[str, Any]) -> None:
    inputs = Inputs(zlib.crc32(kernel["name"].encode()))
    if kernel["mode"] == "group":
        for index, num_splits in enumerate((0, 1, 3, 7)):
            _run_group(kernel, index, num_splits, inputs)
    else:
        for index, case in enumerate(BATCH_CASES):
            _run_batch(kernel, index, case, inputs)


@pytest.mark.parametrize("combine", COMBINE_KERNELS, ids=[k["name"] for k in COMBINE_KERNELS])
def test_combine_kernel_merges_exactly(combine: dict[str, Any]) -> None:
    partners = [k for k in SPLIT_KERNELS
                if (k["dtype"], k["mode"], k["hdim_v"], k["arch_name"])
                == (combine["dtype"], combine["mode"], combine["hdim_v"], combine["arch_name"])]
    if not partners:
        # The paged families share combine kernels; a build filtered to them has none of these.
        paged = device_kernels("fwd_pagedkv") + device_kernels("batch_prefill")
        assert paged, f"no split kernel feeds {combine['name']}"
        pytest.skip(f"{combine['name']} feeds only paged kernels in this build")
    inputs = Inputs(zlib.crc32(combine["name"].encode()))
    # Split counts past one pass of the kernel's split groups (4-8 groups of 8 splits each):
    # decode rows merge 40-90 partials, some of them from splits without keys.
    if combine["mode"] == "group":
        _run_group(partners[0], 2, 5, inputs)
        _run_group(partners[0], 3, 48, inputs)
    else:
        _run_batch(partners[0], 2, (3, 2000, (16, 4), 5, 2), inputs)
        _run_batch(partners[0], 3, (1, 6000, (8, 2), 90, 1), inputs)
        _run_batch(partners[0], 4, (2, 2600, (12, 4), 41, 2), inputs)


@pytest.mark.parametrize("sq", range(1, 9))
def test_decode_shapes_take_the_split_plan(sq: int) -> None:
    """Automatic plans for decode steps (no kernel forced, num_splits chosen) are split-KV
    plans where a split kernel fits, and match the reference."""
    candidates = [k for k in SPLIT_KERNELS if k["mode"] == "batch"]
    if not candidates:
        pytest.skip("library built without batch-mode split-KV kernels")
    kernel = candidates[0]
    hq, hk, sk = 32, 8, 3000
    options = (
        {"causal": True, "causal_alignment": "bottom_right"} if kernel["mask"] != "none" else {}
    )
    problem = ckfmha.FwdProblem(batch=2, nhead_q=hq, nhead_k=hk, seqlen_q=sq, seqlen_k=sk,
                                hdim=kernel["hdim_q"], dtype=kernel["dtype"], lse=True,
                                **options)
    explanation = ckfmha.Dispatcher().explain(problem)
    assert "plan: split-KV" in explanation, explanation
    assert "decode-shaped" in explanation, explanation
    inputs = Inputs(sq)
    dtype = torch_dtype(kernel["dtype"])
    q = inputs.normal((2, hq, sq, kernel["hdim_q"]), dtype)
    k = inputs.normal((2, hk, sk, kernel["hdim_q"]), dtype)
    v = inputs.normal((2, hk, sk, kernel["hdim_v"]), dtype)
    out = torch.full((2, hq, sq, kernel["hdim_v"]), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((2, hq, sq), float("nan"), device="cuda", dtype=torch.float32)
    ckfmha.fwd(q, k, v, return_lse=True, out=out, lse_out=lse, **options)
    torch.cuda.synchronize()
    ref, ref_lse = attention_reference(f64(q), f64(k), f64(v), **options)
    compare(kernel, out, lse, ref, ref_lse, f"decode sq={sq} auto plan {options}")


@pytest.mark.parametrize("return_lse", [True, False])
def test_full_decode_batch_runs_one_split(return_lse: bool) -> None:
    """A decode batch whose unsplit grid fills the GPU in one wave runs the split kernel as one
    split writing O (and LSE when asked) itself, with no combine stage: it must still match."""
    batch, hq, hk, sk = 64, 32, 8, 1000
    candidates = [k for k in SPLIT_KERNELS if k["mode"] == "batch" and k["hdim_q"] == 128]
    if not candidates:
        pytest.skip("library built without batch-mode d128 split-KV kernels")
    kernel = candidates[0]
    options = (
        {"causal": True, "causal_alignment": "bottom_right"} if kernel["mask"] != "none" else {}
    )
    problem = ckfmha.FwdProblem(batch=batch, nhead_q=hq, nhead_k=hk, seqlen_q=1, seqlen_k=sk,
                                hdim=128, dtype=kernel["dtype"], lse=return_lse, **options)
    plan = ckfmha.Dispatcher().explain(problem).split("plan: ")[-1]
    if "num_splits=1: one split writes O directly" not in plan:
        pytest.skip(f"this device and build split a b64 decode step: {plan}")
    inputs = Inputs(batch + return_lse)
    dtype = torch_dtype(kernel["dtype"])
    q = inputs.normal((batch, hq, 1, 128), dtype)
    k = inputs.normal((batch, hk, sk, 128), dtype)
    v = inputs.normal((batch, hk, sk, 128), dtype)
    out = torch.full((batch, hq, 1, 128), float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((batch, hq, 1), float("nan"), device="cuda", dtype=torch.float32)
    result = ckfmha.fwd(q, k, v, return_lse=return_lse, out=out,
                        lse_out=lse if return_lse else None, **options)
    torch.cuda.synchronize()
    ref, ref_lse = attention_reference(f64(q), f64(k), f64(v), **options)
    if not return_lse:
        # No LSE asked for: the untouched buffer must stay poisoned.
        assert result.data_ptr() == out.data_ptr()
        ref_lse = np.full_like(ref_lse, np.nan)
    compare(kernel, out, lse, ref, ref_lse, f"b{batch} one split, lse={return_lse} {options}")
