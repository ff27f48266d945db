# cython: language_level=3
"""ckfmha.bwd: attention gradients on whatever arrays the caller has."""

from libc.stdint cimport int32_t, int64_t, uint64_t, uintptr_t
from libc.string cimport memset

cimport ckfmha as capi
from ckfmha._arrays cimport ArrayView
from ckfmha._bwd_fast cimport (
    fast_key,
    remember,
    run_cached,
    varlen_fast_key,
    workspace_words,
)
from ckfmha._fwd cimport (
    _bhs_strides,
    _bhsd,
    _check_offsets,
    _in_layout,
    _offset_count,
    _offsets,
    _qkv_views,
    _set_strides,
    _validate_offsets,
)
from ckfmha._problem cimport to_int32
from ckfmha._status cimport check

import numpy as np

from ckfmha import _dtypes, first_use
from ckfmha._arrays import as_view
from ckfmha._status import error_for_status
from ckfmha._interop import allocate, array_kind, finish, resolve_stream
from ckfmha.aliasing import check_no_overlap
from ckfmha.array_devices import check_devices
from ckfmha.device_scope import on_device
from ckfmha.errors import InvalidArgumentError
from ckfmha.host_metadata import MetadataValues, validation_requested
from ckfmha.problem import layout_code, mask_code, window_bounds

_F32 = (_dtypes.FP32,)
_OUTPUT_NAMES = frozenset(("dq_out", "dk_out", "dv_out", "dbias_out", "dsink_out"))


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)


