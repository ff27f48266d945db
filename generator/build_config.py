"""Build settings from environment variables, shared by setup.py and the runtime JIT.

CKFMHA_ARCHS          arches to build, ';' or ',' separated (default "sm_80;sm_90a")
CKFMHA_KERNELS        kernel set name: ci | default | full (default "default")
CKFMHA_JOBS           parallel nvcc processes (default: CPU count)
CKFMHA_KERNEL_FILTER  optional regex searched in kernel names
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_ARCHS = ("sm_80", "sm_90a")
DEFAULT_KERNELS = "default"


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


def from_env(environ: Mapping[str, str] | None = None) -> BuildConfig:
    env = os.environ if environ is None else environ
    archs = split_list(env.get("CKFMHA_ARCHS", "")) or DEFAULT_ARCHS
    kernels = env.get("CKFMHA_KERNELS", "").strip() or DEFAULT_KERNELS
    kernel_filter = env.get("CKFMHA_KERNEL_FILTER", "").strip() or None
    return BuildConfig(
        archs=archs,
        kernels=kernels,
        jobs=_jobs(env.get("CKFMHA_JOBS")),
        kernel_filter=kernel_filter,
    )
