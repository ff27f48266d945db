# cython: language_level=3
"""ckfmha.append_kv: new K/V tokens into a KV cache, with optional rotary embedding."""

from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

import numpy as np

cimport ckfmha as capi
from ckfmha._arrays cimport ArrayView
from ckfmha._fp8_kv cimport KvScales
from ckfmha._problem cimport to_int32
from ckfmha._status cimport check

from ckfmha import _dtypes, first_use
from ckfmha._arch import parse_arch
from ckfmha._arrays import as_view
from ckfmha._interop import allocate, array_kind, finish, resolve_stream
from ckfmha._status import error_for_status
from ckfmha.aliasing import check_no_overlap
from ckfmha.array_devices import check_devices
from ckfmha.device_scope import on_device
from ckfmha.errors import BufferTooSmallError, InvalidArgumentError
from ckfmha.fp8_kv import KV_QUANT_FP8_E4M3, append_quant_of, check_scale_args
from ckfmha.host_metadata import MetadataValues, host_values
from ckfmha.metadata_checks import check_append_pages
from ckfmha.page_layouts import VECTOR_CHANNELS, check_vectorized_k
from ckfmha.problem import page_layout_code

_INPUT_DTYPES = (_dtypes.FP16, _dtypes.BF16, _dtypes.FP32)
# fp8 and uint8 pass the views, so that ckfmha.fp8_kv.append_quant_of says what to do instead
# of listing the dtypes.
_VIEWED_DTYPES = _INPUT_DTYPES + (_dtypes.FP8_E4M3, _dtypes.UINT8)
_I32 = (_dtypes.INT32,)
_ROPE_CODES = {
    "none": capi.CKFMHA_ROPE_NONE,
    "interleaved": capi.CKFMHA_ROPE_INTERLEAVED,
    "half_rotated": capi.CKFMHA_ROPE_HALF_ROTATED,
}
_LAYOUTS = {"bhsd": capi.CKFMHA_LAYOUT_BHSD, "bshd": capi.CKFMHA_LAYOUT_BSHD}

cdef enum:
    NAME_CAPACITY = 512


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)


cdef int _layout_code(cache_layout) except -1:
    try:
        return _LAYOUTS[str(cache_layout).lower()]
    except KeyError:
        raise _invalid(f"cache_layout must be 'bshd' or 'bhsd', got {cache_layout!r}") from None


cdef int _rope_code(rope) except -1:
    try:
        return _ROPE_CODES[str(rope)]
    except KeyError:
        raise _invalid(f"rope must be one of {', '.join(_ROPE_CODES)}, got {rope!r}") from None


def _vectorized(page_layout) -> bool:
    return page_layout_code(page_layout) == capi.CKFMHA_PAGE_LAYOUT_VECTORIZED


cdef int _set3(int64_t* dst, tuple strides) except -1:
    dst[0] = strides[0]
    dst[1] = strides[1]
    dst[2] = strides[2]
    return 0


cdef int _init_problem(capi.ckfmha_appendkv_problem* problem, int dtype, int layout, batch,
                       nhead_k, seqlen_new, max_seqlen_cache, hdim_k, hdim_v) except -1:
    check(capi.ckfmha_appendkv_problem_init(
        problem, <capi.ckfmha_dtype>dtype, <capi.ckfmha_layout>layout,
        to_int32(batch, "batch"), to_int32(nhead_k, "nhead_k"),
        to_int32(seqlen_new, "seqlen_new"), to_int32(max_seqlen_cache, "max_seqlen_cache"),
        to_int32(hdim_k, "hdim"), to_int32(hdim_v, "hdim_v")))
    return 0


cdef int _set_paged(capi.ckfmha_appendkv_problem* problem, page_size, num_pages,
                    max_pages_per_seq, block_table_stride) except -1:
    problem.paged_kv = 1
    problem.page_size = to_int32(page_size, "page_size")
    problem.num_pages = to_int32(num_pages, "num_pages")
    problem.max_pages_per_seq = to_int32(max_pages_per_seq, "max_pages_per_seq")
    problem.block_table_stride = block_table_stride
    return 0


