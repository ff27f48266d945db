"""Untrusted input on the GPU never corrupts memory.

Each bad input of the issue runs in a child process: the bad call must raise the documented
InvalidArgumentError, and a correct call made afterwards in the same process (same CUDA
context) must still match the float64 reference, on fresh random inputs into NaN-poisoned
outputs: a bad call that had read or written outside its arrays would have lost the context or
left garbage. Then empty problems against their documented shapes and values, and a seeded fuzz
of valid draws (GQA, odd lengths, 12/24/40 query heads, varlen) against the reference.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from support.paths import REPO_ROOT

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import ckfmha
from ckfmha import first_use
from ckfmha._fwd import first_use_key
from ckfmha.reference import attention_reference, varlen_attention_reference

REL_L2_TOL = {"fp16": 2e-3, "bf16": 1.5e-2}

# One bad call (argv[1]), which must raise InvalidArgumentError containing argv[2]; then correct
# calls of the same family in the same process, checked against the float64 reference. Prints
# "ok" when all holds.
_CHILD = r"""
import sys
import numpy as np
import torch
import ckfmha
from ckfmha.reference import (attention_reference, paged_attention_reference,
                              varlen_attention_reference)

case, fragment = sys.argv[1], sys.argv[2]
g = torch.Generator().manual_seed(1234)
dev = lambda t: t.to("cuda")
rand = lambda *shape: (torch.randn(*shape, generator=g) * 0.5).to("cuda", torch.bfloat16)
f64 = lambda t: t.detach().to("cpu", torch.float64).numpy()
i32 = lambda values: torch.tensor(values, dtype=torch.int32, device="cuda")
H, HK, D, PAGE, PAGES = 8, 2, 128, 16, 12

def rel(got, ref):
    got, ref = f64(got) if hasattr(got, "detach") else got, np.nan_to_num(ref)
    assert not np.isnan(got).any(), "NaN left in the output"
    return np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)

def paged_inputs():
    k_cache, v_cache = rand(PAGES, PAGE, HK, D), rand(PAGES, PAGE, HK, D)
    table = [[3, 5, 0], [7, 1, 11]]
    return rand(2, H, 1, D), k_cache, v_cache, table, [40, 33]

def varlen_inputs():
    cu_q, cu_k = [0, 5, 12], [0, 9, 30]
    return rand(12, H, D), rand(30, HK, D), rand(30, HK, D), cu_q, cu_k

def correct_paged():
    q, k_cache, v_cache, table, lens = paged_inputs()
    out = torch.full_like(q, float("nan"))
    ckfmha.fwd_paged(q, k_cache, v_cache, block_table=i32(table), seqlens_k=i32(lens),
                     causal=True, causal_alignment="bottom_right", out=out, validate=True)
    torch.cuda.synchronize()
    ref, _ = paged_attention_reference(f64(q), f64(k_cache), f64(v_cache),
                                       block_table=np.array(table), seqlens_k=np.array(lens),
                                       causal=True, causal_alignment="bottom_right")
    assert rel(out, ref) < 1.5e-2

