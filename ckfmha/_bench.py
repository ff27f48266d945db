"""``python -m ckfmha run``: random inputs, timing, TFLOPS and an optional reference check."""

from __future__ import annotations

import argparse
import importlib.util
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ckfmha import _dtypes
from ckfmha._fwd import fwd
from ckfmha._registry import Dispatcher
from ckfmha.problem import FwdProblem
from ckfmha.reference import attention_reference, dropout_keep

# (max abs error, relative L2 error) allowed per dtype: bf16 keeps 8 mantissa bits; fp32
# kernels use plain fp32 FFMAs.
TOLERANCES = {"fp16": (2e-2, 1e-2), "bf16": (6e-2, 3e-2), "fp32": (1e-4, 1e-5)}
# The float64 reference materialises [heads, sq, sk] scores; keep it near this size.
REFERENCE_BYTES = 1 << 28


def _torch_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def choose_backend(requested: str, dtype: str) -> str:
    if requested != "auto":
        return requested
    if _torch_cuda():
        return "torch"
    # CuPy has no bfloat16 dtype.
    if dtype in ("fp16", "fp32") and importlib.util.find_spec("cupy") is not None:
        return "cupy"
    return "numpy"


def _shape(problem: FwdProblem, heads: int, seqlen: int, hdim: int) -> tuple[int, ...]:
    if problem.layout == "bshd":
        return (problem.batch, seqlen, heads, hdim)
    return (problem.batch, heads, seqlen, hdim)


def make_inputs(problem: FwdProblem, backend: str, seed: int) -> tuple[Any, Any, Any]:
    shapes = (
        _shape(problem, problem.nhead_q, problem.seqlen_q, problem.hdim),
        _shape(problem, problem.kv_heads, problem.kv_seqlen, problem.hdim),
        _shape(problem, problem.kv_heads, problem.kv_seqlen, problem.value_hdim),
    )
    if backend == "torch":
        import torch

        generator = torch.Generator(device="cuda").manual_seed(seed)
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[
            problem.dtype
        ]
        return tuple(  # type: ignore[return-value]
            torch.randn(s, generator=generator, device="cuda", dtype=dtype) for s in shapes
        )
    rng = np.random.default_rng(seed)
    host_dtype = _dtypes.numpy_dtype(_dtypes.dtype_code(problem.dtype))
    arrays = tuple(rng.standard_normal(s, dtype=np.float32).astype(host_dtype) for s in shapes)
    if backend == "cupy":
        import cupy

        return tuple(cupy.asarray(a) for a in arrays)  # type: ignore[return-value]
    return arrays  # type: ignore[return-value]


def alibi_slopes(nhead: int) -> np.ndarray:
    """The ALiBi paper's geometric slopes 2^(-8 (h + 1) / nhead), fp32 [nhead]."""
    return (2.0 ** (-8.0 * np.arange(1, nhead + 1) / nhead)).astype(np.float32)


def make_features(problem: FwdProblem, seed: int) -> dict[str, Any]:
    """The ``fwd`` keyword arguments for the problem's features, as host NumPy arrays.

    ``on_backend`` moves the arrays to the backend; the host copies feed the reference.
    """
    features: dict[str, Any] = {
        "causal": problem.causal,
        "causal_alignment": problem.causal_alignment,
        "window": problem.window,
        "softcap": problem.softcap,
        "dropout_p": problem.dropout_p,
    }
    if problem.scale is not None:
        features["scale"] = problem.scale
    if problem.bias == "alibi":
        features["alibi_slopes"] = alibi_slopes(problem.nhead_q)
    elif problem.bias != "none":
        raise ValueError(f"run supports bias 'none' or 'alibi', not {problem.bias!r}")
    if problem.sink:
        rng = np.random.default_rng(seed + 1)
        features["sink"] = rng.standard_normal(problem.nhead_q).astype(np.float32)
    if problem.dropout_p > 0:
        features["dropout_seed"] = seed
        features["dropout_offset"] = 0
    return features


def on_backend(features: dict[str, Any], backend: str) -> dict[str, Any]:
    """``features`` with its arrays on the backend (NumPy stays host and is staged)."""
    moved = dict(features)
    for name, value in features.items():
        if not isinstance(value, np.ndarray) or backend == "numpy":
            continue
        if backend == "torch":
            import torch

            moved[name] = torch.from_numpy(value).cuda()
        elif backend == "cupy":
            import cupy

            moved[name] = cupy.asarray(value)
    return moved


def to_numpy(array: Any) -> np.ndarray:
    """A host copy of a torch, CuPy or NumPy array, in its own dtype."""
    module = type(array).__module__.split(".")[0]
    if module == "torch":
        return array.cpu().numpy()
    if module == "cupy":
        import cupy

        return cupy.asnumpy(array)
    return np.asarray(array)


