"""Fresh random GPU inputs and their comparison with the float64 references, for the
device-metadata cases and the seeded valid draws."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import ckfmha

try:
    import torch
except ImportError:  # the case list and the draw planning still import (CPU tests, --list)
    torch = None

# Relative L2 error bounds against the float64 reference (as in the other GPU tests): the
# forward's output, and the backward's gradients (two more rounded products).
REL_L2_TOL = {"fp16": 2e-3, "bf16": 1.5e-2}
BWD_REL_L2_TOL = {"fp16": 4e-3, "bf16": 3e-2}
BWD_ZERO_TOL = {"fp16": 1.5e-2, "bf16": 1e-1}


class Inputs:
    """Fresh random tensors on the GPU from a seeded generator."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def rand(self, *shape: int, dtype: Any = None) -> Any:
        t = torch.randn(*shape, generator=self.generator) * 0.5
        return t.to("cuda", torch.bfloat16 if dtype is None else dtype)


def f64(t: Any) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def i32(values: Sequence[Any]) -> Any:
    return torch.tensor(values, dtype=torch.int32, device="cuda")


def nan_like(t: Any) -> Any:
    return torch.full_like(t, float("nan"))


def assert_close(pairs: Sequence[tuple[np.ndarray, np.ndarray]], tol: float, what: str) -> None:
    """Outputs against the reference, over every pair together: no NaN, relative L2 < tol."""
    got = np.concatenate([np.ravel(g) for g, _ in pairs])
    ref = np.concatenate([np.ravel(r) for _, r in pairs])
    assert not np.isnan(got).any(), f"{what}: NaN left in the output (unwritten rows)"
    rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
    assert rel < tol, f"{what}: relative L2 error {rel:.3e} (bound {tol:.1e})"


def assert_grad_close(got: Any, ref: np.ndarray, dtype: str, what: str) -> None:
    g = f64(got) if hasattr(got, "detach") else got
    assert not np.isnan(g).any(), f"{what}: NaN left in the gradient (unwritten rows)"
    ref_norm = np.linalg.norm(ref)
    if ref_norm < 1e-9:
        # A row that sees one key has dS = P (dP - D) = 0 up to rounding (tests/backward).
        worst = np.abs(g).max(initial=0.0)
        assert worst < BWD_ZERO_TOL[dtype], f"{what} must be ~0, got max {worst:.3e}"
        return
    rel = np.linalg.norm(g - ref) / ref_norm
    assert rel < BWD_REL_L2_TOL[dtype], f"{what}: relative L2 error {rel:.3e}"


def offsets(lengths: Sequence[int]) -> list[int]:
    return [0, *np.cumsum(lengths).tolist()]


def drain_device_errors() -> None:
    """Clears what a failed case left in the record, so the next case starts clean."""
    try:
        ckfmha.check_errors()
    except ckfmha.CkfmhaError:
        pass
