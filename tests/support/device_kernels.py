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


def device_kernels(family: str, kv_quant: str = "none") -> list[dict[str, Any]]:
    """Kernels of ``family`` this device runs that read K/V as ``kv_quant`` ("none": in the
    problem's dtype; fp8 K/V kernels, "fp8_e4m3", have tests of their own); none without a
    device."""
    if ckfmha.device_count() == 0:
        return []
    arch = ckfmha.device_arch()
    return [
        k for k in ckfmha.Registry().kernels()
        if k["family"] == family and k["kv_quant"] == kv_quant and runs_on(k, arch)
    ]  # fmt: skip
