"""Untrusted input, without a GPU: the metadata checks, the aliasing extents, the device rule,
validation's switch, and empty problems as the C API and the runners see them.

Arrays here are stand-in device pointers (ckfmha.device_ptr): every check under test runs
before anything touches the device, and calls that pass all of them stop at NoDeviceError.
"""

from __future__ import annotations

import numpy as np
import pytest

import ckfmha
from ckfmha import errors
from ckfmha.aliasing import Region, byte_extent, check_no_overlap, overlaps
from ckfmha.array_devices import array_device, check_devices
from ckfmha.host_metadata import MetadataValues, host_values, validation_requested
from ckfmha.metadata_checks import (
    check_append_pages,
    check_block_table,
    check_cu_seqlens,
    check_kv_indptr,
    check_offsets,
    check_paged,
    check_varlen,
)

no_gpu = pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")


def _raises(message: str):
    return pytest.raises(errors.InvalidArgumentError, match=message)


# ---- offsets and length bounds ----


def test_offsets_give_lengths() -> None:
    lengths = check_offsets(np.array([0, 3, 3, 10], np.int32), "cu_seqlens_q", 10, "q")
    assert lengths.tolist() == [3, 0, 7]
    assert check_offsets(np.array([0], np.int32), "cu_seqlens_q", 0, "q").tolist() == []


@pytest.mark.parametrize(
    ("offsets", "total", "message"),
    [
        ([1, 3, 5], 9, r"cu_seqlens_q\[0\] = 1; offsets start at 0"),
        ([0, 5, 4, 9], 9, r"cu_seqlens_q\[2\] = 4 is less than cu_seqlens_q\[1\] = 5"),
        ([0, 4, 12], 10, r"cu_seqlens_q\[2\] = 12 runs past the 10 tokens of q"),
        ([0, -3, 2], 10, r"cu_seqlens_q\[1\] = -3 is less than cu_seqlens_q\[0\] = 0"),
    ],
)
def test_bad_offsets_name_the_index_and_bound(offsets: list[int], total: int, message: str) -> None:
    with _raises(message):
        check_offsets(np.array(offsets, np.int32), "cu_seqlens_q", total, "q")


def test_max_seqlen_bounds_every_sequence() -> None:
    offsets = np.array([0, 2, 9, 12], np.int32)
    assert check_cu_seqlens(offsets, "cu_seqlens_k", 12, "k", 7, "max_seqlen_k") is not None
    with _raises(
        r"max_seqlen_k = 6 is less than sequence 1's length 7 "
        r"\(cu_seqlens_k\[2\] - cu_seqlens_k\[1\]\)"
    ):
        check_cu_seqlens(offsets, "cu_seqlens_k", 12, "k", 6, "max_seqlen_k")
    assert check_cu_seqlens(None, "cu_seqlens_k", 12, "k", 6, "max_seqlen_k") is None


def test_varlen_checks_both_sides() -> None:
    check_varlen([0, 2, 5], [0, 4, 4], total_q=5, total_k=4, max_seqlen_q=3, max_seqlen_k=4)
    with _raises(r"cu_seqlens_k\[2\] = 4 runs past the 3 tokens of k"):
        check_varlen([0, 2, 5], [0, 4, 4], total_q=5, total_k=3, max_seqlen_q=3, max_seqlen_k=4)
    with _raises("max_seqlen_q = 2 is less than sequence 1's length 3"):
        check_varlen([0, 2, 5], None, total_q=5, total_k=3, max_seqlen_q=2, max_seqlen_k=4)


def test_int32_offsets_do_not_wrap() -> None:
    # int32 differences of these would overflow; the checks compute in int64.
    offsets = np.array([0, 2**31 - 1], np.int32)
    with _raises("runs past the 5 tokens"):
        check_offsets(offsets, "cu_seqlens_q", 5, "q")


# ---- page tables ----


def test_block_table_entries_past_a_sequence_are_never_read() -> None:
    table = np.array([[3, -1, -1], [0, 1, 99]], np.int32)  # vLLM pads with -1
    check_block_table(
        table, np.array([16, 17], np.int32), batch=2, table_pages=3, page_size=16, num_pages=4
    )
    with _raises(r"block_table\[1, 2\] = 99 is not a page id in \[0, 4\)"):
        check_block_table(
            table, np.array([16, 33], np.int32), batch=2, table_pages=3, page_size=16, num_pages=4
        )


