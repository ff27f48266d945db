# cython: language_level=3
"""ckfmha.fwd_paged: attention over a paged K/V cache (vLLM block tables, SGLang indptr)."""

from libc.stdint cimport int32_t
from libc.string cimport memset

import numpy as np

cimport ckfmha as capi
from ckfmha._arrays cimport ArrayView
from ckfmha._fp8_kv cimport KvScales, attention_views
from ckfmha._fwd cimport _bhs_strides, _bhsd, _check_outputs, _in_layout, _init_problem, _run, \
    _set_scalars, _set_strides, _set_tensors
from ckfmha._problem cimport to_int32

from ckfmha import _dtypes
from ckfmha._arrays import as_view
from ckfmha._interop import allocate, array_kind, finish, resolve_stream
from ckfmha.array_devices import check_devices
from ckfmha.device_scope import on_device
from ckfmha.errors import InvalidArgumentError
from ckfmha.fp8_kv import check_scale_args, kv_quant_of
from ckfmha.host_metadata import MetadataValues
from ckfmha.metadata_checks import check_paged
from ckfmha.page_layouts import check_vectorized_k, paged_cache_dims
from ckfmha.problem import layout_code, page_layout_code

_F32 = (_dtypes.FP32,)
_I32 = (_dtypes.INT32,)
_U8 = (_dtypes.UINT8,)
_INT32_MAX = 2 ** 31 - 1


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)


def _int32_array(obj):
    """Lists and tuples become int32 NumPy arrays (staged like any host array)."""
    return np.asarray(obj, dtype=np.int32) if isinstance(obj, (list, tuple)) else obj


def _shape(obj) -> tuple:
    return tuple(int(n) for n in getattr(obj, "shape", ()))


cdef ArrayView _int32_view(obj, handle, str name, tuple shape):
    """A contiguous int32 view of exactly ``shape`` (None: any extent on that axis)."""
    cdef ArrayView view = as_view(obj, handle, None, name, len(shape), _I32)
    for got, want in zip(view.shape, shape):
        if want is not None and got != want:
            wanted = tuple("any" if n is None else n for n in shape)
            raise _invalid(f"{name} must have shape {wanted}, got {view.shape}")
    if view.shape and view.shape[-1] > 1 and view.strides[-1] != 1:
        raise _invalid(f"{name} must be contiguous along its last axis, got strides "
                       f"{view.strides}")
    return view


def _longest_keys(seqlens_k, kv_indptr, int page_size, int table_pages,
                  int indices_count) -> int:
    """An upper bound of the sequences' key counts from whatever is on the host: it sizes the
    split count only, so a bound that is too large costs speed, never correctness."""
    if isinstance(seqlens_k, np.ndarray) and seqlens_k.size:
        return int(seqlens_k.max())
    if table_pages > 0:
        return table_pages * page_size
    if isinstance(kv_indptr, np.ndarray) and kv_indptr.size > 1:
        return int(np.diff(kv_indptr.astype(np.int64)).max()) * page_size
    return indices_count * page_size


