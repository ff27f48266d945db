"""Seeded torch inputs for GPU tests and the check of a kernel's outputs against the float64
reference, shared by the forward and decode (split-KV, paged) GPU tests."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ckfmha

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

# bf16 keeps 8 mantissa bits, fp16 11: bounds on |out - ref| relative to the
# reference's norm and elementwise; the LSE is computed in fp32 throughout.
# fp32 kernels multiply in plain fp32 (no tf32): plain scores land near 1e-6
# relative, and the worst case is ALiBi over ~1000 keys, whose logits of
# magnitude ~500 carry ~3e-5 of fp32 rounding each (a float32 NumPy
# emulation of these cases gives relative L2 5e-6, max abs 4e-5, LSE 6e-5).
REL_L2_TOL = {"fp16": 2e-3, "bf16": 1.5e-2, "fp32": 2e-5}
MAX_ABS_TOL = {"fp16": 1e-2, "bf16": 6e-2, "fp32": 2e-4}
LSE_TOL = {"fp16": 2e-3, "bf16": 2e-3, "fp32": 2e-4}


def torch_dtype(name: str) -> Any:
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


def f64(t: Any) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


class Inputs:
    """Random tensors for one case, drawn from a seeded generator."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def normal(self, shape: tuple[int, ...], dtype: Any, scale: float = 1.0) -> Any:
        t = torch.randn(shape, generator=self.generator, dtype=torch.float32) * scale
        return t.to(device="cuda", dtype=dtype)

    def uniform(self, shape: tuple[int, ...], low: float, high: float) -> Any:
        t = torch.rand(shape, generator=self.generator, dtype=torch.float32)
        return (low + (high - low) * t).to("cuda")

    def integer(self, high: int) -> int:
        return int(torch.randint(0, high, (1,), generator=self.generator))


def compare(kernel: dict[str, Any], got: Any, got_lse: Any, ref: np.ndarray,
            ref_lse: np.ndarray, what: str) -> float:
    """O against the reference; the LSE too unless got_lse is None (a kernel without LSE).
    Returns O's relative L2 error."""
    dtype = kernel["dtype"]
    o64 = f64(got)
    rows = ~np.isnan(ref)  # NaN rows in the reference mark skipped sequences
    assert np.array_equal(np.isnan(o64), ~rows), f"unwritten or overwritten outputs ({what})"
    err = np.where(rows, o64 - np.nan_to_num(ref), 0.0)
    rel = np.linalg.norm(err) / max(np.linalg.norm(np.nan_to_num(ref)), 1e-30)
    assert rel < REL_L2_TOL[dtype], f"relative L2 error {rel:.3e} ({what})"
    assert np.abs(err).max() < MAX_ABS_TOL[dtype], f"max abs error {np.abs(err).max():.3e} ({what})"
    if got_lse is None:
        return float(rel)
    lse64 = f64(got_lse)
    written = ~np.isnan(ref_lse)
    assert np.array_equal(np.isnan(lse64), ~written), f"LSE rows unwritten ({what})"
    finite = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isfinite(lse64[written]), finite[written], err_msg=what)
    np.testing.assert_allclose(lse64[finite], ref_lse[finite], rtol=0, atol=LSE_TOL[dtype],
                               err_msg=what)
    return float(rel)


def compare_packed(got: Any, got_lse: Any, q: Any, k: Any, v: Any, lengths_q: list[int],
                   lengths_k: list[int], what: str, **mask: Any) -> None:  # fmt: skip
    """A group-mode (varlen) forward against the float64 reference, one sequence at a time:
    q, got [total_q, heads, d], k, v [total_k, heads, d], got_lse [heads, total_q] or None."""
    from ckfmha.reference import attention_reference

    starts_q, starts_k = np.cumsum((0, *lengths_q)), np.cumsum((0, *lengths_k))
    for b in range(len(lengths_q)):
        rows = slice(int(starts_q[b]), int(starts_q[b + 1]))
        keys = slice(int(starts_k[b]), int(starts_k[b + 1]))
        seq = [t.permute(1, 0, 2).unsqueeze(0) for t in (q[rows], k[keys], v[keys])]
        ref, ref_lse = attention_reference(*(f64(t) for t in seq), **mask)
        lse = None if got_lse is None else got_lse[:, rows].unsqueeze(0)
        compare({"dtype": _dtype_name(q)}, got[rows].permute(1, 0, 2).unsqueeze(0), lse, ref,
                None if got_lse is None else ref_lse, f"{what}, sequence {b}")  # fmt: skip


def _dtype_name(t: Any) -> str:
    return str(t.dtype).rsplit(".", 1)[-1].replace("bfloat16", "bf16").replace("float16", "fp16")
