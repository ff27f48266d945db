"""Markers: `gpu` tests skip without a CUDA device; `slow` tests run unless -m excludes them."""

from __future__ import annotations

import functools

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "slow: long-running (deselect with -m 'not slow')")


@functools.cache
def cuda_device_count() -> int:
    try:
        import ckfmha
    except ImportError:
        return 0
    return ckfmha.device_count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and cuda_device_count() == 0:
        skip = pytest.mark.skip(reason="no CUDA device (ckfmha.device_count() == 0)")
        for item in gpu_items:
            item.add_marker(skip)
