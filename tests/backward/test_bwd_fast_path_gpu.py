"""The per-call fast path of ckfmha.bwd (ckfmha/_bwd_fast.pyx) on the GPU.

A torch call whose shapes, strides, dtypes, devices and options match an earlier call reuses
that call's checked C problem. Every call here draws fresh random inputs and is checked
against the float64 reference, so a cached problem that kept an earlier call's pointers,
shapes or options fails; the gradients' memory comes from torch's caching allocator, which
hands the previous call's freed blocks back, so each call's gradients are poisoned with NaN
through those blocks first. Calls that differ in strides, layout, mask, scale or mode get
their own entries, a GPU bias is read call by call, and group-mode calls read each call's
offsets.
The kernels are the default set's (bf16 d64, none and causal, a key-padding bias, group mode).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from support.gpu_compare import Inputs, f64

import ckfmha
from ckfmha import _bwd_fast
from ckfmha.reference import attention_reference, varlen_attention_reference
from ckfmha.reference_bwd import (
    attention_backward_reference,
    varlen_attention_backward_reference,
)

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

REL_L2_TOL = 3e-2  # bf16, as the backward kernel tests


def _shape(layout: str, b: int, h: int, s: int, d: int) -> tuple[int, ...]:
    return (b, s, h, d) if layout == "bshd" else (b, h, s, d)


def _forward(q: Any, k: Any, v: Any, layout: str, **options: Any) -> tuple[Any, Any]:
    """O (bf16) and the LSE (fp32, contiguous rows) from the float64 reference."""
    out, lse = attention_reference(f64(q), f64(k), f64(v), layout=layout, **options)
    o = torch.from_numpy(out).to(device="cuda", dtype=torch.bfloat16)
    return o, torch.from_numpy(np.ascontiguousarray(lse)).to("cuda", torch.float32)


def _poison_freed_blocks(shapes: list[tuple[int, ...]]) -> None:
    """Fill and free blocks of the gradients' sizes, so the caching allocator's next blocks
    of those sizes hold NaN: an element the cached call leaves unwritten then fails."""
    for shape in shapes:
        torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")


def _check(got: tuple, q: Any, k: Any, v: Any, do: Any, layout: str, what: str,
           **options: Any) -> None:  # fmt: skip
    torch.cuda.synchronize()
    ref = attention_backward_reference(f64(q), f64(k), f64(v), f64(do), layout=layout, **options)
    for name, grad, want in zip(("dq", "dk", "dv"), got, (ref.dq, ref.dk, ref.dv)):
        g = f64(grad)
        assert not np.isnan(g).any(), f"unwritten (NaN) elements in {name} ({what})"
        rel = np.linalg.norm(g - want) / max(np.linalg.norm(want), 1e-30)
        assert rel < REL_L2_TOL, f"{name} ({what}): relative L2 error {rel:.3e}"


# (batch, nhead_q, nhead_k, seqlen_q, seqlen_k, hdim, layout, causal): GQA over odd lengths,
# 40 query heads over 8 in bshd, MQA with more keys than queries.
CASES = [
    (1, 24, 8, 257, 257, 64, "bhsd", True),
    (2, 40, 8, 133, 133, 64, "bshd", False),
    (2, 12, 1, 100, 301, 64, "bhsd", False),
]


@pytest.mark.parametrize("case", CASES, ids=[f"b{c[0]}h{c[1]}/{c[2]}s{c[3]}k{c[4]}d{c[5]}"
                                             f"{c[6]}{'c' if c[7] else ''}" for c in CASES])
def test_repeated_calls_read_each_calls_data(case: tuple[Any, ...]) -> None:
    b, hq, hk, sq, sk, d, layout, causal = case
    inputs = Inputs(4321 + sq)
    _bwd_fast.clear()
    scale = 1.0 / math.sqrt(d)
    for call in range(4):
        q = inputs.normal(_shape(layout, b, hq, sq, d), torch.bfloat16)
        k, v = (inputs.normal(_shape(layout, b, hk, sk, d), torch.bfloat16) for _ in range(2))
        do = inputs.normal(_shape(layout, b, hq, sq, d), torch.bfloat16)
        o, lse = _forward(q, k, v, layout, causal=causal, scale=scale)
        _poison_freed_blocks([tuple(q.shape), tuple(k.shape)])
        got = ckfmha.bwd(do, q, k, v, o, lse, causal=causal, scale=scale, layout=layout)
        _check(got, q, k, v, do, layout, f"call {call} {case}", causal=causal, scale=scale)
    assert _bwd_fast.cached_calls() == 1


def test_strides_options_and_modes_get_their_own_entries() -> None:
    inputs = Inputs(17)
    _bwd_fast.clear()
    b, h, sq, sk, d = 1, 12, 200, 300, 64
    q = inputs.normal((b, h, sq, d), torch.bfloat16)
    k, v = (inputs.normal((b, h, sk, d), torch.bfloat16) for _ in range(2))
    # The same sizes as permuted views: other strides.
    kp, vp = (inputs.normal((b, sk, h, d), torch.bfloat16).transpose(1, 2) for _ in range(2))
    do = inputs.normal((b, h, sq, d), torch.bfloat16)
    calls = [
        (k, v, {}),
        (kp, vp, {}),
        (k, v, {"causal": True, "causal_alignment": "bottom_right"}),
        (k, v, {"scale": 0.3}),
        (k, v, {"deterministic": True}),
    ]
    for repeat in range(2):
        for kk, vv, options in calls:
            reference_options = {n: x for n, x in options.items() if n != "deterministic"}
            o, lse = _forward(q, kk, vv, "bhsd", **reference_options)
            got = ckfmha.bwd(do, q, kk, vv, o, lse, **options)
            _check(got, q, kk, vv, do, "bhsd", f"{options} repeat {repeat}",
                   **reference_options)  # fmt: skip
        assert _bwd_fast.cached_calls() == len(calls)


def test_bias_calls_read_each_calls_bias() -> None:
    """A key-padding bias of a new length each call, through one cache entry."""
    inputs = Inputs(23)
    _bwd_fast.clear()
    b, hq, hk, sq, sk, d = 2, 12, 4, 150, 333, 64
    for call in range(3):
        q = inputs.normal((b, hq, sq, d), torch.bfloat16)
        k, v = (inputs.normal((b, hk, sk, d), torch.bfloat16) for _ in range(2))
        do = inputs.normal((b, hq, sq, d), torch.bfloat16)
        bias = torch.zeros((b, 1, 1, sk), dtype=torch.bfloat16, device="cuda")
        bias[0, ..., 1 + inputs.integer(sk - 1):] = float("-inf")
        o, lse = _forward(q, k, v, "bhsd", causal=True, bias=f64(bias))
        got = ckfmha.bwd(do, q, k, v, o, lse, causal=True, bias=bias)
        _check(got, q, k, v, do, "bhsd", f"key-padding bias, call {call}", causal=True,
               bias=f64(bias))  # fmt: skip
    assert _bwd_fast.cached_calls() == 1


def test_features_outside_the_fast_path_take_the_full_path() -> None:
    """Dropout, sinks and caller outputs are not cached: their calls leave the cache empty."""
    inputs = Inputs(29)
    _bwd_fast.clear()
    q, k, v, do = (inputs.normal((1, 4, 64, 64), torch.bfloat16) for _ in range(4))
    o, lse = _forward(q, k, v, "bhsd")
    dq = torch.full_like(q, float("nan"))
    got = ckfmha.bwd(do, q, k, v, o, lse, dq_out=dq)
    assert got[0] is dq
    _check(got, q, k, v, do, "bhsd", "caller dq")
    assert _bwd_fast.cached_calls() == 0


# Three sequences with the same totals and maximum lengths each call (one without queries,
# whose keys get zero gradients, among them): one entry serves every call.
VARLEN_OFFSETS = [
    ([0, 100, 250, 300], [0, 200, 300, 420]),
    ([0, 140, 160, 300], [0, 120, 320, 420]),
    ([0, 150, 150, 300], [0, 200, 220, 420]),
]


def test_varlen_calls_read_each_calls_offsets() -> None:
    inputs = Inputs(37)
    _bwd_fast.clear()
    hq, hk, d, max_q, max_k = 12, 4, 64, 160, 200
    for call, (offsets_q, offsets_k) in enumerate(VARLEN_OFFSETS):
        total_q, total_k = offsets_q[-1], offsets_k[-1]
        q, do = (inputs.normal((total_q, hq, d), torch.bfloat16) for _ in range(2))
        k, v = (inputs.normal((total_k, hk, d), torch.bfloat16) for _ in range(2))
        cu_q, cu_k = (torch.tensor(o, dtype=torch.int32, device="cuda")
                      for o in (offsets_q, offsets_k))  # fmt: skip
        out, lse = varlen_attention_reference(f64(q), f64(k), f64(v), offsets_q, offsets_k,
                                              causal=True)  # fmt: skip
        o = torch.from_numpy(out).to(device="cuda", dtype=torch.bfloat16)
        lse = torch.from_numpy(np.ascontiguousarray(lse)).to("cuda", torch.float32)
        _poison_freed_blocks([tuple(q.shape), tuple(k.shape)])
        got = ckfmha.bwd_varlen(do, q, k, v, o, lse, cu_q, cu_k, max_seqlen_q=max_q,
                                max_seqlen_k=max_k, causal=True)  # fmt: skip
        torch.cuda.synchronize()
        ref = varlen_attention_backward_reference(f64(q), f64(k), f64(v), f64(do), offsets_q,
                                                  offsets_k, causal=True)  # fmt: skip
        for name, grad, want in zip(("dq", "dk", "dv"), got, (ref.dq, ref.dk, ref.dv)):
            g = f64(grad)
            assert not np.isnan(g).any(), f"unwritten (NaN) elements in {name} (call {call})"
            rel = np.linalg.norm(g - want) / max(np.linalg.norm(want), 1e-30)
            assert rel < REL_L2_TOL, f"{name} (varlen call {call}): relative L2 error {rel:.3e}"
    assert _bwd_fast.cached_calls() == 1
