"""The per-call fast path of ckfmha.fwd (ckfmha/_fwd_fast.pyx) on the GPU.

A torch call whose shapes, strides, dtypes, devices and options match an earlier call reuses
that call's checked C problem. These tests repeat calls with fresh random data each time
(checked against the float64 reference, outputs poisoned first), so a cached problem that kept
an earlier call's pointers, shapes or options would fail them; they also check that calls
which differ in strides, layout, mask or LSE get their own entries, that calls with a GPU
bias read each call's bias, that group-mode calls read each call's offsets, and that caller
outputs overlapping the inputs (the bias among them) are still refused on a cached call.
The kernels are those of the default set (bf16, d64/d128, none/causal/window, split-KV,
group mode at d64).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from support.gpu_compare import Inputs, compare, f64

import ckfmha
from ckfmha import _fwd_fast
from ckfmha.errors import InvalidArgumentError
from ckfmha.reference import attention_reference, varlen_attention_reference

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

# (batch, nhead_q, nhead_k, seqlen_q, seqlen_k, hdim, options): a decode step on the split-KV
# plan (GQA group of 3), a causal prefill with GQA over odd lengths, and an unmasked bshd
# call with 40 query heads over 8.
CASES = [
    (2, 12, 4, 1, 1000, 128, {}),
    (1, 24, 8, 257, 257, 64, {"causal": True}),
    (1, 40, 8, 333, 301, 128, {"layout": "bshd", "return_lse": True}),
]


def _qkv(inputs: Inputs, q_shape: tuple[int, ...], kv_shape: tuple[int, ...]) -> tuple[Any, ...]:
    return tuple(inputs.normal(shape, torch.bfloat16) for shape in (q_shape, kv_shape, kv_shape))


def _shape(layout: str, b: int, h: int, s: int, d: int) -> tuple[int, ...]:
    return (b, s, h, d) if layout == "bshd" else (b, h, s, d)


@pytest.mark.parametrize(
    "case", CASES, ids=[f"b{c[0]}h{c[1]}/{c[2]}s{c[3]}k{c[4]}d{c[5]}" for c in CASES]
)
def test_repeated_calls_read_each_calls_data(case: tuple[Any, ...]) -> None:
    b, hq, hk, sq, sk, d, options = case
    layout = options.get("layout", "bhsd")
    causal = options.get("causal", False)
    return_lse = options.get("return_lse", False)
    inputs = Inputs(1234 + sq)
    _fwd_fast.clear()
    for call in range(4):
        q, k, v = _qkv(inputs, _shape(layout, b, hq, sq, d), _shape(layout, b, hk, sk, d))
        # Every other call writes into a poisoned caller output.
        out = (
            torch.full(
                _shape(layout, b, hq, sq, d), float("nan"), device="cuda", dtype=torch.bfloat16
            )
            if call % 2
            else None
        )
        scale = 1.0 / math.sqrt(d)
        result = ckfmha.fwd(q, k, v, scale=scale, out=out, **options)
        o, lse = result if return_lse else (result, None)
        if out is not None:
            assert o is out
        torch.cuda.synchronize()
        ref, ref_lse = attention_reference(
            f64(q), f64(k), f64(v), scale=scale, layout=layout, causal=causal
        )
        compare({"dtype": "bf16"}, o, lse, ref, ref_lse, f"call {call} {case}")
    # One entry for calls without an output and one for calls with one.
    assert _fwd_fast.cached_calls() == 2


def test_strides_layouts_and_options_get_their_own_entries() -> None:
    inputs = Inputs(7)
    _fwd_fast.clear()
    q, k, v = _qkv(inputs, (1, 12, 200, 64), (1, 12, 300, 64))
    # The same shapes as a permuted view: other strides, the same problem sizes.
    kp = inputs.normal((1, 300, 12, 64), torch.bfloat16).transpose(1, 2)
    vp = inputs.normal((1, 300, 12, 64), torch.bfloat16).transpose(1, 2)
    calls = [
        (q, k, v, {}),
        (q, kp, vp, {}),
        (q, k, v, {"causal": True, "causal_alignment": "bottom_right"}),
        (q, k, v, {"window": (32, 0)}),
        (q, k, v, {"scale": 0.3}),
    ]
    for repeat in range(2):
        for qq, kk, vv, options in calls:
            o = ckfmha.fwd(qq, kk, vv, **options)
            torch.cuda.synchronize()
            ref, _ = attention_reference(f64(qq), f64(kk), f64(vv), **options)
            compare({"dtype": "bf16"}, o, None, ref, None, f"{options} repeat {repeat}")
        assert _fwd_fast.cached_calls() == len(calls)


def test_cached_call_still_refuses_outputs_over_inputs() -> None:
    inputs = Inputs(11)
    _fwd_fast.clear()
    q, k, v = _qkv(inputs, (1, 8, 128, 64), (1, 8, 128, 64))
    out = torch.empty_like(q)
    ckfmha.fwd(q, k, v, out=out)
    assert _fwd_fast.cached_calls() == 1
    # Same shapes, strides, dtype and device as the cached call: only the pointers say that
    # out is q itself.
    with pytest.raises(InvalidArgumentError, match="out"):
        ckfmha.fwd(q, k, v, out=q)
    # A view of k's memory with out's shape and strides overlaps k.
    k_view = k.view(torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match="out"):
        ckfmha.fwd(q, k, v, out=k_view)


def test_bias_calls_read_each_calls_bias() -> None:
    """A GPU bias takes the fast path with its shape and strides in the key: every call reads
    its own bias (key-padding rows of a new length each call, then a full bias), and a caller
    output over the bias is still refused."""
    inputs = Inputs(13)
    _fwd_fast.clear()
    b, hq, hk, sq, sk, d = 2, 12, 4, 200, 333, 64
    for call in range(3):
        q, k, v = _qkv(inputs, (b, hq, sq, d), (b, hk, sk, d))
        bias = inputs.normal((b, 1, 1, sk), torch.bfloat16)
        bias[0, ..., 1 + inputs.integer(sk):] = float("-inf")
        o = ckfmha.fwd(q, k, v, bias=bias)
        torch.cuda.synchronize()
        ref, _ = attention_reference(f64(q), f64(k), f64(v), bias=f64(bias))
        compare({"dtype": "bf16"}, o, None, ref, None, f"key-padding bias, call {call}")
    assert _fwd_fast.cached_calls() == 1
    q, k, v = _qkv(inputs, (b, hq, sq, d), (b, hk, d, d))
    for call in range(2):
        full = inputs.normal((b, hq, sq, d), torch.bfloat16)
        out = torch.full((b, hq, sq, d), float("nan"), device="cuda", dtype=torch.bfloat16)
        ckfmha.fwd(q, k, v, bias=full, out=out)
        torch.cuda.synchronize()
        ref, _ = attention_reference(f64(q), f64(k), f64(v), bias=f64(full))
        compare({"dtype": "bf16"}, out, None, ref, None, f"full bias, call {call}")
    assert _fwd_fast.cached_calls() == 2
    # The output's spec equals the bias's: only the pointers say that they meet.
    with pytest.raises(InvalidArgumentError, match="out"):
        ckfmha.fwd(q, k, v, bias=full, out=full)


# Offsets of three sequences with the same totals and maximum lengths each call (an empty
# query sequence among them): one cache entry serves every call, and each call's boundaries
# must be the ones read.
VARLEN_OFFSETS = [
    ([0, 100, 250, 300], [0, 200, 300, 420]),
    ([0, 140, 160, 300], [0, 120, 320, 420]),
    ([0, 60, 200, 300], [0, 50, 250, 420]),
    ([0, 150, 150, 300], [0, 200, 220, 420]),
]


def test_varlen_calls_read_each_calls_offsets() -> None:
    inputs = Inputs(31)
    _fwd_fast.clear()
    hq, hk, d, max_q, max_k = 12, 4, 64, 160, 200
    for call, (offsets_q, offsets_k) in enumerate(VARLEN_OFFSETS):
        q, k, v = _qkv(inputs, (offsets_q[-1], hq, d), (offsets_k[-1], hk, d))
        cu_q, cu_k = (torch.tensor(o, dtype=torch.int32, device="cuda")
                      for o in (offsets_q, offsets_k))  # fmt: skip
        o, lse = ckfmha.fwd_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                                   causal=True, return_lse=True)  # fmt: skip
        torch.cuda.synchronize()
        ref, ref_lse = varlen_attention_reference(f64(q), f64(k), f64(v), offsets_q, offsets_k,
                                                  causal=True)  # fmt: skip
        compare({"dtype": "bf16"}, o, lse, ref, ref_lse, f"varlen call {call}")
    assert _fwd_fast.cached_calls() == 1
    # Validation reads the offsets back on every call: such calls take the full path.
    ckfmha.fwd_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k, causal=True,
                      return_lse=True, validate=True)  # fmt: skip
    assert _fwd_fast.cached_calls() == 1
