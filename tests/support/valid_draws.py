"""Seeded valid random draws on the GPU (fwd batch and varlen, fwd_paged decode, bwd batch;
GQA, odd lengths, 12/24/40 query heads, fp16/bf16, causal or not) against the float64
reference, restricted to problems the registered kernels serve (nothing is compiled on first
use). Each must also leave the device error record clear: valid metadata reports nothing."""

from __future__ import annotations

import traceback
from typing import Any

import numpy as np

import ckfmha
from ckfmha import first_use
from ckfmha._fwd import first_use_key
from ckfmha.reference import (
    attention_reference,
    paged_attention_reference,
    varlen_attention_reference,
)
from ckfmha.reference_bwd import attention_backward_reference
from support.gpu_inputs import (
    REL_L2_TOL,
    Inputs,
    assert_close,
    assert_grad_close,
    drain_device_errors,
    f64,
    i32,
    nan_like,
    offsets,
    torch,
)

HEADS_Q = (12, 24, 40)
KV_HEAD_COUNTS = (1, 2, 3, 4, 6, 8, 12)
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def fwd_runnable(arch: Any = None, **fields: Any) -> bool:
    """Whether the registered kernels serve the problem's best plan, as _runnable in
    tests/validation/test_untrusted_input_gpu.py: nothing is compiled on first use."""
    problem = ckfmha.FwdProblem(**fields)
    try:
        ckfmha.Dispatcher().select(problem, arch=arch)
    except ckfmha.CkfmhaError:
        return False
    key = first_use.key_of(first_use_key(problem))
    return not first_use.missing_kernels(key, arch)


def bwd_runnable(arch: Any = None, **fields: Any) -> bool:
    problem = ckfmha.FwdProblem(**fields)
    try:
        ckfmha.Dispatcher().select_bwd(problem, arch=arch)
    except ckfmha.CkfmhaError:
        return False
    hdim_v = problem.value_hdim
    key = first_use.BwdKey(problem.dtype_code, 0, problem.hdim, hdim_v, problem.mask_code, 0,
                           False, False, False)  # fmt: skip
    return not first_use.missing_kernels(key, arch)


def _heads(rng: np.random.Generator) -> tuple[int, int]:
    hq = int(rng.choice(HEADS_Q))
    return hq, int(rng.choice([n for n in KV_HEAD_COUNTS if hq % n == 0]))