@pytest.mark.parametrize(
    ("table", "lens", "message"),
    [
        ([[0, 5]], [17], r"block_table\[0, 1\] = 5 is not a page id in \[0, 4\): the caches hold"),
        ([[-2, 1]], [3], r"block_table\[0, 0\] = -2 is not a page id"),
        ([[0, 1]], [33], r"seqlens_k\[0\] = 33 exceeds the 32 keys of block_table row 0 \(2 pa"),
        ([[0, 1]], [-1], r"seqlens_k\[0\] = -1 is negative"),
    ],
)
def test_bad_block_tables(table: list[list[int]], lens: list[int], message: str) -> None:
    with _raises(message):
        check_block_table(
            np.array(table, np.int32),
            np.array(lens, np.int32),
            batch=1,
            table_pages=2,
            page_size=16,
            num_pages=4,
        )


def test_block_table_lengths_and_bound_without_the_table() -> None:
    with _raises("seqlens_k"):
        check_block_table(None, [40], batch=1, table_pages=2, page_size=16, num_pages=4)
    with _raises(r"max_seqlen_k = 8 is less than sequence 0's length 9 \(seqlens_k\[0\]\)"):
        check_block_table(
            None, [9], batch=1, table_pages=2, page_size=16, num_pages=4, max_seqlen_k=8
        )
    check_block_table([[9, 9]], None, batch=1, table_pages=2, page_size=16, num_pages=4)


@pytest.mark.parametrize(
    ("indptr", "indices", "lens", "message"),
    [
        ([0, 2, 1], [0, 1, 2], None, r"kv_indptr\[2\] = 1 is less than kv_indptr\[1\] = 2"),
        ([0, 2, 4], [0, 1, 2], None, r"kv_indptr\[2\] = 4 runs past the 3 page ids of kv_in"),
        ([1, 2, 3], [0, 1, 2], None, r"kv_indptr\[0\] = 1; offsets start at 0"),
        ([0, 2, 3], [0, 7, 2], None, r"kv_indices\[1\] = 7 is not a page id in \[0, 3\)"),
        ([0, 2, 3], [0, 1, -1], None, r"kv_indices\[2\] = -1 is not a page id"),
        ([0, 2, 3], [0, 1, 2], [8, 5], r"seqlens_k\[1\] = 5 exceeds the 4 keys of its pages"),
    ],
)
def test_bad_indptr_pages(
    indptr: list[int], indices: list[int], lens: list[int] | None, message: str
) -> None:
    with _raises(message):
        check_kv_indptr(
            np.array(indptr),
            np.array(indices),
            lens,
            indices_count=len(indices),
            page_size=4,
            num_pages=3,
        )


def test_indptr_messages_name_the_pages() -> None:
    with _raises(r"\(kv_indptr\[2\] - kv_indptr\[1\] pages of 4 keys\)"):
        check_kv_indptr([0, 2, 3], [0, 1, 2], [8, 5], indices_count=3, page_size=4, num_pages=3)


def test_indptr_ids_past_the_last_sequence_are_never_read() -> None:
    check_kv_indptr(
        [0, 1, 2], [0, 2, 55, -9], None, indices_count=4, page_size=4, num_pages=3, max_seqlen_k=4
    )
    with _raises(r"max_seqlen_k = 3 is less than sequence 0's length 4"):
        check_kv_indptr(
            [0, 1, 2], [0, 2], None, indices_count=2, page_size=4, num_pages=3, max_seqlen_k=3
        )


def test_paged_checks_route_by_table_kind() -> None:
    values = {
        "block_table": np.array([[0, 9]]),
        "seqlens_k": np.array([20]),
        "cu_seqlens_q": np.array([0, 5]),
    }
    bounds = {
        "batch": 1,
        "table_pages": 2,
        "indices_count": 0,
        "page_size": 16,
        "num_pages": 4,
        "max_seqlen_q": None,
        "max_seqlen_k": None,
    }
    with _raises(r"block_table\[0, 1\] = 9"):
        check_paged(values, indptr=False, total_q=None, **bounds)
    values["block_table"] = np.array([[0, 1]])
    with _raises(r"cu_seqlens_q\[1\] = 5 runs past the 4 tokens of q"):
        check_paged(values, indptr=False, total_q=4, **bounds)


