"""Building C programs against the built libckfmha, for the tests that drive the C API from C.

The headers and the library are found through the imported ckfmha package, so the programs
use the same build as the Python tests.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

import ckfmha

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def build_c_program(source: Path, program: Path, *flags: str) -> Path:
    """Compiles and links `source` into `program`, with the compiler's output in the failure."""
    lib = ckfmha.get_library_dir()
    # libm last: with --as-needed linkers a library before the objects that use it is dropped.
    command = ["cc", *flags, str(source), f"-I{ckfmha.get_include()[-1]}", f"-L{lib}",
               "-lckfmha", f"-Wl,-rpath,{lib}", "-lm", "-o", str(program)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{shlex.join(command)}\n{result.stdout}{result.stderr}"
    return program
