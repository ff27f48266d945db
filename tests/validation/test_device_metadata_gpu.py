"""Out-of-range device metadata is bounded by the kernels and reported, never followed.

Each case of support/device_metadata_cases.py runs in a child process (a kernel that did read
outside its buffers could take the CUDA context with it): one call with int32 CUDA metadata
that is out of range for exactly one sequence (validate=False, CKFMHA_VALIDATE unset: the
kernels' path, not the host checks) must not raise; then ``ckfmha.check_errors()`` (mode
"check") or the next call on the device (mode "next_call") raises DeviceMetadataError naming the
kind and the sequence, once; the valid sequences' outputs match the float64 reference and so
does a correct call of the family afterwards, in the same process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.paths import REPO_ROOT, child_env

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from support.device_metadata_cases import CASES, MODES

import ckfmha


def run_cases(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "support.device_metadata_cases", *args],
        cwd=REPO_ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_device_metadata_is_skipped_and_reported(case: str, mode: str) -> None:
    result = run_cases(case, "--mode", mode)
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and f"{case} ok" in lines, (
        f"{case} ({mode}): exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    assert "device-metadata cases: 1 run, 1 passed" in lines, result.stdout


def test_valid_device_metadata_reports_nothing() -> None:
    """Seeded valid draws (device offsets and page tables among them) match the reference and
    leave the error record clear."""
    result = run_cases("--valid-draws", "8", "--seed", "11")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "valid draws: 8 run, 8 passed" in result.stdout.splitlines(), result.stdout


def test_check_errors_is_quiet_after_correct_calls() -> None:
    """In this process (which never passes bad metadata): check_errors waits, finds nothing,
    and so do the device-index and no-wait spellings."""
    try:  # start clean, whatever tests before this one left in the record
        ckfmha.check_errors()
    except ckfmha.DeviceMetadataError:
        pass
    g = torch.Generator().manual_seed(8)
    q = (torch.randn(12, 8, 128, generator=g) * 0.5).to("cuda", torch.bfloat16)
    k = (torch.randn(30, 2, 128, generator=g) * 0.5).to("cuda", torch.bfloat16)
    cu_q = torch.tensor([0, 5, 12], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 9, 30], dtype=torch.int32, device="cuda")
    ckfmha.fwd_varlen(q, k, k, cu_q, cu_k, max_seqlen_q=7, max_seqlen_k=21, causal=True,
                      validate=False)  # fmt: skip
    ckfmha.check_errors()
    ckfmha.check_errors(device=torch.cuda.current_device(), synchronize=True)
    ckfmha.check_errors(synchronize=False)