cdef class _Launch:
    """One backward launch: the C structs plus every view and buffer the kernels touch, kept
    alive until the launch is queued (stream order keeps the memory valid after that)."""
    cdef capi.ckfmha_bwd_problem problem
    cdef capi.ckfmha_bwd_args args
    cdef list views
    # (name, view) of every array the caller passed or the call allocated, for the aliasing
    # checks.
    cdef list named
    cdef object workspace

    def __cinit__(self):
        memset(&self.problem, 0, sizeof(self.problem))
        memset(&self.args, 0, sizeof(self.args))
        self.views = []
        self.named = []
        self.workspace = None

    cdef ArrayView view(self, obj, handle, dtype, str name, int ndim, tuple allowed,
                        bint writable=False):
        cdef ArrayView view = as_view(obj, handle, dtype, name, ndim, allowed, writable)
        self.views.append(view)
        self.named.append((name, view))
        return view

    cdef int scalars(self, causal, causal_alignment, window, scale, softcap, dropout_p,
                     dropout_seed, dropout_offset, deterministic) except -1:
        cdef int code = mask_code(bool(causal), causal_alignment, window)
        self.problem.mask = <capi.ckfmha_mask>code
        left, right = window_bounds(window)
        self.problem.window_left = to_int32(left, "window left")
        self.problem.window_right = to_int32(right, "window right")
        if scale is not None:
            self.problem.scale = float(scale)
        self.problem.softcap = float(softcap)
        self.problem.dropout_p = float(dropout_p)
        self.problem.dropout_seed = <uint64_t>(int(dropout_seed) & 0xFFFFFFFFFFFFFFFF)
        self.problem.dropout_offset = <uint64_t>(int(dropout_offset) & 0xFFFFFFFFFFFFFFFF)
        self.problem.deterministic = 1 if deterministic else 0
        return 0

    cdef int biases(self, bias, alibi_slopes, handle, int dtype, int batch, int nhead_q,
                    int seqlen_q, int seqlen_k) except -1:
        cdef ArrayView bv, av
        if bias is not None and alibi_slopes is not None:
            raise _invalid("pass bias or alibi_slopes, not both")
        if bias is not None:
            bv = self.view(bias, handle, None, "bias", 4, (dtype,))
            target = (batch, nhead_q, seqlen_q, seqlen_k)
            for got, want in zip(bv.shape, target):
                if got != want and got != 1:
                    raise _invalid(f"bias shape {bv.shape} does not broadcast to {target}")
            if bv.shape[3] != seqlen_k or (bv.strides[3] != 1 and seqlen_k > 1):
                raise _invalid(f"bias must have a contiguous last axis of seqlen_k={seqlen_k}")
            self.problem.bias = capi.CKFMHA_BIAS_ELEMENTWISE
            for axis in range(3):
                self.problem.bias_stride[axis] = 0 if bv.shape[axis] == 1 else bv.strides[axis]
            self.args.bias = <const void*>bv.ptr
        if alibi_slopes is not None:
            av = self.view(alibi_slopes, handle, None, "alibi_slopes",
                           len(getattr(alibi_slopes, "shape", (0,))), _F32)
            if av.shape not in ((nhead_q,), (batch, nhead_q)) or av.strides[-1] != 1:
                raise _invalid(f"alibi_slopes must be fp32 [{nhead_q}] or [{batch}, {nhead_q}] "
                               f"with contiguous heads, got shape {av.shape}")
            self.problem.bias = capi.CKFMHA_BIAS_ALIBI
            self.problem.alibi_stride = av.strides[0] if len(av.shape) == 2 else 0
            self.args.alibi_slopes = <const float*>av.ptr
        return 0

    cdef int tensors(self, ArrayView qv, ArrayView kv, ArrayView vv, ArrayView ov,
                     ArrayView lv, ArrayView dov, ArrayView dqv, ArrayView dkv,
                     ArrayView dvv) except -1:
        self.args.q = <const void*>qv.ptr
        self.args.k = <const void*>kv.ptr
        self.args.v = <const void*>vv.ptr
        self.args.o = <const void*>ov.ptr
        self.args.lse = <const float*>lv.ptr
        self.args.do_ = <const void*>dov.ptr
        self.args.dq = <void*>dqv.ptr
        self.args.dk = <void*>dkv.ptr
        self.args.dv = <void*>dvv.ptr
        return 0

    cdef int check_outputs(self, list given) except -1:
        """Outputs the caller passed (``given``: their names) share no memory with the inputs
        or with each other; outputs allocated here cannot."""
        if not given:
            return 0
        regions = [view.region(name) for name, view in self.named]
        check_no_overlap([r for r in regions if r.name in _OUTPUT_NAMES],
                         [r for r in regions if r.name not in _OUTPUT_NAMES])
        return 0

    cdef bint launches_kernels(self):
        """Whether ckfmha_bwd_run runs kernels (bwd_run_work in cpp/src/empty_problems.cpp):
        not when every gradient is empty, nor in batch mode without queries or keys (zero
        gradients are memsets), so nothing is compiled on first use for those."""
        cdef capi.ckfmha_bwd_problem* p = &self.problem
        if p.batch == 0 or (p.seqlen_q == 0 and p.seqlen_k == 0):
            return False
        return p.mode == capi.CKFMHA_MODE_GROUP or (p.seqlen_q > 0 and p.seqlen_k > 0)

    cdef int run(self, str kind, like, handle, kernel) except -1:
        check(capi.ckfmha_bwd_problem_validate(&self.problem))
        cdef capi.ckfmha_bwd_problem* p = &self.problem
        # The fields of first_use.BwdKey, in order.
        key = ("bwd", (<int>p.dtype, <int>p.mode, p.hdim_q, p.hdim_v, <int>p.mask, <int>p.bias,
                       p.dropout_p > 0, p.softcap > 0, bool(p.store_dbias),
                       bool(p.deterministic),
                       p.bias == capi.CKFMHA_BIAS_ELEMENTWISE and p.bias_stride[2] != 0))
        cdef size_t workspace_bytes = 0
        cdef ArrayView wv
        # Without kernels (empty problems, zero gradients by memset) nothing is compiled and
        # no workspace is needed.
        if self.launches_kernels():
            if kernel is None:
                first_use.ensure(key)
            else:
                first_use.ensure_named(str(kernel))
            check(capi.ckfmha_bwd_workspace_size(&self.problem, &workspace_bytes))
            # The caller's framework allocates the workspace (torch's caching allocator, or a
            # DeviceArray), so the C library never allocates on the stream.
            self.workspace = allocate(kind, like, (workspace_words(workspace_bytes),),
                                      _dtypes.FP32)
            wv = self.view(self.workspace, handle, None, "workspace", 1, _F32, True)
            self.args.workspace = <void*>wv.ptr
            self.args.workspace_bytes = workspace_bytes
        cdef const char* c_kernel = NULL
        kernel_bytes = b""
        if kernel is not None:
            kernel_bytes = str(kernel).encode("utf-8")
            c_kernel = kernel_bytes
        cdef uintptr_t c_stream = <uintptr_t>handle
        cdef int status
        with nogil:
            status = capi.ckfmha_bwd_run(&self.problem, &self.args, c_kernel,
                                         <capi.ckfmha_stream_t>c_stream)
        if status == capi.CKFMHA_ERROR_UNSUPPORTED and kernel is None:
            raise first_use.explain(key, error_for_status(status))
        check(status)
        return 0


