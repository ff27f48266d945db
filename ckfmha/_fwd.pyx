# cython: language_level=3
"""ckfmha.fwd: forward attention on whatever arrays the caller has."""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t, uintptr_t
from libc.string cimport memset

import numpy as np

cimport ckfmha as capi
from ckfmha._arrays cimport ArrayView
from ckfmha._fp8_kv cimport KvScales, attention_views
from ckfmha._fwd_fast cimport fast_key, remember, run_cached, varlen_fast_key
from ckfmha._problem cimport fill_fwd_problem, to_int32
from ckfmha._status cimport check

from ckfmha import _dtypes, first_use
from ckfmha._status import error_for_status
from ckfmha._arrays import as_view
from ckfmha._interop import allocate, array_kind, finish, resolve_stream
from ckfmha.aliasing import check_no_overlap
from ckfmha.array_devices import check_devices
from ckfmha.device_scope import on_device
from ckfmha.errors import BufferTooSmallError, InvalidArgumentError
from ckfmha.fp8_attention import (
    check_q_scale_arg,
    out_dtype_of,
    q_quant_of,
    uses_block_scales,
)
from ckfmha.fp8_kv import KV_QUANT_NONE, check_scale_args, kv_quant_of
from ckfmha.host_metadata import MetadataValues, validation_requested
from ckfmha.metadata_checks import check_varlen
from ckfmha.problem import layout_code, mask_code, window_bounds

_INPUT_DTYPES = (_dtypes.FP16, _dtypes.BF16, _dtypes.FP32)
# fp8 K/V passes the backward's views, to be refused with a reason rather than a dtype list.
_BWD_KV_DTYPES = _INPUT_DTYPES + (_dtypes.FP8_E4M3,)
_LSE_DTYPES = (_dtypes.FP32,)
_F32 = (_dtypes.FP32,)
_I32 = (_dtypes.INT32,)
_U8 = (_dtypes.UINT8,)


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)


cdef tuple _bhsd(tuple shape, int layout):
    """(batch, heads, seqlen, hdim) of a 4-D shape in ``layout``."""
    if layout == capi.CKFMHA_LAYOUT_BSHD:
        return (shape[0], shape[2], shape[1], shape[3])
    return shape


cdef tuple _bhs_strides(ArrayView view, int layout):
    """(batch, head, seq) strides, the order the C problem takes them in."""
    if layout == capi.CKFMHA_LAYOUT_BSHD:
        return (view.strides[0], view.strides[2], view.strides[1])
    return (view.strides[0], view.strides[1], view.strides[2])


cdef tuple _in_layout(int batch, int heads, int seqlen, int hdim, int layout):
    if layout == capi.CKFMHA_LAYOUT_BSHD:
        return (batch, seqlen, heads, hdim)
    return (batch, heads, seqlen, hdim)


cdef int _set_strides(int64_t* dst, tuple strides) except -1:
    dst[0] = strides[0]
    dst[1] = strides[1]
    dst[2] = strides[2]
    return 0


cdef int _set_mask(capi.ckfmha_fwd_problem* problem, causal, causal_alignment,
                   window) except -1:
    cdef int code = mask_code(bool(causal), causal_alignment, window)
    problem.mask = <capi.ckfmha_mask>code
    left, right = window_bounds(window)
    problem.window_left = to_int32(left, "window left")
    problem.window_right = to_int32(right, "window right")
    return 0


cdef class _Features:
    """Optional inputs (bias, ALiBi, sink) and outputs (dropout bytes) of one launch.

    Holds the views so staged copies and DLPack owners outlive the kernel.
    """
    cdef list views
    # Regions of the inputs among them (bias, slopes, sink), for the aliasing checks.
    cdef public list input_regions
    cdef public object randval

    def __cinit__(self):
        self.views = []
        self.input_regions = []
        self.randval = None

    cdef ArrayView view(self, obj, handle, str name, int ndim, tuple allowed,
                        bint writable=False):
        cdef ArrayView view = as_view(obj, handle, None, name, ndim, allowed, writable)
        self.views.append(view)
        if not writable:
            self.input_regions.append(view.region(name))
        return view

    cdef int apply(self, capi.ckfmha_fwd_problem* problem, capi.ckfmha_fwd_args* args,
                   str kind, like, handle, int dtype, int batch, int nhead_q, int seqlen_q,
                   int seqlen_k, bias, alibi_slopes, sink, dropout_seed, dropout_offset,
                   bint want_randval) except -1:
        cdef ArrayView bv, av, sv, rv
        if bias is not None and alibi_slopes is not None:
            raise _invalid("pass bias or alibi_slopes, not both")
        if bias is not None:
            bv = self.view(bias, handle, "bias", 4, (dtype,))
            target = (batch, nhead_q, seqlen_q, seqlen_k)
            for axis, (got, want) in enumerate(zip(bv.shape, target)):
                if got != want and got != 1:
                    raise _invalid(f"bias shape {bv.shape} does not broadcast to {target}")
            if bv.shape[3] != seqlen_k or (bv.strides[3] != 1 and seqlen_k > 1):
                raise _invalid(f"bias must have a contiguous last axis of seqlen_k={seqlen_k}")
            problem.bias = capi.CKFMHA_BIAS_ELEMENTWISE
            for axis in range(3):
                # A size-1 axis broadcasts: stride 0, whatever the producer reported.
                problem.bias_stride[axis] = 0 if bv.shape[axis] == 1 else bv.strides[axis]
            args.bias = <const void*>bv.ptr
        if alibi_slopes is not None:
            av = self.view(alibi_slopes, handle, "alibi_slopes", len(getattr(
                alibi_slopes, "shape", (0,))), _F32)
            if av.shape not in ((nhead_q,), (batch, nhead_q)) or av.strides[-1] != 1:
                raise _invalid(f"alibi_slopes must be fp32 [{nhead_q}] or [{batch}, {nhead_q}] "
                               f"with contiguous heads, got shape {av.shape}")
            problem.bias = capi.CKFMHA_BIAS_ALIBI
            problem.alibi_stride = av.strides[0] if len(av.shape) == 2 else 0
            args.alibi_slopes = <const float*>av.ptr
        if sink is not None:
            sv = self.view(sink, handle, "sink", 1, _F32)
            if sv.shape != (nhead_q,) or (sv.strides[0] != 1 and nhead_q > 1):
                raise _invalid(f"sink must be contiguous fp32 [{nhead_q}], got {sv.shape}")
            problem.has_sink = 1
            args.sink = <const float*>sv.ptr
        problem.dropout_seed = <uint64_t>(int(dropout_seed) & 0xFFFFFFFFFFFFFFFF)
        problem.dropout_offset = <uint64_t>(int(dropout_offset) & 0xFFFFFFFFFFFFFFFF)
        if want_randval:
            shape = (batch, nhead_q, seqlen_q, seqlen_k)
            self.randval = allocate(kind, like, shape, _dtypes.UINT8)
            rv = self.view(self.randval, handle, "dropout_randval", 4, _U8, True)
            # An empty array (a zero extent) has nothing to store (see ckfmha.h).
            problem.store_dropout_randval = 1 if batch and seqlen_q and seqlen_k else 0
            args.dropout_randval = <uint8_t*>rv.ptr
        return 0


