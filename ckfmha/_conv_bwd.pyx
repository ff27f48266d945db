# cython: language_level=3
"""ckfmha.conv_bwd_data and ckfmha.conv_bwd_weight: the gradients of ``conv_fwd``."""

import math

from libc.stdint cimport uintptr_t
from libc.string cimport memset

cimport ckfmha as capi
from ckfmha._arrays cimport ArrayView
from ckfmha._conv cimport _init_geometry, _set_outer, _workspace, _y_shape
from ckfmha._status cimport check

from ckfmha import _dtypes, first_use
from ckfmha._arrays import as_view
from ckfmha._interop import allocate, array_kind, finish, resolve_stream
from ckfmha._status import error_for_status
from ckfmha.aliasing import check_no_overlap
from ckfmha.array_devices import check_devices
from ckfmha.conv_problem import (
    CONV_BWD_DATA,
    CONV_BWD_WEIGHT,
    check_channels_dense,
    check_dense,
    outer_strides,
)
from ckfmha.device_scope import on_device
from ckfmha.errors import InvalidArgumentError

_DTYPES = (_dtypes.FP16, _dtypes.BF16)

cdef enum:
    # ckfmha_conv_direction, for the launch outside the GIL.
    DIRECTION_BWD_DATA = 1


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)


def _rank(obj, str name, str channels) -> int:
    """5 (2D) or 6 (3D): the rank of an array of positions, groups and channels."""
    shape = getattr(obj, "shape", None)
    rank = len(shape) if shape is not None else 0
    if rank not in (5, 6):
        raise _invalid(f"{name} has shape {None if shape is None else tuple(shape)}; supported: "
                       f"[N, H, W, G, {channels}] (2D) or [N, D, H, W, G, {channels}] (3D)")
    return rank


def _spatial(value, str name, int dims, out_shape, str source) -> tuple:
    """`dims` positive sizes from `value`, else from the output array's shape."""
    if value is None:
        if out_shape is None:
            raise _invalid(f"{name} is required (the {dims} spatial sizes of {source}) unless "
                           "out is given")
        return tuple(out_shape)
    sizes = tuple(value) if isinstance(value, (tuple, list)) else None
    if sizes is None or len(sizes) != dims or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
        raise _invalid(f"{name} is {value!r}; accepted: {dims} integers >= 1 (the spatial "
                       f"sizes of {source}, outermost first)")
    if out_shape is not None and tuple(out_shape) != sizes:
        raise _invalid(f"{name} {sizes} disagrees with out's spatial sizes {tuple(out_shape)}")
    return sizes


cdef int _same_dtype(dict codes) except -1:
    for name, code in codes.items():
        if code is not None and code not in _DTYPES:
            raise _invalid(f"{name} must be fp16 or bf16, got {_dtypes.NAMES[code]}")
    given = {name: code for name, code in codes.items() if code is not None}
    if len(set(given.values())) > 1:
        listed = ", ".join(f"{name} {_dtypes.NAMES[code]}" for name, code in given.items())
        raise _invalid(f"{', '.join(given)} share one dtype (fp16 or bf16); got {listed}")
    return 0


cdef int _check_dy(capi.ckfmha_conv_problem* problem, ArrayView dyv) except -1:
    expected = _y_shape(problem)
    if dyv.shape != expected:
        raise _invalid(f"dy must be [N, *output, G, K] = {expected} for these sizes, stride, "
                       f"padding and dilation, got {dyv.shape}")
    check_channels_dense("dy", dyv.shape, dyv.strides)
    _set_outer(problem.y_stride, outer_strides(dyv.shape, dyv.strides))
    return 0


