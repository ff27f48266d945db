# cython: language_level=3
"""ckfmha.fwd: forward attention on whatever arrays the caller has."""

from libc.stdint cimport int64_t, uintptr_t

cimport ckfmha as capi
from ckfmha._arrays cimport ArrayView
from ckfmha._problem cimport to_int32
from ckfmha._status cimport check

from ckfmha import _dtypes
from ckfmha._arrays import as_view
from ckfmha._interop import allocate, array_kind, finish, resolve_stream
from ckfmha.errors import InvalidArgumentError
from ckfmha.problem import layout_code, mask_code

_INPUT_DTYPES = (_dtypes.FP16, _dtypes.BF16)
_LSE_DTYPES = (_dtypes.FP32,)


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


def fwd(q, k, v, *, causal=False, causal_alignment="top_left", scale=None, return_lse=False,
        layout="bhsd", out=None, lse_out=None, kernel=None, stream=None, dtype=None):
    """Fused multi-head attention forward: softmax(scale * q k^T [+ causal mask]) v.

    q is [batch, nhead_q, seqlen_q, hdim] and k, v are [batch, nhead_k, seqlen_k,
    hdim / hdim_v] for layout "bhsd", or [batch, seqlen, heads, hdim] for "bshd";
    any strides work as long as the head dimension is contiguous, so permuted
    views need no copy. nhead_q must be a multiple of nhead_k (GQA/MQA).

    Arrays may be DLPack or __cuda_array_interface__ producers (torch, CuPy,
    JAX, numba), ckfmha DeviceArrays or ``device_ptr`` views, or NumPy arrays
    (copied to the GPU and back). The output is of q's kind and layout; with
    ``return_lse`` the fp32 log-sum-exp [batch, nhead_q, seqlen_q] comes too.

    ``causal_alignment``: "top_left" lets query i see keys j <= i;
    "bottom_right" aligns the last query with the last key (j <= i + sk - sq).
    ``kernel`` forces a registered kernel by name. ``stream`` is a CUDA stream
    handle or stream object; by default the framework's current stream (torch,
    CuPy) or the legacy default stream.
    """
    cdef int c_layout = layout_code(layout)
    cdef int c_mask = mask_code(bool(causal), causal_alignment)
    kind = array_kind(q)
    handle = resolve_stream(stream, kind, q)

    cdef ArrayView qv = as_view(q, handle, dtype, "q", 4, _INPUT_DTYPES)
    cdef ArrayView kv = as_view(k, handle, dtype, "k", 4, _INPUT_DTYPES)
    cdef ArrayView vv = as_view(v, handle, dtype, "v", 4, _INPUT_DTYPES)
    if not qv.dtype == kv.dtype == vv.dtype:
        raise _invalid(f"q, k and v must have one dtype, got {qv.dtype_name}, "
                       f"{kv.dtype_name}, {vv.dtype_name}")
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

    # Built before any allocation so a bad size fails without touching the device.
    cdef capi.ckfmha_fwd_problem problem
    check(capi.ckfmha_fwd_problem_init(
        &problem, <capi.ckfmha_dtype>qv.dtype, <capi.ckfmha_layout>c_layout,
        to_int32(batch, "batch"), to_int32(nhead_q, "nhead_q"), to_int32(nhead_k, "nhead_k"),
        to_int32(seqlen_q, "seqlen_q"), to_int32(seqlen_k, "seqlen_k"),
        to_int32(hdim_q, "hdim"), to_int32(hdim_v, "hdim_v")))
    problem.mask = <capi.ckfmha_mask>c_mask
    if scale is not None:
        problem.scale = float(scale)
    check(capi.ckfmha_fwd_problem_validate(&problem))

    o_shape = _in_layout(batch, nhead_q, seqlen_q, hdim_v, c_layout)
    o_obj = allocate(kind, q, o_shape, qv.dtype) if out is None else out
    cdef ArrayView ov = as_view(o_obj, handle, None, "out", 4, (qv.dtype,), True)
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
        if lv.strides != (nhead_q * seqlen_q, seqlen_q, 1) and batch * nhead_q * seqlen_q > 1:
            raise _invalid(f"lse_out must be contiguous, got strides {lv.strides}")

    problem.store_lse = 1 if lv is not None else 0
    _set_strides(problem.q_stride, _bhs_strides(qv, c_layout))
    _set_strides(problem.k_stride, _bhs_strides(kv, c_layout))
    _set_strides(problem.v_stride, _bhs_strides(vv, c_layout))
    _set_strides(problem.o_stride, _bhs_strides(ov, c_layout))

    cdef capi.ckfmha_fwd_args args
    args.q = <const void*>qv.ptr
    args.k = <const void*>kv.ptr
    args.v = <const void*>vv.ptr
    args.o = <void*>ov.ptr
    args.lse = <float*>lv.ptr if lv is not None else NULL
    cdef const char* c_kernel = NULL
    kernel_bytes = b""
    if kernel is not None:
        kernel_bytes = str(kernel).encode("utf-8")
        c_kernel = kernel_bytes
    cdef uintptr_t c_stream = <uintptr_t>handle
    cdef int status
    with nogil:
        status = capi.ckfmha_fwd_run(&problem, &args, c_kernel,
                                     <capi.ckfmha_stream_t>c_stream)
    check(status)

    # The views (and with them staged copies and DLPack owners) live until here,
    # past the launch; stream ordering keeps the memory valid for the kernel.
    o_result = finish(kind, o_obj, handle) if out is None else out
    if lse_obj is None:
        return o_result
    return o_result, (finish(kind, lse_obj, handle) if lse_out is None else lse_out)
