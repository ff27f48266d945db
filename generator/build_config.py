"""Build settings from environment variables, shared by setup.py and the runtime JIT.

CKFMHA_ARCHS          arches to build, ';' or ',' separated (default: the arches of the GPUs
                      visible at build time, else "sm_80;sm_90a")
CKFMHA_KERNELS        kernel set name: core | ci | default | full (default "core")
CKFMHA_JOBS           parallel nvcc processes (default: CPU count)
CKFMHA_KERNEL_FILTER  optional regex searched in kernel names
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_ARCHS = ("sm_80", "sm_90a")
DEFAULT_KERNELS = "core"


class BuildConfigError(ValueError):
    """An environment variable holds a value the build cannot use."""


def split_list(text: str) -> tuple[str, ...]:
    """'sm_80;sm_90a' or 'sm_80, sm_90a' -> ('sm_80', 'sm_90a'); duplicates dropped."""
    items = (item.strip() for item in re.split(r"[;,]", text))
    return tuple(dict.fromkeys(item for item in items if item))


@dataclass(frozen=True)
class BuildConfig:
    archs: tuple[str, ...] = DEFAULT_ARCHS
    kernels: str = DEFAULT_KERNELS
    jobs: int = 1
    kernel_filter: str | None = None


def _jobs(raw: str | None) -> int:
    if raw is None or not raw.strip():
        return max(1, os.cpu_count() or 1)
    try:
        jobs = int(raw)
    except ValueError:
        raise BuildConfigError(f"CKFMHA_JOBS={raw!r} is not an integer") from None
    if jobs < 1:
        raise BuildConfigError(f"CKFMHA_JOBS={jobs} must be at least 1")
    return jobs


# Compute capability -> the arch_specs.json target whose kernels run there.
_TARGETS = {(8, 0): "sm_80", (8, 6): "sm_86", (8, 7): "sm_80", (8, 9): "sm_89", (9, 0): "sm_90a"}


def visible_gpu_archs() -> tuple[str, ...]:
    """Targets for the GPUs the CUDA driver shows (none without a driver or a GPU, or for a GPU
    no target serves). Asks libcuda directly: a build environment has no torch or CuPy."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return ()
    count, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return ()
    archs = []
    for ordinal in range(count.value):
        device = ctypes.c_int(0)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            continue
        # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
        cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device)
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)
        target = _TARGETS.get((major.value, minor.value))
        if target is not None:
            archs.append(target)
    return tuple(dict.fromkeys(archs))


def from_env(environ: Mapping[str, str] | None = None, detect_gpus: bool = False) -> BuildConfig:
    """Settings from the environment; with ``detect_gpus`` (setup.py) an unset CKFMHA_ARCHS
    means the visible GPUs' arches, and both code paths' arches only when there is none."""
    env = os.environ if environ is None else environ
    archs = split_list(env.get("CKFMHA_ARCHS", ""))
    if not archs and detect_gpus:
        archs = visible_gpu_archs()
    archs = archs or DEFAULT_ARCHS
    kernels = env.get("CKFMHA_KERNELS", "").strip() or DEFAULT_KERNELS
    kernel_filter = env.get("CKFMHA_KERNEL_FILTER", "").strip() or None
    return BuildConfig(
        archs=archs,
        kernels=kernels,
        jobs=_jobs(env.get("CKFMHA_JOBS")),
        kernel_filter=kernel_filter,
    )