def fwd_paged(q, k_cache, v_cache, *, block_table=None, seqlens_k=None, kv_indices=None,
              kv_indptr=None, cu_seqlens_q=None, max_seqlen_q=None, max_seqlen_k=None,
              causal=False, causal_alignment="top_left", window=None, scale=None,
              softcap=0.0, return_lse=False, layout="bhsd", page_layout="linear",
              num_splits=0, out=None, lse_out=None, kernel=None, stream=None, dtype=None,
              validate=None, workspace=None, kv_dtype=None, k_scale=None, v_scale=None):
    """Attention over a paged K/V cache: decode steps (fwd_pagedkv) and batch prefill.

    k_cache and v_cache are [num_pages, page_size, nhead_k, hdim] (vLLM's flash
    layout; any strides with a contiguous head dim); page_size, a power of two,
    is read from their shape. With ``page_layout="vectorized"`` (vLLM's older
    layout, fp16/bf16) k_cache is [num_pages, nhead_k, hdim / 8, page_size, 8]
    (each [page_size, 8] chunk dense) and v_cache [num_pages, nhead_k, hdim,
    page_size] (keys contiguous). Sequence b's keys are the tokens of its pages in
    order, given either by ``block_table`` (int32 [batch, max_pages_per_seq],
    vLLM) with ``seqlens_k`` (int32 [batch]), or by ``kv_indices`` (int32 page
    ids of all sequences, flat) and ``kv_indptr`` (int32 [batch + 1], SGLang),
    where ``seqlens_k`` is optional (default: every key of the pages). Entries
    past a sequence's last page are never read.

    Queries: q [batch, nhead_q, seqlen_q, hdim] ("bhsd", or "bshd" with
    ``layout``), e.g. a decode step of 1..8 new tokens per sequence; or, with
    ``cu_seqlens_q`` (int32 [batch + 1]), ragged queries packed as q [total_q,
    nhead_q, hdim] (batch prefill; ``max_seqlen_q`` the longest, computed when
    cu_seqlens_q is a host array). nhead_q is a multiple of nhead_k (GQA).
    q and the caches share one dtype (fp16 or bf16 for the paged kernels), or the caches are
    fp8: float8_e4m3fn (or uint8 codes with ``kv_dtype="fp8_e4m3"``) in the linear layout,
    standing for ``k_scale * k_cache`` and ``v_scale * v_cache``, with q fp16 or bf16.
    ``k_scale``/``v_scale`` as in ``fwd``: numbers (default 1.0), or both fp32 device arrays
    of 1 or nhead_k values, read by the kernels (a captured graph follows their updates).

    ``causal``/``window`` masks align as in ``fwd``; "bottom_right" makes each
    sequence's last query see its last key (what decoding and prefilling
    after a cached prefix want). ``max_seqlen_k`` bounds the key counts (it
    sizes the split count; default: from host arrays, else the table's
    capacity). ``num_splits`` 0 chooses; n >= 1 splits each sequence's keys n
    ways. Returns o (like q) and, with ``return_lse``, the fp32 LSE
    ([batch, nhead_q, seqlen_q], or [nhead_q, total_q] for packed queries).

    Split-KV plans of two or more splits need scratch memory, allocated per call like the
    outputs. ``workspace`` (a 1-D uint8 device array, 16-byte aligned, e.g.
    ``ckfmha.empty((n,), "uint8")``) is used instead, so that a call with ``out`` (and
    ``lse_out``) allocates nothing; it must hold at least
    ``Dispatcher().workspace_size(problem)`` bytes, else BufferTooSmallError names how many
    the plan needs. The call's stream must be the only one using it until the call's
    kernels finish.

    Metadata given on the host (NumPy, lists) is checked before it is staged: each
    sequence's length fits its pages (seqlens_k <= the table row's or kv_indptr's pages x
    page_size), every page id its keys use is in [0, num_pages), kv_indptr starts at 0, never
    decreases and ends within kv_indices, cu_seqlens_q likewise within q, and max_seqlen_q/k
    (when given) bound the lengths: InvalidArgumentError naming the array, the index and the
    bound. Device metadata is checked the same way when ``validate=True`` (or
    CKFMHA_VALIDATE=1): it is copied back, which waits for the stream. Otherwise the kernels
    bound it: a page id outside [0, num_pages) is read as zeros, and a sequence whose key count
    or kv_indptr range is out of range is skipped; the next call on the device (or
    ``ckfmha.check_errors()``) raises DeviceMetadataError. Devices and
    output overlaps are checked as in ``fwd``; a batch or query count of 0 launches nothing.
    """
    check_scale_args(k_scale, v_scale)
    index = check_devices((("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out),
                           ("lse_out", lse_out), ("workspace", workspace)),
                          (("block_table", block_table), ("seqlens_k", seqlens_k),
                           ("kv_indices", kv_indices), ("kv_indptr", kv_indptr),
                           ("cu_seqlens_q", cu_seqlens_q), ("k_scale", k_scale),
                           ("v_scale", v_scale)))
    with on_device(index):
        return _fwd_paged(index, q, k_cache, v_cache, block_table, seqlens_k, kv_indices, kv_indptr,
                          cu_seqlens_q, max_seqlen_q, max_seqlen_k, causal, causal_alignment,
                          window, scale, softcap, return_lse, layout, page_layout, num_splits, out,
                          lse_out, kernel, stream, dtype, validate, workspace, kv_dtype, k_scale,
                          v_scale)


cdef object _fwd_paged(index, q, k_cache, v_cache, block_table, seqlens_k, kv_indices, kv_indptr,
                       cu_seqlens_q, max_seqlen_q, max_seqlen_k, causal, causal_alignment, window,
                       scale, softcap, return_lse, layout, page_layout, num_splits, out, lse_out,
                       kernel, stream, dtype, validate, workspace, kv_dtype, k_scale, v_scale):
    """``fwd_paged`` with the arrays' device (``index``) current."""
    cdef int c_page_layout = page_layout_code(page_layout)
    cdef bint indptr = kv_indices is not None or kv_indptr is not None
    if indptr == (block_table is not None):
        raise _invalid("pass block_table (vLLM) or kv_indices with kv_indptr (SGLang), "
                       "not both and not neither")
    if indptr and (kv_indices is None or kv_indptr is None):
        raise _invalid("kv_indices and kv_indptr go together")
    if block_table is not None and seqlens_k is None:
        raise _invalid("block_table needs seqlens_k (int32 [batch] key counts)")
    cdef bint group = cu_seqlens_q is not None
    cdef int c_layout = capi.CKFMHA_LAYOUT_BSHD if group else layout_code(layout)
    block_table = _int32_array(block_table)
    seqlens_k = _int32_array(seqlens_k)
    kv_indices = _int32_array(kv_indices)
    kv_indptr = _int32_array(kv_indptr)
    cu_seqlens_q = _int32_array(cu_seqlens_q)

    # Shapes first: everything below that can fail on arguments fails before any staging.
    cdef bint vectorized = c_page_layout == capi.CKFMHA_PAGE_LAYOUT_VECTORIZED
    num_pages, page_size, nhead_k, hdim_k, hdim_v = paged_cache_dims(
        _shape(k_cache), _shape(v_cache), vectorized)
    cdef int table_pages = 0
    if indptr:
        if len(_shape(kv_indptr)) != 1 or _shape(kv_indptr)[0] < 1:
            raise _invalid(f"kv_indptr must be 1-D with batch + 1 >= 1 offsets, got shape "
                           f"{_shape(kv_indptr)}")
        if len(_shape(kv_indices)) != 1:
            raise _invalid(f"kv_indices must be 1-D, got shape {_shape(kv_indices)}")
        batch = _shape(kv_indptr)[0] - 1
    else:
        if len(_shape(block_table)) != 2:
            raise _invalid(f"block_table must be 2-D [batch, max_pages_per_seq], got shape "
                           f"{_shape(block_table)}")
        batch, table_pages = _shape(block_table)
    q_shape = _shape(q)
    if group:
        if len(q_shape) != 3:
            raise _invalid(f"with cu_seqlens_q, q must be 3-D [total_q, nhead_q, hdim], got "
                           f"{q_shape}")
        total_q, nhead_q, hdim_q = q_shape
        if _shape(cu_seqlens_q) != (batch + 1,):
            raise _invalid(f"cu_seqlens_q must hold batch + 1 = {batch + 1} offsets, got shape "
                           f"{_shape(cu_seqlens_q)}")
        if max_seqlen_q is None:
            if not isinstance(cu_seqlens_q, np.ndarray):
                raise _invalid("max_seqlen_q is needed when cu_seqlens_q is a device array")
            max_seqlen_q = int(np.diff(cu_seqlens_q.astype(np.int64)).max(initial=0))
        seqlen_q = int(max_seqlen_q)
    else:
        if len(q_shape) != 4:
            raise _invalid(f"q must be 4-D ({layout}), or 3-D packed with cu_seqlens_q; got "
                           f"{q_shape}")
        q_batch, nhead_q, seqlen_q, hdim_q = _bhsd(q_shape, c_layout)
        if q_batch != batch:
            raise _invalid(f"q holds {q_batch} sequences but the page table {batch}")
    if hdim_k != hdim_q:
        raise _invalid(f"k_cache head dim {hdim_k} differs from q head dim {hdim_q}")
    meta = MetadataValues(validate)
    for name, obj in (("block_table", block_table), ("seqlens_k", seqlens_k),
                      ("kv_indices", kv_indices), ("kv_indptr", kv_indptr),
                      ("cu_seqlens_q", cu_seqlens_q)):
        meta.given(name, obj)
    metadata_bounds = dict(
        indptr=indptr, batch=batch, table_pages=table_pages,
        indices_count=_shape(kv_indices)[0] if indptr else 0, page_size=page_size,
        num_pages=num_pages, total_q=total_q if group else None,
        max_seqlen_q=max_seqlen_q if group else None, max_seqlen_k=max_seqlen_k)
    check_paged(meta.values, **metadata_bounds)
    if max_seqlen_k is None:
        indices_count = _shape(kv_indices)[0] if indptr else 0
        max_seqlen_k = _longest_keys(seqlens_k, kv_indptr, page_size, table_pages,
                                     indices_count)
    seqlen_k = min(max(int(max_seqlen_k), 1), _INT32_MAX)

    kind = array_kind(q)
    handle = resolve_stream(stream, kind, q, index)
    cdef ArrayView qv, kcv, vcv
    qv, kcv, vcv = attention_views(q, k_cache, v_cache, handle, dtype, kv_dtype,
                                   3 if group else 4, 5 if vectorized else 4, 4, "k_cache",
                                   "v_cache")
    kv_quant = kv_quant_of(qv.dtype, kcv.dtype, vcv.dtype,
                           scales_given=k_scale is not None or v_scale is not None,
                           k_name="k_cache", v_name="v_cache")
    cdef ArrayView wv = None
    if workspace is not None:
        wv = as_view(workspace, handle, None, "workspace", 1, _U8, True)

    cdef capi.ckfmha_fwd_problem problem
    cdef capi.ckfmha_fwd_args args
    memset(&args, 0, sizeof(args))
    _init_problem(&problem, qv.dtype, c_layout, batch, nhead_q, nhead_k, seqlen_q, seqlen_k,
                  hdim_q, hdim_v, "seqlen_q", "max_seqlen_k")
    problem.kv_storage = capi.CKFMHA_KV_PAGED_INDPTR if indptr else capi.CKFMHA_KV_PAGED_TABLE
    problem.page_layout = <capi.ckfmha_page_layout>c_page_layout
    problem.page_size = to_int32(page_size, "page_size")
    # Kernels check every page id and kv_indptr range against these.
    problem.num_pages = to_int32(num_pages, "num_pages")
    problem.num_kv_indices = _shape(kv_indices)[0] if indptr else 0
    if group:
        problem.mode = capi.CKFMHA_MODE_GROUP
        problem.total_q = total_q
    cdef KvScales kv_scales = KvScales()
    kv_scales.apply(&problem, &args, kv_quant, k_scale, v_scale, handle, nhead_k)
    if vectorized:
        check_vectorized_k(kcv.shape, kcv.strides)
        # (page, head, 8-channel chunk) for K, (page, head, channel) for V.
        _set_strides(problem.k_stride, kcv.strides[:3])
        _set_strides(problem.v_stride, vcv.strides[:3])
    else:
        # (page, head, token in page) strides, where contiguous K/V has (batch, head, seq).
        _set_strides(problem.k_stride, (kcv.strides[0], kcv.strides[2], kcv.strides[1]))
        _set_strides(problem.v_stride, (vcv.strides[0], vcv.strides[2], vcv.strides[1]))

    cdef ArrayView tv = None, iv = None, pv = None, sv = None, cqv = None
    if indptr:
        pv = _int32_view(kv_indptr, handle, "kv_indptr", (batch + 1,))
        iv = _int32_view(kv_indices, handle, "kv_indices", (None,))
        args.kv_indptr = <const int32_t*>pv.ptr
        args.kv_indices = <const int32_t*>iv.ptr
    else:
        tv = _int32_view(block_table, handle, "block_table", (batch, None))
        problem.max_pages_per_seq = to_int32(table_pages, "max_pages_per_seq")
        problem.block_table_stride = tv.strides[0] if batch > 1 else table_pages
        args.block_table = <const int32_t*>tv.ptr
    if seqlens_k is not None:
        sv = _int32_view(seqlens_k, handle, "seqlens_k", (batch,))
        args.seqlens_k = <const int32_t*>sv.ptr
    if group:
        cqv = _int32_view(cu_seqlens_q, handle, "cu_seqlens_q", (batch + 1,))
    for name, view in (("block_table", tv), ("seqlens_k", sv), ("kv_indices", iv),
                       ("kv_indptr", pv), ("cu_seqlens_q", cqv)):
        meta.fetch(name, view, handle)
    if meta.copied:
        check_paged(meta.values, **metadata_bounds)
    _set_scalars(&problem, causal, causal_alignment, window, scale, softcap, 0.0, num_splits)

    o_shape = (total_q, nhead_q, hdim_v) if group else _in_layout(batch, nhead_q, seqlen_q,
                                                                   hdim_v, c_layout)
    o_obj = allocate(kind, q, o_shape, qv.dtype) if out is None else out
    cdef ArrayView ov = as_view(o_obj, handle, None, "out", len(o_shape), (qv.dtype,), True)
    if ov.shape != o_shape:
        raise _invalid(f"out must have shape {o_shape}, got {ov.shape}")
    lse_obj = None
    cdef ArrayView lv = None
    if return_lse or lse_out is not None:
        lse_shape = (nhead_q, total_q) if group else (batch, nhead_q, seqlen_q)
        lse_obj = allocate(kind, q, lse_shape, _dtypes.FP32) if lse_out is None else lse_out
        lv = as_view(lse_obj, handle, None, "lse_out", len(lse_shape), _F32, True)
        if lv.shape != lse_shape or (lv.strides[-1] != 1 and lse_shape[-1] > 1):
            raise _invalid(f"lse_out must be {lse_shape} with contiguous rows, got shape "
                           f"{lv.shape} strides {lv.strides}")
        problem.lse_stride[0] = 0 if group else lv.strides[0]
        problem.lse_stride[1] = lv.strides[0] if group else lv.strides[1]
    problem.store_lse = 1 if lv is not None else 0

    if group:
        args.cu_seqlens_q = <const int32_t*>cqv.ptr
        # Tokens are rows; the batch stride is unused in group mode.
        _set_strides(problem.q_stride, (0, qv.strides[1], qv.strides[0]))
        _set_strides(problem.o_stride, (0, ov.strides[1], ov.strides[0]))
    else:
        _set_strides(problem.q_stride, _bhs_strides(qv, c_layout))
        _set_strides(problem.o_stride, _bhs_strides(ov, c_layout))
    _set_tensors(&args, qv, kcv, vcv, ov, lv)
    _check_outputs(out, lse_out, ov, lv, [
        view.region(name) for name, view in (
            ("q", qv), ("k_cache", kcv), ("v_cache", vcv), ("block_table", tv),
            ("seqlens_k", sv), ("kv_indices", iv), ("kv_indptr", pv), ("cu_seqlens_q", cqv),
            ("workspace", wv))
        if view is not None] + kv_scales.regions)
    _run(&problem, &args, kernel, handle, kind, q, wv)

    # The views (staged copies, DLPack owners) live until here, past the launch.
    o_result = finish(kind, o_obj, handle) if out is None else out
    if lse_obj is None:
        return o_result
    return o_result, (finish(kind, lse_obj, handle) if lse_out is None else lse_out)
