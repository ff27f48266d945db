"""GPU architecture spellings: 90, "90", "sm_90a", "sm90", "compute_90", "9.0"."""

from __future__ import annotations

import re

from ckfmha.errors import InvalidArgumentError

_ARCH_PATTERN = re.compile(r"^(?:sm_?|compute_?)?(\d{2,3})[af]?$")


def parse_arch(arch: int | str | None) -> int:
    """10*major+minor for the C API; -1 (None) means the current device's arch."""
    if arch is None:
        return -1
    if isinstance(arch, bool):
        raise InvalidArgumentError(f"arch must be an int or a name like 'sm_90a', not {arch}", 1)
    if isinstance(arch, int):
        if arch < 0:
            return -1
        return arch
    text = str(arch).strip().lower()
    if re.fullmatch(r"\d+\.\d", text):
        major, minor = text.split(".")
        return 10 * int(major) + int(minor)
    match = _ARCH_PATTERN.match(text)
    if match is None:
        raise InvalidArgumentError(
            f"cannot read arch {arch!r}: use an int like 90 or a name like 'sm_90a'", 1
        )
    return int(match.group(1))


def arch_name(arch: int) -> str:
    """The nvcc target name ckfmha compiles for: Hopper kernels need the 'a' variant."""
    return f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
