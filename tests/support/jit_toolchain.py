"""Skips a test that compiles kernels where nvcc or the CUTLASS/CuTe headers are missing."""

from __future__ import annotations

import pytest

from ckfmha import jit


def skip_without_jit_toolchain() -> None:
    toolchain = jit.generator_modules().toolchain
    try:
        toolchain.find_nvcc()
        toolchain.find_cutlass_include()
    except toolchain.ToolchainError as error:
        pytest.skip(f"JIT toolchain unavailable: {error}")