cdef ArrayView _output(_Launch launch, str kind, like, out, handle, tuple shape, int dtype,
                       str name, list keep):
    obj = allocate(kind, like, shape, dtype) if out is None else out
    keep.append(obj)
    cdef ArrayView view = launch.view(obj, handle, None, name, len(shape), (dtype,), True)
    if view.shape != shape:
        raise _invalid(f"{name} must have shape {shape}, got {view.shape}")
    return view


cdef int _dbias_output(_Launch launch, str kind, like, out, handle, tuple shape, int dtype,
                       list keep) except -1:
    """The full-size bias gradient [batch, nhead_q, seqlen_q, seqlen_k] (group mode: the
    longest lengths), in the bias's dtype."""
    if launch.problem.bias != capi.CKFMHA_BIAS_ELEMENTWISE:
        raise _invalid("return_dbias needs an elementwise `bias`: dbias is its gradient "
                       "(ALiBi slopes are constants)")
    cdef ArrayView view = _output(launch, kind, like, out, handle, shape, dtype, "dbias_out",
                                  keep)
    if view.strides[3] != 1 and shape[3] > 1:
        raise _invalid(f"dbias_out must have a contiguous last axis, got strides {view.strides}")
    # An empty dbias (a zero extent) has nothing to store (see ckfmha.h).
    launch.problem.store_dbias = 1 if all(shape) else 0
    for axis in range(3):
        launch.problem.dbias_stride[axis] = view.strides[axis]
    launch.args.dbias = <void*>view.ptr
    return 0


cdef int _sink_input(_Launch launch, sink, return_dsink, dsink_out, handle,
                     int nhead_q) except -1:
    """The forward's sink logits, fp32 [nhead_q]. dq, dk and dv need only the LSE (which
    includes the sinks); the sink logits are read for their gradient, ``return_dsink``."""
    cdef ArrayView sv
    if sink is None:
        if return_dsink:
            raise _invalid(f"return_dsink needs `sink`, the forward's sink logits (fp32 "
                           f"[{nhead_q}]): dsink is their gradient")
    else:
        sv = launch.view(sink, handle, None, "sink", 1, _F32)
        if sv.shape != (nhead_q,) or (sv.strides[0] != 1 and nhead_q > 1):
            raise _invalid(f"sink must be contiguous fp32 [{nhead_q}], got shape {sv.shape}")
        if return_dsink:
            launch.problem.has_sink = 1
            launch.args.sink = <const float*>sv.ptr
    if dsink_out is not None and not return_dsink:
        raise _invalid("dsink_out is given but return_dsink is False")
    return 0


cdef int _dsink_output(_Launch launch, str kind, like, out, handle, int nhead_q,
                       list keep) except -1:
    """The sink gradient, fp32 [nhead_q]."""
    cdef ArrayView view = _output(launch, kind, like, out, handle, (nhead_q,), _dtypes.FP32,
                                  "dsink_out", keep)
    launch.args.dsink = <float*>view.ptr
    return 0


cdef list _given(dq_out, dk_out, dv_out, return_dbias, dbias_out, return_dsink, dsink_out):
    """The caller's ``*_out`` arrays (or None) of the gradients returned, in their order."""
    given = [dq_out, dk_out, dv_out]
    if return_dbias:
        given.append(dbias_out)
    if return_dsink:
        given.append(dsink_out)
    return given


cdef tuple _results(str kind, handle, list keep, list given):
    """The gradients in order: those allocated here converted to the caller's kind, the
    caller's own ``*_out`` arrays as given."""
    return tuple(finish(kind, obj, handle) if out is None else out
                 for obj, out in zip(keep, given))


