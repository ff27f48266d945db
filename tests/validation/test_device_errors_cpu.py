"""The device-metadata error report's surface, checked without a GPU.

Kernels that meet out-of-range device metadata record it; the next call, or
``ckfmha.check_errors()``, raises DeviceMetadataError (status CKFMHA_ERROR_DEVICE_METADATA).
Here: the exception class and status mapping, check_errors without a device, the C header's
declaration and the library's export, and that the message fragments the GPU cases
(support/device_metadata_cases.py) expect are the ones cpp/src/device_errors.cpp writes.
tests/validation/test_device_metadata_gpu.py runs the cases themselves.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest
from support import device_metadata_cases
from support.paths import REPO_ROOT

import ckfmha
from ckfmha import errors
from ckfmha._status import error_for_status, raise_for_status, status_name

HEADER = REPO_ROOT / "cpp" / "include" / "ckfmha" / "ckfmha.h"
MESSAGES = REPO_ROOT / "cpp" / "src" / "device_errors.cpp"
DEVICE_METADATA = 8
NO_DEVICE = 4

no_gpu = pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")


def test_device_metadata_error_is_an_invalid_argument_error() -> None:
    assert ckfmha.DeviceMetadataError is errors.DeviceMetadataError
    assert issubclass(ckfmha.DeviceMetadataError, ckfmha.InvalidArgumentError)
    assert issubclass(ckfmha.DeviceMetadataError, ValueError)
    assert "DeviceMetadataError" in ckfmha.__all__ and "check_errors" in ckfmha.__all__


def test_status_8_is_device_metadata() -> None:
    assert status_name(DEVICE_METADATA) == "CKFMHA_ERROR_DEVICE_METADATA"
    assert ckfmha.status_name(DEVICE_METADATA) == "CKFMHA_ERROR_DEVICE_METADATA"
    error = error_for_status(DEVICE_METADATA, "x")
    assert type(error) is ckfmha.DeviceMetadataError
    assert error.status == DEVICE_METADATA and str(error) == "x"
    with pytest.raises(ckfmha.DeviceMetadataError):
        raise_for_status(DEVICE_METADATA)


@no_gpu
def test_check_errors_without_a_device_raises_no_device_error() -> None:
    with pytest.raises(ckfmha.NoDeviceError):
        ckfmha.check_errors()
    with pytest.raises(ckfmha.NoDeviceError):
        ckfmha.check_errors(device=0, synchronize=False)


def test_header_declares_the_status_and_the_check() -> None:
    header = HEADER.read_text()
    assert re.search(r"CKFMHA_ERROR_DEVICE_METADATA\s*=\s*8\b", header)
    assert re.search(
        r"CKFMHA_API\s+int\s+ckfmha_check_device_errors\s*\(\s*int\s+device\s*,"
        r"\s*int\s+synchronize\s*\)\s*;",
        header,
    ), "ckfmha.h must declare int ckfmha_check_device_errors(int device, int synchronize)"


@no_gpu
def test_library_exports_the_check() -> None:
    library = ctypes.CDLL(str(Path(ckfmha.get_library_dir()) / "libckfmha.so"))
    check = library.ckfmha_check_device_errors
    check.argtypes, check.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    assert check(-1, 1) == NO_DEVICE
    assert check(-1, 0) == NO_DEVICE


def _source_text(path: Path) -> str:
    """The C++ source with its adjacent string literals joined, so a message split over
    lines reads as one string."""
    literals = re.findall(r'"((?:[^"\\]|\\.)*)"', path.read_text())
    return "".join(literals)


def test_gpu_cases_expect_the_messages_the_library_writes() -> None:
    text = _source_text(MESSAGES)
    cases = device_metadata_cases.CASES
    assert len(cases) >= 11 and set(device_metadata_cases.MODES) == {"check", "next_call"}
    for case in cases.values():
        assert case.fragment in text, f"{case.name}: {case.fragment!r} not in {MESSAGES.name}"
    # The three kinds that name a sequence write "sequence <N>: ...", which the cases parse.
    named = re.findall(r'" sequence " \+ std::to_string\(\w+ - 1\) \+\s*": ', MESSAGES.read_text())
    assert len(named) == 3, named