def conv_bwd_data(dy, w, *, input_size=None, stride=1, padding=0, dilation=1, out=None,
                  kernel=None, stream=None, dtype=None):
    """dx, the gradient of ``conv_fwd(x, w)`` by x given dy, the gradient by its output.

    dy: [N, *output, G, K] (y's layout: groups and channels of a position dense, batch and
    spatial strides free); w: [G, K, *filter, C], dense. ``input_size``: x's spatial sizes
    (several input sizes give one output size when the stride is over 1), or taken from
    ``out``. Returns dx [N, *input_size, G, C], allocated like dy or written into ``out``
    (groups and channels dense, strides >= 1) and returned. stride, padding and dilation as in
    ``conv_fwd``.

    The plan runs conv_fwd kernels over dy: one per stride phase (the dx positions with one
    remainder by the stride in each dim) with the filter taps that reach it, flipped and
    transposed; the direct, TMA and sm_90 gathering kernels read them so from w (the last
    where C is a multiple of 8), the others from a copy in a workspace (allocated like dx), where groups of 8-32 channels may also be multiplied
    several at a time through block-diagonal filters. Positions no tap reaches are zeroed.
    ``kernel``
    names a conv_fwd kernel for every phase (``conv_select(..., direction="bwd_data")`` names
    the automatic choice of the first). fp16 or bf16, fp32 accumulation; dy's stream rules as
    in ``conv_fwd``.
    """
    index = check_devices((("dy", dy), ("w", w), ("out", out)))
    with on_device(index):
        return _conv_bwd_data(dy, w, input_size, stride, padding, dilation, out, kernel,
                              stream, dtype, index)


cdef tuple _operand_views(first, str first_name, str channels, second, str second_name, out,
                          handle, dtype):
    """Views of a pass's two operands (the first, [N, *spatial, G, channels], sets the rank) and
    of ``out`` when given (else None), once they are known to share one dtype."""
    cdef ArrayView a = as_view(first, handle, dtype, first_name,
                               _rank(first, first_name, channels), _DTYPES)
    cdef ArrayView b = as_view(second, handle, dtype, second_name, len(a.shape), _DTYPES)
    cdef ArrayView o = None
    if out is not None:
        o = as_view(out, handle, None, "out", len(a.shape), None, True)
    _same_dtype({first_name: a.dtype, second_name: b.dtype,
                 "out": None if o is None else o.dtype})
    return a, b, o


cdef object _conv_bwd_data(dy, w, input_size, stride, padding, dilation, out, kernel, stream,
                           dtype, index):
    cdef capi.ckfmha_conv_problem problem
    memset(&problem, 0, sizeof(problem))
    kind = array_kind(dy)
    handle = resolve_stream(stream, kind, dy, index)
    cdef ArrayView dyv, wv, dxv
    dyv, wv, dxv = _operand_views(dy, "dy", "K", w, "w", out, handle, dtype)
    cdef int dims = len(dyv.shape) - 3
    if wv.shape[0] != dyv.shape[-2] or wv.shape[1] != dyv.shape[-1]:
        raise _invalid(f"w {wv.shape} does not match dy {dyv.shape}: w is [G, K, *filter, C] "
                       f"with dy's G={dyv.shape[-2]} and K={dyv.shape[-1]}")
    sizes = _spatial(input_size, "input_size", dims,
                     None if dxv is None else dxv.shape[1:1 + dims], "x")
    x_shape = (dyv.shape[0], *sizes, wv.shape[0], wv.shape[-1])
    _init_geometry(&problem, dyv.dtype, x_shape, wv.shape, stride, padding, dilation)
    _check_dy(&problem, dyv)
    check_dense("w", wv.shape, wv.strides)
    dx_obj = out
    if dxv is None:
        dx_obj = allocate(kind, dy, x_shape, dyv.dtype)
        dxv = as_view(dx_obj, handle, None, "out", len(x_shape), _DTYPES, True)
    else:
        if dxv.shape != x_shape:
            raise _invalid(f"out must be [N, *input_size, G, C] = {x_shape}, got {dxv.shape}")
        check_channels_dense("out", dxv.shape, dxv.strides)
        check_no_overlap([dxv.region("out")], [dyv.region("dy"), wv.region("w")])
    _set_outer(problem.x_stride, outer_strides(dxv.shape, dxv.strides))
    check(capi.ckfmha_conv_problem_validate(&problem))
    if problem.batch == 0:
        return finish(kind, dx_obj, handle) if out is None else out

    workspace, wsv = _workspace(&problem, CONV_BWD_DATA, kind, dy, handle)
    cdef capi.ckfmha_conv_bwd_data_args args
    args.dy = <const void*>dyv.ptr
    args.w = <const void*>wv.ptr
    args.dx = <void*>dxv.ptr
    args.workspace = <void*>(<ArrayView>wsv).ptr if wsv is not None else NULL
    args.workspace_bytes = 4 * (<ArrayView>wsv).shape[0] if wsv is not None else 0
    # The phases are forward convolutions over dy: K channels in, C out (first_use.ConvKey).
    dy_outer = tuple(problem.y_stride[i] for i in range(dims + 1))
    key = ("conv", (CONV_BWD_DATA, <int>problem.dtype, dims,
                    first_use.conv_vector(problem.out_channels, dy_outer, dyv.ptr, 0),
                    first_use.conv_direct_bucket(problem.out_channels, problem.in_channels)))
    return _launch(&problem, CONV_BWD_DATA, &args, kernel, key, handle, kind, dx_obj, out)