def _check_devices(do, q, k, v, o, lse, bias, alibi_slopes, sink, dq_out, dk_out, dv_out,
                   dbias_out, dsink_out, cu_seqlens_q=None, cu_seqlens_k=None):
    """The arrays' CUDA device index (None: host data), see ckfmha.array_devices."""
    return check_devices((("do", do), ("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse),
                          ("bias", bias), ("dq_out", dq_out), ("dk_out", dk_out),
                          ("dv_out", dv_out), ("dbias_out", dbias_out),
                          ("dsink_out", dsink_out)),
                         (("alibi_slopes", alibi_slopes), ("sink", sink),
                          ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)))


def bwd(do, q, k, v, o, lse, *, causal=False, causal_alignment="top_left", window=None,
        scale=None, softcap=0.0, bias=None, alibi_slopes=None, sink=None, dropout_p=0.0,
        dropout_seed=0, dropout_offset=0, deterministic=False, layout="bhsd", dq_out=None,
        dk_out=None, dv_out=None, return_dbias=False, dbias_out=None, return_dsink=False,
        dsink_out=None, kernel=None, stream=None, dtype=None):
    """Gradients of attention: (dq, dk, dv) for upstream gradient ``do``.

    q, k, v, o and the fp32 ``lse`` [batch, nhead_q, seqlen_q] are the forward's inputs and
    outputs (``ckfmha.fwd(..., return_lse=True)``); ``do`` is shaped like o. Masks, scale,
    soft-cap, ``bias``/``alibi_slopes`` and dropout (p, seed, offset) must be the ones the
    forward used; they are recomputed. Layouts, array kinds and strides as in ``fwd``; dq, dk
    and dv have the shapes of q, k and v (with GQA/MQA, dk and dv sum over the query heads that
    share a K/V head) and q's kind.

    ``return_dbias`` (elementwise ``bias`` only) also returns dbias, the bias gradient, as a
    fourth array: always the full [batch, nhead_q, seqlen_q, seqlen_k] in the bias's dtype,
    written entirely (0 where the mask hides a score); the gradient of a bias that broadcasts
    over batch or heads is its sum over those axes. ``dbias_out`` receives it if given.

    Sinks: a forward with ``sink`` (fp32 [nhead_q]) gives an LSE that includes them, and dq,
    dk and dv need nothing more. ``return_dsink`` (which needs ``sink``, staged like
    alibi_slopes) also returns the sink gradient dsink[h] = -sum over batch and queries of
    exp(sink[h] - lse) * rowsum(do * o), fp32 [nhead_q], after dq, dk, dv (and dbias); it is
    reduced in a fixed order, bit-identical across runs in either mode. ``dsink_out``
    receives it if given.

    ``deterministic`` makes dq bit-identical across runs (no fp32 atomics; see ckfmha.h);
    the default adds dQ partials atomically, which is faster. ``kernel`` forces the
    bwd_dq_dk_dv kernel by name; the other two stages are chosen to match. The workspace
    (ckfmha_bwd_workspace_size bytes) is allocated like the outputs, by q's framework.

    Arrays share one device, where the call runs, as in ``fwd``; dq_out, dk_out, dv_out,
    dbias_out and dsink_out must not share memory with an input or with each other
    (InvalidArgumentError naming both; views of one packed dqkv buffer that do not overlap are
    fine). Empty problems: batch 0, or no queries and no keys, launch nothing; without queries
    dk = dv = 0, without keys dq = 0, and dsink = 0 in both cases (memsets, no kernel).

    Repeated calls: with torch tensors on the current device and no ALiBi, sink, dropout,
    bias gradient, caller output, ``kernel``, ``stream`` or ``dtype``, a call whose arrays'
    shapes, strides, dtypes and devices and whose options equal an earlier successful call's
    reuses that call's checked problem (a training step's backward, step after step).
    """
    key = None
    if (alibi_slopes is None and sink is None and not dropout_p and not return_dbias and
            not return_dsink and dq_out is None and dk_out is None and dv_out is None and
            dbias_out is None and dsink_out is None and kernel is None and stream is None and
            dtype is None):
        # ckfmha/_bwd_fast.pyx: an earlier call's checked problem serves.
        key = fast_key(do, q, k, v, o, lse, bias, causal, causal_alignment, window, scale,
                       softcap, deterministic, layout)
        if key is not None:
            results = run_cached(key, do, q, k, v, o, lse, bias)
            if results is not None:
                return results
    index = _check_devices(do, q, k, v, o, lse, bias, alibi_slopes, sink, dq_out, dk_out, dv_out,
                           dbias_out, dsink_out)
    with on_device(index):
        return _bwd(index, do, q, k, v, o, lse, causal, causal_alignment, window, scale, softcap,
                    bias, alibi_slopes, sink, dropout_p, dropout_seed, dropout_offset,
                    deterministic, layout, dq_out, dk_out, dv_out, return_dbias, dbias_out,
                    return_dsink, dsink_out, kernel, stream, dtype, key)