cdef tuple _first_use_key(capi.ckfmha_fwd_problem* p):
    """The fields of first_use.FwdKey, in order: what decides which kernels can run p. q_quant
    (fp8 queries) comes last and only when set: a defaulted trailing field of FwdKey, so the
    keys of fp16/bf16 queries keep their length."""
    fields = (
        <int>p.dtype, <int>p.mode, p.hdim_q, p.hdim_v, <int>p.mask, <int>p.bias,
        p.dropout_p > 0 or p.store_dropout_randval != 0, p.softcap > 0,
        bool(p.has_sink), bool(p.v_col_major), <int>p.kv_storage, <int>p.page_layout,
        p.num_splits > 1,
        <int64_t>p.seqlen_q * (p.nhead_q // max(p.nhead_k, 1)) <= first_use.DECODE_PACKED_ROWS,
        <int>p.kv_quant)
    if p.q_quant != capi.CKFMHA_KV_QUANT_NONE:
        fields += (<int>p.q_quant,)
    return ("fwd", fields)


def first_use_key(problem) -> tuple:
    """The first-use key (operation, fields) of a ckfmha.FwdProblem, as fwd would compute it."""
    cdef capi.ckfmha_fwd_problem c_problem
    fill_fwd_problem(problem, &c_problem)
    return _first_use_key(&c_problem)


cdef bint _launches_kernels(capi.ckfmha_fwd_problem* p):
    """Whether ckfmha_fwd_run runs kernels for p (fwd_run_work in cpp/src/empty_problems.cpp):
    not when every output is empty, nor without keys in batch mode (O = 0 and LSE = -inf are
    memsets), so no kernel is compiled on first use and no workspace allocated for them."""
    if p.batch == 0 or p.seqlen_q == 0:
        return False
    return not (p.seqlen_k == 0 and p.mode == capi.CKFMHA_MODE_BATCH and
                p.kv_storage == capi.CKFMHA_KV_CONTIGUOUS)


cdef object _run(capi.ckfmha_fwd_problem* problem, capi.ckfmha_fwd_args* args, kernel, handle,
                 str kind, like, ArrayView workspace=None):
    """Plans and launches ``problem``. ``workspace`` (a uint8 view the caller owns) serves a
    split-KV plan instead of scratch memory allocated here; it must hold the plan's bytes."""
    check(capi.ckfmha_fwd_problem_validate(problem))
    cdef const char* c_kernel = NULL
    cdef uintptr_t c_stream = <uintptr_t>handle
    cdef int status
    if not _launches_kernels(problem):
        with nogil:
            status = capi.ckfmha_fwd_run(problem, args, NULL, <capi.ckfmha_stream_t>c_stream)
        check(status)
        return None
    kernel_bytes = b""
    key = _first_use_key(problem)
    if kernel is not None:
        kernel_bytes = str(kernel).encode("utf-8")
        c_kernel = kernel_bytes
        first_use.ensure_named(str(kernel))
    else:
        # Kernels this problem's best plan needs and the library lacks compile here, before
        # the plan (and its workspace size) is made.
        first_use.ensure(key)
    # Two-stage (split-KV) plans need scratch memory: the caller's, or allocated like the
    # outputs (torch's caching allocator for torch inputs, else ckfmha device memory),
    # and held here until the launches are queued; stream order keeps it valid.
    # A failed size query (no device, no plan) is left to the run to report, after
    # its argument checks, so errors come in the same order as without a workspace.
    cdef size_t workspace_bytes = 0
    cdef int size_status = capi.ckfmha_fwd_workspace_size(problem, -1, c_kernel,
                                                          &workspace_bytes)
    cdef ArrayView wv = workspace
    scratch = None
    if wv is not None:
        if size_status == capi.CKFMHA_SUCCESS and wv.shape[0] < <int64_t>workspace_bytes:
            raise BufferTooSmallError(
                f"workspace holds {wv.shape[0]} bytes; this problem's split-KV plan needs "
                f"{workspace_bytes} (Dispatcher.workspace_size says how many)", 5)
        # Passed even when the plan needs none, so the run plans as the size query did
        # (with a workspace at hand).
        args.workspace = <void*>wv.ptr
        args.workspace_bytes = <size_t>wv.shape[0]
    elif size_status == capi.CKFMHA_SUCCESS and workspace_bytes > 0:
        scratch = allocate(kind, like, (workspace_bytes,), _dtypes.UINT8)
        wv = as_view(scratch, handle, None, "workspace", 1, _U8, True)
        args.workspace = <void*>wv.ptr
        args.workspace_bytes = workspace_bytes
    with nogil:
        status = capi.ckfmha_fwd_run(problem, args, c_kernel, <capi.ckfmha_stream_t>c_stream)
    if status == capi.CKFMHA_ERROR_UNSUPPORTED and kernel is None:
        raise first_use.explain(key, error_for_status(status))
    check(status)


cdef tuple _results(str kind, handle, o_obj, out, lse_obj, lse_out, _Features features):
    """(o[, lse][, randval]) converted back to the caller's array kind."""
    results = [finish(kind, o_obj, handle) if out is None else out]
    if lse_obj is not None:
        results.append(finish(kind, lse_obj, handle) if lse_out is None else lse_out)
    if features.randval is not None:
        results.append(finish(kind, features.randval, handle))
    return tuple(results)


cdef int _check_outputs(out, lse_out, ArrayView ov, ArrayView lv, list inputs) except -1:
    """Outputs the caller passed share no memory with the inputs (``inputs``: their regions)
    or with each other; outputs allocated here cannot."""
    if out is None and lse_out is None:
        return 0
    outputs = [ov.region("out")]
    if lv is not None:
        outputs.append(lv.region("lse_out"))
    check_no_overlap(outputs, inputs)
    return 0


cdef class _Quant:
    """What a forward call's arrays say of fp8: q_quant, kv_quant, the output's dtype code
    (the C problem's dtype) and whether the scales are per block, from ckfmha.fp8_attention
    and ckfmha.fp8_kv."""
    cdef int q_quant
    cdef int kv_quant
    cdef int out_dtype
    cdef bint block_scales

    def __init__(self, ArrayView qv, ArrayView kv, ArrayView vv, out_dtype, q_scale, k_scale,
                 v_scale):
        # Before q_quant_of: 3-D scales over fp16/bf16 q are refused as per-block scales.
        self.block_scales = uses_block_scales(qv.dtype, q_scale, k_scale, v_scale)
        self.q_quant = q_quant_of(qv.dtype, kv.dtype, vv.dtype,
                                  q_scale_given=q_scale is not None)
        self.out_dtype = out_dtype_of(qv.dtype, self.q_quant, out_dtype)
        # fp8 queries are settled: K/V pair with the output's dtype, as with fp16/bf16 q.
        self.kv_quant = kv_quant_of(self.out_dtype if self.q_quant else qv.dtype, kv.dtype,
                                    vv.dtype,
                                    scales_given=k_scale is not None or v_scale is not None)


cdef int _apply_scales(capi.ckfmha_fwd_problem* problem, capi.ckfmha_fwd_args* args,
                       KvScales kv_scales, _Quant quant, q_scale, k_scale, v_scale, handle,
                       str seqlen_q_name="seqlen_q", str seqlen_k_name="seqlen_k") except -1:
    """q_quant, kv_quant and the scales, once the problem's counts are set: per block, or per
    tensor or head (numbers, device arrays). The seqlen names are the caller's arguments."""
    if quant.block_scales:
        return kv_scales.apply_blocks(problem, args, quant.kv_quant, quant.q_quant, q_scale,
                                      k_scale, v_scale, handle, seqlen_q_name, seqlen_k_name)
    kv_scales.apply(problem, args, quant.kv_quant, k_scale, v_scale, handle, problem.nhead_k)
    kv_scales.apply_query(problem, args, quant.q_quant, q_scale, handle, problem.nhead_q)
    return 0


cdef ArrayView _out_view(o_obj, handle, int ndim, _Quant quant):
    """The output's view, in the problem's dtype: q's, or fp8 queries' out_dtype."""
    if quant.q_quant == KV_QUANT_NONE:
        return as_view(o_obj, handle, None, "out", ndim, (quant.out_dtype,), True)
    cdef ArrayView ov = as_view(o_obj, handle, None, "out", ndim, _INPUT_DTYPES, True)
    if ov.dtype != quant.out_dtype:
        raise _invalid(f"out is {ov.dtype_name}, but this call writes "
                       f"{_dtypes.NAMES[quant.out_dtype]} (fp8 queries write out_dtype: bf16 "
                       "unless given)")
    return ov


cdef tuple _qkv_views(q, k, v, handle, dtype, int ndim):
    """Views of q, k and v, which must share one fp16, bf16 or fp32 dtype (the backward's)."""
    cdef ArrayView qv = as_view(q, handle, dtype, "q", ndim, _INPUT_DTYPES)
    cdef ArrayView kv = as_view(k, handle, dtype, "k", ndim, _BWD_KV_DTYPES)
    cdef ArrayView vv = as_view(v, handle, dtype, "v", ndim, _BWD_KV_DTYPES)
    if _dtypes.FP8_E4M3 in (kv.dtype, vv.dtype):
        raise _invalid("k or v is fp8_e4m3: fp8 K/V is for the forward (inference); the "
                       "backward takes k and v in q's dtype")
    if not qv.dtype == kv.dtype == vv.dtype:
        raise _invalid(f"q, k and v must have one dtype, got {qv.dtype_name}, "
                       f"{kv.dtype_name}, {vv.dtype_name}")
    return qv, kv, vv


cdef int _init_problem(capi.ckfmha_fwd_problem* problem, int dtype, int layout, batch,
                       nhead_q, nhead_k, seqlen_q, seqlen_k, hdim_q, hdim_v,
                       str seqlen_q_name="seqlen_q", str seqlen_k_name="seqlen_k") except -1:
    """ckfmha_fwd_problem_init with every count checked to fit int32; the seqlen names are the
    caller's argument names, so an error points at what the caller passed."""
    check(capi.ckfmha_fwd_problem_init(
        problem, <capi.ckfmha_dtype>dtype, <capi.ckfmha_layout>layout,
        to_int32(batch, "batch"), to_int32(nhead_q, "nhead_q"), to_int32(nhead_k, "nhead_k"),
        to_int32(seqlen_q, seqlen_q_name), to_int32(seqlen_k, seqlen_k_name),
        to_int32(hdim_q, "hdim"), to_int32(hdim_v, "hdim_v")))
    return 0


cdef int _set_scalars(capi.ckfmha_fwd_problem* problem, causal, causal_alignment, window,
                      scale, softcap, dropout_p, num_splits) except -1:
    _set_mask(problem, causal, causal_alignment, window)
    problem.num_splits = to_int32(num_splits, "num_splits")
    if scale is not None:
        problem.scale = float(scale)
    problem.softcap = float(softcap)
    problem.dropout_p = float(dropout_p)
    check(capi.ckfmha_fwd_problem_validate(problem))
    return 0


cdef int _set_tensors(capi.ckfmha_fwd_args* args, ArrayView qv, ArrayView kv, ArrayView vv,
                      ArrayView ov, ArrayView lv) except -1:
    args.q = <const void*>qv.ptr
    args.k = <const void*>kv.ptr
    args.v = <const void*>vv.ptr
    args.o = <void*>ov.ptr
    args.lse = <float*>lv.ptr if lv is not None else NULL
    return 0


def fwd(q, k, v, *, causal=False, causal_alignment="top_left", window=None, scale=None,
        softcap=0.0, bias=None, alibi_slopes=None, sink=None, dropout_p=0.0, dropout_seed=0,
        dropout_offset=0, return_dropout_randval=False, return_lse=False, layout="bhsd",
        v_col_major=False, num_splits=0, out=None, lse_out=None, kernel=None, stream=None,
        dtype=None, kv_dtype=None, k_scale=None, v_scale=None, q_dtype=None, q_scale=None,
        out_dtype=None):
    """Fused multi-head attention forward: softmax(mask(bias + cap(scale * q k^T))) v.

    q is [batch, nhead_q, seqlen_q, hdim] and k, v are [batch, nhead_k, seqlen_k,
    hdim / hdim_v] for layout "bhsd", or [batch, seqlen, heads, hdim] for "bshd";
    any strides work as long as the head dimension is contiguous, so permuted
    views need no copy. nhead_q must be a multiple of nhead_k (GQA/MQA). With
    ``v_col_major`` v is [batch, nhead_k, hdim_v, seqlen_k] (keys contiguous)
    in either layout. q, k and v share one dtype: fp16, bf16, or fp32 (computed
    with fp32 FMAs on CUDA cores, no tf32; slower than the tensor-core kernels).
    The output has q's dtype.

    fp8 K/V: k and v may both hold e4m3 values (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn,
    or uint8 codes with ``kv_dtype="fp8_e4m3"``) standing for ``k_scale * k`` and
    ``v_scale * v``, with q (and the output) fp16 or bf16; strides stay in elements (= bytes)
    and must be multiples of 16 but for the head dim's. ``k_scale`` and ``v_scale`` are numbers
    (default 1.0; positive and finite) or, both, fp32 device arrays of 1 or nhead_k values (one
    per K/V head), read by the kernels so that a captured CUDA graph follows their updates.
    Served by the split-KV kernels on sm_89 and later (UnsupportedError elsewhere). Scales
    given for K/V that are not fp8, or one of k and v in fp8, raise
    InvalidArgumentError. ``dtype`` overrides the dtype q
    reports (unless ``q_dtype`` is given), and k's and v's unless ``kv_dtype`` is given.

    fp8 queries (Hopper, sm_90a): q may hold e4m3 values too (float8_e4m3fn, or uint8 codes
    with ``q_dtype="fp8_e4m3"``) standing for ``q_scale * q``, over fp8 K/V; both products run
    in e4m3 (P is rounded to e4m3 for P V). ``q_scale`` is a number or an fp32 device array of
    1 or nhead_q values (nhead_q exactly when k_scale and v_scale hold nhead_k). The output is
    ``out_dtype``: fp16 or bf16 (default). No bias, ALiBi, dropout, softcap, sink,
    v_col_major or fp32; hdim 64, 128 or 256 (UnsupportedError or InvalidArgumentError from
    the C library). fp8 q over K/V that are not fp8, ``q_scale`` without fp8 q, and an
    ``out_dtype`` other than q's for a q that is not fp8 raise InvalidArgumentError.

    Per-block scales (fp8 queries only): ``q_scale``, ``k_scale`` and ``v_scale`` all 3-D fp32
    arrays (device arrays, read by the kernels; NumPy arrays are staged) with one scale per
    block of 128 tokens of each head, contiguous: q_scale [batch, nhead_q, ceil(seqlen_q /
    128)], k_scale and v_scale [batch, nhead_k, ceil(seqlen_k / 128)]; token t of a head
    stands for its code times the scale of block t // 128. An outlier then coarsens only its
    own block. Scales must be positive and finite (not checked here: the kernels read them).
    A 3-D scale beside a number or a 1-D array, a shape off by a block or a head, another
    dtype than fp32, and 3-D scales over q that is not fp8 raise InvalidArgumentError.

    Arrays may be DLPack or __cuda_array_interface__ producers (torch, CuPy,
    JAX, numba), ckfmha DeviceArrays or ``device_ptr`` views, or NumPy arrays
    (copied to the GPU and back). The output is of q's kind and layout. The arrays share one
    device (InvalidArgumentError naming each array's device otherwise): arrays on cuda:N run
    on cuda:N whatever the current device is, which is restored afterwards (also when the call
    raises); NumPy data is staged to the current device. Small host arrays (alibi_slopes,
    sink) are staged. ``out`` and ``lse_out`` must not share memory with an input or with each
    other (InvalidArgumentError naming both).

    Repeated calls: with torch tensors on the current device and no feature, fp8, ``kernel``,
    ``stream`` or dtype argument, a call whose arrays' shapes, strides, dtypes and devices
    and whose options equal an earlier successful call's reuses that call's checked problem
    (a few hundred distinct calls are kept); only its pointers and outputs are new.

    Empty problems: batch or seqlen_q 0 returns empty outputs without launching anything;
    seqlen_k 0 (every row sees no key) returns o = 0 and LSE = -inf (the sink with ``sink``),
    written with memsets, no kernel.

    Masks: ``causal`` (``causal_alignment`` "top_left": key j visible to query i
    iff j <= i; "bottom_right": iff j <= i + sk - sq) or ``window=(left, right)``
    (keys i+off-left .. i+off+right, -1 unbounded, same alignments).
    ``softcap`` > 0 caps logits as softcap*tanh(logit/softcap). ``bias`` is an
    additive [b, hq, sq, sk] tensor (size-1 axes broadcast; q's dtype);
    ``alibi_slopes`` fp32 [hq] or [b, hq] adds -slope*|i + sk - sq - j|.
    ``sink`` fp32 [hq] adds exp(sink) to each softmax denominator. ``dropout_p``
    drops probabilities with the documented Philox stream (seed, offset);
    ``return_dropout_randval`` also returns its uint8 bytes [b, hq, sq, sk].

    Returns o, then the fp32 LSE [b, hq, sq] with ``return_lse``, then the
    random bytes with ``return_dropout_randval``. ``num_splits`` 0 lets the
    dispatcher choose a split-KV plan (decode shapes, grids too small for the
    GPU), 1 forces one stage, n > 1 splits the keys n ways; the plan's
    workspace is allocated here. ``kernel`` forces a
    registered kernel by name; ``stream`` is a CUDA stream handle or object of the arrays'
    device (default: torch's current stream of the tensors' device, CuPy's current stream of
    the arrays' device, else that device's legacy stream). A torch or CuPy stream of another
    device raises InvalidArgumentError naming both devices; an int handle cannot be checked
    and must belong to the arrays' device.
    """
    key = None
    if (alibi_slopes is None and sink is None and not dropout_p and
            not return_dropout_randval and not v_col_major and kernel is None and
            stream is None and dtype is None and kv_dtype is None and k_scale is None and
            v_scale is None and q_dtype is None and q_scale is None and out_dtype is None):
        # Torch tensors and options an earlier call had: its checked problem serves
        # (ckfmha/_fwd_fast.pyx).
        key = fast_key(q, k, v, out, lse_out, bias, causal, causal_alignment, window, scale,
                       softcap, return_lse, layout, num_splits)
        if key is not None:
            results = run_cached(key, q, k, v, out, lse_out, bias)
            if results is not None:
                return results
    check_scale_args(k_scale, v_scale)
    check_q_scale_arg(q_scale)
    index = check_devices((("q", q), ("k", k), ("v", v), ("out", out), ("lse_out", lse_out),
                           ("bias", bias)), (("alibi_slopes", alibi_slopes), ("sink", sink),
                                             ("k_scale", k_scale), ("v_scale", v_scale),
                                             ("q_scale", q_scale)))
    with on_device(index):
        return _fwd(index, q, k, v, causal, causal_alignment, window, scale, softcap, bias,
                    alibi_slopes, sink, dropout_p, dropout_seed, dropout_offset,
                    return_dropout_randval, return_lse, layout, v_col_major, num_splits, out,
                    lse_out, kernel, stream, dtype, kv_dtype, k_scale, v_scale, q_dtype,
                    q_scale, out_dtype, key)


cdef object _fwd(index, q, k, v, causal, causal_alignment, window, scale, softcap, bias,
                 alibi_slopes, sink, dropout_p, dropout_seed, dropout_offset,
                 return_dropout_randval, return_lse, layout, v_col_major, num_splits, out, lse_out,
                 kernel, stream, dtype, kv_dtype, k_scale, v_scale, q_dtype, q_scale,
                 out_dtype, fast_path_key=None):
    """``fwd`` with the arrays' device (``index``) current. ``fast_path_key``: the call's
    key in the fast path's cache (None: not eligible), under which a call that launches
    kernels is remembered."""
    cdef int c_layout = layout_code(layout)
    kind = array_kind(q)
    handle = resolve_stream(stream, kind, q, index)

    cdef ArrayView qv, kv, vv
    qv, kv, vv = attention_views(q, k, v, handle, dtype, kv_dtype, 4, 4, 4, "k", "v", q_dtype)
    cdef _Quant quant = _Quant(qv, kv, vv, out_dtype, q_scale, k_scale, v_scale)
    batch, nhead_q, seqlen_q, hdim_q = _bhsd(qv.shape, c_layout)
    k_batch, nhead_k, seqlen_k, k_hdim = _bhsd(kv.shape, c_layout)
    if v_col_major:
        v_batch, v_heads, hdim_v, v_seqlen = vv.shape
    else:
        v_batch, v_heads, v_seqlen, hdim_v = _bhsd(vv.shape, c_layout)
    if not batch == k_batch == v_batch:
        raise _invalid(f"batch sizes differ: q {batch}, k {k_batch}, v {v_batch} ({layout})")
    if k_hdim != hdim_q:
        raise _invalid(f"k head dim {k_hdim} differs from q head dim {hdim_q}")
    if (v_heads, v_seqlen) != (nhead_k, seqlen_k):
        raise _invalid(f"v has {v_heads} heads x {v_seqlen} keys but k has {nhead_k} x "
                       f"{seqlen_k} ({layout})")

    # Built and checked before any allocation so a bad size fails without
    # touching the device.
    cdef capi.ckfmha_fwd_problem problem
    cdef capi.ckfmha_fwd_args args
    memset(&args, 0, sizeof(args))
    _init_problem(&problem, quant.out_dtype, c_layout, batch, nhead_q, nhead_k, seqlen_q,
                  seqlen_k, hdim_q, hdim_v)
    cdef KvScales kv_scales = KvScales()
    _apply_scales(&problem, &args, kv_scales, quant, q_scale, k_scale, v_scale, handle)
    _set_scalars(&problem, causal, causal_alignment, window, scale, softcap, dropout_p,
                 num_splits)

    o_shape = _in_layout(batch, nhead_q, seqlen_q, hdim_v, c_layout)
    o_obj = allocate(kind, q, o_shape, quant.out_dtype) if out is None else out
    cdef ArrayView ov = _out_view(o_obj, handle, 4, quant)
    if ov.shape != o_shape:
        raise _invalid(f"out must have shape {o_shape} ({layout}), got {ov.shape}")

    lse_obj = None
    cdef ArrayView lv = None
    lse_shape = (batch, nhead_q, seqlen_q)
    if return_lse or lse_out is not None:
        lse_obj = allocate(kind, q, lse_shape, _dtypes.FP32) if lse_out is None else lse_out
        lv = as_view(lse_obj, handle, None, "lse_out", 3, _LSE_DTYPES, True)
        if lv.shape != lse_shape:
            raise _invalid(f"lse_out must have shape {lse_shape}, got {lv.shape}")
        if lv.strides[2] != 1 and seqlen_q > 1:
            raise _invalid(f"lse_out rows must be contiguous, got strides {lv.strides}")
        problem.lse_stride[0] = lv.strides[0]
        problem.lse_stride[1] = lv.strides[1]

    cdef _Features features = _Features()
    features.apply(&problem, &args, kind, q, handle, quant.out_dtype, batch, nhead_q, seqlen_q,
                   seqlen_k, bias, alibi_slopes, sink, dropout_seed, dropout_offset,
                   return_dropout_randval)

    problem.store_lse = 1 if lv is not None else 0
    _set_strides(problem.q_stride, _bhs_strides(qv, c_layout))
    _set_strides(problem.k_stride, _bhs_strides(kv, c_layout))
    if v_col_major:
        # Keys are contiguous; the third stride is the head-dim one.
        problem.v_col_major = 1
        _set_strides(problem.v_stride, (vv.strides[0], vv.strides[1], vv.strides[2]))
    else:
        _set_strides(problem.v_stride, _bhs_strides(vv, c_layout))
    _set_strides(problem.o_stride, _bhs_strides(ov, c_layout))
    _set_tensors(&args, qv, kv, vv, ov, lv)
    _check_outputs(out, lse_out, ov, lv, [qv.region("q"), kv.region("k"), vv.region("v")] +
                   features.input_regions + kv_scales.regions)
    _run(&problem, &args, kernel, handle, kind, q)
    if fast_path_key is not None and _launches_kernels(&problem):
        remember(fast_path_key, &problem, index, o_shape,
                 lse_shape if lse_obj is not None else None)

    # The views (and with them staged copies and DLPack owners) live until here,
    # past the launch; stream ordering keeps the memory valid for the kernel.
    results = _results(kind, handle, o_obj, out, lse_obj, lse_out, features)
    return results[0] if len(results) == 1 else results


def _offset_array(obj):
    """Lists and tuples of offsets become int32 NumPy arrays (staged like any host array)."""
    return np.asarray(obj, dtype=np.int32) if isinstance(obj, (list, tuple)) else obj


cdef int _offset_count(obj, str name) except -1:
    """batch + 1, read from the shape alone so nothing is staged before the problem checks
    (batch may be 0: an empty problem)."""
    shape = tuple(getattr(obj, "shape", ()))
    if len(shape) != 1 or int(shape[0]) < 1:
        raise _invalid(f"{name} must be a 1-D array of batch + 1 >= 1 int32 offsets, "
                       f"got shape {shape}")
    return int(shape[0])


cdef int _check_offsets(meta, total_q, total_k, max_seqlen_q, max_seqlen_k) except -1:
    """Group-mode offsets known on the host (see ckfmha.metadata_checks.check_varlen)."""
    check_varlen(meta.get("cu_seqlens_q"), meta.get("cu_seqlens_k"), total_q=total_q,
                 total_k=total_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    return 0


cdef int _validate_offsets(meta, ArrayView cqv, ArrayView ckv, handle, total_q, total_k,
                           max_seqlen_q, max_seqlen_k) except -1:
    """With validation, device offsets copied back and checked like host ones."""
    meta.fetch("cu_seqlens_q", cqv, handle)
    meta.fetch("cu_seqlens_k", ckv, handle)
    if meta.copied:
        _check_offsets(meta, total_q, total_k, max_seqlen_q, max_seqlen_k)
    return 0


cdef ArrayView _offsets(obj, handle, str name, int count):
    cdef ArrayView view = as_view(obj, handle, None, name, 1, _I32)
    if view.shape[0] != count:
        raise _invalid(f"{name} must hold batch + 1 = {count} int32 offsets, "
                       f"got shape {view.shape}")
    return view


def fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q, max_seqlen_k,
               skip_min_seqlen_q=0, causal=False, causal_alignment="top_left", window=None,
               scale=None, softcap=0.0, bias=None, alibi_slopes=None, sink=None, dropout_p=0.0,
               dropout_seed=0, dropout_offset=0, return_dropout_randval=False,
               return_lse=False, v_col_major=False, num_splits=0, out=None, lse_out=None,
               kernel=None, stream=None, dtype=None, validate=None, kv_dtype=None, k_scale=None,
               v_scale=None, q_dtype=None, q_scale=None, out_dtype=None):
    """Forward attention over a packed batch of variable-length sequences (group mode).

    q is [total_q, nhead_q, hdim], k and v [total_k, nhead_k, hdim / hdim_v];
    sequence b owns tokens cu_seqlens_q[b] .. cu_seqlens_q[b+1] (int32, batch + 1
    offsets, device or host). max_seqlen_q/k must be at least the longest
    sequence. Sequences shorter than ``skip_min_seqlen_q`` are skipped and their
    outputs left as they were. Masks and features as in ``fwd``, with positions
    local to each sequence (bias [batch, hq, max_sq, max_sk]); with
    ``v_col_major`` v is [nhead_k, hdim_v, total_k] (tokens contiguous). Returns o
    [total_q, nhead_q, hdim_v], then LSE [nhead_q, total_q] with ``return_lse``,
    then the dropout bytes [batch, hq, max_sq, max_sk]. ``num_splits`` as in ``fwd``; fp8 K/V
    (``kv_dtype``, ``k_scale``, ``v_scale``) and fp8 queries (``q_dtype``, ``q_scale``,
    ``out_dtype``) as in ``fwd``. Per-block scales as in ``fwd``, one row per sequence and
    blocks counted from each sequence's first token: q_scale [batch, nhead_q,
    ceil(max_seqlen_q / 128)], k_scale and v_scale [batch, nhead_k, ceil(max_seqlen_k / 128)]
    (a sequence's blocks past its end are not read).

    Offsets given on the host (NumPy, lists) are checked before they are staged: they start
    at 0, never decrease, end within q and k, and no sequence is longer than max_seqlen_q/k
    (InvalidArgumentError naming the array, the index and the bound). Device offsets are
    checked the same way when ``validate=True`` (or CKFMHA_VALIDATE=1 in the environment):
    they are copied back, which waits for the stream. Otherwise the kernels bound them: a
    sequence whose range leaves q or k, runs backwards or passes max_seqlen_q/k is skipped
    and the next call on the device (or ``ckfmha.check_errors()``) raises DeviceMetadataError. Devices and
    ``out``/``lse_out`` overlaps are checked as in ``fwd``.

    Empty problems: batch 0 (one offset), no tokens or max_seqlen_q 0 launch nothing; a
    sequence without keys (max_seqlen_k 0: all of them) gets o = 0 and LSE = -inf.

    Repeated calls: with torch tensors on the current device (int32 offsets there too), no
    bias, ALiBi, sink, dropout, V layout, caller output, fp8, ``kernel``, ``stream``,
    ``dtype`` or validation, a call whose arrays' shapes, strides, dtypes and devices, maximum
    lengths and options equal an earlier successful call's reuses that call's checked problem;
    the offsets' values may differ (the kernels read them).
    """
    key = None
    if (bias is None and alibi_slopes is None and sink is None and not dropout_p and
            not return_dropout_randval and not v_col_major and out is None and
            lse_out is None and kernel is None and stream is None and dtype is None and
            kv_dtype is None and k_scale is None and v_scale is None and q_dtype is None and
            q_scale is None and out_dtype is None and not validation_requested(validate)):
        # ckfmha/_fwd_fast.pyx, as for fwd.
        key = varlen_fast_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              skip_min_seqlen_q, causal, causal_alignment, window, scale,
                              softcap, return_lse, num_splits)
        if key is not None:
            results = run_cached(key, q, k, v, None, None, None, cu_seqlens_q, cu_seqlens_k)
            if results is not None:
                return results
    check_scale_args(k_scale, v_scale)
    check_q_scale_arg(q_scale)
    index = check_devices((("q", q), ("k", k), ("v", v), ("out", out), ("lse_out", lse_out),
                           ("bias", bias)), (("alibi_slopes", alibi_slopes), ("sink", sink),
                                             ("cu_seqlens_q", cu_seqlens_q),
                                             ("cu_seqlens_k", cu_seqlens_k),
                                             ("k_scale", k_scale), ("v_scale", v_scale),
                                             ("q_scale", q_scale)))
    with on_device(index):
        return _fwd_varlen(index, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           skip_min_seqlen_q, causal, causal_alignment, window, scale, softcap,
                           bias, alibi_slopes, sink, dropout_p, dropout_seed, dropout_offset,
                           return_dropout_randval, return_lse, v_col_major, num_splits, out,
                           lse_out, kernel, stream, dtype, validate, kv_dtype, k_scale, v_scale,
                           q_dtype, q_scale, out_dtype, key)