def conv_bwd_weight(x, dy, *, filter_size=None, stride=1, padding=0, dilation=1, out=None,
                    kernel=None, splits=None, stream=None, dtype=None):
    """dw, the gradient of ``conv_fwd(x, w)`` by w given dy, the gradient by its output.

    x: [N, *input, G, C] and dy: [N, *output, G, K], each with groups and channels of a
    position dense (batch and spatial strides free). ``filter_size``: w's spatial sizes, or
    taken from ``out``. Returns dw [G, K, *filter_size, C], dense, allocated like x or written
    into ``out`` (dense) and returned; a batch of 0 gives zeros. stride, padding and dilation
    as in ``conv_fwd``.

    One conv_bwd_weight kernel reduces over the batch and output positions; where dw has
    few tiles the reduction is split over CTAs that add fp32 partial sums into a workspace
    (allocated like dw), converted into dw after: the last bits may then differ from run to
    run. ``kernel`` names a conv_bwd_weight kernel (``conv_select(..., direction=
    "bwd_weight")`` names the automatic choice). ``splits`` (1 to 65535) overrides the plan's
    count of CTAs sharing the reduction: splits of the positions for an implicit-GEMM kernel,
    CTAs per block of 32 groups for a direct one. fp16 or bf16, fp32 accumulation.
    """
    index = check_devices((("x", x), ("dy", dy), ("out", out)))
    with on_device(index):
        return _conv_bwd_weight(x, dy, filter_size, stride, padding, dilation, out, kernel,
                                splits, stream, dtype, index)