def to_float64(array: Any) -> np.ndarray:
    module = type(array).__module__.split(".")[0]
    if module == "torch":
        return array.float().cpu().numpy().astype(np.float64)
    if module == "cupy":
        import cupy

        return cupy.asnumpy(array.astype("float32")).astype(np.float64)
    return np.asarray(array).astype(np.float64)


def time_calls(backend: str, call: Callable[[], Any], warmup: int, iters: int) -> float:
    """Seconds per call: CUDA events on the device backends, wall clock for staged NumPy."""
    for _ in range(warmup):
        call()
    if backend == "torch":
        import torch

        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            call()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1e3 / iters
    if backend == "cupy":
        import cupy

        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(iters):
            call()
        stop.record()
        stop.synchronize()
        return cupy.cuda.get_elapsed_time(start, stop) / 1e3 / iters
    began = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - began) / iters


def _reference_subset(problem: FwdProblem) -> tuple[int, int]:
    """(batches, kv heads) small enough for the float64 reference."""
    group = problem.nhead_q // problem.kv_heads
    per_kv_head = 3 * 8 * group * problem.seqlen_q * problem.kv_seqlen
    kv_heads = max(1, min(problem.kv_heads, REFERENCE_BYTES // max(per_kv_head, 1)))
    batches = 1 if kv_heads < problem.kv_heads else problem.batch
    return batches, kv_heads


def validate(
    problem: FwdProblem,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    features: dict[str, Any] | None = None,
    randval: Any = None,
) -> tuple[float, float, str]:
    """(max abs error, relative L2 error, what was compared) against the float64 reference.

    ``features`` are the host ``fwd`` options (see ``make_features``); with dropout,
    ``randval`` holds the random bytes the kernel stored and decides which
    probabilities the reference keeps.
    """
    batches, kv_heads = _reference_subset(problem)
    q_heads = kv_heads * (problem.nhead_q // problem.kv_heads)
    head_axis = 2 if problem.layout == "bshd" else 1

    def subset(array: Any, heads: int, axis: int = head_axis) -> np.ndarray:
        host = to_float64(array)[:batches]
        return np.take(host, np.arange(heads), axis=axis)

    options = {
        name: value
        for name, value in (features or {}).items()
        if name not in ("dropout_seed", "dropout_offset", "alibi_slopes", "sink")
    }
    options.setdefault("causal", problem.causal)
    options.setdefault("causal_alignment", problem.causal_alignment)
    for name in ("alibi_slopes", "sink"):
        if features and name in features:
            options[name] = np.asarray(features[name], dtype=np.float64)[:q_heads]
    if randval is not None:
        keep_bytes = to_numpy(randval)[:batches, :q_heads]
        options["dropout_keep"] = dropout_keep(keep_bytes, problem.dropout_p)
    expected, _ = attention_reference(
        subset(q, q_heads),
        subset(k, kv_heads),
        subset(v, kv_heads),
        layout=problem.layout,
        **options,
    )
    actual = subset(out, q_heads)
    max_abs = float(np.max(np.abs(actual - expected))) if expected.size else 0.0
    norm = float(np.linalg.norm(expected))
    rel_l2 = float(np.linalg.norm(actual - expected)) / norm if norm else 0.0
    return max_abs, rel_l2, f"{batches} batch(es) x {q_heads} query heads"


def run_command(args: argparse.Namespace, problem: FwdProblem) -> int:
    backend = choose_backend(args.backend, problem.dtype)
    kernel = args.kernel or Dispatcher().select(problem)
    q, k, v = make_inputs(problem, backend, args.seed)
    features = make_features(problem, args.seed)
    device_features = on_backend(features, backend)

    def call(return_randval: bool = False) -> Any:
        return fwd(
            q,
            k,
            v,
            return_lse=problem.lse,
            return_dropout_randval=return_randval,
            layout=problem.layout,
            kernel=args.kernel,
            **device_features,
        )

    seconds = time_calls(backend, call, args.warmup, max(1, args.iters))
    tflops = problem.flops() / seconds / 1e12 if seconds > 0 else math.inf
    timer = "CUDA events" if backend != "numpy" else "wall clock incl. host copies"
    print(f"kernel:  {kernel}")
    print(f"backend: {backend}")
    print(f"time:    {seconds * 1e3:.3f} ms ({timer}, {args.iters} iters)")
    print(f"TFLOPS:  {tflops:.2f}")
    if not args.validate:
        return 0
    with_randval = problem.dropout_p > 0
    result = call(return_randval=with_randval)
    out = result[0] if problem.lse or with_randval else result
    randval = result[-1] if with_randval else None
    max_abs, rel_l2, compared = validate(problem, q, k, v, out, features, randval)
    atol, rtol = TOLERANCES[problem.dtype]
    ok = max_abs <= atol and rel_l2 <= rtol
    print(
        f"check:   max abs err {max_abs:.3e} (tol {atol:.0e}), rel L2 err {rel_l2:.3e} "
        f"(tol {rtol:.0e}) over {compared}: {'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1
