"""Arrays on cuda:1 run on cuda:1 while cuda:0 is current, on cuda:1's current stream.

With cuda:0 current, forward, backward and paged calls on cuda:1 torch tensors (fresh random
inputs, outputs poisoned with NaN) must match the float64 reference, leave cuda:0 current (also
when the call raises), and run on torch's current stream of cuda:1: a side stream s1 that is
busy (a sleep, then the NaN fill of the outputs) when the call is queued, with the outputs
copied on s1 right after it while cuda:1's default stream sleeps longer. A launch on any other
stream leaves NaN in those copies, which are read after s1.synchronize() only. Arrays on both
GPUs, and a stream of cuda:0 for cuda:1 arrays, raise InvalidArgumentError naming both devices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import ckfmha
from ckfmha import errors
from ckfmha._device import set_device
from ckfmha.reference import attention_reference, paged_attention_reference
from ckfmha.reference_bwd import attention_backward_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(ckfmha.device_count() < 2, reason="needs two CUDA devices"),
]

torch = pytest.importorskip("torch") if ckfmha.device_count() >= 2 else None

if torch is not None:
    from support.gpu_compare import compare, f64

# s1 sleeps this many cycles (tens of ms) before the outputs are filled with NaN; cuda:1's
# default stream sleeps three times as long.
BUSY_CYCLES = 100_000_000
# bwd tolerances of tests/backward/test_bwd_gpu.py (bf16).
BWD_REL_L2 = 3e-2
BWD_MAX_REL = 1e-1


@pytest.fixture(autouse=True)
def cuda0_current() -> Iterator[None]:
    torch.cuda.set_device(0)
    assert ckfmha.current_device() == 0
    yield
    assert ckfmha.current_device() == 0, "the call left another device current"
    assert torch.cuda.current_device() == 0


def _random(generator: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """Fresh normal values on the host, in ``dtype`` (never zeros)."""
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)


def _on_busy_side_stream(
    host: dict[str, Any],
    poisoned: dict[str, tuple[tuple[int, ...], Any]],
    call: Callable[[dict[str, Any]], Any],
) -> dict[str, Any]:
    """Runs ``call(tensors)`` with cuda:0 current and a side stream s1 torch's current stream
    of cuda:1; returns the inputs (``host`` copied to cuda:1) and the outputs as s1 saw them.

    The outputs (``poisoned``, name: (shape, dtype)) are filled with NaN on s1 after a sleep
    there, and copied on s1 right after the call, while cuda:1's default stream sleeps three
    times as long: a launch on s1 lands between the fill and the copy; one on the default stream
    comes after the copy, and one on an idle stream before the fill, both leaving NaN. The
    copies are read after s1.synchronize() only."""
    tensors = {name: t.to("cuda:1") for name, t in host.items()}
    for name, (shape, dtype) in poisoned.items():
        tensors[name] = torch.empty(shape, dtype=dtype, device="cuda:1")
    # A first call, cuda:0 current too, builds what first use needs, so that the one on the busy
    # stream only launches; then the kernels used around it are loaded (lazy loading may wait
    # for the whole device on a kernel's first launch).
    call(tensors)
    assert ckfmha.current_device() == 0
    with torch.cuda.device(1):
        torch.cuda._sleep(1)
        for name in poisoned:
            tensors[name].fill_(float("nan")).clone()
        torch.cuda.synchronize(1)
    s1 = torch.cuda.Stream(device=1)
    with torch.cuda.stream(s1):
        with torch.cuda.device(1):
            with torch.cuda.stream(torch.cuda.default_stream(1)):
                torch.cuda._sleep(3 * BUSY_CYCLES)
            torch.cuda._sleep(BUSY_CYCLES)
            for name in poisoned:
                tensors[name].fill_(float("nan"))
        # torch.cuda.stream(s1) may have made cuda:1 current; the call must not need it.
        torch.cuda.set_device(0)
        assert ckfmha.current_device() == 0
        assert torch.cuda.current_stream(1) == s1
        call(tensors)
        assert ckfmha.current_device() == 0, "the call left cuda:1 current"
        assert torch.cuda.current_device() == 0
        with torch.cuda.device(1):
            seen = {name: tensors[name].clone() for name in poisoned}
    s1.synchronize()
    return {**tensors, **seen}


def test_set_device_is_seen_by_torch() -> None:
    set_device(1)
    try:
        assert ckfmha.current_device() == 1
        assert torch.cuda.current_device() == 1
    finally:
        set_device(0)
    assert torch.cuda.current_device() == 0
    with pytest.raises(errors.InvalidArgumentError, match=r"valid devices are 0\.\."):
        set_device(ckfmha.device_count())


def test_fwd_on_cuda1_with_cuda0_current() -> None:
    generator = torch.Generator().manual_seed(101)
    b, hq, hk, sq, sk, d = 2, 4, 2, 300, 257, 64
    host = {
        "q": _random(generator, (b, hq, sq, d), torch.float16),
        "k": _random(generator, (b, hk, sk, d), torch.float16),
        "v": _random(generator, (b, hk, sk, d), torch.float16),
    }
    poisoned = {"out": ((b, hq, sq, d), torch.float16), "lse": ((b, hq, sq), torch.float32)}

    def call(t: dict[str, Any]) -> None:
        ckfmha.fwd(
            t["q"], t["k"], t["v"], return_lse=True, out=t["out"], lse_out=t["lse"], num_splits=1
        )

    t = _on_busy_side_stream(host, poisoned, call)
    ref, ref_lse = attention_reference(f64(host["q"]), f64(host["k"]), f64(host["v"]))
    compare({"dtype": "fp16"}, t["out"], t["lse"], ref, ref_lse, "fwd on cuda:1")


def test_fwd_explicit_stream_of_cuda1() -> None:
    generator = torch.Generator().manual_seed(102)
    q = _random(generator, (1, 2, 128, 64), torch.float16)
    k = _random(generator, (1, 2, 96, 64), torch.float16)
    v = _random(generator, (1, 2, 96, 64), torch.float16)
    s1 = torch.cuda.Stream(device=1)
    with torch.cuda.device(1):
        qd, kd, vd = (t.to("cuda:1") for t in (q, k, v))
        out = torch.empty((1, 2, 128, 64), dtype=torch.float16, device="cuda:1")
        # First use builds here, and the kernels used on s1 below are loaded, not on s1.
        ckfmha.fwd(qd, kd, vd, out=out, num_splits=1)
        out.fill_(float("nan"))
        torch.cuda._sleep(1)
        torch.cuda.synchronize(1)
        with torch.cuda.stream(s1):
            torch.cuda._sleep(BUSY_CYCLES)
            out.fill_(float("nan"))
    assert torch.cuda.current_device() == 0
    # cuda:1's current stream is its default one; the call must use the stream given.
    result = ckfmha.fwd(qd, kd, vd, out=out, stream=s1, num_splits=1)
    assert result.data_ptr() == out.data_ptr()
    assert ckfmha.current_device() == 0
    s1.synchronize()
    ref, _ = attention_reference(f64(q), f64(k), f64(v))
    compare({"dtype": "fp16"}, out, None, ref, None, "fwd on cuda:1, stream=s1")


def test_bwd_on_cuda1_with_cuda0_current() -> None:
    generator = torch.Generator().manual_seed(103)
    b, hq, hk, sq, sk, d = 2, 4, 2, 200, 230, 128
    dtype = torch.bfloat16
    host = {
        "q": _random(generator, (b, hq, sq, d), dtype),
        "k": _random(generator, (b, hk, sk, d), dtype),
        "v": _random(generator, (b, hk, sk, d), dtype),
        "do": _random(generator, (b, hq, sq, d), dtype),
    }
    options = {"causal": True, "scale": 0.8 / math.sqrt(d)}
    o, lse = attention_reference(f64(host["q"]), f64(host["k"]), f64(host["v"]), **options)
    host["o"] = torch.from_numpy(o).to(dtype)
    host["lse"] = torch.from_numpy(np.ascontiguousarray(lse)).to(torch.float32)
    poisoned = {
        name: (tuple(host[like].shape), dtype)
        for name, like in (("dq", "q"), ("dk", "k"), ("dv", "v"))
    }

    def call(t: dict[str, Any]) -> None:
        ckfmha.bwd(
            t["do"],
            t["q"],
            t["k"],
            t["v"],
            t["o"],
            t["lse"],
            dq_out=t["dq"],
            dk_out=t["dk"],
            dv_out=t["dv"],
            **options,
        )

    t = _on_busy_side_stream(host, poisoned, call)
    ref = attention_backward_reference(
        f64(host["q"]), f64(host["k"]), f64(host["v"]), f64(host["do"]), **options
    )
    for name, expected in (("dq", ref.dq), ("dk", ref.dk), ("dv", ref.dv)):
        got = f64(t[name])
        assert not np.isnan(got).any(), f"unwritten (NaN) elements in {name}"
        err = got - expected
        rel = np.linalg.norm(err) / max(np.linalg.norm(expected), 1e-30)
        assert rel < BWD_REL_L2, f"{name}: relative L2 error {rel:.3e}"
        worst = np.abs(err).max() / max(np.abs(expected).max(), 1e-30)
        assert worst < BWD_MAX_REL, f"{name}: max error {worst:.3e} of max |ref|"


def test_paged_prefill_on_cuda1_with_cuda0_current() -> None:
    generator = torch.Generator().manual_seed(104)
    rng = np.random.default_rng(104)
    hq, hk, d, page_size = 4, 2, 128, 16
    dtype = torch.bfloat16
    lens_q, lens_k = np.array([40, 100]), np.array([300, 129])
    counts = [-(-int(n) // page_size) for n in lens_k]
    num_pages = sum(counts) + 3
    ids = rng.permutation(num_pages).astype(np.int32)
    table = np.zeros((2, max(counts)), np.int32)
    table[0, : counts[0]] = ids[: counts[0]]
    table[1, : counts[1]] = ids[counts[0] : counts[0] + counts[1]]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    total_q = int(cu_q[-1])
    host = {
        "q": _random(generator, (total_q, hq, d), dtype),
        "k_cache": _random(generator, (num_pages, page_size, hk, d), dtype),
        "v_cache": _random(generator, (num_pages, page_size, hk, d), dtype),
        "block_table": torch.from_numpy(table),
        "seqlens_k": torch.from_numpy(lens_k.astype(np.int32)),
        "cu_seqlens_q": torch.from_numpy(cu_q),
    }
    options = {"window": (64, 0), "causal_alignment": "bottom_right"}
    poisoned = {"out": ((total_q, hq, d), dtype), "lse": ((hq, total_q), torch.float32)}

    def call(t: dict[str, Any]) -> None:
        ckfmha.fwd_paged(
            t["q"],
            t["k_cache"],
            t["v_cache"],
            block_table=t["block_table"],
            seqlens_k=t["seqlens_k"],
            cu_seqlens_q=t["cu_seqlens_q"],
            max_seqlen_q=int(lens_q.max()),
            return_lse=True,
            out=t["out"],
            lse_out=t["lse"],
            num_splits=1,
            **options,
        )

    t = _on_busy_side_stream(host, poisoned, call)
    ref, ref_lse = paged_attention_reference(
        f64(host["q"]),
        f64(host["k_cache"]),
        f64(host["v_cache"]),
        block_table=table,
        seqlens_k=lens_k,
        cu_seqlens_q=cu_q,
        **options,
    )
    compare({"dtype": "bf16"}, t["out"], t["lse"], ref, ref_lse, "paged prefill on cuda:1")


def test_other_device_array_kinds() -> None:
    """ckfmha DeviceArrays made on cuda:1 run there too (its legacy stream), and NumPy inputs
    are still staged to the current device, cuda:0, which stays current."""
    rng = np.random.default_rng(105)
    q, k, v = (rng.standard_normal((1, 2, 64, 64)).astype(np.float16) for _ in range(3))
    ref, _ = attention_reference(q, k, v)
    set_device(1)
    try:
        qd, kd, vd = (ckfmha.from_host(x) for x in (q, k, v))
    finally:
        set_device(0)
    assert qd.device == 1
    out = ckfmha.fwd(qd, kd, vd, num_splits=1)
    assert ckfmha.current_device() == 0
    assert out.device == 1
    torch.cuda.synchronize(1)  # the kernel ran on cuda:1's legacy stream
    got = out.copy_to_host().astype(np.float64)
    np.testing.assert_allclose(got, ref, atol=1e-2, rtol=0)
    host_out = ckfmha.fwd(q, k, v, num_splits=1)
    np.testing.assert_allclose(host_out.astype(np.float64), ref, atol=1e-2, rtol=0)


def test_device_restored_when_the_call_raises() -> None:
    q = torch.randn(1, 2, 16, 64, device="cuda:1", dtype=torch.float16)
    bad_out = torch.empty(1, 2, 8, 64, device="cuda:1", dtype=torch.float16)
    with pytest.raises(errors.InvalidArgumentError, match="out must have shape"):
        ckfmha.fwd(q, q, q, out=bad_out)
    assert ckfmha.current_device() == 0


def test_arrays_on_both_gpus_name_both_devices() -> None:
    q0 = torch.randn(1, 2, 16, 64, device="cuda:0", dtype=torch.float16)
    k1 = torch.randn(1, 2, 16, 64, device="cuda:1", dtype=torch.float16)
    with pytest.raises(errors.InvalidArgumentError, match="q is on cuda:0, k is on cuda:1"):
        ckfmha.fwd(q0, k1, k1)
    with pytest.raises(errors.InvalidArgumentError, match="do is on cuda:0, q is on cuda:1"):
        ckfmha.bwd(q0, k1, k1, k1, k1, torch.zeros(1, 2, 16, device="cuda:1"))


def test_stream_of_another_device_names_both() -> None:
    q = torch.randn(1, 2, 16, 64, device="cuda:1", dtype=torch.float16)
    s0 = torch.cuda.Stream(device=0)
    with pytest.raises(
        errors.InvalidArgumentError, match="stream is on cuda:0 but the arrays are on cuda:1"
    ):
        ckfmha.fwd(q, q, q, stream=s0)