def plan_draw(rng: np.random.Generator, arch: Any = None) -> dict[str, Any] | None:
    """One random valid problem (small: sanitizer runs are ~50x slower), or None when the
    registered kernels do not serve it."""
    kind = str(rng.choice(["fwd", "varlen", "paged", "bwd"]))
    hq, hk = _heads(rng)
    draw: dict[str, Any] = {
        "kind": kind, "hq": hq, "hk": hk, "d": int(rng.choice([64, 128])),
        "dtype": str(rng.choice(list(DTYPES))), "causal": bool(rng.integers(2)),
        "batch": int(rng.integers(1, 4)),
    }  # fmt: skip
    common = {"nhead_q": hq, "nhead_k": hk, "hdim": draw["d"], "dtype": draw["dtype"],
              "causal": draw["causal"]}  # fmt: skip
    if kind == "fwd":
        draw["sq"], draw["sk"] = int(rng.integers(1, 97)), int(rng.integers(1, 131))
        ok = fwd_runnable(arch, batch=draw["batch"], seqlen_q=draw["sq"], seqlen_k=draw["sk"],
                          **common)  # fmt: skip
    elif kind == "varlen":
        draw["lens_q"] = rng.integers(1, 70, draw["batch"]).tolist()
        draw["lens_k"] = rng.integers(1, 110, draw["batch"]).tolist()
        ok = fwd_runnable(arch, batch=draw["batch"], mode="group",
                          seqlen_q=max(draw["lens_q"]), seqlen_k=max(draw["lens_k"]),
                          total_q=sum(draw["lens_q"]), total_k=sum(draw["lens_k"]),
                          **common)  # fmt: skip
    elif kind == "paged":
        draw["sq"] = int(rng.choice([1, 1, 2, 4]))
        draw["page_size"] = int(rng.choice([16, 32]))
        draw["lens_k"] = rng.integers(draw["sq"], 150, draw["batch"]).tolist()
        width = -(-max(draw["lens_k"]) // draw["page_size"]) + int(rng.integers(0, 2))
        draw["pool"] = draw["batch"] * width + int(rng.integers(0, 4))
        # Distinct pages scattered over the pool, one row per sequence.
        draw["table"] = rng.permutation(draw["pool"])[: draw["batch"] * width].reshape(
            draw["batch"], width).tolist()  # fmt: skip
        ok = fwd_runnable(arch, batch=draw["batch"], seqlen_q=draw["sq"],
                          seqlen_k=max(draw["lens_k"]), causal_alignment="bottom_right",
                          paged_kv="block_table", page_size=draw["page_size"],
                          max_pages_per_seq=width, num_pages=draw["pool"],
                          **common)  # fmt: skip
    else:
        draw["sq"], draw["sk"] = int(rng.integers(1, 65)), int(rng.integers(2, 97))
        draw["batch"] = min(draw["batch"], 2)
        ok = bwd_runnable(arch, batch=draw["batch"], seqlen_q=draw["sq"], seqlen_k=draw["sk"],
                          **common)  # fmt: skip
    return draw if ok else None


def describe(draw: dict[str, Any]) -> str:
    shown = {k: v for k, v in draw.items() if k not in ("table",)}
    return " ".join(f"{k}={v}" for k, v in shown.items())


def run_draw(draw: dict[str, Any], inputs: Inputs) -> None:
    dtype = getattr(torch, DTYPES[draw["dtype"]])
    hq, hk, d, b, causal = draw["hq"], draw["hk"], draw["d"], draw["batch"], draw["causal"]
    tol = REL_L2_TOL[draw["dtype"]]
    kind = draw["kind"]
    if kind == "fwd":
        q = inputs.rand(b, hq, draw["sq"], d, dtype=dtype)
        k, v = (inputs.rand(b, hk, draw["sk"], d, dtype=dtype) for _ in range(2))
        out = nan_like(q)
        ckfmha.fwd(q, k, v, causal=causal, out=out)
        torch.cuda.synchronize()
        ref, _ = attention_reference(f64(q), f64(k), f64(v), causal=causal)
        assert_close([(f64(out), ref)], tol, "fwd")
    elif kind == "varlen":
        cu_q, cu_k = offsets(draw["lens_q"]), offsets(draw["lens_k"])
        q = inputs.rand(cu_q[-1], hq, d, dtype=dtype)
        k, v = (inputs.rand(cu_k[-1], hk, d, dtype=dtype) for _ in range(2))
        out = nan_like(q)
        # Device offsets: the kernels check them, and valid ones must report nothing.
        ckfmha.fwd_varlen(q, k, v, i32(cu_q), i32(cu_k), max_seqlen_q=max(draw["lens_q"]),
                          max_seqlen_k=max(draw["lens_k"]), causal=causal, out=out,
                          validate=False)  # fmt: skip
        torch.cuda.synchronize()
        ref, _ = varlen_attention_reference(f64(q), f64(k), f64(v), cu_q, cu_k, causal=causal)
        assert_close([(f64(out), ref)], tol, "fwd_varlen")
    elif kind == "paged":
        q = inputs.rand(b, hq, draw["sq"], d, dtype=dtype)
        k_cache, v_cache = (inputs.rand(draw["pool"], draw["page_size"], hk, d, dtype=dtype)
                            for _ in range(2))  # fmt: skip
        out = nan_like(q)
        options = {"causal": causal, "causal_alignment": "bottom_right"}
        ckfmha.fwd_paged(q, k_cache, v_cache, block_table=i32(draw["table"]),
                         seqlens_k=i32(draw["lens_k"]), max_seqlen_k=max(draw["lens_k"]),
                         out=out, validate=False, **options)  # fmt: skip
        torch.cuda.synchronize()
        ref, _ = paged_attention_reference(f64(q), f64(k_cache), f64(v_cache),
                                           block_table=np.array(draw["table"]),
                                           seqlens_k=np.array(draw["lens_k"]), **options)
        assert_close([(f64(out), ref)], tol, "fwd_paged")
    else:
        q, do = (inputs.rand(b, hq, draw["sq"], d, dtype=dtype) for _ in range(2))
        k, v = (inputs.rand(b, hk, draw["sk"], d, dtype=dtype) for _ in range(2))
        ref = attention_backward_reference(f64(q), f64(k), f64(v), f64(do), causal=causal)
        o = torch.from_numpy(ref.o).to("cuda", dtype)
        lse = torch.from_numpy(np.ascontiguousarray(ref.lse)).to("cuda", torch.float32)
        dq, dk, dv = nan_like(q), nan_like(k), nan_like(v)
        ckfmha.bwd(do, q, k, v, o, lse, causal=causal, dq_out=dq, dk_out=dk, dv_out=dv)
        torch.cuda.synchronize()
        for name, got, want in (("dq", dq, ref.dq), ("dk", dk, ref.dk), ("dv", dv, ref.dv)):
            assert_grad_close(got, want, draw["dtype"], f"bwd {name}")
    ckfmha.check_errors()  # valid metadata reports nothing


def run_valid_draws(count: int, seed: int) -> tuple[int, int]:
    """(draws run, draws passed); prints one line per draw and the summary line."""
    rng = np.random.default_rng(seed)
    inputs = Inputs(seed)
    run = passed = 0
    for _ in range(50 * count):
        if run == count:
            break
        draw = plan_draw(rng)
        if draw is None:
            continue
        run += 1
        try:
            run_draw(draw, inputs)
        except Exception:  # noqa: BLE001 - every failure is reported, then the next draw runs
            print(f"draw {run}: {describe(draw)} FAILED", flush=True)
            traceback.print_exc()
            drain_device_errors()
        else:
            passed += 1
            print(f"draw {run}: {describe(draw)} ok", flush=True)
    if run < count:
        print(f"only {run} of {count} draws had registered kernels", flush=True)
    print(f"valid draws: {run} run, {passed} passed", flush=True)
    return run, passed
