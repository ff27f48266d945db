"""The registered kernels the current device can run, for parametrizing GPU tests."""

from __future__ import annotations

from typing import Any

import ckfmha


def runs_on(kernel: dict[str, Any], arch: int) -> bool:
    # Mirrors the runtime: "a" targets run only on their own arch, plain SASS
    # on later minors of the same major.
    if kernel["arch_name"].endswith("a"):
        return kernel["arch"] == arch
    return kernel["arch"] // 10 == arch // 10 and kernel["arch"] <= arch


def device_kernels(family: str) -> list[dict[str, Any]]:
    """Kernels of ``family`` this device runs; none without a device."""
    if ckfmha.device_count() == 0:
        return []
    arch = ckfmha.device_arch()
    return [k for k in ckfmha.Registry().kernels() if k["family"] == family and runs_on(k, arch)]