def test_append_pages_check_where_the_new_tokens_land() -> None:
    table = np.array([[7, 1, -1]], np.int32)
    bounds = {"batch": 1, "table_pages": 3, "page_size": 4, "num_pages": 8}
    check_append_pages(table, np.array([2]), seqlen_new=6, **bounds)  # positions 2..7
    with _raises(r"block_table\[0, 2\] = -1 is not a page id"):
        check_append_pages(table, np.array([5]), seqlen_new=4, **bounds)
    with _raises(
        r"cache_seqlens\[0\] = 10 \+ seqlen_new 3 exceeds the 12 tokens of "
        r"block_table row 0 \(3 pages of 4\)"
    ):
        check_append_pages(table, np.array([10]), seqlen_new=3, **bounds)
    with _raises(r"cache_seqlens\[0\] = -1 is negative"):
        check_append_pages(table, np.array([-1]), seqlen_new=1, **bounds)
    check_append_pages(table, np.array([12]), seqlen_new=0, **bounds)


# ---- aliasing ----


def test_byte_extent() -> None:
    assert byte_extent(1000, (2, 3), (3, 1), 2) == (1000, 1012)
    assert byte_extent(1000, (2, 3), (8, 1), 4) == (1000, 1000 + (8 + 2 + 1) * 4)
    assert byte_extent(1000, (2, 0, 3), (8, 1, 1), 4) == (1000, 1000)
    assert byte_extent(1000, (4,), (0,), 2) == (1000, 1002)  # broadcast: one element
    assert byte_extent(1000, (3,), (-1,), 2) == (996, 1002)


def _region(
    name: str,
    ptr: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...] | None = None,
    itemsize: int = 2,
    device: int = 0,
) -> Region:
    if strides is None:
        strides = tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
    return Region(name, ptr, shape, strides, itemsize, device)


def test_overlaps_is_exact_for_interleaved_views() -> None:
    # dq, dk, dv of one packed [b, s, 3, h, d] buffer: their extents meet, their bytes do not.
    b, s, h, d = 2, 5, 4, 8
    strides = (s * 3 * h * d, 3 * h * d, d, 1)
    base = 1 << 30
    dq, dk, dv = (
        _region(n, base + i * h * d * 2, (b, s, h, d), strides)
        for i, n in enumerate(("dq", "dk", "dv"))
    )
    assert dq.extent[1] > dk.extent[0]
    assert not overlaps(dq, dk) and not overlaps(dk, dv)
    check_no_overlap([dq, dk, dv], [_region("q", base + 10**6, (b, s, h, d), strides)])
    shifted = _region("dk", base + 2, (b, s, h, d), strides)
    assert overlaps(dq, shifted)


def test_views_on_other_devices_or_empty_never_overlap() -> None:
    q = _region("q", 4096, (4, 4))
    assert not overlaps(q, _region("out", 4096, (4, 4), device=1))
    assert not overlaps(q, _region("out", 4096, (0, 4)))
    assert overlaps(q, _region("out", 4096, (4, 4), device=-1))


def test_check_no_overlap_names_both_arrays() -> None:
    q = _region("q", 4096, (2, 8))
    with _raises("out overlaps the input q"):
        check_no_overlap([_region("out", 4096 + 16, (2, 8))], [q])
    with _raises("out overlaps the output lse_out"):
        check_no_overlap(
            [_region("out", 8192, (2, 8)), _region("lse_out", 8192, (2,), None, 4)], [q]
        )
    # An in-place output may be exactly its input, not a shifted view of it.
    check_no_overlap([_region("q_out", 4096, (2, 8))], [q], in_place=[("q_out", "q")])
    with _raises("q_out overlaps the input q"):
        check_no_overlap([_region("q_out", 4098, (2, 8))], [q], in_place=[("q_out", "q")])


# ---- devices ----


class _HostDLPack:
    """A CPU DLPack producer that NumPy cannot import (like a bf16 CPU torch tensor)."""

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    def __dlpack__(self, stream=None):
        raise BufferError("Unsupported dtype in DLTensor")