cdef object _bwd(index, do, q, k, v, o, lse, causal, causal_alignment, window, scale, softcap,
                 bias, alibi_slopes, sink, dropout_p, dropout_seed, dropout_offset, deterministic,
                 layout, dq_out, dk_out, dv_out, return_dbias, dbias_out, return_dsink, dsink_out,
                 kernel, stream, dtype, fast_path_key=None):
    """``bwd`` with the arrays' device (``index``) current. ``fast_path_key``: the call's key
    in the fast path's cache (None: not eligible), under which a call that launches kernels is
    remembered."""
    cdef int c_layout = layout_code(layout)
    kind = array_kind(q)
    handle = resolve_stream(stream, kind, q, index)
    cdef _Launch launch = _Launch()
    cdef ArrayView qv, kv, vv
    qv, kv, vv = _qkv_views(q, k, v, handle, dtype, 4)
    launch.views.extend((qv, kv, vv))
    launch.named.extend((("q", qv), ("k", kv), ("v", vv)))
    batch, nhead_q, seqlen_q, hdim_q = _bhsd(qv.shape, c_layout)
    k_batch, nhead_k, seqlen_k, k_hdim = _bhsd(kv.shape, c_layout)
    v_batch, v_heads, v_seqlen, hdim_v = _bhsd(vv.shape, c_layout)
    if not batch == k_batch == v_batch:
        raise _invalid(f"batch sizes differ: q {batch}, k {k_batch}, v {v_batch} ({layout})")
    if k_hdim != hdim_q:
        raise _invalid(f"k head dim {k_hdim} differs from q head dim {hdim_q}")
    if (v_heads, v_seqlen) != (nhead_k, seqlen_k):
        raise _invalid(f"v has {v_heads} heads x {v_seqlen} keys but k has {nhead_k} x "
                       f"{seqlen_k} ({layout})")
    o_shape = _in_layout(batch, nhead_q, seqlen_q, hdim_v, c_layout)
    cdef ArrayView ov = launch.view(o, handle, dtype, "o", 4, (qv.dtype,))
    cdef ArrayView dov = launch.view(do, handle, dtype, "do", 4, (qv.dtype,))
    for name, view in (("o", ov), ("do", dov)):
        if view.shape != o_shape:
            raise _invalid(f"{name} must have shape {o_shape} ({layout}), got {view.shape}")
    cdef ArrayView lv = launch.view(lse, handle, None, "lse", 3, _F32)
    if lv.shape != (batch, nhead_q, seqlen_q) or (lv.strides[2] != 1 and seqlen_q > 1):
        raise _invalid(f"lse must be fp32 [{batch}, {nhead_q}, {seqlen_q}] with contiguous "
                       f"rows, got shape {lv.shape} strides {lv.strides}")

    check(capi.ckfmha_bwd_problem_init(
        &launch.problem, <capi.ckfmha_dtype>qv.dtype, <capi.ckfmha_layout>c_layout,
        to_int32(batch, "batch"), to_int32(nhead_q, "nhead_q"), to_int32(nhead_k, "nhead_k"),
        to_int32(seqlen_q, "seqlen_q"), to_int32(seqlen_k, "seqlen_k"),
        to_int32(hdim_q, "hdim"), to_int32(hdim_v, "hdim_v")))
    launch.scalars(causal, causal_alignment, window, scale, softcap, dropout_p, dropout_seed,
                   dropout_offset, deterministic)
    launch.biases(bias, alibi_slopes, handle, qv.dtype, batch, nhead_q, seqlen_q, seqlen_k)
    _sink_input(launch, sink, return_dsink, dsink_out, handle, nhead_q)
    check(capi.ckfmha_bwd_problem_validate(&launch.problem))

    keep = []
    cdef ArrayView dqv = _output(launch, kind, q, dq_out, handle, qv.shape, qv.dtype, "dq_out",
                                 keep)
    cdef ArrayView dkv = _output(launch, kind, q, dk_out, handle, kv.shape, qv.dtype, "dk_out",
                                 keep)
    cdef ArrayView dvv = _output(launch, kind, q, dv_out, handle, vv.shape, qv.dtype, "dv_out",
                                 keep)
    _set_strides(launch.problem.q_stride, _bhs_strides(qv, c_layout))
    _set_strides(launch.problem.k_stride, _bhs_strides(kv, c_layout))
    _set_strides(launch.problem.v_stride, _bhs_strides(vv, c_layout))
    _set_strides(launch.problem.o_stride, _bhs_strides(ov, c_layout))
    _set_strides(launch.problem.do_stride, _bhs_strides(dov, c_layout))
    _set_strides(launch.problem.dq_stride, _bhs_strides(dqv, c_layout))
    _set_strides(launch.problem.dk_stride, _bhs_strides(dkv, c_layout))
    _set_strides(launch.problem.dv_stride, _bhs_strides(dvv, c_layout))
    launch.problem.lse_stride[0] = lv.strides[0]
    launch.problem.lse_stride[1] = lv.strides[1]
    if return_dbias:
        _dbias_output(launch, kind, q, dbias_out, handle, (batch, nhead_q, seqlen_q, seqlen_k),
                      qv.dtype, keep)
    elif dbias_out is not None:
        raise _invalid("dbias_out is given but return_dbias is False")
    if return_dsink:
        _dsink_output(launch, kind, q, dsink_out, handle, nhead_q, keep)
    launch.tensors(qv, kv, vv, ov, lv, dov, dqv, dkv, dvv)
    launch.check_outputs([out for out in (dq_out, dk_out, dv_out, dbias_out, dsink_out)
                          if out is not None])
    launch.run(kind, q, handle, kernel)
    if fast_path_key is not None and launch.launches_kernels():
        remember(fast_path_key, &launch.problem, index, qv.shape, kv.shape, vv.shape)
    return _results(kind, handle, keep, _given(dq_out, dk_out, dv_out, return_dbias, dbias_out,
                                               return_dsink, dsink_out))