cdef object _conv_bwd_weight(x, dy, filter_size, stride, padding, dilation, out, kernel,
                             splits, stream, dtype, index):
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int)
                               or not 1 <= splits <= 65535):
        raise _invalid(f"splits is {splits!r}; None (the plan's count) or an int from 1 to "
                       "65535")
    cdef capi.ckfmha_conv_problem problem
    memset(&problem, 0, sizeof(problem))
    kind = array_kind(x)
    handle = resolve_stream(stream, kind, x, index)
    cdef ArrayView xv, dyv, dwv
    xv, dyv, dwv = _operand_views(x, "x", "C", dy, "dy", out, handle, dtype)
    cdef int dims = len(xv.shape) - 3
    if dyv.shape[-2] != xv.shape[-2]:
        raise _invalid(f"dy {dyv.shape} and x {xv.shape} have different groups "
                       f"({dyv.shape[-2]} and {xv.shape[-2]})")
    sizes = _spatial(filter_size, "filter_size", dims,
                     None if dwv is None else dwv.shape[2:2 + dims], "w")
    w_shape = (xv.shape[-2], dyv.shape[-1], *sizes, xv.shape[-1])
    _init_geometry(&problem, xv.dtype, xv.shape, w_shape, stride, padding, dilation)
    check_channels_dense("x", xv.shape, xv.strides)
    _set_outer(problem.x_stride, outer_strides(xv.shape, xv.strides))
    _check_dy(&problem, dyv)
    dw_obj = out
    if dwv is None:
        dw_obj = allocate(kind, x, w_shape, xv.dtype)
        dwv = as_view(dw_obj, handle, None, "out", len(w_shape), _DTYPES, True)
    else:
        if dwv.shape != w_shape:
            raise _invalid(f"out must be [G, K, *filter_size, C] = {w_shape}, got {dwv.shape}")
        check_dense("out", dwv.shape, dwv.strides)
        check_no_overlap([dwv.region("out")], [xv.region("x"), dyv.region("dy")])
    check(capi.ckfmha_conv_problem_validate(&problem))

    workspace, wsv = _workspace(&problem, CONV_BWD_WEIGHT, kind, x, handle)
    cdef capi.ckfmha_conv_bwd_weight_args args
    args.x = <const void*>xv.ptr
    args.dy = <const void*>dyv.ptr
    args.dw = <void*>dwv.ptr
    args.workspace = <void*>(<ArrayView>wsv).ptr if wsv is not None else NULL
    args.workspace_bytes = 4 * (<ArrayView>wsv).shape[0] if wsv is not None else 0
    args.splits = 0 if splits is None else splits
    # Its vector divides both channel counts and both arrays' strides.
    outer = tuple(problem.x_stride[i] for i in range(dims + 1)) + tuple(
        problem.y_stride[i] for i in range(dims + 1))
    vector = first_use.conv_vector(math.gcd(problem.in_channels, problem.out_channels), outer,
                                   xv.ptr, dyv.ptr)
    # Groups of one or two channels also get the direct kernel of their size.
    key = ("conv", (CONV_BWD_WEIGHT, <int>problem.dtype, dims, vector,
                    first_use.conv_weight_direct_bucket(problem.in_channels,
                                                        problem.out_channels)))
    return _launch(&problem, CONV_BWD_WEIGHT, &args, kernel, key, handle, kind, dw_obj, out)


cdef object _launch(capi.ckfmha_conv_problem* problem, int direction, void* args, kernel, key,
                    handle, str kind, result, out):
    """Builds what the pass needs on first use, runs it, and returns its output."""
    cdef const char* c_kernel = NULL
    kernel_bytes = b""
    launches = problem.batch > 0
    if kernel is not None:
        kernel_bytes = str(kernel).encode("utf-8")
        c_kernel = kernel_bytes
        if launches:
            first_use.ensure_named(str(kernel))
        key = None
    elif launches:
        first_use.ensure(key)
    else:
        key = None
    cdef uintptr_t c_stream = <uintptr_t>handle
    cdef int status
    with nogil:
        if direction == DIRECTION_BWD_DATA:
            status = capi.ckfmha_conv_bwd_data_run(
                problem, <capi.ckfmha_conv_bwd_data_args*>args, c_kernel,
                <capi.ckfmha_stream_t>c_stream)
        else:
            status = capi.ckfmha_conv_bwd_weight_run(
                problem, <capi.ckfmha_conv_bwd_weight_args*>args, c_kernel,
                <capi.ckfmha_stream_t>c_stream)
    if status == capi.CKFMHA_ERROR_UNSUPPORTED and key is not None:
        raise first_use.explain(key, error_for_status(status))
    check(status)
    # The views (staged copies, DLPack owners) lived until the launch was queued.
    return finish(kind, result, handle) if out is None else out