cdef int _set_rope(capi.ckfmha_appendkv_problem* problem, int rope, rotary_dim, int rope_dtype,
                   rope_max_pos, cos_stride, sin_stride) except -1:
    problem.rope = <capi.ckfmha_rope>rope
    problem.rotary_dim = to_int32(rotary_dim, "rotary_dim")
    problem.rope_dtype = <capi.ckfmha_dtype>rope_dtype
    problem.rope_max_pos = to_int32(rope_max_pos, "rope_max_pos")
    problem.cos_stride = cos_stride
    problem.sin_stride = sin_stride
    return 0


def _vectorized_page_strides(page_size, heads, hdim_k, hdim_v) -> tuple:
    """Strides of dense vectorized pages: K (page, head, 8-channel chunk), V (page, head,
    channel)."""
    page_size, heads = int(page_size), int(heads)
    k = (heads * int(hdim_k) * page_size, int(hdim_k) * page_size, page_size * VECTOR_CHANNELS)
    v = (heads * int(hdim_v) * page_size, int(hdim_v) * page_size, page_size)
    return k, v


def _page_strides(page_size, heads, hdim, bint heads_first) -> tuple:
    """(page, head, token) strides of contiguous pages."""
    page_size, heads, hdim = int(page_size), int(heads), int(hdim)
    if heads_first:
        return (page_size * heads * hdim, page_size * hdim, hdim)
    return (page_size * heads * hdim, hdim, heads * hdim)