def _offset_array(obj):
    return np.asarray(obj, dtype=np.int32) if isinstance(obj, (list, tuple)) else obj


def bwd_varlen(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q, max_seqlen_k,
               causal=False, causal_alignment="top_left", window=None, scale=None, softcap=0.0,
               bias=None, alibi_slopes=None, sink=None, dropout_p=0.0, dropout_seed=0,
               dropout_offset=0, deterministic=False, dq_out=None, dk_out=None, dv_out=None,
               return_dbias=False, dbias_out=None, return_dsink=False, dsink_out=None,
               kernel=None, stream=None, dtype=None, validate=None):
    """Gradients over a packed batch of variable-length sequences (group mode).

    Arrays as ``fwd_varlen`` takes and returns them: q [total_q, nhead_q, hdim], k and v
    [total_k, nhead_k, hdim / hdim_v], o and ``do`` [total_q, nhead_q, hdim_v] and the fp32
    ``lse`` [nhead_q, total_q]; offsets and features as in ``fwd_varlen``. Returns (dq, dk,
    dv) shaped like q, k and v; keys of a sequence with no queries get zero gradients.
    ``return_dbias`` adds dbias [batch, nhead_q, max_seqlen_q, max_seqlen_k] as in ``bwd``:
    each sequence's gradient in its top-left corner, zeros elsewhere. ``sink`` and
    ``return_dsink`` as in ``bwd``: dsink [nhead_q] sums over every sequence's queries (0 when
    no sequence has any). Offsets are checked as
    in ``fwd_varlen`` (host ones always; device ones with ``validate=True`` or
    CKFMHA_VALIDATE=1, else bounded by the kernels and reported as DeviceMetadataError).
    Repeated calls take the fast path of ``bwd`` (without a bias) and of ``fwd_varlen``
    (int32 offsets on the GPU, no validation).
    """
    key = None
    if (bias is None and alibi_slopes is None and sink is None and not dropout_p and
            not return_dbias and not return_dsink and dq_out is None and dk_out is None and
            dv_out is None and dbias_out is None and dsink_out is None and kernel is None and
            stream is None and dtype is None and not validation_requested(validate)):
        key = varlen_fast_key(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, causal, causal_alignment, window, scale, softcap,
                              deterministic)
        if key is not None:
            results = run_cached(key, do, q, k, v, o, lse, None, cu_seqlens_q, cu_seqlens_k)
            if results is not None:
                return results
    index = _check_devices(do, q, k, v, o, lse, bias, alibi_slopes, sink, dq_out, dk_out, dv_out,
                           dbias_out, dsink_out, cu_seqlens_q, cu_seqlens_k)
    with on_device(index):
        return _bwd_varlen(index, do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                           max_seqlen_k, causal, causal_alignment, window, scale, softcap, bias,
                           alibi_slopes, sink, dropout_p, dropout_seed, dropout_offset,
                           deterministic, dq_out, dk_out, dv_out, return_dbias, dbias_out,
                           return_dsink, dsink_out, kernel, stream, dtype, validate, key)


