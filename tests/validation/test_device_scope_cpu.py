"""Arrays on a GPU other than the current one run there: the device scope and its checks.

The device functions are monkeypatched, so these run without a GPU (or with one, touching
nothing): ``on_device`` switches only when the arrays' device is not current and restores
the caller's device on exit, also when the call raises; ``check_devices`` returns the
arrays' device instead of raising when it is not the current one; a stream object of another
device is refused. tests/validation/test_multi_gpu_gpu.py runs the same on two real GPUs.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import ckfmha
from ckfmha import device_scope, errors
from ckfmha._device import set_device
from ckfmha._interop import resolve_stream
from ckfmha._streams import stream_device
from ckfmha.array_devices import check_devices
from ckfmha.device_scope import on_device


class _Devices:
    """A fake current device: records each query and each switch."""

    def __init__(self, current: int | None) -> None:
        self.current = current
        self.queries = 0
        self.switches: list[int] = []

    def current_device(self) -> int:
        self.queries += 1
        if self.current is None:
            raise errors.NoDeviceError("no CUDA device is visible", 4)
        return self.current

    def set_device(self, index: int) -> None:
        self.switches.append(index)
        self.current = index


@pytest.fixture
def devices(monkeypatch: pytest.MonkeyPatch) -> _Devices:
    fake = _Devices(current=0)
    monkeypatch.setattr(device_scope, "current_device", fake.current_device)
    monkeypatch.setattr(device_scope, "set_device", fake.set_device)
    return fake


def test_host_data_switches_and_queries_nothing(devices: _Devices) -> None:
    with on_device(None):
        assert devices.current == 0
    assert (devices.queries, devices.switches) == (0, [])


def test_current_device_costs_one_query_and_no_switch(devices: _Devices) -> None:
    with on_device(0):
        assert devices.current == 0
    assert (devices.queries, devices.switches) == (1, [])


def test_other_device_is_made_current_then_restored(devices: _Devices) -> None:
    with on_device(1):
        assert devices.current == 1
    assert devices.switches == [1, 0]
    assert devices.current == 0
    assert devices.queries == 1


def test_device_is_restored_when_the_body_raises(devices: _Devices) -> None:
    devices.current = 2
    with pytest.raises(ValueError, match="inside"), on_device(1):
        assert devices.current == 1
        raise ValueError("inside")
    assert devices.switches == [1, 2]
    assert devices.current == 2


def test_nested_scopes_restore_in_order(devices: _Devices) -> None:
    with on_device(1):
        with on_device(2):
            assert devices.current == 2
        assert devices.current == 1
        with on_device(1):
            pass
    assert devices.switches == [1, 2, 1, 0]


def test_no_device_switches_nothing(devices: _Devices) -> None:
    # Without a device the call fails where it needs one, as before the scope existed.
    devices.current = None
    with on_device(1):
        pass
    assert devices.switches == []


def test_check_devices_returns_a_non_current_device(devices: _Devices) -> None:
    q = ckfmha.device_ptr(4096, (1, 2, 8, 64), device=1)
    k = ckfmha.device_ptr(8192, (1, 2, 8, 64), device=1)
    assert devices.current == 0
    assert check_devices([("q", q), ("k", k)], [("sink", np.zeros(2, np.float32))]) == 1
    assert check_devices([("q", ckfmha.device_ptr(4096, (1,), device=3))]) == 3
    assert check_devices([("q", np.zeros(3))]) is None
    # Arrays on two GPUs still raise, naming both devices.
    with pytest.raises(errors.InvalidArgumentError, match="q is on cuda:1, k is on cuda:0"):
        check_devices([("q", q), ("k", ckfmha.device_ptr(4096, (1,), device=0))])


def _cuda1(shape: tuple[int, ...], address: int = 0x100000, dtype: str = "fp16") -> Any:
    return ckfmha.device_ptr(address, shape, dtype, device=1)


# Each runner with an argument error it finds inside the device scope: the scope was entered
# (cuda:1 made current) and left (cuda:0 current again) although the call raised.
_RUNNER_ERRORS = {
    "fwd": (
        lambda: ckfmha.fwd(_cuda1((1, 2, 8, 64)), _cuda1((1, 2, 8, 32)), _cuda1((1, 2, 8, 64))),
        "k head dim 32 differs",
    ),
    "fwd_varlen": (
        lambda: ckfmha.fwd_varlen(
            _cuda1((8, 2, 64)),
            _cuda1((8, 2, 32)),
            _cuda1((8, 2, 64)),
            np.array([0, 8], np.int32),
            np.array([0, 8], np.int32),
            max_seqlen_q=8,
            max_seqlen_k=8,
        ),
        "k head dim 32 differs",
    ),
    "bwd": (
        lambda: ckfmha.bwd(
            *(_cuda1((1, 2, 8, 64)),) * 2,
            _cuda1((1, 2, 8, 32)),
            *(_cuda1((1, 2, 8, 64)),) * 2,
            _cuda1((1, 2, 8), dtype="fp32"),
        ),
        "k head dim 32 differs",
    ),
    "fwd_paged": (
        lambda: ckfmha.fwd_paged(
            _cuda1((1, 2, 1, 64)), _cuda1((4, 16, 2, 64)), _cuda1((4, 16, 2, 64))
        ),
        "pass block_table",
    ),
    "append_kv": (
        lambda: ckfmha.append_kv(*(_cuda1((1, 16, 2, 64)),) * 4, 3, page_layout="vectorized"),
        "describes pages",
    ),
}


@pytest.mark.parametrize("runner", sorted(_RUNNER_ERRORS))
def test_runners_run_on_the_arrays_device_and_restore(devices: _Devices, runner: str) -> None:
    call, message = _RUNNER_ERRORS[runner]
    with pytest.raises(errors.InvalidArgumentError, match=message):
        call()
    assert devices.switches == [1, 0]
    assert devices.current == 0


def test_host_data_runs_on_the_current_device(devices: _Devices) -> None:
    # NumPy data has no device: staged to the current one, nothing is queried or switched.
    q = np.zeros((1, 2, 8, 64), np.float16)
    with pytest.raises(errors.InvalidArgumentError, match="layout must be"):
        ckfmha.fwd(q, q, q, layout="nope")
    assert (devices.queries, devices.switches) == (0, [])


class _TorchLikeStream:
    def __init__(self, index: int) -> None:
        self.device = SimpleNamespace(type="cuda", index=index)
        self.cuda_stream = 0x5000


class _CuPyLikeStream:
    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self.ptr = 0x6000


def test_stream_device() -> None:
    assert stream_device(_TorchLikeStream(1)) == 1
    assert stream_device(_CuPyLikeStream(2)) == 2
    assert stream_device(1234) is None
    assert stream_device(None) is None
    assert stream_device(SimpleNamespace(ptr=5)) is None


def test_stream_of_another_device_names_both() -> None:
    for stream, owner in ((_TorchLikeStream(0), 0), (_CuPyLikeStream(2), 2)):
        with pytest.raises(
            errors.InvalidArgumentError,
            match=f"stream is on cuda:{owner} but the arrays are on cuda:1",
        ):
            resolve_stream(stream, "device", None, 1)
    assert resolve_stream(_TorchLikeStream(1), "device", None, 1) == 0x5000
    assert resolve_stream(_CuPyLikeStream(1), "device", None, 1) == 0x6000
    # An int handle cannot be asked cheaply: taken as the arrays' device's stream.
    assert resolve_stream(0x7000, "device", None, 1) == 0x7000
    # Host data (no device) is staged to the current device; nothing to compare with.
    assert resolve_stream(_TorchLikeStream(0), "numpy", None, None) == 0x5000


def test_runner_refuses_a_stream_of_another_device(devices: _Devices) -> None:
    q = _cuda1((1, 2, 8, 64))
    with pytest.raises(
        errors.InvalidArgumentError, match="stream is on cuda:0 but the arrays are on cuda:1"
    ):
        ckfmha.fwd(q, q, q, stream=_TorchLikeStream(0))
    assert devices.switches == [1, 0]


def test_set_device_checks_the_range() -> None:
    count = ckfmha.device_count()
    if count == 0:
        with pytest.raises(errors.NoDeviceError):
            set_device(0)
        return
    before = ckfmha.current_device()
    with pytest.raises(
        errors.InvalidArgumentError,
        match=rf"device {count} does not exist; valid devices are 0\.\.{count - 1}",
    ):
        set_device(count)
    with pytest.raises(errors.InvalidArgumentError, match="device -1 does not exist"):
        set_device(-1)
    assert ckfmha.current_device() == before