cdef int _problem_from_fields(capi.ckfmha_appendkv_problem* problem, dict fields) except -1:
    """A problem with contiguous tensors from keyword fields (for select/explain)."""
    known = {"dtype", "batch", "nhead_k", "seqlen_new", "hdim", "hdim_v", "max_seqlen_cache",
             "cache_layout", "page_size", "num_pages", "max_pages_per_seq", "page_layout",
             "rope", "rotary_dim", "rope_dtype", "rope_max_pos", "nhead_q", "seqlen_q",
             "kv_dtype"}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise TypeError(f"unknown append problem fields: {', '.join(unknown)}; "
                        f"known: {', '.join(sorted(known))}")
    try:
        batch, nhead_k, seqlen_new, hdim = (fields[name] for name in
                                            ("batch", "nhead_k", "seqlen_new", "hdim"))
    except KeyError as missing:
        raise TypeError(f"missing append problem field {missing}") from None
    cdef int dtype = _dtypes.dtype_code(fields.get("dtype", "fp16"))
    hdim_v = fields.get("hdim_v") or hdim
    paged = fields.get("page_size") is not None
    max_seqlen_cache = fields.get("max_seqlen_cache") or (1 if paged else 4096)
    _init_problem(problem, dtype, _layout_code(fields.get("cache_layout", "bshd")), batch,
                  nhead_k, seqlen_new, max_seqlen_cache, hdim, hdim_v)
    if paged:
        page_size = fields["page_size"]
        max_pages = fields.get("max_pages_per_seq") or 1
        _set_paged(problem, page_size, fields.get("num_pages") or batch * max_pages, max_pages,
                   max_pages)
        if _vectorized(fields.get("page_layout", "linear")):
            problem.page_layout = capi.CKFMHA_PAGE_LAYOUT_VECTORIZED
            k_strides, v_strides = _vectorized_page_strides(page_size, nhead_k, hdim, hdim_v)
            _set3(problem.k_cache_stride, k_strides)
            _set3(problem.v_cache_stride, v_strides)
        else:
            heads_first = fields.get("cache_layout", "bshd") == "bhsd"
            _set3(problem.k_cache_stride, _page_strides(page_size, nhead_k, hdim, heads_first))
            _set3(problem.v_cache_stride, _page_strides(page_size, nhead_k, hdim_v, heads_first))
    rope = _rope_code(fields.get("rope", "none"))
    if rope != capi.CKFMHA_ROPE_NONE:
        rotary_dim = fields.get("rotary_dim") or hdim
        rope_dtype = _dtypes.dtype_code(fields.get("rope_dtype", "fp32"))
        _set_rope(problem, rope, rotary_dim, rope_dtype, fields.get("rope_max_pos") or 1 << 20,
                  int(rotary_dim) // 2, int(rotary_dim) // 2)
    nhead_q = fields.get("nhead_q") or 0
    if nhead_q:
        seqlen_q = fields.get("seqlen_q") or seqlen_new
        problem.rotate_q = 1
        problem.nhead_q = to_int32(nhead_q, "nhead_q")
        problem.seqlen_q = to_int32(seqlen_q, "seqlen_q")
        q_strides = (int(seqlen_q) * int(nhead_q) * int(hdim), hdim, int(nhead_q) * int(hdim))
        _set3(problem.q_stride, q_strides)
        _set3(problem.q_out_stride, q_strides)
    if fields.get("kv_dtype") is not None:
        kv_dtype = _dtypes.dtype_code(fields["kv_dtype"])
        if kv_dtype != _dtypes.FP8_E4M3:
            raise _invalid(f"kv_dtype is the caches' fp8 format ('fp8_e4m3'), got "
                           f"{fields['kv_dtype']!r}")
        problem.cache_quant = <capi.ckfmha_kv_quant>KV_QUANT_FP8_E4M3
    check(capi.ckfmha_appendkv_problem_validate(problem))
    return 0


def select_append_kv(*, arch=None, **fields) -> str:
    """Name of the fwd_appendkv kernel ``append_kv`` would launch for a problem given by fields.

    Fields: dtype, batch, nhead_k, seqlen_new, hdim (hdim_v), max_seqlen_cache (contiguous
    cache) or page_size, num_pages, max_pages_per_seq (paged cache), cache_layout, rope
    ("none", "interleaved", "half_rotated"), rotary_dim, rope_dtype, rope_max_pos, and nhead_q
    (> 0 rotates q too) with seqlen_q, and kv_dtype="fp8_e4m3" for fp8 caches (dtype is then
    the new tokens'). Tensors are taken as contiguous.
    """
    cdef capi.ckfmha_appendkv_problem problem
    cdef char buf[NAME_CAPACITY]
    _problem_from_fields(&problem, fields)
    check(capi.ckfmha_appendkv_select(&problem, parse_arch(arch), buf, NAME_CAPACITY))
    return buf.decode("utf-8", "replace")


def explain_append_kv(*, arch=None, **fields) -> str:
    """Kernel-by-kernel account of which fwd_appendkv kernels fit (fields as in
    ``select_append_kv``) and the plan."""
    cdef capi.ckfmha_appendkv_problem problem
    _problem_from_fields(&problem, fields)
    cdef int c_arch = parse_arch(arch)
    cdef size_t needed = 1 << 16
    cdef char* buf = NULL
    cdef int status
    for _ in range(8):
        buf = <char*>malloc(needed)
        if buf == NULL:
            raise MemoryError()
        try:
            status = capi.ckfmha_appendkv_explain(&problem, c_arch, buf, needed, &needed)
            if status != capi.CKFMHA_ERROR_BUFFER_TOO_SMALL:
                check(status)
                return buf.decode("utf-8", "replace")
        finally:
            free(buf)
    raise BufferTooSmallError("explanation kept growing", 5)


cdef tuple _bhs(ArrayView view, int layout):
    """(batch or page, head, seq) strides of a 4-D view in ``layout``."""
    if layout == capi.CKFMHA_LAYOUT_BSHD:
        return (view.strides[0], view.strides[2], view.strides[1])
    return (view.strides[0], view.strides[1], view.strides[2])


cdef tuple _dims(tuple shape, int layout):
    """(batch or pages, heads, seqlen, hdim) of a 4-D shape in ``layout``."""
    if layout == capi.CKFMHA_LAYOUT_BSHD:
        return (shape[0], shape[2], shape[1], shape[3])
    return shape


def _host_lengths(obj, int batch):
    """int32 host copy of lengths the caller gave on the host (int, list, NumPy, a CPU
    tensor), else None."""
    if isinstance(obj, (int, np.integer)) and not isinstance(obj, bool):
        return np.full(batch, int(obj), dtype=np.int32)
    host = host_values(obj)
    if host is not None:
        obj = host
    if isinstance(obj, np.ndarray):
        if obj.shape != (batch,) or not np.issubdtype(obj.dtype, np.integer):
            raise _invalid(f"cache_seqlens must be {batch} integers, got {obj.dtype} "
                           f"{obj.shape}")
        host = obj.astype(np.int32)
        if not np.array_equal(host, obj):
            raise _invalid("cache_seqlens do not fit in int32")
        return np.ascontiguousarray(host)
    return None


cdef int _check_outputs(bint q_out_given, ArrayView knv, ArrayView vnv, ArrayView kcv,
                        ArrayView vcv, ArrayView cv, ArrayView sv, ArrayView qv, ArrayView qov,
                        ArrayView lv, ArrayView btv, ArrayView ov, list scale_regions) except -1:
    """The caches (written in place by design), a caller's q_out and overflow share no memory
    with the inputs (device scales among them) or each other; q_out may be q itself (rotation
    in place)."""
    named_inputs = (("k_new", knv), ("v_new", vnv), ("cos", cv), ("sin", sv), ("q", qv),
                    ("cache_seqlens", lv), ("block_table", btv))
    named_outputs = (("k_cache", kcv), ("v_cache", vcv),
                     ("q_out", qov if q_out_given else None), ("overflow", ov))
    check_no_overlap([view.region(name) for name, view in named_outputs if view is not None],
                     [view.region(name) for name, view in named_inputs if view is not None]
                     + scale_regions,
                     in_place=(("q_out", "q"),))
    return 0


def append_kv(k_cache, v_cache, k_new, v_new, cache_seqlens, *, cos=None, sin=None,
              rotary_interleaved=False, q=None, q_out=None, block_table=None,
              cache_layout="bshd", page_layout="linear", overflow=None, kernel=None, stream=None,
              dtype=None, validate=None, kv_dtype=None, k_scale=None, v_scale=None):
    """Writes k_new/v_new into the cache at each sequence's length, rotating keys (and q).

    k_new, v_new: [batch, seqlen_new, nhead_k, hdim] (any strides, head dim contiguous).
    Cache, ``cache_layout`` "bshd": [batch, max_seqlen, nhead_k, hdim], or with
    ``block_table`` (int32 [batch, max_pages], vLLM) pages [num_pages, page_size, nhead_k,
    hdim]; "bhsd" swaps the head and token axes of either. With ``page_layout="vectorized"``
    (fp16/bf16, vLLM's older layout) the pages are k_cache [num_pages, nhead_k, hdim / 8,
    page_size, 8] (each [page_size, 8] chunk dense) and v_cache [num_pages, nhead_k, hdim,
    page_size] (keys contiguous), and cache_layout does not apply. Token t of sequence b goes to
    position cache_seqlens[b] + t; cache_seqlens (int32 [batch], or an int for all) is not
    advanced here.

    cos, sin: [max_pos, rotary_dim / 2], fp32 or the cache dtype; keys are rotated at their
    positions, pairs (i, i + rotary_dim/2) (GPT-NeoX) or, with ``rotary_interleaved``,
    (2i, 2i+1) (GPT-J); columns past rotary_dim and the values are copied. ``q`` [batch,
    seqlen_q, nhead_q, hdim] is rotated too, query t at cache_seqlens[b] + t (causal
    positions), into ``q_out`` (new array by default; pass q itself to rotate in place), which
    is returned.

    Bounds: host-side lengths (int, list, NumPy) are checked before the launch and an
    overflow raises InvalidArgumentError. Device-side lengths and page numbers are trusted
    as far as the kernel checks them: tokens that would land outside the cache, in a page
    outside [0, num_pages) or past the cos/sin rows are not written, and ``overflow`` (a
    device int32 [1] array the caller zeroes) is set to 1; without ``overflow`` the next call
    on the device (or ``ckfmha.check_errors()``) raises DeviceMetadataError. A host block_table is checked with
    host lengths: every entry the new tokens land in must be a page id in [0, num_pages).
    ``validate=True`` (or CKFMHA_VALIDATE=1) copies device lengths and block tables back and
    checks them the same way before the launch (waiting for the stream).

    All arrays share one device, where the call runs, as in ``ckfmha.fwd``. The caches are
    written in place by design; no output (caches, q_out, overflow) may share memory with an
    input or another output, except q_out being exactly q (rotation in place). batch 0, or no
    new tokens and no query to rotate, launches nothing.

    fp8 caches: k_cache and v_cache may both hold e4m3 values (torch.float8_e4m3fn,
    ml_dtypes.float8_e4m3fn, or uint8 codes with ``kv_dtype="fp8_e4m3"``), as ``ckfmha.fwd`` and
    ``fwd_paged`` read them: the new tokens (fp16 or bf16, as are q and q_out) are written as
    e4m3(k_new / k_scale) and e4m3(v_new / v_scale), the division correctly rounded in fp32 (after
    RoPE, whose result is first rounded to the tokens' dtype), then rounded to nearest even and
    saturated at +-448. ``k_scale`` and ``v_scale`` as in ``fwd``: numbers (default 1.0), or both
    fp32 device arrays of 1 or nhead_k values (read by the kernel). Contiguous caches and linear
    pages only; sm_89 and later. Scales without fp8 caches, one cache fp8, fp8 k_new/v_new or
    fp8 vectorized pages raise InvalidArgumentError. ``dtype`` overrides what k_new and v_new
    report, and the caches' unless ``kv_dtype`` is given.
    """
    check_scale_args(k_scale, v_scale)
    index = check_devices((("k_cache", k_cache), ("v_cache", v_cache), ("k_new", k_new),
                           ("v_new", v_new), ("q", q), ("q_out", q_out), ("overflow", overflow)),
                          (("cos", cos), ("sin", sin), ("block_table", block_table),
                           ("cache_seqlens", cache_seqlens), ("k_scale", k_scale),
                           ("v_scale", v_scale)))
    with on_device(index):
        return _append_kv(index, k_cache, v_cache, k_new, v_new, cache_seqlens, cos, sin,
                          rotary_interleaved, q, q_out, block_table, cache_layout, page_layout,
                          overflow, kernel, stream, dtype, validate, kv_dtype, k_scale, v_scale)


cdef object _append_kv(index, k_cache, v_cache, k_new, v_new, cache_seqlens, cos, sin,
                       rotary_interleaved, q, q_out, block_table, cache_layout, page_layout,
                       overflow, kernel, stream, dtype, validate, kv_dtype, k_scale, v_scale):
    """``append_kv`` with the arrays' device (``index``) current."""
    cdef int layout = _layout_code(cache_layout)
    cdef bint vectorized = _vectorized(page_layout)
    if vectorized and block_table is None:
        raise _invalid("page_layout 'vectorized' describes pages: pass block_table")
    kind = array_kind(k_cache)
    handle = resolve_stream(stream, kind, k_cache, index)
    cache_override = dtype if kv_dtype is None else kv_dtype
    cdef ArrayView knv = as_view(k_new, handle, dtype, "k_new", 4, _VIEWED_DTYPES)
    cdef ArrayView vnv = as_view(v_new, handle, dtype, "v_new", 4, _VIEWED_DTYPES)
    cdef ArrayView kcv = as_view(k_cache, handle, cache_override, "k_cache",
                                 5 if vectorized else 4, _VIEWED_DTYPES, True)
    cdef ArrayView vcv = as_view(v_cache, handle, cache_override, "v_cache", 4, _VIEWED_DTYPES,
                                 True)
    cache_quant = append_quant_of(knv.dtype, vnv.dtype, kcv.dtype, vcv.dtype,
                                  scales_given=k_scale is not None or v_scale is not None,
                                  vectorized=vectorized)
    batch, seqlen_new, nhead_k, hdim_k = knv.shape
    if vnv.shape[:3] != (batch, seqlen_new, nhead_k):
        raise _invalid(f"v_new is {vnv.shape} but k_new is {knv.shape}: both are "
                       "[batch, seqlen_new, nhead_k, hdim]")
    hdim_v = vnv.shape[3]
    if vectorized:
        check_vectorized_k(kcv.shape, kcv.strides)
        slabs, cache_heads, chunks, cache_tokens, channels = kcv.shape
        cache_hdim = chunks * channels
        v_dims = (vcv.shape[0], vcv.shape[1], vcv.shape[3], vcv.shape[2])
    else:
        slabs, cache_heads, cache_tokens, cache_hdim = _dims(kcv.shape, layout)
        v_dims = _dims(vcv.shape, layout)
    if (cache_heads, cache_hdim) != (nhead_k, hdim_k) or v_dims != (
            slabs, nhead_k, cache_tokens, hdim_v):
        raise _invalid(f"caches k {kcv.shape}, v {vcv.shape} "
                       f"({'vectorized pages' if vectorized else cache_layout}) do not hold "
                       f"{nhead_k} heads of head dims {hdim_k}/{hdim_v} like k_new/v_new")
    paged = block_table is not None
    if not paged and slabs != batch:
        raise _invalid(f"the cache holds {slabs} sequences but k_new has batch {batch}; "
                       "pass block_table for a paged cache")

    cdef capi.ckfmha_appendkv_problem problem
    cdef capi.ckfmha_appendkv_args args
    memset(&args, 0, sizeof(args))
    _init_problem(&problem, knv.dtype, layout, batch, nhead_k, seqlen_new,
                  1 if paged else cache_tokens, hdim_k, hdim_v)
    if isinstance(block_table, (list, tuple)):
        block_table = np.asarray(block_table, dtype=np.int32)
    meta = MetadataValues(validate)
    host = _host_lengths(cache_seqlens, batch)
    meta.values["cache_seqlens"] = host
    meta.given("block_table", block_table)
    if paged:
        table_shape = tuple(int(n) for n in getattr(block_table, "shape", ()))
        page_bounds = dict(seqlen_new=seqlen_new, batch=batch,
                           table_pages=table_shape[1] if len(table_shape) == 2 else 0,
                           page_size=cache_tokens, num_pages=slabs)
        if len(table_shape) == 2 and table_shape[0] == batch:
            check_append_pages(meta.get("block_table"), host, **page_bounds)
    cdef ArrayView btv = None
    if paged:
        btv = as_view(block_table, handle, None, "block_table", 2, _I32)
        if btv.shape[0] != batch:
            raise _invalid(f"block_table must be int32 [{batch}, max_pages], got {btv.shape}")
        _set_paged(&problem, cache_tokens, slabs, btv.shape[1], btv.strides[0])
        args.block_table = <const int32_t*>btv.ptr

    cdef ArrayView cv = None
    cdef ArrayView sv = None
    if (cos is None) != (sin is None):
        raise _invalid("pass both cos and sin for rotary embeddings, or neither")
    if cos is not None:
        cv = as_view(cos, handle, None, "cos", 2, (_dtypes.FP32, knv.dtype))
        sv = as_view(sin, handle, None, "sin", 2, (_dtypes.FP32, knv.dtype))
        if cv.shape != sv.shape or cv.dtype != sv.dtype:
            raise _invalid(f"cos {cv.dtype_name} {cv.shape} and sin {sv.dtype_name} "
                           f"{sv.shape} must match")
        rope = capi.CKFMHA_ROPE_INTERLEAVED if rotary_interleaved else \
            capi.CKFMHA_ROPE_HALF_ROTATED
        _set_rope(&problem, rope, 2 * cv.shape[1], cv.dtype, cv.shape[0], cv.strides[0],
                  sv.strides[0])
        args.cos = <const void*>cv.ptr
        args.sin = <const void*>sv.ptr
    elif q is not None:
        raise _invalid("q is rotated with the keys: pass cos and sin with it")

    cdef ArrayView qv = None
    cdef ArrayView qov = None
    q_obj = None
    if q is not None:
        qv = as_view(q, handle, dtype, "q", 4, (knv.dtype,))
        q_batch, seqlen_q, nhead_q, q_hdim = qv.shape
        if (q_batch, q_hdim) != (batch, hdim_k):
            raise _invalid(f"q must be [{batch}, seqlen_q, nhead_q, {hdim_k}], got {qv.shape}")
        q_obj = allocate(kind, q, qv.shape, qv.dtype) if q_out is None else q_out
        qov = as_view(q_obj, handle, None, "q_out", 4, (qv.dtype,), True)
        if qov.shape != qv.shape:
            raise _invalid(f"q_out must have q's shape {qv.shape}, got {qov.shape}")
        problem.rotate_q = 1
        problem.nhead_q = to_int32(nhead_q, "nhead_q")
        problem.seqlen_q = to_int32(seqlen_q, "seqlen_q")
        _set3(problem.q_stride, (qv.strides[0], qv.strides[2], qv.strides[1]))
        _set3(problem.q_out_stride, (qov.strides[0], qov.strides[2], qov.strides[1]))
        args.q = <const void*>qv.ptr
        args.q_out = <void*>qov.ptr
    elif q_out is not None:
        raise _invalid("q_out given without q")

    _set3(problem.k_new_stride, (knv.strides[0], knv.strides[2], knv.strides[1]))
    _set3(problem.v_new_stride, (vnv.strides[0], vnv.strides[2], vnv.strides[1]))
    if vectorized:
        problem.page_layout = capi.CKFMHA_PAGE_LAYOUT_VECTORIZED
        _set3(problem.k_cache_stride, kcv.strides[:3])
        _set3(problem.v_cache_stride, vcv.strides[:3])
    else:
        _set3(problem.k_cache_stride, _bhs(kcv, layout))
        _set3(problem.v_cache_stride, _bhs(vcv, layout))
    cdef KvScales kv_scales = KvScales()
    kv_scales.apply_append(&problem, &args, cache_quant, k_scale, v_scale, handle, nhead_k)
    check(capi.ckfmha_appendkv_problem_validate(&problem))

    cdef ArrayView lv = as_view(host if host is not None else cache_seqlens, handle, None,
                                "cache_seqlens", 1, _I32)
    if lv.shape != (batch,) or (lv.strides[0] != 1 and batch > 1):
        raise _invalid(f"cache_seqlens must be contiguous int32 [{batch}], got {lv.shape}")
    meta.fetch("cache_seqlens", lv, handle)
    meta.fetch("block_table", btv, handle)
    if meta.copied:
        host = np.ascontiguousarray(meta.get("cache_seqlens"), dtype=np.int32)
        if paged:
            check_append_pages(meta.get("block_table"), host, **page_bounds)
    cdef const int32_t[::1] host_view
    if host is not None and batch > 0:
        host_view = host
        args.cache_seqlens_host = &host_view[0]
    cdef ArrayView ov = None
    if overflow is not None:
        ov = as_view(overflow, handle, None, "overflow", 1, _I32, True)
        if ov.shape != (1,):
            raise _invalid(f"overflow must be a device int32 [1] array, got {ov.shape}")
        args.overflow = <int32_t*>ov.ptr

    args.k_new = <const void*>knv.ptr
    args.v_new = <const void*>vnv.ptr
    args.k_cache = <void*>kcv.ptr
    args.v_cache = <void*>vcv.ptr
    args.cache_seqlens = <const int32_t*>lv.ptr
    _check_outputs(q_out is not None, knv, vnv, kcv, vcv, cv, sv, qv, qov, lv, btv, ov,
                   kv_scales.regions)
    cdef const char* c_kernel = NULL
    kernel_bytes = b""
    # The fields of first_use.AppendKvKey, in order.
    key = ("appendkv", (<int>problem.dtype, problem.hdim_k, problem.hdim_v, <int>problem.rope,
                        bool(problem.paged_kv), <int>problem.cache_quant))
    # Mirrors appendkv_run_work (cpp/src/empty_problems.cpp): no kernel to compile for an
    # empty append.
    launches = batch > 0 and (seqlen_new > 0 or (problem.rotate_q and problem.seqlen_q > 0))
    if kernel is not None:
        kernel_bytes = str(kernel).encode("utf-8")
        c_kernel = kernel_bytes
        if launches:
            first_use.ensure_named(str(kernel))
    elif launches:
        first_use.ensure(key)
    cdef uintptr_t c_stream = <uintptr_t>handle
    cdef int status
    with nogil:
        status = capi.ckfmha_appendkv_run(&problem, &args, c_kernel,
                                          <capi.ckfmha_stream_t>c_stream)
    if status == capi.CKFMHA_ERROR_UNSUPPORTED and kernel is None:
        raise first_use.explain(key, error_for_status(status))
    check(status)
    # The views (staged copies, DLPack owners) lived until the launch was queued.
    if q is None:
        return None
    return finish(kind, q_obj, handle) if q_out is None else q_out