def test_array_device() -> None:
    assert array_device(np.zeros(3)) == "cpu"
    assert array_device([0, 1]) == "cpu"
    assert array_device(ckfmha.device_ptr(4096, (2,), "fp16", device=1)) == "cuda:1"
    assert array_device(_HostDLPack()) == "cpu"
    assert array_device(42) is None


def test_mixed_devices_name_each_array() -> None:
    q = ckfmha.device_ptr(4096, (1, 2, 8, 64))
    with _raises("arrays are on different devices: q is on cuda:0, k is on cpu, v is on cuda:0"):
        check_devices([("q", q), ("k", _HostDLPack()), ("v", q)])
    with _raises("q is on cuda:0, k is on cuda:1"):
        check_devices([("q", q), ("k", ckfmha.device_ptr(4096, (1,), device=1))])
    with _raises("sink is on cuda:1 but q is on cuda:0"):
        check_devices([("q", q)], [("sink", ckfmha.device_ptr(4096, (2,), "fp32", device=1))])
    # Small host arrays are staged; all-host data is NumPy's staged mode.
    check_devices([("q", q), ("out", None)], [("cu_seqlens_q", np.zeros(3, np.int32))])
    assert check_devices([("q", np.zeros(3)), ("k", np.zeros(3))]) is None


def test_cpu_tensor_beside_device_arrays_is_named_by_the_runner() -> None:
    q = ckfmha.device_ptr(4096, (1, 2, 8, 64))
    with _raises("k is on cpu"):
        ckfmha.fwd(q, _HostDLPack(), q)
    with _raises("out is on cpu"):
        ckfmha.fwd(q, q, q, out=np.zeros((1, 2, 8, 64), np.float16))


def test_out_that_is_q_is_rejected_by_the_runner() -> None:
    q = ckfmha.device_ptr(4096, (1, 2, 8, 64))
    with _raises("out overlaps the input q"):
        ckfmha.fwd(
            q,
            ckfmha.device_ptr(1 << 20, (1, 2, 8, 64)),
            ckfmha.device_ptr(1 << 21, (1, 2, 8, 64)),
            out=q,
        )
    k = ckfmha.device_ptr(1 << 20, (1, 2, 8, 64))
    with _raises("lse_out overlaps the input k"):
        ckfmha.fwd(
            q,
            k,
            k,
            out=ckfmha.device_ptr(1 << 22, (1, 2, 8, 64)),
            lse_out=ckfmha.device_ptr(1 << 20, (1, 2, 8), "fp32"),
        )


# ---- validation's switch and host values ----


def test_validation_follows_the_argument_then_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("CKFMHA_VALIDATE", raising=False)
    assert not validation_requested(None)
    assert validation_requested(True)
    monkeypatch.setenv("CKFMHA_VALIDATE", "1")
    assert validation_requested(None) and not validation_requested(False)
    monkeypatch.setenv("CKFMHA_VALIDATE", "0")
    assert not validation_requested(None)


def test_host_values() -> None:
    assert host_values([0, 2]).tolist() == [0, 2]
    assert host_values(ckfmha.device_ptr(4096, (3,), "int32")) is None
    assert host_values(_HostDLPack()) is None
    meta = MetadataValues(validate=False)
    meta.given("cu", np.array([0, 1]))
    meta.fetch("cu", None, 0)
    assert meta.get("cu").tolist() == [0, 1] and not meta.copied


# ---- the runners check host metadata before staging it ----


def _ptr(shape: tuple[int, ...], dtype: str = "fp16", address: int = 0x400000):
    return ckfmha.device_ptr(address, shape, dtype)


def _varlen(cu_q, cu_k, total_q: int = 10, total_k: int = 12, **kwargs):
    q = _ptr((total_q, 2, 64))
    k = _ptr((total_k, 2, 64), address=0x500000)
    v = _ptr((total_k, 2, 64), address=0x600000)
    kwargs.setdefault("max_seqlen_q", 6)
    kwargs.setdefault("max_seqlen_k", 7)
    return ckfmha.fwd_varlen(
        q, k, v, cu_q, cu_k, out=_ptr((total_q, 2, 64), address=0x800000), **kwargs
    )


