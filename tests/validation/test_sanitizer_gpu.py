"""compute-sanitizer over the device-metadata cases and seeded valid draws.

memcheck runs every case of support/device_metadata_cases.py (each one call with out-of-range
device metadata for one sequence, then correct calls) and seeded valid draws: the kernels must
bound every read and write by the caller's buffers, so memcheck must report 0 errors, bad
metadata included. torch's caching allocator is turned off for the run, so each tensor is its
own allocation and a read past one is an access memcheck sees. racecheck (much slower) runs a
few cases (split-KV and combine, varlen forward, varlen backward) and valid draws for
shared-memory hazards. The sanitizers' summary lines and the cases' and draws' lines go to a
file under the test's tmp dir and to the test's output.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO_ROOT, child_env

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

torch = pytest.importorskip("torch")

from support.device_metadata_cases import CASES

SANITIZER = shutil.which("compute-sanitizer")
TIMEOUT_S = 500

RACECHECK_CASES = (
    "paged_split_page_past_pool",
    "varlen_cu_seqlens_k_past_total",
    "bwd_varlen_cu_seqlens_k_past_total",
)
RUNS = {
    # tool: (cases, valid draws, seed)
    "memcheck": (("all",), 12, 5),
    "racecheck": (RACECHECK_CASES, 4, 5),
}
CASES_LINE = re.compile(r"device-metadata cases: (\d+) run, (\d+) passed")
DRAWS_LINE = re.compile(r"valid draws: (\d+) run, (\d+) passed")
# "<case> ok", "<case> FAILED (mode)", "draw 3: kind=... ok"
RESULT_LINE = re.compile(r"(draw \d+: .*|\w+) (ok|FAILED.*)$")
# memcheck ends with "ERROR SUMMARY: 0 errors"; racecheck with "RACECHECK SUMMARY: 0 hazards
# displayed (0 errors, 0 warnings)" (and may print an ERROR SUMMARY too).
CLEAN_SUMMARY = re.compile(
    r"ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: \d+ hazards displayed \(0 errors"
)


def _env() -> dict[str, str]:
    # Without torch's caching allocator every tensor is its own allocation, so a read past
    # one is outside any allocation and memcheck sees it.
    return child_env(PYTORCH_NO_CUDA_MEMORY_CACHING="1")


MAX_FINDING_LINES = 400


def _summary(output: str) -> list[str]:
    """The sanitizer's findings (the first MAX_FINDING_LINES) and summaries, and each case's
    and draw's line."""
    keep, findings = [], 0
    for line in output.splitlines():
        if line.startswith("========="):
            findings += 1
            if findings <= MAX_FINDING_LINES or "SUMMARY" in line:
                keep.append(line)
        elif CASES_LINE.search(line) or DRAWS_LINE.search(line) or RESULT_LINE.match(line):
            keep.append(line)
    return keep


@pytest.mark.skipif(SANITIZER is None, reason="compute-sanitizer is not on PATH")
@pytest.mark.parametrize("tool", list(RUNS))
def test_sanitizer_finds_nothing(tool: str, tmp_path: Path) -> None:
    cases, draws, seed = RUNS[tool]
    command = [
        str(SANITIZER), "--tool", tool, "--error-exitcode", "99",
        sys.executable, "-m", "support.device_metadata_cases", *cases,
        "--valid-draws", str(draws), "--seed", str(seed),
    ]  # fmt: skip
    try:
        result = subprocess.run(
            command,
            cwd=REPO_ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        output = result.stdout + "\n" + result.stderr
        returncode = result.returncode
    except subprocess.TimeoutExpired as expired:

        def text(data: bytes | str | None) -> str:
            return data.decode(errors="replace") if isinstance(data, bytes) else data or ""

        output = text(expired.stdout) + "\n" + text(expired.stderr)
        returncode = None
    lines = _summary(output)
    log = tmp_path / f"{tool}-summary.txt"
    log.write_text("\n".join([" ".join(command), *lines]) + "\n")
    print(f"{tool} summary ({log}):")
    print("\n".join(lines))

    assert returncode is not None, f"{tool} ran past {TIMEOUT_S} s\n" + "\n".join(lines)
    detail = f"{tool}: exit {returncode}\n{output[-8000:]}"
    assert returncode == 0, detail
    assert CLEAN_SUMMARY.search(output), detail
    if tool == "memcheck":
        assert "ERROR SUMMARY: 0 errors" in output, detail
    expected_cases = len(CASES) if "all" in cases else len(cases)
    ran = CASES_LINE.search(output)
    assert ran and int(ran.group(1)) == int(ran.group(2)) == expected_cases, detail
    drawn = DRAWS_LINE.search(output)
    assert drawn and int(drawn.group(1)) == int(drawn.group(2)) == draws, detail


# The control: k and v described as 64 times longer than their allocation, so the kernel reads
# past it. memcheck must see that here, or its "0 errors" above would prove nothing (out is
# allocated before k, so the aliasing check does not stop the call first).
PLANTED_READ = """
import torch, ckfmha
q = torch.randn(1, 8, 64, 128, device="cuda", dtype=torch.bfloat16)
out = torch.empty_like(q)
k = torch.randn(1, 2, 64, 128, device="cuda", dtype=torch.bfloat16)
too_long = ckfmha.device_ptr(k.data_ptr(), (1, 2, 4096, 128), "bf16")
ckfmha.fwd(q, too_long, too_long, out=out)
torch.cuda.synchronize()
"""


@pytest.mark.skipif(SANITIZER is None, reason="compute-sanitizer is not on PATH")
def test_memcheck_sees_a_planted_read() -> None:
    result = subprocess.run(
        [str(SANITIZER), "--tool", "memcheck", "--print-limit", "1", sys.executable, "-c",
         PLANTED_READ],
        cwd=REPO_ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    errors = re.search(r"ERROR SUMMARY: (\d+) error", output)
    assert errors and int(errors.group(1)) > 0, output[-4000:]