cdef object _fwd_varlen(index, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        skip_min_seqlen_q, causal, causal_alignment, window, scale, softcap, bias,
                        alibi_slopes, sink, dropout_p, dropout_seed, dropout_offset,
                        return_dropout_randval, return_lse, v_col_major, num_splits, out, lse_out,
                        kernel, stream, dtype, validate, kv_dtype, k_scale, v_scale, q_dtype,
                        q_scale, out_dtype, fast_path_key=None):
    """``fwd_varlen`` with the arrays' device (``index``) current. ``fast_path_key`` as in
    ``_fwd``."""
    kind = array_kind(q)
    handle = resolve_stream(stream, kind, q, index)
    cdef ArrayView qv, kv, vv
    qv, kv, vv = attention_views(q, k, v, handle, dtype, kv_dtype, 3, 3, 3, "k", "v", q_dtype)
    cdef _Quant quant = _Quant(qv, kv, vv, out_dtype, q_scale, k_scale, v_scale)
    total_q, nhead_q, hdim_q = qv.shape
    total_k, nhead_k, k_hdim = kv.shape
    if v_col_major:
        v_heads, hdim_v, v_total = vv.shape
    else:
        v_total, v_heads, hdim_v = vv.shape
    if k_hdim != hdim_q:
        raise _invalid(f"k head dim {k_hdim} differs from q head dim {hdim_q}")
    if (v_total, v_heads) != (total_k, nhead_k):
        raise _invalid(f"v is [{v_total}, {v_heads}, ...] but k is [{total_k}, {nhead_k}, ...]")
    cu_seqlens_q = _offset_array(cu_seqlens_q)
    cu_seqlens_k = _offset_array(cu_seqlens_k)
    cdef int count = _offset_count(cu_seqlens_q, "cu_seqlens_q")
    if _offset_count(cu_seqlens_k, "cu_seqlens_k") != count:
        raise _invalid(f"cu_seqlens_k must hold batch + 1 = {count} offsets like cu_seqlens_q, "
                       f"got shape {tuple(cu_seqlens_k.shape)}")
    batch = count - 1

    cdef capi.ckfmha_fwd_problem problem
    cdef capi.ckfmha_fwd_args args
    memset(&args, 0, sizeof(args))
    _init_problem(&problem, quant.out_dtype, capi.CKFMHA_LAYOUT_BSHD, batch, nhead_q, nhead_k,
                  max_seqlen_q, max_seqlen_k, hdim_q, hdim_v, "max_seqlen_q", "max_seqlen_k")
    problem.mode = capi.CKFMHA_MODE_GROUP
    problem.total_q = total_q
    problem.total_k = total_k
    problem.skip_min_seqlen_q = to_int32(skip_min_seqlen_q, "skip_min_seqlen_q")
    cdef KvScales kv_scales = KvScales()
    _apply_scales(&problem, &args, kv_scales, quant, q_scale, k_scale, v_scale, handle,
                  "max_seqlen_q", "max_seqlen_k")
    _set_scalars(&problem, causal, causal_alignment, window, scale, softcap, dropout_p,
                 num_splits)
    meta = MetadataValues(validate)
    meta.given("cu_seqlens_q", cu_seqlens_q)
    meta.given("cu_seqlens_k", cu_seqlens_k)
    _check_offsets(meta, total_q, total_k, max_seqlen_q, max_seqlen_k)
    cdef ArrayView cqv = _offsets(cu_seqlens_q, handle, "cu_seqlens_q", count)
    cdef ArrayView ckv = _offsets(cu_seqlens_k, handle, "cu_seqlens_k", count)
    _validate_offsets(meta, cqv, ckv, handle, total_q, total_k, max_seqlen_q, max_seqlen_k)

    o_shape = (total_q, nhead_q, hdim_v)
    o_obj = allocate(kind, q, o_shape, quant.out_dtype) if out is None else out
    cdef ArrayView ov = _out_view(o_obj, handle, 3, quant)
    if ov.shape != o_shape:
        raise _invalid(f"out must have shape {o_shape}, got {ov.shape}")
    lse_obj = None
    cdef ArrayView lv = None
    if return_lse or lse_out is not None:
        lse_shape = (nhead_q, total_q)
        lse_obj = allocate(kind, q, lse_shape, _dtypes.FP32) if lse_out is None else lse_out
        lv = as_view(lse_obj, handle, None, "lse_out", 2, _LSE_DTYPES, True)
        if lv.shape != lse_shape or (lv.strides[1] != 1 and total_q > 1):
            raise _invalid(f"lse_out must be [{nhead_q}, {total_q}] with contiguous rows, "
                           f"got shape {lv.shape} strides {lv.strides}")
        problem.lse_stride[0] = 0
        problem.lse_stride[1] = lv.strides[0]

    cdef _Features features = _Features()
    features.apply(&problem, &args, kind, q, handle, quant.out_dtype, batch, nhead_q,
                   problem.seqlen_q, problem.seqlen_k, bias, alibi_slopes, sink,
                   dropout_seed, dropout_offset, return_dropout_randval)

    problem.store_lse = 1 if lv is not None else 0
    # Tokens are rows; the batch stride is unused in group mode.
    _set_strides(problem.q_stride, (0, qv.strides[1], qv.strides[0]))
    _set_strides(problem.k_stride, (0, kv.strides[1], kv.strides[0]))
    if v_col_major:
        problem.v_col_major = 1
        _set_strides(problem.v_stride, (0, vv.strides[0], vv.strides[1]))
    else:
        _set_strides(problem.v_stride, (0, vv.strides[1], vv.strides[0]))
    _set_strides(problem.o_stride, (0, ov.strides[1], ov.strides[0]))
    _set_tensors(&args, qv, kv, vv, ov, lv)
    args.cu_seqlens_q = <const int32_t*>cqv.ptr
    args.cu_seqlens_k = <const int32_t*>ckv.ptr
    _check_outputs(out, lse_out, ov, lv, [qv.region("q"), kv.region("k"), vv.region("v"),
                                          cqv.region("cu_seqlens_q"),
                                          ckv.region("cu_seqlens_k")] + features.input_regions
                   + kv_scales.regions)
    _run(&problem, &args, kernel, handle, kind, q)
    if fast_path_key is not None and _launches_kernels(&problem):
        remember(fast_path_key, &problem, index, o_shape,
                 (nhead_q, total_q) if lv is not None else None)

    results = _results(kind, handle, o_obj, out, lse_obj, lse_out, features)
    return results[0] if len(results) == 1 else results
