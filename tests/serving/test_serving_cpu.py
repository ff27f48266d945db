"""Serving wrappers without a GPU: plan() argument errors and bounds caught on the host before
anything reaches the device, the page tables they keep, the split count read from the
workspace size, and the stream and workspace arguments of copy_from_host and fwd_paged."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckfmha
from ckfmha import errors
from ckfmha.serving import BatchDecode, BatchPrefill
from ckfmha.serving.page_tables import step_pages

no_gpu = pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")

BOUNDS = {"max_batch": 4, "max_pages": 40, "max_seqlen_k": 300}
# Two sequences of 10 and 100 keys on 16-key pages: 1 + 7 pages of a 20-page table row.
TABLE = np.arange(40, dtype=np.int32).reshape(2, 20)
DECODE: dict[str, Any] = {
    "block_table": TABLE, "seqlens_k": [10, 100], "nhead_q": 8, "nhead_k": 2, "head_dim": 128,
    "page_size": 16,
}  # fmt: skip
PREFILL: dict[str, Any] = {**DECODE, "cu_seqlens_q": [0, 5, 12]}


def _decode() -> BatchDecode:
    return BatchDecode(**BOUNDS)


def _prefill() -> BatchPrefill:
    return BatchPrefill(**BOUNDS, max_seqlen_q=8, max_total_q=16)


def _fake(shape: tuple[int, ...], dtype: str = "int32", address: int = 0x400000) -> Any:
    return ckfmha.device_ptr(address, shape, dtype)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch": 0}, r"max_batch must be in \[1, 2147483647\], got 0"),
        ({"max_pages": 2.5}, r"max_pages must be an integer, got 2.5"),
        ({"max_seqlen_k": 2**31}, r"max_seqlen_k must be in \[1, 2147483647\]"),
        ({"device": -1}, r"device must be in \[0, 2147483647\], got -1"),
    ],
)
def test_constructor_checks_its_bounds(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=message):
        BatchDecode(**{**BOUNDS, **kwargs})


def test_prefill_constructor_checks_query_bounds() -> None:
    with pytest.raises(errors.InvalidArgumentError, match=r"max_total_q must be in \[1, "):
        BatchPrefill(**BOUNDS, max_seqlen_q=8, max_total_q=0)


def test_nothing_is_planned_or_allocated_before_plan() -> None:
    decode = _decode()
    assert decode.kernel is None and decode.workspace_bytes is None and decode.capture_key is None
    q = _fake((2, 8, 1, 128), "bf16")
    cache = _fake((40, 16, 2, 128), "bf16", 0x500000)
    with pytest.raises(errors.InvalidArgumentError, match=r"BatchDecode.run\(\) needs a plan"):
        decode.run(q, cache, cache, out=q)
    with pytest.raises(errors.InvalidArgumentError, match=r"call plan\(\) first"):
        decode.explain()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        # Page tables: the forms and their shapes.
        ({"block_table": None}, "not both and not neither"),
        ({"kv_indptr": [0, 1, 8]}, "not both and not neither"),
        ({"block_table": None, "kv_indptr": [0, 1, 8]}, "kv_indices and kv_indptr go together"),
        ({"seqlens_k": None}, "block_table needs seqlens_k"),
        ({"block_table": TABLE[0]}, r"block_table must be 2-D, got shape \(20,\)"),
        ({"block_table": TABLE.astype(np.float32)}, "block_table must hold integers"),
        ({"seqlens_k": [10, 100, 3]}, r"one length per block_table row \(2\)"),
        ({"block_table": _fake((2, 20))}, "block_table must be host metadata"),
        ({"seqlens_k": _fake((2,))}, "seqlens_k must be host metadata"),
        # fwd_paged's host checks.
        ({"seqlens_k": [10, 321]}, r"seqlens_k\[1\] = 321 exceeds the 320 keys of block_table"),
        ({"seqlens_k": [-1, 3]}, r"seqlens_k\[0\] = -1 is negative"),
        ({"block_table": -TABLE}, r"block_table\[1, 0\] = -20 is not a page id"),
        ({"num_pages": 22}, r"block_table\[1, 2\] = 22 is not a page id in \[0, 22\)"),
        ({"block_table": None, "seqlens_k": None, "kv_indptr": [0, 2, 9],
          "kv_indices": list(range(8))}, r"kv_indptr\[2\] = 9 runs past the 8 page ids"),
        ({"block_table": None, "kv_indptr": [0, 1, 2], "kv_indices": [0, 1]},
         r"seqlens_k\[1\] = 100 exceeds the 16 keys of its pages"),
        # The bounds given at construction.
        ({"block_table": np.zeros((5, 20), np.int32), "seqlens_k": [1] * 5},
         r"describe 5 sequences, but this BatchDecode was built for at most max_batch=4"),
        ({"block_table": np.zeros((2, 20), np.int32), "seqlens_k": [300, 301]},
         "sequence 1 has 301 keys, but this BatchDecode was built for at most max_seqlen_k=300"),
        ({"block_table": np.zeros((4, 20), np.int32), "seqlens_k": [300] * 4},
         r"keys use 76 pages, but this BatchDecode was built for at most max_pages=40"),
        # The problem.
        ({"page_size": 12}, "page_size is 12; paged K/V takes a power of two"),
        ({"page_size": 0}, r"page_size must be in \[1, "),
        ({"nhead_q": 7}, r"nhead_q \(7\) must be a multiple of nhead_k \(2\)"),
        ({"nhead_k": True}, "nhead_k must be an integer, got True"),
        ({"dtype": "int32"}, "dtype must be fp16, bf16 or fp32"),
        ({"dtype": "fp8"}, "unsupported dtype"),
        ({"seqlen_q": 0}, r"seqlen_q must be in \[1, "),
        ({"layout": "sbhd"}, "layout must be 'bhsd' or 'bshd'"),
        ({"window": (8, 0)}, "pass causal=True or window=.*not both"),
        ({"window": (8,), "causal": False}, r"window must be a \(left, right\) pair"),
        ({"causal_alignment": "center"}, "causal_alignment must be 'top_left' or 'bottom_right'"),
        ({"page_layout": "blocked"}, "page_layout must be 'linear' or 'vectorized'"),
        ({"num_pages": -1}, r"num_pages must be in \[0, "),
    ],
)
def test_decode_plan_errors_come_before_the_device(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _decode().plan(**{**DECODE, **changes})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cu_seqlens_q": [0, 5]}, r"cu_seqlens_q must hold batch \+ 1 = 3 offsets"),
        ({"cu_seqlens_q": []}, r"cu_seqlens_q must hold batch \+ 1 >= 1 offsets"),
        ({"cu_seqlens_q": [1, 5, 12]}, r"cu_seqlens_q\[0\] = 1; offsets start at 0"),
        ({"cu_seqlens_q": [0, 5, 4]}, r"cu_seqlens_q\[2\] = 4 is less than cu_seqlens_q\[1\]"),
        ({"cu_seqlens_q": [0, 8, 17]},
         r"cu_seqlens_q\[2\] = 17 query tokens, but .* at most max_total_q=16"),
        ({"cu_seqlens_q": [0, 3, 12]},
         "sequence 1 has 9 queries, but this BatchPrefill was built for at most max_seqlen_q=8"),
        ({"cu_seqlens_q": _fake((3,))}, "cu_seqlens_q must be host metadata"),
        ({"seqlens_k": [10, 301]}, "sequence 1 has 301 keys"),
    ],
)
def test_prefill_plan_errors_come_before_the_device(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _prefill().plan(**{**PREFILL, **changes})


@pytest.mark.parametrize("stream", ["stream", True, -1])
def test_plan_rejects_a_malformed_stream(stream: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        _decode().plan(**DECODE, stream=stream)


@no_gpu
@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"block_table": None, "seqlens_k": None, "kv_indptr": [0, 1, 8],
         "kv_indices": list(range(8))},
        {"layout": "bshd", "seqlen_q": 4, "num_pages": 40, "softcap": 30.0, "stream": 0},
        {"causal": False, "window": (64, 0), "scale": 0.1, "dtype": "fp16"},
    ],
)  # fmt: skip
def test_well_formed_plans_reach_the_device(changes: dict[str, Any]) -> None:
    decode = _decode()
    with pytest.raises(errors.NoDeviceError):
        decode.plan(**{**DECODE, **changes})
    assert decode.kernel is None and decode.device is None


@no_gpu
def test_well_formed_prefill_plan_reaches_the_device() -> None:
    with pytest.raises(errors.NoDeviceError):
        _prefill().plan(**PREFILL)


# ---- the page tables kept on the device ----


def test_block_tables_keep_the_pages_their_keys_use() -> None:
    table = np.array([[7, 3, 9, -1], [2, -1, -1, -1], [5, 6, 8, 1]], np.int32)
    pages = step_pages(block_table=table, seqlens_k=[33, 0, 49], kv_indptr=None,
                       kv_indices=None, page_size=16, num_pages=10)  # fmt: skip
    np.testing.assert_array_equal(pages.kv_indptr, [0, 3, 3, 7])
    np.testing.assert_array_equal(pages.kv_indices, [7, 3, 9, 5, 6, 8, 1])
    np.testing.assert_array_equal(pages.seqlens_k, [33, 0, 49])
    assert pages.batch == 3 and pages.pages_used == 7


def test_sglang_tables_keep_their_used_pages_and_default_lengths() -> None:
    pages = step_pages(block_table=None, seqlens_k=None, kv_indptr=[0, 2, 3],
                       kv_indices=[4, 0, 2, 99], page_size=64, num_pages=5)  # fmt: skip
    np.testing.assert_array_equal(pages.kv_indices, [4, 0, 2])
    np.testing.assert_array_equal(pages.seqlens_k, [128, 64])


# ---- copy_from_host(stream=) and fwd_paged(workspace=) ----


@pytest.mark.parametrize(
    ("stream", "error", "message"),
    [
        ("stream", TypeError, "cannot get a CUDA stream from str"),
        (True, TypeError, "not bool"),
        (-1, ValueError, "stream handle must be >= 0"),
    ],
)
def test_copy_from_host_rejects_a_malformed_stream(stream: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        _fake((4,)).copy_from_host(np.zeros(4, np.int32), stream=stream)


def test_copy_from_host_with_a_stream_checks_the_array_first() -> None:
    with pytest.raises(errors.InvalidArgumentError, match=r"shape \(3,\) does not match \(4,\)"):
        _fake((4,)).copy_from_host(np.zeros(3, np.int32), stream=0)
    with pytest.raises(errors.InvalidArgumentError, match="dtype float32 does not match int32"):
        _fake((4,)).copy_from_host(np.zeros(4, np.float32), stream=0)


@no_gpu
def test_copy_from_host_on_a_stream_reaches_the_device() -> None:
    with pytest.raises(errors.NoDeviceError):
        _fake((4,)).copy_from_host(np.zeros(4, np.int32), stream=0)


@no_gpu
def test_library_exports_the_async_copy() -> None:
    library = ctypes.CDLL(str(Path(ckfmha.get_library_dir()) / "libckfmha.so"))
    copy = library.ckfmha_memcpy_to_device_async
    copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    copy.restype = ctypes.c_int
    assert copy(None, None, 0, None) == 4  # CKFMHA_ERROR_NO_DEVICE


def _paged_call(**kwargs: Any) -> Any:
    q = _fake((2, 8, 1, 128), "bf16")
    cache = _fake((40, 16, 2, 128), "bf16", 0x500000)
    return ckfmha.fwd_paged(
        q, cache, cache, block_table=_fake((2, 20), address=0x900000),
        seqlens_k=_fake((2,), address=0xA00000), out=_fake((2, 8, 1, 128), "bf16", 0x800000),
        **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("workspace", "message"),
    [
        (_fake((64,)), "workspace must be uint8, got int32"),
        (_fake((8, 8), "uint8"), "workspace must be 1-D"),
        (np.zeros(64, np.uint8), "out is on cuda:0, workspace is on cpu"),
    ],
)
def test_fwd_paged_workspace_argument_errors(workspace: Any, message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _paged_call(workspace=workspace)


@no_gpu
def test_fwd_paged_with_a_workspace_reaches_the_device() -> None:
    with pytest.raises(errors.NoDeviceError):
        _paged_call(workspace=_fake((1 << 20,), "uint8", 0xB00000), num_splits=4)
