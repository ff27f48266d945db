"""Compiling on first use on the GPU: a forward problem whose kernel is in neither the library
nor the cache runs correctly on its first call, compiled there, then in milliseconds, in this
process and in a new one; two processes that need it at once compile it once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO_ROOT

from ckfmha import first_use, jit

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

# Runs one forward problem in a fresh process and prints, as JSON, the seconds of the first and
# the second call, whether this process compiled, and the error against the float64 reference.
_CALL_SCRIPT = """
import json, sys, time
import numpy as np
import torch
import ckfmha
from ckfmha import jit
from ckfmha.reference import attention_reference

compiled = []
real = jit._compile
def counted(*args, **kwargs):
    compiled.append(True)
    return real(*args, **kwargs)
jit._compile = counted

problem = json.loads(sys.argv[1])
seed = int(sys.argv[2])
g = torch.Generator().manual_seed(seed)
b, hq, hk, sq, sk, d = (problem[k] for k in ("b", "hq", "hk", "sq", "sk", "d"))
dtype = getattr(torch, problem["dtype"])
q, k, v = (torch.randn(s, generator=g).to("cuda", dtype) for s in
           ((b, hq, sq, d), (b, hk, sk, d), (b, hk, sk, d)))
options = problem["options"]
out = torch.full((b, hq, sq, d), float("nan"), device="cuda", dtype=dtype)
torch.cuda.synchronize()
start = time.perf_counter()
ckfmha.fwd(q, k, v, out=out, **options)
torch.cuda.synchronize()
first = time.perf_counter() - start
start = time.perf_counter()
ckfmha.fwd(q, k, v, **options)
torch.cuda.synchronize()
second = time.perf_counter() - start
f64 = lambda t: t.detach().to("cpu", torch.float64).numpy()
ref = attention_reference(f64(q), f64(k), f64(v), **options)
ref = ref[0] if isinstance(ref, tuple) else ref
got = f64(out)
rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
print(json.dumps({"first": first, "second": second, "compiled": bool(compiled), "rel": rel,
                  "nan": bool(np.isnan(got).any())}))
"""


def _missing_problem() -> tuple[dict, str]:
    """A Gemma-2-shaped forward problem (bf16 d256, causal, soft-cap 50, GQA, odd lengths)
    whose kernel no kernel set prebuilds: soft-cap at d256 is compiled on first use."""
    problem = {"b": 2, "hq": 8, "hk": 2, "sq": 333, "sk": 777, "d": 256, "dtype": "bfloat16",
               "options": {"causal": True, "causal_alignment": "bottom_right", "softcap": 50.0}}
    key = first_use.FwdKey(dtype=1, mode=0, hdim_q=256, hdim_v=256, mask=2, bias=0,
                           dropout=False, softcap=True, sink=False, v_col_major=False,
                           kv_storage=0, page_layout=0, forced_splits=False,
                           decode_shaped=False)
    names = first_use.missing_kernels(key)
    if not names:
        pytest.skip("the installed library already has the kernel")
    return problem, names[0]


def _call(problem: dict, cache: Path, seed: int) -> subprocess.Popen[str]:
    env = {**os.environ, "CKFMHA_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("CKFMHA_JIT", None)
    return subprocess.Popen(
        [sys.executable, "-c", _CALL_SCRIPT, json.dumps(problem), str(seed)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def _result(run: subprocess.Popen[str]) -> tuple[dict, str]:
    out, err = run.communicate(timeout=900)
    assert run.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


def _check_correct(result: dict) -> None:
    assert not result["nan"], "unwritten outputs"
    assert result["rel"] < 1.5e-2, f"relative L2 error {result['rel']:.3e} against float64"


def test_missing_kernel_compiles_on_the_first_call(tmp_path: Path) -> None:
    problem, name = _missing_problem()
    first, err = _result(_call(problem, tmp_path, 1))
    _check_correct(first)
    assert first["compiled"]
    assert f"ckfmha: compiling {name}" in err and "(done)" in err
    print(f"first call, compiling {name}: {first['first']:.1f} s; second call: "
          f"{first['second'] * 1e3:.2f} ms")
    assert first["first"] < 30, "first use must compile one forward kernel in under 30 s"
    assert first["second"] < 0.05
    # A new process finds it in the cache: no compiling, milliseconds.
    again, err = _result(_call(problem, tmp_path, 2))
    _check_correct(again)
    assert not again["compiled"] and "compiling" not in err
    print(f"new process, from the cache: first call {again['first'] * 1e3:.1f} ms")
    assert again["first"] < 1.0


def test_two_processes_needing_it_compile_it_once(tmp_path: Path) -> None:
    problem, name = _missing_problem()
    runs = [_call(problem, tmp_path, seed) for seed in (3, 4)]
    results = [_result(run) for run in runs]
    for result, _ in results:
        _check_correct(result)
    assert sum(result["compiled"] for result, _ in results) == 1
    assert sum(f"ckfmha: compiling {name}" in err for _, err in results) == 1
    assert [p.name.startswith(name) for p in jit.cached_modules(tmp_path)] == [True]


def test_jit_off_names_the_kernel_and_the_command(tmp_path: Path) -> None:
    _problem, name = _missing_problem()
    script = (
        "import torch, ckfmha\n"
        "q = torch.randn(1, 2, 64, 256, device='cuda', dtype=torch.bfloat16)\n"
        "ckfmha.fwd(q, q, q, causal=True, causal_alignment='bottom_right', softcap=50.0)\n"
    )
    env = {**os.environ, "CKFMHA_JIT": "0", "CKFMHA_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, timeout=300, check=False)
    assert result.returncode != 0
    assert "UnsupportedError" in result.stderr and "CKFMHA_JIT=0" in result.stderr
    assert name in result.stderr and "python -m ckfmha build --arch sm_90a" in result.stderr