@pytest.mark.parametrize(
    ("cu_q", "cu_k", "kwargs", "message"),
    [
        ([0, 6, 4], [0, 5, 12], {}, r"cu_seqlens_q\[2\] = 4 is less than cu_seqlens_q\[1\]"),
        ([0, 4, 10], [0, 5, 13], {}, r"cu_seqlens_k\[2\] = 13 runs past the 12 tokens of k"),
        ([0, 4, 11], [0, 5, 12], {}, r"cu_seqlens_q\[2\] = 11 runs past the 10 tokens of q"),
        (
            [0, 4, 10],
            [0, 5, 12],
            {"max_seqlen_k": 6},
            r"max_seqlen_k = 6 is less than sequence 1's length 7",
        ),
    ],
)
def test_fwd_varlen_rejects_bad_host_offsets(cu_q, cu_k, kwargs, message) -> None:
    with _raises(message):
        _varlen(np.array(cu_q, np.int32), np.array(cu_k, np.int32), **kwargs)


def test_bwd_varlen_rejects_bad_host_offsets() -> None:
    q = _ptr((10, 2, 64))
    k = _ptr((12, 2, 64), address=0x500000)
    lse = _ptr((2, 10), "fp32", address=0x700000)
    with _raises(r"cu_seqlens_q\[2\] = 11 runs past the 10 tokens of q"):
        ckfmha.bwd_varlen(
            q, q, k, k, q, lse, [0, 4, 11], [0, 5, 12], max_seqlen_q=7, max_seqlen_k=7
        )


def test_fwd_paged_rejects_bad_host_tables() -> None:
    q = _ptr((2, 8, 1, 128), "bf16")
    cache = (40, 16, 2, 128)
    k, v = _ptr(cache, "bf16", 0x500000), _ptr(cache, "bf16", 0x600000)
    out = _ptr((2, 8, 1, 128), "bf16", 0x800000)
    table = np.zeros((2, 4), np.int32)
    table[1, 1] = 40
    with _raises(r"block_table\[1, 1\] = 40 is not a page id in \[0, 40\)"):
        ckfmha.fwd_paged(q, k, v, block_table=table, seqlens_k=[5, 17], out=out)
    with _raises(r"seqlens_k\[0\] = 65 exceeds the 64 keys"):
        ckfmha.fwd_paged(q, k, v, block_table=table, seqlens_k=[65, 1], out=out)
    with _raises(r"kv_indices\[0\] = -1 is not a page id"):
        ckfmha.fwd_paged(q, k, v, kv_indices=[-1, 3], kv_indptr=[0, 1, 2], out=out)


def test_append_kv_rejects_bad_host_pages() -> None:
    cache = ckfmha.device_ptr(1 << 24, (8, 16, 2, 64), "fp16")
    v_cache = ckfmha.device_ptr(2 << 24, (8, 16, 2, 64), "fp16")
    new = ckfmha.device_ptr(3 << 24, (2, 3, 2, 64), "fp16")
    v_new = ckfmha.device_ptr(4 << 24, (2, 3, 2, 64), "fp16")
    table = np.array([[0, 1], [2, 8]], np.int32)
    with _raises(r"block_table\[1, 1\] = 8 is not a page id in \[0, 8\)"):
        ckfmha.append_kv(cache, v_cache, new, v_new, [4, 15], block_table=table)
    contiguous = ckfmha.device_ptr(1 << 24, (2, 16, 2, 64), "fp16")
    v_contiguous = ckfmha.device_ptr(2 << 24, (2, 16, 2, 64), "fp16")
    with _raises("k_cache overlaps the input k_new"):
        ckfmha.append_kv(
            contiguous,
            v_contiguous,
            ckfmha.device_ptr((1 << 24) + 128, (2, 3, 2, 64), "fp16"),
            v_new,
            ckfmha.device_ptr(5 << 24, (2,), "int32"),
        )


# ---- empty problems ----


def test_zero_batch_and_lengths_validate() -> None:
    for fields in ({"batch": 0}, {"seqlen_q": 0}, {"seqlen_k": 0}, {"seqlen_q": 0, "seqlen_k": 0}):
        problem = ckfmha.FwdProblem(
            **{"batch": 2, "nhead_q": 4, "seqlen_q": 8, "hdim": 64, **fields}
        )
        problem.validate()
    for fields in ({"nhead_q": 0}, {"hdim": 0}, {"seqlen_q": -1}):
        with pytest.raises(errors.InvalidArgumentError):
            ckfmha.FwdProblem(
                **{"batch": 2, "nhead_q": 4, "seqlen_q": 8, "hdim": 64, **fields}
            ).validate()


