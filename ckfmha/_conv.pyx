# cython: language_level=3
"""ckfmha.conv_fwd: grouped convolution, 2D and 3D, channels-last with the group explicit; and
selection and explanation for all three passes."""

from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

import numpy as np

cimport ckfmha as capi
from ckfmha._arrays cimport ArrayView
from ckfmha._problem cimport to_int32
from ckfmha._status cimport check

from ckfmha import _dtypes, first_use
from ckfmha._arch import parse_arch
from ckfmha._arrays import _host_numpy, as_view
from ckfmha._interop import allocate, array_kind, finish, resolve_stream
from ckfmha._memory import contiguous_strides
from ckfmha._status import error_for_status
from ckfmha.aliasing import check_no_overlap
from ckfmha.array_devices import HOST, array_device, check_devices
from ckfmha.conv_problem import (
    CONV_FWD,
    ConvProblem,
    direction_code,
    check_channels_dense,
    check_dense,
    outer_strides,
    per_dim,
    split_shapes,
)
from ckfmha.device_scope import on_device
from ckfmha.errors import BufferTooSmallError, InvalidArgumentError

_DTYPES = (_dtypes.FP16, _dtypes.BF16)
_F32 = (_dtypes.FP32,)

cdef enum:
    NAME_CAPACITY = 512
    # Explanations that keep growing are retried this often before giving up.
    MAX_TRIES = 8


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, 1)


cdef int _fill3(int32_t* dst, tuple values, str name) except -1:
    cdef int i
    for i in range(len(values)):
        dst[i] = to_int32(values[i], name)
    return 0


cdef int _init_geometry(capi.ckfmha_conv_problem* problem, int dtype, tuple x_shape,
                        tuple w_shape, stride, padding, dilation) except -1:
    """A problem with dense x and y from the shapes and the per-dim arguments; the C library
    checks what the shapes leave open (sizes >= 1, the filter fitting the padded input)."""
    shapes = split_shapes(x_shape, w_shape)
    cdef int dims = shapes.spatial_dims
    cdef int32_t c_input[3]
    cdef int32_t c_filter[3]
    cdef int32_t c_stride[3]
    cdef int32_t c_padding[3]
    cdef int32_t c_dilation[3]
    _fill3(c_input, shapes.input, "input size")
    _fill3(c_filter, shapes.filter, "filter size")
    _fill3(c_stride, per_dim("stride", stride, dims, 1), "stride")
    _fill3(c_padding, per_dim("padding", padding, dims, 0), "padding")
    _fill3(c_dilation, per_dim("dilation", dilation, dims, 1), "dilation")
    check(capi.ckfmha_conv_problem_init(
        problem, <capi.ckfmha_dtype>dtype, dims, to_int32(shapes.batch, "batch"),
        to_int32(shapes.groups, "groups"), to_int32(shapes.in_channels, "in_channels"),
        to_int32(shapes.out_channels, "out_channels"), c_input, c_filter, c_stride, c_padding,
        c_dilation))
    return 0


cdef int _set_outer(int64_t* dst, tuple strides) except -1:
    cdef int i
    for i in range(len(strides)):
        dst[i] = strides[i]
    return 0


cdef tuple _y_shape(capi.ckfmha_conv_problem* p):
    return (p.batch, *(p.output[i] for i in range(p.spatial_dims)), p.groups, p.out_channels)


cdef int _check_dtypes(int x_dtype, int w_dtype, y_dtype) except -1:
    for name, code in (("x", x_dtype), ("w", w_dtype), ("out", y_dtype)):
        if code is not None and code not in _DTYPES:
            raise _invalid(f"{name} must be fp16 or bf16, got {_dtypes.NAMES[code]}")
    if w_dtype != x_dtype or (y_dtype is not None and y_dtype != x_dtype):
        given = f"x {_dtypes.NAMES[x_dtype]}, w {_dtypes.NAMES[w_dtype]}"
        if y_dtype is not None:
            given += f", out {_dtypes.NAMES[y_dtype]}"
        raise _invalid(f"x, w and out share one dtype (fp16 or bf16); got {given}")
    return 0