def correct_varlen():
    q, k, v, cu_q, cu_k = varlen_inputs()
    out = torch.full((12, H, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    ckfmha.fwd_varlen(q, k, v, i32(cu_q), i32(cu_k), max_seqlen_q=7, max_seqlen_k=21,
                      causal=True, out=out, validate=True)
    torch.cuda.synchronize()
    ref, _ = varlen_attention_reference(f64(q), f64(k), f64(v), cu_q, cu_k, causal=True)
    assert rel(out, ref) < 1.5e-2

def correct_batch():
    q, k, v = rand(2, H, 37, D), rand(2, HK, 53, D), rand(2, HK, 53, D)
    out = torch.full_like(q, float("nan"))
    ckfmha.fwd(q, k, v, causal=True, out=out)
    torch.cuda.synchronize()
    ref, _ = attention_reference(f64(q), f64(k), f64(v), causal=True)
    assert rel(out, ref) < 1.5e-2

def bad_paged(table=None, lens=None, device=True, **kwargs):
    q, k_cache, v_cache, good_table, good_lens = paged_inputs()
    table, lens = table or good_table, lens or good_lens
    if device:
        table, lens = i32(table), i32(lens)
    else:
        table, lens = np.array(table, np.int32), np.array(lens, np.int32)
    ckfmha.fwd_paged(q, k_cache, v_cache, block_table=table, seqlens_k=lens, **kwargs)

def bad_varlen(cu_q=None, cu_k=None, device=True, max_q=7, max_k=21, **kwargs):
    q, k, v, good_q, good_k = varlen_inputs()
    cu_q, cu_k = cu_q or good_q, cu_k or good_k
    wrap = i32 if device else (lambda x: np.array(x, np.int32))
    ckfmha.fwd_varlen(q, k, v, wrap(cu_q), wrap(cu_k), max_seqlen_q=max_q, max_seqlen_k=max_k,
                      **kwargs)

def out_is_q():
    q, k, v = rand(1, H, 16, D), rand(1, HK, 16, D), rand(1, HK, 16, D)
    ckfmha.fwd(q, k, v, out=q)

def cpu_mixed():
    q, k = rand(1, H, 16, D), rand(1, HK, 16, D)
    ckfmha.fwd(q, k.cpu(), k)

BAD = {
    "page_past_pool": (lambda: bad_paged(table=[[3, 5, 0], [7, 1, PAGES]], validate=True),
                       correct_paged),
    "page_past_pool_env": (lambda: bad_paged(table=[[3, 5, 0], [7, 1, PAGES + 9]]),
                           correct_paged),
    "page_past_pool_host": (lambda: bad_paged(table=[[3, 5, 0], [7, 1, PAGES]], device=False),
                            correct_paged),
    "negative_page": (lambda: bad_paged(table=[[3, -1, 0], [7, 1, 11]], validate=True),
                      correct_paged),
    "seqlens_over_table": (lambda: bad_paged(lens=[49, 33], validate=True), correct_paged),
    "seqlens_over_table_host": (lambda: bad_paged(lens=[49, 33], device=False), correct_paged),
    "decreasing_cu_seqlens": (lambda: bad_varlen(cu_q=[0, 9, 5], validate=True),
                              correct_varlen),
    "decreasing_cu_seqlens_host": (lambda: bad_varlen(cu_q=[0, 9, 5], device=False),
                                   correct_varlen),
    "cu_seqlens_past_tensor": (lambda: bad_varlen(cu_k=[0, 9, 31], validate=True),
                               correct_varlen),
    "cu_seqlens_past_tensor_host": (lambda: bad_varlen(cu_k=[0, 9, 31], device=False),
                                    correct_varlen),
    "max_seqlen_too_small": (lambda: bad_varlen(max_k=20, validate=True), correct_varlen),
    "max_seqlen_too_small_host": (lambda: bad_varlen(max_q=6, device=False), correct_varlen),
    "out_is_q": (out_is_q, correct_batch),
    "cpu_tensor_mixed": (cpu_mixed, correct_batch),
}

bad, correct = BAD[case]
try:
    bad()
except ckfmha.InvalidArgumentError as error:
    assert fragment in str(error), f"{fragment!r} not in {str(error)!r}"
else:
    raise AssertionError(f"{case}: no InvalidArgumentError")
torch.cuda.synchronize()
correct()
correct()
print("ok")
"""

BAD_CASES = {
    "page_past_pool": r"block_table[1, 2] = 12 is not a page id in [0, 12)",
    "page_past_pool_env": r"block_table[1, 2] = 21 is not a page id",
    "page_past_pool_host": r"block_table[1, 2] = 12 is not a page id",
    "negative_page": r"block_table[0, 1] = -1 is not a page id",
    "seqlens_over_table": "seqlens_k[0] = 49 exceeds the 48 keys of block_table row 0",
    "seqlens_over_table_host": "seqlens_k[0] = 49 exceeds the 48 keys",
    "decreasing_cu_seqlens": "cu_seqlens_q[2] = 5 is less than cu_seqlens_q[1] = 9",
    "decreasing_cu_seqlens_host": "cu_seqlens_q[2] = 5 is less than cu_seqlens_q[1] = 9",
    "cu_seqlens_past_tensor": "cu_seqlens_k[2] = 31 runs past the 30 tokens of k",
    "cu_seqlens_past_tensor_host": "cu_seqlens_k[2] = 31 runs past the 30 tokens of k",
    "max_seqlen_too_small": "max_seqlen_k = 20 is less than sequence 1's length 21",
    "max_seqlen_too_small_host": "max_seqlen_q = 6 is less than sequence 1's length 7",
    "out_is_q": "out overlaps the input q",
    "cpu_tensor_mixed": "q is on cuda:0, k is on cpu, v is on cuda:0",
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_raises_and_leaves_the_context_usable(case: str) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.pop("CKFMHA_VALIDATE", None)
    if case.endswith("_env"):
        env["CKFMHA_VALIDATE"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, case, BAD_CASES[case]],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), (
        f"{case}\n{result.stdout}\n{result.stderr}"
    )


# ---- empty problems ----


def _rand(generator: Any, *shape: int, dtype: Any = torch.bfloat16) -> Any:
    return (torch.randn(*shape, generator=generator) * 0.5).to("cuda", dtype)


def _f64(t: Any) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


@pytest.mark.parametrize(
    ("q_shape", "kv_shape"),
    [
        ((0, 4, 16, 64), (0, 2, 16, 64)),
        ((2, 4, 0, 64), (2, 2, 16, 64)),
        ((0, 4, 0, 64), (0, 2, 0, 64)),
    ],
)
def test_empty_outputs_match_sdpa_shapes(
    q_shape: tuple[int, ...], kv_shape: tuple[int, ...]
) -> None:
    g = torch.Generator().manual_seed(3)
    q, k, v = _rand(g, *q_shape), _rand(g, *kv_shape), _rand(g, *kv_shape)
    o, lse = ckfmha.fwd(q, k, v, return_lse=True)
    # SDPA's shape rule (batch, heads, seqlen_q, hdim_v); torch's own SDPA returns None for some
    # empty inputs, so the shape is spelled out.
    assert o.shape == q_shape and o.dtype == q.dtype
    assert lse.shape == q_shape[:3] and lse.dtype == torch.float32


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("with_sink", [False, True])
def test_no_keys_gives_zero_output_and_minus_inf_lse(layout: str, with_sink: bool) -> None:
    g = torch.Generator().manual_seed(4)
    b, hq, hk, sq, d = 2, 6, 3, 19, 64
    q_shape = (b, hq, sq, d) if layout == "bhsd" else (b, sq, hq, d)
    kv_shape = (b, hk, 0, d) if layout == "bhsd" else (b, 0, hk, d)
    q = _rand(g, *q_shape)
    k, v = _rand(g, *kv_shape), _rand(g, *kv_shape)
    # Padded rows: the memsets must follow the strides and leave the padding alone.
    storage = torch.full(q_shape[:3] + (d + 8,), float("nan"), device="cuda", dtype=q.dtype)
    out = storage[..., :d]
    lse = torch.full((b, hq, sq), float("nan"), device="cuda")
    sink = torch.randn(hq, generator=g).cuda() if with_sink else None
    ckfmha.fwd(q, k, v, layout=layout, out=out, lse_out=lse, return_lse=True, sink=sink)
    torch.cuda.synchronize()
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isnan(storage[..., d:]).all()
    expected = (
        sink.view(1, hq, 1).expand(b, hq, sq) if with_sink else torch.full_like(lse, float("-inf"))
    )
    assert torch.equal(lse, expected)
    ref, ref_lse = attention_reference(
        _f64(q), _f64(k), _f64(v), layout=layout, sink=None if sink is None else _f64(sink)
    )
    np.testing.assert_array_equal(_f64(out), ref)
    np.testing.assert_array_equal(_f64(lse), ref_lse)


def test_varlen_sequences_without_keys_or_queries() -> None:
    g = torch.Generator().manual_seed(5)
    hq, hk, d = 4, 2, 128
    cu_empty = torch.zeros(4, dtype=torch.int32, device="cuda")
    # Every sequence without queries: nothing to compute, an empty output.
    o = ckfmha.fwd_varlen(
        _rand(g, 0, hq, d),
        _rand(g, 9, hk, d),
        _rand(g, 9, hk, d),
        cu_empty,
        torch.tensor([0, 3, 3, 9], dtype=torch.int32, device="cuda"),
        max_seqlen_q=0,
        max_seqlen_k=6,
        causal=True,
    )
    assert o.shape == (0, hq, d)
    # Every sequence without keys: O = 0, LSE = -inf (the kernels' empty key range). k and v
    # hold tokens no sequence owns: the sm90 template needs a packed tensor to describe.
    cu_q = torch.tensor([0, 2, 7, 8], dtype=torch.int32, device="cuda")
    q = _rand(g, 8, hq, d)
    out = torch.full((8, hq, d), float("nan"), device="cuda", dtype=q.dtype)
    _, lse = ckfmha.fwd_varlen(
        q,
        _rand(g, 5, hk, d),
        _rand(g, 5, hk, d),
        cu_q,
        cu_empty,
        max_seqlen_q=5,
        max_seqlen_k=0,
        causal=True,
        out=out,
        return_lse=True,
    )
    torch.cuda.synchronize()
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, torch.full_like(lse, float("-inf")))
    # A batch of no sequences.
    o = ckfmha.fwd_varlen(
        _rand(g, 0, hq, d),
        _rand(g, 0, hk, d),
        _rand(g, 0, hk, d),
        torch.zeros(1, dtype=torch.int32, device="cuda"),
        torch.zeros(1, dtype=torch.int32, device="cuda"),
        max_seqlen_q=0,
        max_seqlen_k=0,
    )
    assert o.shape == (0, hq, d)


def test_backward_without_queries_or_keys_gives_zero_gradients() -> None:
    g = torch.Generator().manual_seed(6)
    b, hq, hk, d = 2, 4, 2, 64
    q, o, do = _rand(g, b, hq, 11, d), _rand(g, b, hq, 11, d), _rand(g, b, hq, 11, d)
    lse = torch.randn(b, hq, 11, generator=g).cuda()
    no_keys = _rand(g, b, hk, 0, d)
    dq, dk, dv = ckfmha.bwd(
        do, q, no_keys, no_keys, o, lse, dq_out=torch.full_like(q, float("nan"))
    )
    torch.cuda.synchronize()
    assert torch.equal(dq, torch.zeros_like(dq)) and dk.shape == dv.shape == no_keys.shape
    k, v = _rand(g, b, hk, 13, d), _rand(g, b, hk, 13, d)
    none_q = _rand(g, b, hq, 0, d)
    dq, dk, dv = ckfmha.bwd(
        none_q,
        none_q,
        k,
        v,
        none_q,
        torch.zeros(b, hq, 0, device="cuda"),
        dk_out=torch.full_like(k, float("nan")),
        dv_out=torch.full_like(v, float("nan")),
    )
    torch.cuda.synchronize()
    assert dq.shape == none_q.shape
    assert torch.equal(dk, torch.zeros_like(dk)) and torch.equal(dv, torch.zeros_like(dv))


def test_empty_append_leaves_the_cache() -> None:
    g = torch.Generator().manual_seed(7)
    k_cache, v_cache = _rand(g, 2, 32, 2, 128), _rand(g, 2, 32, 2, 128)
    before = k_cache.clone(), v_cache.clone()
    none = _rand(g, 2, 0, 2, 128)
    assert ckfmha.append_kv(k_cache, v_cache, none, none, [3, 5]) is None
    empty_batch = _rand(g, 0, 4, 2, 128)
    assert (
        ckfmha.append_kv(
            _rand(g, 0, 32, 2, 128),
            _rand(g, 0, 32, 2, 128),
            empty_batch,
            empty_batch,
            np.zeros(0, np.int32),
        )
        is None
    )
    torch.cuda.synchronize()
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


# ---- a seeded fuzz of valid draws ----

FUZZ_SEED = 77
FUZZ_DRAWS = 40


def _runnable(**fields: Any) -> bool:
    """Whether the registered kernels serve the problem's best plan, so that the fuzz compiles
    nothing on first use and stays short."""
    problem = ckfmha.FwdProblem(**fields)
    try:
        ckfmha.Dispatcher().select(problem)
    except ckfmha.CkfmhaError:
        return False
    return not first_use.missing_kernels(first_use.key_of(first_use_key(problem)))


def _fuzz_draw(rng: np.random.Generator) -> dict[str, Any] | None:
    hq = int(rng.choice([12, 24, 40]))
    hk = int(rng.choice([n for n in (1, 2, 3, 4, 6, 8, 12) if hq % n == 0]))
    draw = {
        "hq": hq,
        "hk": hk,
        "d": int(rng.choice([64, 128])),
        "dtype": str(rng.choice(["fp16", "bf16"])),
        "causal": bool(rng.integers(2)),
        "varlen": bool(rng.integers(2)),
        "batch": int(rng.integers(1, 4)),
    }
    if draw["varlen"]:
        draw["lens_q"] = rng.integers(1, 90, draw["batch"]).tolist()
        draw["lens_k"] = rng.integers(1, 140, draw["batch"]).tolist()
        fields = {
            "mode": "group",
            "seqlen_q": max(draw["lens_q"]),
            "seqlen_k": max(draw["lens_k"]),
            "total_q": sum(draw["lens_q"]),
            "total_k": sum(draw["lens_k"]),
        }
    else:
        draw["sq"], draw["sk"] = int(rng.integers(1, 150)), int(rng.integers(1, 200))
        fields = {"seqlen_q": draw["sq"], "seqlen_k": draw["sk"]}
    ok = _runnable(
        batch=draw["batch"],
        nhead_q=hq,
        nhead_k=hk,
        hdim=draw["d"],
        dtype=draw["dtype"],
        causal=draw["causal"],
        **fields,
    )
    return draw if ok else None


def test_fuzz_valid_draws_match_the_reference() -> None:
    rng = np.random.default_rng(FUZZ_SEED)
    g = torch.Generator().manual_seed(FUZZ_SEED)
    done = 0
    for _ in range(20 * FUZZ_DRAWS):
        if done == FUZZ_DRAWS:
            break
        draw = _fuzz_draw(rng)
        if draw is None:
            continue
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[draw["dtype"]]
        hq, hk, d, causal = draw["hq"], draw["hk"], draw["d"], draw["causal"]
        if draw["varlen"]:
            cu_q = np.concatenate([[0], np.cumsum(draw["lens_q"])]).astype(np.int32)
            cu_k = np.concatenate([[0], np.cumsum(draw["lens_k"])]).astype(np.int32)
            q = _rand(g, int(cu_q[-1]), hq, d, dtype=dtype)
            k, v = (_rand(g, int(cu_k[-1]), hk, d, dtype=dtype) for _ in range(2))
            out = torch.full_like(q, float("nan"))
            ckfmha.fwd_varlen(
                q,
                k,
                v,
                cu_q,
                cu_k,
                max_seqlen_q=max(draw["lens_q"]),
                max_seqlen_k=max(draw["lens_k"]),
                causal=causal,
                out=out,
            )
            ref, _ = varlen_attention_reference(
                _f64(q), _f64(k), _f64(v), cu_q, cu_k, causal=causal
            )
        else:
            b, sq, sk = draw["batch"], draw["sq"], draw["sk"]
            q = _rand(g, b, hq, sq, d, dtype=dtype)
            k, v = (_rand(g, b, hk, sk, d, dtype=dtype) for _ in range(2))
            out = torch.full_like(q, float("nan"))
            ckfmha.fwd(q, k, v, causal=causal, out=out)
            ref, _ = attention_reference(_f64(q), _f64(k), _f64(v), causal=causal)
        torch.cuda.synchronize()
        got = _f64(out)
        assert not np.isnan(got).any(), f"unwritten output: {draw}"
        rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
        assert rel < REL_L2_TOL[draw["dtype"]], f"relative L2 error {rel:.3e}: {draw}"
        done += 1
    assert done == FUZZ_DRAWS, f"only {done} draws had a registered kernel"
