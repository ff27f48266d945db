"""A third-party Cython extension can `cimport ckfmha` and call the C API without the GIL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ckfmha

# Building the probe needs Cython in the test environment (it is a build-time
# dependency of ckfmha, so an isolated `pip install` does not leave it behind).
pytest.importorskip("Cython", reason="Cython is needed to build a cimporting extension")

EXTENSION = """
# cython: language_level=3
cimport ckfmha


def probe():
    cdef int major = 0, minor = 0, patch = 0, count = 0
    cdef int version_status, count_status, init_status, features_status, dropout_status
    cdef ckfmha.ckfmha_fwd_problem problem
    cdef ckfmha.ckfmha_fwd_args args
    with nogil:
        version_status = ckfmha.ckfmha_version(&major, &minor, &patch)
        count_status = ckfmha.ckfmha_registry_count(&count)
        init_status = ckfmha.ckfmha_fwd_problem_init(
            &problem, ckfmha.CKFMHA_DTYPE_BF16, ckfmha.CKFMHA_LAYOUT_BSHD, 2, 8, 2, 64, 128, 64, 64)
        problem.mode = ckfmha.CKFMHA_MODE_GROUP
        problem.total_q = 100
        problem.total_k = 200
        problem.skip_min_seqlen_q = 4
        problem.mask = ckfmha.CKFMHA_MASK_WINDOW_BOTTOM_RIGHT
        problem.window_left = 32
        problem.window_right = -1
        problem.softcap = 30.0
        problem.bias = ckfmha.CKFMHA_BIAS_ALIBI
        problem.alibi_stride = 0
        problem.has_sink = 1
        problem.dropout_p = 0.1
        problem.dropout_seed = 0xFFFFFFFFFFFFFFFF
        problem.dropout_offset = 7
        problem.store_dropout_randval = 1
        features_status = ckfmha.ckfmha_fwd_problem_validate(&problem)
        problem.dropout_p = 1.5
        dropout_status = ckfmha.ckfmha_fwd_problem_validate(&problem)
        args.alibi_slopes = NULL
        args.sink = NULL
        args.cu_seqlens_q = NULL
        args.cu_seqlens_k = NULL
        args.dropout_randval = NULL
    return {
        "statuses": [version_status, count_status, init_status, features_status],
        "dropout_status": dropout_status,
        "invalid": ckfmha.CKFMHA_ERROR_INVALID_ARGUMENT,
        "success": ckfmha.CKFMHA_SUCCESS,
        "version": [major, minor, patch],
        "header": [ckfmha.CKFMHA_VERSION_MAJOR, ckfmha.CKFMHA_VERSION_MINOR,
                   ckfmha.CKFMHA_VERSION_PATCH],
        "count": count,
        "q_stride": [problem.q_stride[0], problem.q_stride[1], problem.q_stride[2]],
    }
"""

SETUP = """
import ckfmha
from Cython.Build import cythonize
from setuptools import Extension, setup

extension = Extension(
    "ckfmha_probe",
    ["ckfmha_probe.pyx"],
    include_dirs=ckfmha.get_include(),
    library_dirs=[ckfmha.get_library_dir()],
    runtime_library_dirs=[ckfmha.get_library_dir()],
    libraries=["ckfmha"],
    language="c++",
)
setup(
    name="ckfmha_probe",
    py_modules=[],
    ext_modules=cythonize([extension], include_path=ckfmha.get_include(), quiet=True),
)
"""


def test_cimport_ckfmha_from_another_extension(tmp_path: Path) -> None:
    (tmp_path / "ckfmha_probe.pyx").write_text(textwrap.dedent(EXTENSION))
    (tmp_path / "setup.py").write_text(textwrap.dedent(SETUP))
    # The checkout's ckfmha must win over anything installed, in both subprocesses.
    env = {**os.environ, "PYTHONPATH": str(Path(ckfmha.__file__).resolve().parent.parent)}
    build = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, ckfmha_probe; print(json.dumps(ckfmha_probe.probe()))",
        ],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["statuses"] == [result["success"]] * 4
    assert result["dropout_status"] == result["invalid"]
    assert result["version"] == result["header"] == list(ckfmha.version())
    assert result["count"] == len(ckfmha.Registry()) > 0
    # bshd: (batch, head, seq) strides of [2, 64, 8, 64].
    assert result["q_stride"] == [64 * 8 * 64, 64, 8 * 64]