cdef int _apply_layouts(capi.ckfmha_conv_problem* p, tuple x_strides, tuple w_shape,
                        tuple w_strides, tuple y_shape, tuple y_strides) except -1:
    """Checks the arrays' strides against the layouts and writes x's and y's batch and spatial
    strides into ``p``; y_shape None: y is allocated dense here."""
    x_shape = (p.batch, *(p.input[i] for i in range(p.spatial_dims)), p.groups, p.in_channels)
    check_channels_dense("x", x_shape, x_strides)
    check_dense("w", w_shape, w_strides)
    _set_outer(p.x_stride, outer_strides(x_shape, x_strides))
    if y_shape is not None:
        expected = _y_shape(p)
        if y_shape != expected:
            raise _invalid(f"out must be [N, *output, G, K] = {expected} for these x, w, "
                           f"stride, padding and dilation, got {y_shape}")
        check_channels_dense("out", y_shape, y_strides)
        _set_outer(p.y_stride, outer_strides(y_shape, y_strides))
    check(capi.ckfmha_conv_problem_validate(p))
    return 0


def _shape_attr(obj):
    """An array's shape as ints, read without touching its memory; None when it has none."""
    shape = getattr(obj, "shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        return None


cdef object _workspace(capi.ckfmha_conv_problem* problem, int direction, str kind, like,
                       handle):
    """The pass's workspace, allocated like its output (torch's caching allocator for torch),
    as (owner, view); (None, None) when it needs none."""
    cdef size_t nbytes = 0
    check(capi.ckfmha_conv_workspace_size(problem, <capi.ckfmha_conv_direction>direction, -1,
                                          &nbytes))
    if nbytes == 0:
        return None, None
    owner = allocate(kind, like, (max(1, (nbytes + 3) // 4),), _dtypes.FP32)
    return owner, as_view(owner, handle, None, "workspace", 1, _F32, True)


def conv_fwd(x, w, *, stride=1, padding=0, dilation=1, out=None, kernel=None, stream=None,
             dtype=None):
    """y = grouped convolution of x with w (cross-correlation, as torch's conv2d/conv3d).

    x: [N, H, W, G, C] (2D) or [N, D, H, W, G, C] (3D), channels-last with the group axis
    explicit: a torch channels_last [N, G*C, H, W] tensor is
    ``x.permute(0, 2, 3, 1).view(N, H, W, G, C)`` without a copy. Batch and spatial strides
    may be anything (a slice of a larger tensor); within a position the G*C channels are
    dense. w: [G, K, *filter, C], dense (torch's [G*K, C, *filter] weight is
    ``w.view(G, K, C, *filter).permute(0, 1, 3, 4, 2).contiguous()`` in 2D). C and K count the
    channels of one group: G = 1 is an ordinary convolution, C = K = 1 a depthwise one.

    ``stride``, ``padding`` (zeros, the same on both sides) and ``dilation`` are an int or a
    tuple with one per spatial dim (outermost first). Returns y [N, *output, G, K], output =
    (input + 2 * padding - dilation * (filter - 1) - 1) // stride + 1 per dim, allocated like
    x (torch in -> torch out, NumPy in -> NumPy out after one copy each way), or written
    into ``out`` (same dtype, groups and channels dense; other strides free) and returned.

    fp16 or bf16 (x, w and y alike), fp32 accumulation. All arrays share one device, where the
    call runs, on ``stream`` (default: the framework's current stream of that device).
    ``kernel`` forces a registered conv_fwd kernel by name (``conv_select`` names the
    automatic choice); ``dtype`` overrides what x and w report (bf16 over the CUDA Array
    Interface). Groups of 8, 16 or 32 input channels may run several at a time on sm_90
    through block-diagonal filters in a workspace allocated like y (``conv_explain`` says
    when). Batch 0 returns an empty y without a launch. Shapes, strides and dtypes are
    checked before anything is staged or launched: InvalidArgumentError (a ValueError) says
    what is wrong and what is supported; a problem no kernel covers raises UnsupportedError.
    """
    cdef capi.ckfmha_conv_problem problem
    memset(&problem, 0, sizeof(problem))
    x_shape, w_shape = _shape_attr(x), _shape_attr(w)
    # Geometry first: a wrong shape is reported before any array is staged to the device.
    cdef bint initialised = x_shape is not None and w_shape is not None
    if initialised:
        _init_geometry(&problem, _dtypes.FP16, x_shape, w_shape, stride, padding, dilation)
    index = check_devices((("x", x), ("w", w), ("out", out)))
    with on_device(index):
        return _conv_fwd(&problem, initialised, x_shape, w_shape, x, w, stride, padding,
                         dilation, out, kernel, stream, dtype, index)


cdef object _conv_fwd(capi.ckfmha_conv_problem* problem, bint initialised, x_shape, w_shape,
                      x, w, stride, padding, dilation, out, kernel, stream, dtype, index):
    """``conv_fwd`` with the arrays' device (``index``) current."""
    kind = array_kind(x)
    handle = resolve_stream(stream, kind, x, index)
    cdef ArrayView xv = as_view(x, handle, dtype, "x", len(x_shape) if x_shape else 5, _DTYPES)
    cdef ArrayView wv = as_view(w, handle, dtype, "w", len(xv.shape), _DTYPES)
    if not initialised or xv.shape != x_shape or wv.shape != w_shape:
        _init_geometry(problem, _dtypes.FP16, xv.shape, wv.shape, stride, padding, dilation)
    cdef ArrayView yv = None
    if out is not None:
        yv = as_view(out, handle, None, "out", len(xv.shape), None, True)
    _check_dtypes(xv.dtype, wv.dtype, None if yv is None else yv.dtype)
    problem.dtype = <capi.ckfmha_dtype>xv.dtype
    y_obj = out
    if yv is None:
        _apply_layouts(problem, xv.strides, wv.shape, wv.strides, None, None)
        y_obj = allocate(kind, x, _y_shape(problem), xv.dtype)
        yv = as_view(y_obj, handle, None, "out", len(xv.shape), _DTYPES, True)
    else:
        _apply_layouts(problem, xv.strides, wv.shape, wv.strides, yv.shape, yv.strides)
        check_no_overlap([yv.region("out")], [xv.region("x"), wv.region("w")])
    _set_outer(problem.y_stride, outer_strides(yv.shape, yv.strides))

    cdef capi.ckfmha_conv_fwd_args args
    memset(&args, 0, sizeof(args))
    args.x = <const void*>xv.ptr
    args.w = <const void*>wv.ptr
    args.y = <void*>yv.ptr
    cdef const char* c_kernel = NULL
    kernel_bytes = b""
    launches = problem.batch > 0
    key = None
    if kernel is not None:
        kernel_bytes = str(kernel).encode("utf-8")
        c_kernel = kernel_bytes
        if launches:
            first_use.ensure_named(str(kernel))
    elif launches:
        vector = first_use.conv_vector(problem.in_channels,
                                       tuple(problem.x_stride[i]
                                             for i in range(problem.spatial_dims + 1)),
                                       xv.ptr, wv.ptr)
        # The fields of first_use.ConvKey, in order; groups of few channels also get the
        # direct kernel of their size.
        small = first_use.conv_direct_bucket(problem.in_channels, problem.out_channels)
        key = ("conv", (CONV_FWD, <int>problem.dtype, problem.spatial_dims, vector, small))
        first_use.ensure(key)
    # Groups of 8-32 channels may run packed: their block-diagonal filters go here.
    workspace = None
    if launches:
        workspace, wsv = _workspace(problem, CONV_FWD, kind, x, handle)
        if wsv is not None:
            args.workspace = <void*>(<ArrayView>wsv).ptr
            args.workspace_bytes = 4 * (<ArrayView>wsv).shape[0]
    cdef uintptr_t c_stream = <uintptr_t>handle
    cdef int status
    with nogil:
        status = capi.ckfmha_conv_fwd_run(problem, &args, c_kernel,
                                          <capi.ckfmha_stream_t>c_stream)
    if status == capi.CKFMHA_ERROR_UNSUPPORTED and key is not None:
        raise first_use.explain(key, error_for_status(status))
    check(status)
    # The views (staged copies, DLPack owners) lived until the launch was queued.
    return finish(kind, y_obj, handle) if out is None else out


# ---- selection and explanation ----


def _describe(obj, str name, dtype, int ndim) -> tuple:
    """(shape, strides in elements, dtype code) of an array as conv_fwd would see it, without
    copying it: host arrays have the dense strides of their staged copy."""
    override = None if dtype is None else _dtypes.dtype_code(dtype)
    cdef ArrayView view
    if array_kind(obj) == "torch":
        from ckfmha._torch_fast import DTYPE_CODES

        code = DTYPE_CODES.get(obj.dtype)
        if code is None:
            raise _invalid(f"{name}: torch dtype {obj.dtype} is not fp16 or bf16")
        shape = tuple(obj.shape)
        strides = tuple(obj.stride()) if obj.is_cuda else contiguous_strides(shape)
    elif array_device(obj) == HOST:
        host = obj if isinstance(obj, np.ndarray) else _host_numpy(obj, name)
        shape = tuple(host.shape)
        strides = contiguous_strides(shape)
        code = override if override is not None else _dtypes.dtype_code(host.dtype)
    else:
        view = as_view(obj, 0, dtype, name, ndim, None)
        shape, strides, code = view.shape, view.strides, view.dtype
    if override is not None:
        code = override
    if 0 in shape:
        strides = contiguous_strides(shape)
    if len(shape) != ndim:
        raise _invalid(f"{name} must be {ndim}-D like x, got shape {shape}")
    return shape, strides, code


cdef int _problem_from_request(capi.ckfmha_conv_problem* problem, x, w, stride, padding,
                               dilation, out, dtype) except -1:
    memset(problem, 0, sizeof(problem[0]))
    if isinstance(x, ConvProblem):
        if w is not None or out is not None or dtype is not None or (stride, padding,
                                                                     dilation) != (1, 0, 1):
            raise TypeError("pass a ConvProblem alone (its fields hold stride, padding, "
                            "dilation, dtype and strides), or arrays x and w with those "
                            "arguments")
        _init_geometry(problem, x.dtype_code, x.x_shape, x.w_shape, x.stride, x.padding,
                       x.dilation)
        _set_outer(problem.x_stride, tuple(x.x_outer_strides))
        _set_outer(problem.y_stride, tuple(x.y_outer_strides))
        check(capi.ckfmha_conv_problem_validate(problem))
        return 0
    if w is None:
        raise TypeError("pass arrays x and w (or a ckfmha.ConvProblem)")
    x_shape = _shape_attr(x)
    ndim = len(x_shape) if x_shape is not None else 5
    x_shape, x_strides, x_dtype = _describe(x, "x", dtype, ndim)
    w_shape, w_strides, w_dtype = _describe(w, "w", dtype, len(x_shape))
    _init_geometry(problem, _dtypes.FP16, x_shape, w_shape, stride, padding, dilation)
    y_shape = y_strides = y_dtype = None
    if out is not None:
        y_shape, y_strides, y_dtype = _describe(out, "out", None, len(x_shape))
    _check_dtypes(x_dtype, w_dtype, y_dtype)
    problem.dtype = <capi.ckfmha_dtype>x_dtype
    _apply_layouts(problem, x_strides, w_shape, w_strides, y_shape, y_strides)
    return 0


def conv_select(x, w=None, *, stride=1, padding=0, dilation=1, out=None, dtype=None,
                arch=None, direction="fwd") -> str:
    """Name of the kernel a pass of this convolution would launch ('' when the batch is empty
    and nothing runs).

    x, w (and out, the forward's y): arrays as ``conv_fwd`` takes them; only their shapes,
    strides and dtypes are read (host arrays are not copied, device memory is not touched).
    Or x a ``ckfmha.ConvProblem`` alone. The problem is the forward's for every pass.
    ``direction``: "fwd" (conv_fwd), "bwd_data" (conv_bwd_data: the conv_fwd kernel of its
    first stride phase) or "bwd_weight" (conv_bwd_weight). ``arch`` (90, "sm_90a", ...)
    defaults to the current device's; pass it to ask about another architecture, or on a
    machine without a GPU. The pointers' alignment is not known here: a launch on pointers
    that 16 bytes do not divide takes a narrower-vector kernel.
    """
    cdef capi.ckfmha_conv_problem problem
    cdef char buf[NAME_CAPACITY]
    cdef int c_direction = direction_code(direction)
    _problem_from_request(&problem, x, w, stride, padding, dilation, out, dtype)
    check(capi.ckfmha_conv_select(&problem, <capi.ckfmha_conv_direction>c_direction,
                                  parse_arch(arch), buf, NAME_CAPACITY))
    return buf.decode("utf-8", "replace")


def conv_explain(x, w=None, *, stride=1, padding=0, dilation=1, out=None, dtype=None,
                 arch=None, direction="fwd") -> str:
    """Kernel-by-kernel account of which kernels fit a pass (arguments as in
    ``conv_select``), why the others do not, and the plan (backward-data: its stride phases
    and each one's kernel)."""
    cdef capi.ckfmha_conv_problem problem
    cdef int c_direction = direction_code(direction)
    _problem_from_request(&problem, x, w, stride, padding, dilation, out, dtype)
    cdef int c_arch = parse_arch(arch)
    cdef size_t needed = 1 << 16
    cdef char* buf = NULL
    cdef int status
    for _ in range(MAX_TRIES):
        buf = <char*>malloc(needed)
        if buf == NULL:
            raise MemoryError()
        try:
            status = capi.ckfmha_conv_explain(&problem,
                                              <capi.ckfmha_conv_direction>c_direction, c_arch,
                                              buf, needed, &needed)
            if status != capi.CKFMHA_ERROR_BUFFER_TOO_SMALL:
                check(status)
                return buf.decode("utf-8", "replace")
        finally:
            free(buf)
    raise BufferTooSmallError("explanation kept growing", 5)
