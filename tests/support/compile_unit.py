"""Compiling generated kernel instances as the build does, for the generator tests that check
the templates take the arguments and agree with the numbers the generator writes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from generator import build, emit, toolchain
from generator.signature import KernelConfig
from generator.specs import load_specs
from support.paths import REPO_ROOT


def compile_one_unit(tmp_path: Path, configs: list[KernelConfig], arch: str) -> None:
    """Compiles `configs` (one arch) in one unit; fails naming nvcc's complaint, skips where
    the CUDA toolchain is missing."""
    try:
        toolchain.find_nvcc()
        toolchain.find_cutlass_include()
    except toolchain.ToolchainError as error:
        pytest.skip(f"CUDA toolchain unavailable: {error}")
    files = emit.emit(tmp_path, configs, [], load_specs(), jobs=1)
    ((unit_path, unit),) = files.units
    compiler = toolchain.CudaToolchain(
        build.arch_specs_for([arch]), [REPO_ROOT / "cpp" / "include", tmp_path]
    )
    job = toolchain.CompileJob(unit_path, tmp_path / "unit.o", unit.arch)
    command = compiler.compile_command(job, tmp_path / "unit.d")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
