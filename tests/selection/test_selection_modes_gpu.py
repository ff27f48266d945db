"""Every selection mode on a GPU: the plans the learned model picks (forward, decode with GQA,
the backward main stage) compute what the float64 reference does, into poisoned outputs, on
shapes the model was not trained on (12 and 40 query heads, odd lengths)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.gpu_compare import Inputs, compare, compare_packed, f64, torch_dtype

import ckfmha
from ckfmha.reference import attention_reference
from ckfmha.reference_bwd import attention_backward_reference

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

# (batch, nhead_q, nhead_k, seqlen_q, seqlen_k, hdim, causal)
FORWARD = [(3, 40, 8, 1, 9001, 128, False), (2, 12, 3, 517, 517, 128, True),
           (1, 40, 5, 1, 33333, 64, False), (4, 12, 12, 1000, 1000, 64, True)]  # fmt: skip
BACKWARD = [(2, 12, 4, 333, 333, 128, True), (1, 40, 8, 700, 700, 64, False)]
MODES = ("heuristic", "learned")
# Backward gradients: relative L2 against float64, as the backward suite's bf16 bound.
GRAD_REL_L2 = 2e-2


def _tensors(case: tuple, seed: int) -> tuple[Any, Any, Any]:
    b, hq, hk, sq, sk, d, _ = case
    inputs, dtype = Inputs(seed), torch_dtype("bf16")
    return (inputs.normal((b, hq, sq, d), dtype), inputs.normal((b, hk, sk, d), dtype),
            inputs.normal((b, hk, sk, d), dtype))  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", FORWARD, ids=lambda c: "b{}h{}/{}q{}k{}d{}{}".format(
    *c[:6], "c" if c[6] else ""))  # fmt: skip
def test_forward_plans_of_each_mode_match_the_reference(case: tuple, mode: str) -> None:
    q, k, v = _tensors(case, seed=hash(case) % 1000)
    causal = case[6]
    mask = {"causal": True, "causal_alignment": "bottom_right"} if causal else {}
    ref, ref_lse = attention_reference(f64(q), f64(k), f64(v), **mask)
    out = torch.full(q.shape, float("nan"), device="cuda", dtype=q.dtype)
    with ckfmha.selection(mode):
        explain = ckfmha.Dispatcher().explain(
            batch=case[0], nhead_q=case[1], nhead_k=case[2], seqlen_q=case[3], seqlen_k=case[4],
            hdim=case[5], dtype="bf16", lse=True, **mask)  # fmt: skip
        _, lse = ckfmha.fwd(q, k, v, out=out, return_lse=True, **mask)
    torch.cuda.synchronize()
    if mode == "learned":
        assert "selection: learned" in explain and "  predicted " in explain, explain
    compare({"dtype": "bf16"}, out, lse, ref, ref_lse, f"{case} {mode}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", BACKWARD, ids=lambda c: "b{}h{}/{}q{}k{}d{}{}".format(
    *c[:6], "c" if c[6] else ""))  # fmt: skip
def test_backward_main_stage_of_each_mode_matches_the_reference(case: tuple, mode: str) -> None:
    q, k, v = _tensors(case, seed=7 + hash(case) % 1000)
    do = Inputs(99).normal(q.shape, q.dtype)
    causal = case[6]
    o, lse = ckfmha.fwd(q, k, v, return_lse=True, causal=causal)
    ref = attention_backward_reference(f64(q), f64(k), f64(v), f64(do), causal=causal)
    grads = [torch.full(t.shape, float("nan"), device="cuda", dtype=t.dtype) for t in (q, k, v)]
    with ckfmha.selection(mode):
        ckfmha.bwd(do, q, k, v, o, lse, causal=causal, dq_out=grads[0], dk_out=grads[1],
                   dv_out=grads[2])  # fmt: skip
    torch.cuda.synchronize()
    for name, got, want in zip(("dq", "dk", "dv"), grads, (ref.dq, ref.dk, ref.dv)):
        g = f64(got)
        assert not np.isnan(g).any(), f"{name} left unwritten ({case} {mode})"
        rel = np.linalg.norm(g - want) / np.linalg.norm(want)
        assert rel < GRAD_REL_L2, f"{name} relative L2 {rel:.3e} ({case} {mode})"


# Group mode: (nhead_q, nhead_k, query lengths, key lengths, hdim, causal), packed.
VARLEN = [(40, 8, (1, 1, 1), (3001, 517, 9000), 128, False),
          (12, 4, (333, 1000, 47), (333, 1000, 47), 64, True),
          (24, 24, (700, 5, 1290, 2), (700, 5, 1290, 2), 128, False)]  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", VARLEN, ids=lambda c: "h{}/{}q{}k{}d{}{}".format(
    c[0], c[1], sum(c[2]), sum(c[3]), c[4], "c" if c[5] else ""))  # fmt: skip
def test_varlen_plans_of_each_mode_match_the_reference(case: tuple, mode: str) -> None:
    hq, hk, lengths_q, lengths_k, d, causal = case
    inputs, dtype = Inputs(sum(lengths_k) % 1000), torch_dtype("bf16")
    q = inputs.normal((sum(lengths_q), hq, d), dtype)
    k, v = (inputs.normal((sum(lengths_k), hk, d), dtype) for _ in range(2))
    cu_q = torch.tensor(np.cumsum((0, *lengths_q)), device="cuda", dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum((0, *lengths_k)), device="cuda", dtype=torch.int32)
    out = torch.full(q.shape, float("nan"), device="cuda", dtype=q.dtype)
    problem = {"mode": "group", "batch": len(lengths_q), "nhead_q": hq, "nhead_k": hk,
               "seqlen_q": max(lengths_q), "seqlen_k": max(lengths_k), "total_q": sum(lengths_q),
               "total_k": sum(lengths_k), "hdim": d, "dtype": "bf16", "causal": causal,
               "lse": True}  # fmt: skip
    with ckfmha.selection(mode):
        explain = ckfmha.Dispatcher().explain(**problem)
        _, lse = ckfmha.fwd_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=max(lengths_q),
                                   max_seqlen_k=max(lengths_k), causal=causal, out=out,
                                   return_lse=True)  # fmt: skip
    torch.cuda.synchronize()
    if mode == "learned":
        assert "  trees     varlen\n" in explain and "  predicted " in explain, explain
    compare_packed(out, lse, q, k, v, list(lengths_q), list(lengths_k), f"{case} {mode}",
                   causal=causal)  # fmt: skip