@pytest.mark.parametrize("fields", [{"batch": 0}, {"seqlen_q": 0}, {"seqlen_k": 0}])
def test_empty_problems_select_no_kernel(fields: dict[str, int]) -> None:
    problem = ckfmha.FwdProblem(**{"batch": 2, "nhead_q": 4, "seqlen_q": 8, "hdim": 128, **fields})
    dispatcher = ckfmha.Dispatcher()
    assert dispatcher.select(problem, arch=80) == ""
    assert "no kernel runs" in dispatcher.explain(problem, arch=80)
    assert dispatcher.workspace_size(problem, arch=80) == 0


def test_empty_outputs_return_without_a_device() -> None:
    # Every output empty: the C run returns before it needs a device.
    q = _ptr((0, 2, 8, 64))
    kv = _ptr((0, 2, 8, 64), address=0x500000)
    out = _ptr((0, 2, 8, 64), address=0x800000)
    assert ckfmha.fwd(q, kv, kv, out=out) is out
    q = _ptr((1, 2, 0, 64))
    out = _ptr((1, 2, 0, 64), address=0x800000)
    lse = _ptr((1, 2, 0), "fp32", address=0x900000)
    assert ckfmha.fwd(q, _ptr((1, 2, 8, 64)), _ptr((1, 2, 8, 64)), out=out, lse_out=lse) == (
        out,
        lse,
    )
    # A varlen batch of no sequences, and one of sequences without queries (device offsets:
    # host ones would be staged, which needs the device).
    empty = _ptr((0, 2, 64))
    out = _ptr((0, 2, 64), address=0x800000)
    one, three = _ptr((1,), "int32", 0x900000), _ptr((3,), "int32", 0xA00000)
    assert (
        ckfmha.fwd_varlen(empty, empty, empty, one, one, max_seqlen_q=0, max_seqlen_k=0, out=out)
        is out
    )
    assert (
        ckfmha.fwd_varlen(
            empty,
            _ptr((5, 2, 64)),
            _ptr((5, 2, 64)),
            three,
            three,
            max_seqlen_q=0,
            max_seqlen_k=3,
            out=out,
        )
        is out
    )
    # Backward with neither queries nor keys, and an empty append.
    e4 = _ptr((1, 2, 0, 64))
    grads = [_ptr((1, 2, 0, 64), address=a) for a in (0x800000, 0x900000, 0xA00000)]
    assert ckfmha.bwd(
        e4,
        e4,
        e4,
        e4,
        e4,
        _ptr((1, 2, 0), "fp32"),
        dq_out=grads[0],
        dk_out=grads[1],
        dv_out=grads[2],
    ) == tuple(grads)
    cache = ckfmha.device_ptr(1 << 24, (2, 16, 2, 64), "fp16")
    v_cache = ckfmha.device_ptr(2 << 24, (2, 16, 2, 64), "fp16")
    none_new = ckfmha.device_ptr(3 << 24, (2, 0, 2, 64), "fp16")
    assert (
        ckfmha.append_kv(
            cache, v_cache, none_new, none_new, ckfmha.device_ptr(5 << 24, (2,), "int32")
        )
        is None
    )


@no_gpu
def test_no_keys_is_filled_on_the_device() -> None:
    # seqlen_k = 0 with queries: O = 0 and LSE = -inf are memsets, which need the device.
    q = _ptr((1, 2, 8, 64))
    kv = _ptr((1, 2, 0, 64), address=0x500000)
    with pytest.raises(errors.NoDeviceError):
        ckfmha.fwd(q, kv, kv, out=_ptr((1, 2, 8, 64), address=0x800000))
    with pytest.raises(errors.NoDeviceError):
        ckfmha.bwd(
            q,
            q,
            kv,
            kv,
            q,
            _ptr((1, 2, 8), "fp32", address=0x700000),
            dq_out=_ptr((1, 2, 8, 64), address=0x800000),
            dk_out=_ptr((1, 2, 0, 64), address=0x900000),
            dv_out=_ptr((1, 2, 0, 64), address=0xA00000),
        )
