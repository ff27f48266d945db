"""The C examples in examples/: each compiles as warning-free C11 against the built library;
on a GPU each runs and checks its own results (a non-zero exit is a wrong result or a failed
call, reported on its stderr).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from support.c_programs import build_c_program, needs_cc
from support.paths import REPO_ROOT

EXAMPLES_DIR = REPO_ROOT / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.c"))
# What the examples promise their readers: standard C, clean under the common warnings.
EXAMPLE_FLAGS = ("-std=c11", "-Wall", "-Wextra", "-Werror")
# An example exits with this when no kernel of this build (CKFMHA_KERNELS, CKFMHA_ARCHS)
# serves its problem; read from the header that defines it, so the two cannot drift.
EXAMPLE_SKIPPED = int(
    re.search(r"#define EXAMPLE_SKIPPED (\d+)", (EXAMPLES_DIR / "c_api_example.h").read_text())[1]
)


def _build(source: Path, directory: Path) -> Path:
    return build_c_program(source, directory / source.stem, *EXAMPLE_FLAGS)


def test_every_example_is_collected():
    assert {path.name for path in EXAMPLES} >= {
        "c_api_fwd.c", "c_api_decode.c", "c_api_paged_decode.c", "c_api_append_kv.c"}  # fmt: skip


@needs_cc
@pytest.mark.parametrize("source", EXAMPLES, ids=lambda path: path.stem)
def test_example_compiles(source: Path, tmp_path: Path):
    _build(source, tmp_path)


@needs_cc
@pytest.mark.gpu
@pytest.mark.parametrize("source", EXAMPLES, ids=lambda path: path.stem)
def test_example_runs(source: Path, tmp_path: Path):
    program = _build(source, tmp_path)
    result = subprocess.run([str(program)], capture_output=True, text=True, check=False,
                            timeout=600)  # fmt: skip
    if result.returncode == EXAMPLE_SKIPPED:
        pytest.skip(f"no kernel of this build fits: {result.stderr.strip()}")
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}{result.stderr}"
    assert "no GPU" not in result.stdout
