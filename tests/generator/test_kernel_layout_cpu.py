"""The kernel headers' folders and the direction of their includes.

cpp/include/ckfmha/kernel/ holds arch-neutral pieces in common/ (masks, softmax, tile copies,
...) and the launch parameters in params/, and one folder per kernel family: sm80/, sm90/,
simt/, splitkv_combine/, appendkv/ and conv/. Includes point from a family folder to common/ and
params/ or within the family, never from one family to another nor from the shared folders
to a family: a piece two families need lives in common/ (or params/).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.paths import REPO_ROOT

INCLUDE = REPO_ROOT / "cpp" / "include"
KERNEL = INCLUDE / "ckfmha" / "kernel"

SHARED_FOLDERS = ("common", "params")
FAMILY_FOLDERS = ("sm80", "sm90", "simt", "splitkv_combine", "appendkv", "conv")
KERNEL_INCLUDE = re.compile(r'^\s*#\s*include\s+"ckfmha/kernel/([^"]+)"', re.MULTILINE)


def _headers() -> list[Path]:
    return sorted(p for p in KERNEL.rglob("*") if p.is_file())


def _folder(path: Path) -> str:
    """A header's folder below kernel/ ('' for one lying in kernel/ itself)."""
    parts = path.relative_to(KERNEL).parts
    return parts[0] if len(parts) > 1 else ""


def _kernel_includes(path: Path) -> list[str]:
    """Paths below kernel/ that `path` includes."""
    return KERNEL_INCLUDE.findall(path.read_text())


def test_every_header_lives_in_a_known_folder() -> None:
    headers = _headers()
    assert headers, f"no headers under {KERNEL}"
    misplaced = [
        str(p.relative_to(KERNEL))
        for p in headers
        if _folder(p) not in SHARED_FOLDERS + FAMILY_FOLDERS
        or len(p.relative_to(KERNEL).parts) != 2
    ]
    assert not misplaced, f"headers outside {SHARED_FOLDERS + FAMILY_FOLDERS}: {misplaced}"


def test_every_kernel_include_names_an_existing_header() -> None:
    sources = _headers() + sorted((REPO_ROOT / "cpp" / "src").glob("*.cpp"))
    sources += sorted((INCLUDE / "ckfmha").glob("*.h"))
    sources += sorted((INCLUDE / "ckfmha" / "runtime").glob("*"))
    missing = [
        f"{p.relative_to(REPO_ROOT)}: ckfmha/kernel/{name}"
        for p in sources
        for name in _kernel_includes(p)
        if not (KERNEL / name).is_file()
    ]
    assert not missing, f"includes of headers that do not exist: {missing}"


@pytest.mark.parametrize("folder", SHARED_FOLDERS)
def test_shared_folders_include_no_kernel_family(folder: str) -> None:
    wrong = [
        f"{p.relative_to(KERNEL)} includes {name}"
        for p in _headers()
        if _folder(p) == folder
        for name in _kernel_includes(p)
        if name.split("/", 1)[0] in FAMILY_FOLDERS
    ]
    assert not wrong, f"{folder}/ must not depend on a kernel family: {wrong}"


@pytest.mark.parametrize("family", FAMILY_FOLDERS)
def test_a_family_includes_no_other_family(family: str) -> None:
    wrong = [
        f"{p.relative_to(KERNEL)} includes {name}"
        for p in _headers()
        if _folder(p) == family
        for name in _kernel_includes(p)
        if name.split("/", 1)[0] in FAMILY_FOLDERS and name.split("/", 1)[0] != family
    ]
    assert not wrong, f"what two families share belongs in common/ or params/: {wrong}"


def test_the_generator_names_launch_headers_that_exist() -> None:
    from generator import emit

    templates = [*emit.PIPELINE_TEMPLATES.values(), *emit.FAMILY_TEMPLATES.values()]
    headers = {t.header for t in templates}
    missing = sorted(h for h in headers if not (INCLUDE / h).is_file())
    assert not missing, f"launch headers the generator includes but that do not exist: {missing}"
    assert all(h.split("/")[2] in FAMILY_FOLDERS for h in headers), sorted(headers)