cdef object _bwd_varlen(index, do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, causal, causal_alignment, window, scale, softcap, bias,
                        alibi_slopes, sink, dropout_p, dropout_seed, dropout_offset,
                        deterministic, dq_out, dk_out, dv_out, return_dbias, dbias_out,
                        return_dsink, dsink_out, kernel, stream, dtype, validate,
                        fast_path_key=None):
    """``bwd_varlen`` with the arrays' device (``index``) current; ``fast_path_key`` as in
    ``_bwd``."""
    kind = array_kind(q)
    handle = resolve_stream(stream, kind, q, index)
    cdef _Launch launch = _Launch()
    cdef ArrayView qv, kv, vv
    qv, kv, vv = _qkv_views(q, k, v, handle, dtype, 3)
    launch.views.extend((qv, kv, vv))
    launch.named.extend((("q", qv), ("k", kv), ("v", vv)))
    total_q, nhead_q, hdim_q = qv.shape
    total_k, nhead_k, k_hdim = kv.shape
    v_total, v_heads, hdim_v = vv.shape
    if k_hdim != hdim_q:
        raise _invalid(f"k head dim {k_hdim} differs from q head dim {hdim_q}")
    if (v_total, v_heads) != (total_k, nhead_k):
        raise _invalid(f"v is [{v_total}, {v_heads}, ...] but k is [{total_k}, {nhead_k}, ...]")
    o_shape = (total_q, nhead_q, hdim_v)
    cdef ArrayView ov = launch.view(o, handle, dtype, "o", 3, (qv.dtype,))
    cdef ArrayView dov = launch.view(do, handle, dtype, "do", 3, (qv.dtype,))
    for name, view in (("o", ov), ("do", dov)):
        if view.shape != o_shape:
            raise _invalid(f"{name} must have shape {o_shape}, got {view.shape}")
    cdef ArrayView lv = launch.view(lse, handle, None, "lse", 2, _F32)
    if lv.shape != (nhead_q, total_q) or (lv.strides[1] != 1 and total_q > 1):
        raise _invalid(f"lse must be fp32 [{nhead_q}, {total_q}] with contiguous rows, got "
                       f"shape {lv.shape} strides {lv.strides}")
    cu_seqlens_q = _offset_array(cu_seqlens_q)
    cu_seqlens_k = _offset_array(cu_seqlens_k)
    cdef int count = _offset_count(cu_seqlens_q, "cu_seqlens_q")
    if _offset_count(cu_seqlens_k, "cu_seqlens_k") != count:
        raise _invalid(f"cu_seqlens_k must hold batch + 1 = {count} offsets like cu_seqlens_q, "
                       f"got shape {tuple(cu_seqlens_k.shape)}")
    batch = count - 1

    check(capi.ckfmha_bwd_problem_init(
        &launch.problem, <capi.ckfmha_dtype>qv.dtype, capi.CKFMHA_LAYOUT_BSHD,
        to_int32(batch, "batch"), to_int32(nhead_q, "nhead_q"), to_int32(nhead_k, "nhead_k"),
        to_int32(max_seqlen_q, "max_seqlen_q"), to_int32(max_seqlen_k, "max_seqlen_k"),
        to_int32(hdim_q, "hdim"), to_int32(hdim_v, "hdim_v")))
    launch.problem.mode = capi.CKFMHA_MODE_GROUP
    launch.problem.total_q = total_q
    launch.problem.total_k = total_k
    launch.scalars(causal, causal_alignment, window, scale, softcap, dropout_p, dropout_seed,
                   dropout_offset, deterministic)
    launch.biases(bias, alibi_slopes, handle, qv.dtype, batch, nhead_q, launch.problem.seqlen_q,
                  launch.problem.seqlen_k)
    _sink_input(launch, sink, return_dsink, dsink_out, handle, nhead_q)
    check(capi.ckfmha_bwd_problem_validate(&launch.problem))
    meta = MetadataValues(validate)
    meta.given("cu_seqlens_q", cu_seqlens_q)
    meta.given("cu_seqlens_k", cu_seqlens_k)
    _check_offsets(meta, total_q, total_k, max_seqlen_q, max_seqlen_k)
    cdef ArrayView cqv = _offsets(cu_seqlens_q, handle, "cu_seqlens_q", count)
    cdef ArrayView ckv = _offsets(cu_seqlens_k, handle, "cu_seqlens_k", count)
    _validate_offsets(meta, cqv, ckv, handle, total_q, total_k, max_seqlen_q, max_seqlen_k)
    launch.views.extend((cqv, ckv))
    launch.named.extend((("cu_seqlens_q", cqv), ("cu_seqlens_k", ckv)))

    keep = []
    cdef ArrayView dqv = _output(launch, kind, q, dq_out, handle, qv.shape, qv.dtype, "dq_out",
                                 keep)
    cdef ArrayView dkv = _output(launch, kind, q, dk_out, handle, kv.shape, qv.dtype, "dk_out",
                                 keep)
    cdef ArrayView dvv = _output(launch, kind, q, dv_out, handle, vv.shape, qv.dtype, "dv_out",
                                 keep)
    # Tokens are rows; the batch stride is unused in group mode.
    _set_strides(launch.problem.q_stride, (0, qv.strides[1], qv.strides[0]))
    _set_strides(launch.problem.k_stride, (0, kv.strides[1], kv.strides[0]))
    _set_strides(launch.problem.v_stride, (0, vv.strides[1], vv.strides[0]))
    _set_strides(launch.problem.o_stride, (0, ov.strides[1], ov.strides[0]))
    _set_strides(launch.problem.do_stride, (0, dov.strides[1], dov.strides[0]))
    _set_strides(launch.problem.dq_stride, (0, dqv.strides[1], dqv.strides[0]))
    _set_strides(launch.problem.dk_stride, (0, dkv.strides[1], dkv.strides[0]))
    _set_strides(launch.problem.dv_stride, (0, dvv.strides[1], dvv.strides[0]))
    launch.problem.lse_stride[0] = 0
    launch.problem.lse_stride[1] = lv.strides[0]
    if return_dbias:
        _dbias_output(launch, kind, q, dbias_out, handle,
                      (batch, nhead_q, launch.problem.seqlen_q, launch.problem.seqlen_k),
                      qv.dtype, keep)
    elif dbias_out is not None:
        raise _invalid("dbias_out is given but return_dbias is False")
    if return_dsink:
        _dsink_output(launch, kind, q, dsink_out, handle, nhead_q, keep)
    launch.tensors(qv, kv, vv, ov, lv, dov, dqv, dkv, dvv)
    launch.args.cu_seqlens_q = <const int32_t*>cqv.ptr
    launch.args.cu_seqlens_k = <const int32_t*>ckv.ptr
    launch.check_outputs([out for out in (dq_out, dk_out, dv_out, dbias_out, dsink_out)
                          if out is not None])
    launch.run(kind, q, handle, kernel)
    if fast_path_key is not None and launch.launches_kernels():
        remember(fast_path_key, &launch.problem, index, qv.shape, kv.shape, vv.shape)
    return _results(kind, handle, keep, _given(dq_out, dk_out, dv_out, return_dbias, dbias_out,
                                               return_dsink, dsink_out))
