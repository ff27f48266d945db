# cython: language_level=3
"""FwdProblem (a Python dataclass) <-> the C struct ckfmha_fwd_problem."""

from libc.stdint cimport int64_t

cimport ckfmha as capi
from ckfmha._status cimport check

from ckfmha.errors import InvalidArgumentError
from ckfmha.problem import bias_code, kv_storage_code, mode_code, page_layout_code, window_bounds

_INT32_MIN = -(2 ** 31)
_INT32_MAX = 2 ** 31 - 1


cdef int to_int32(value, str field) except? -1:
    # Out-of-range sizes are an argument error, not Cython's OverflowError.
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{field} must be an integer, got {value!r}", 1) from None
    if not _INT32_MIN <= number <= _INT32_MAX:
        raise InvalidArgumentError(f"{field}={number} does not fit in int32", 1)
    return number


cdef int fill_fwd_problem(object problem, capi.ckfmha_fwd_problem* out) except -1:
    check(capi.ckfmha_fwd_problem_init(
        out,
        <capi.ckfmha_dtype>problem.dtype_code,
        <capi.ckfmha_layout>problem.layout_code,
        to_int32(problem.batch, "batch"),
        to_int32(problem.nhead_q, "nhead_q"),
        to_int32(problem.kv_heads, "nhead_k"),
        to_int32(problem.seqlen_q, "seqlen_q"),
        to_int32(problem.kv_seqlen, "seqlen_k"),
        to_int32(problem.hdim, "hdim"),
        to_int32(problem.value_hdim, "hdim_v"),
    ))
    out.mask = <capi.ckfmha_mask>problem.mask_code
    left, right = window_bounds(problem.window)
    out.window_left = to_int32(left, "window left")
    out.window_right = to_int32(right, "window right")
    out.store_lse = 1 if problem.lse else 0
    if problem.scale is not None:
        out.scale = float(problem.scale)
    out.softcap = float(problem.softcap)
    cdef int bias = bias_code(problem.bias)
    cdef int mode = mode_code(problem.mode)
    out.bias = <capi.ckfmha_bias>bias
    if bias == capi.CKFMHA_BIAS_ELEMENTWISE:
        # A contiguous [batch, nhead_q, seqlen_q or 1, seqlen_k] bias (0 broadcasts a row).
        out.bias_stride[2] = 0 if problem.bias_rows_broadcast else out.seqlen_k
        out.bias_stride[1] = <int64_t>(1 if problem.bias_rows_broadcast else out.seqlen_q) \
            * out.seqlen_k
        out.bias_stride[0] = <int64_t>out.nhead_q * out.bias_stride[1]
    out.has_sink = 1 if problem.sink else 0
    out.dropout_p = float(problem.dropout_p)
    out.mode = <capi.ckfmha_mode>mode
    out.skip_min_seqlen_q = to_int32(problem.skip_min_seqlen_q, "skip_min_seqlen_q")
    if mode == capi.CKFMHA_MODE_GROUP:
        # Unless given, the packed tensors are taken at their largest: every
        # sequence at the longest length.
        out.total_q = (<int64_t>out.batch * out.seqlen_q if problem.total_q is None
                       else problem.total_q)
        out.total_k = (<int64_t>out.batch * out.seqlen_k if problem.total_k is None
                       else problem.total_k)
    out.num_splits = to_int32(problem.num_splits, "num_splits")
    out.kv_quant = <capi.ckfmha_kv_quant><int>problem.kv_quant_code
    out.kv_scale_per_head = 1 if problem.kv_scale_per_head else 0
    out.k_scale = float(problem.k_scale)
    out.v_scale = float(problem.v_scale)
    out.q_quant = <capi.ckfmha_kv_quant><int>problem.q_quant_code
    out.q_scale = float(problem.q_scale)
    if problem.v_col_major:
        # Contiguous [batch, nhead_k, hdim_v, seqlen_k]: the third stride is the head dim's.
        out.v_col_major = 1
        out.v_stride[2] = out.seqlen_k
        out.v_stride[1] = <int64_t>out.hdim_v * out.seqlen_k
        out.v_stride[0] = <int64_t>out.nhead_k * out.v_stride[1]
    cdef int storage = kv_storage_code(problem.paged_kv)
    cdef int page_layout = page_layout_code(problem.page_layout)
    if storage != capi.CKFMHA_KV_CONTIGUOUS:
        # Linear caches [num_pages, page_size, nhead_k, hdim]: (page, head, token) strides.
        out.kv_storage = <capi.ckfmha_kv_storage>storage
        out.page_layout = <capi.ckfmha_page_layout>page_layout
        out.page_size = to_int32(problem.page_size, "page_size")
        page_tokens = max(out.page_size, 1)
        pages = (-(-out.seqlen_k // page_tokens) if problem.max_pages_per_seq is None
                 else problem.max_pages_per_seq)
        out.max_pages_per_seq = to_int32(pages, "max_pages_per_seq")
        out.block_table_stride = out.max_pages_per_seq
        out.num_pages = to_int32(
            <int64_t>out.batch * out.max_pages_per_seq if problem.num_pages is None
            else problem.num_pages, "num_pages")
        if storage == capi.CKFMHA_KV_PAGED_INDPTR:
            out.num_kv_indices = out.num_pages
        if page_layout == capi.CKFMHA_PAGE_LAYOUT_VECTORIZED:
            # Contiguous k [pages, nhead_k, hdim / 8, page_size, 8]: (page, head, chunk);
            # v [pages, nhead_k, hdim, page_size]: (page, head, channel).
            out.k_stride[2] = <int64_t>page_tokens * 8
            out.k_stride[1] = <int64_t>page_tokens * out.hdim_q
            out.k_stride[0] = <int64_t>out.nhead_k * out.k_stride[1]
            out.v_stride[2] = page_tokens
            out.v_stride[1] = <int64_t>page_tokens * out.hdim_v
            out.v_stride[0] = <int64_t>out.nhead_k * out.v_stride[1]
            return 0
        out.k_stride[2] = <int64_t>out.nhead_k * out.hdim_q
        out.k_stride[1] = out.hdim_q
        out.k_stride[0] = <int64_t>page_tokens * out.k_stride[2]
        out.v_stride[2] = <int64_t>out.nhead_k * out.hdim_v
        out.v_stride[1] = out.hdim_v
        out.v_stride[0] = <int64_t>page_tokens * out.v_stride[2]
    return 0


cdef tuple _triple(const int64_t* values):
    return (values[0], values[1], values[2])


cdef tuple _pair(const int64_t* values):
    return (values[0], values[1])


cdef dict fwd_problem_dict(const capi.ckfmha_fwd_problem* problem):
    return {
        "dtype": <int>problem.dtype,
        "mode": <int>problem.mode,
        "batch": problem.batch,
        "nhead_q": problem.nhead_q,
        "nhead_k": problem.nhead_k,
        "seqlen_q": problem.seqlen_q,
        "seqlen_k": problem.seqlen_k,
        "hdim_q": problem.hdim_q,
        "hdim_v": problem.hdim_v,
        "mask": <int>problem.mask,
        "window": (problem.window_left, problem.window_right),
        "scale": problem.scale,
        "softcap": problem.softcap,
        "bias": <int>problem.bias,
        "has_sink": problem.has_sink,
        "dropout_p": problem.dropout_p,
        "dropout_seed": problem.dropout_seed,
        "dropout_offset": problem.dropout_offset,
        "store_dropout_randval": problem.store_dropout_randval,
        "skip_min_seqlen_q": problem.skip_min_seqlen_q,
        "v_col_major": problem.v_col_major,
        "store_lse": problem.store_lse,
        "q_stride": _triple(problem.q_stride),
        "k_stride": _triple(problem.k_stride),
        "v_stride": _triple(problem.v_stride),
        "o_stride": _triple(problem.o_stride),
        "lse_stride": _pair(problem.lse_stride),
        "bias_stride": _triple(problem.bias_stride),
        "alibi_stride": problem.alibi_stride,
        "total_q": problem.total_q,
        "total_k": problem.total_k,
        "num_splits": problem.num_splits,
        "kv_storage": <int>problem.kv_storage,
        "page_layout": <int>problem.page_layout,
        "page_size": problem.page_size,
        "max_pages_per_seq": problem.max_pages_per_seq,
        "block_table_stride": problem.block_table_stride,
        "num_pages": problem.num_pages,
        "num_kv_indices": problem.num_kv_indices,
        "kv_quant": <int>problem.kv_quant,
        "kv_scale_per_head": problem.kv_scale_per_head,
        "k_scale": problem.k_scale,
        "v_scale": problem.v_scale,
        "q_quant": <int>problem.q_quant,
        "q_scale": problem.q_scale,
    }


def as_dict(problem) -> dict:
    """The C struct built from ``problem`` (a FwdProblem), as a dict."""
    cdef capi.ckfmha_fwd_problem c_problem
    fill_fwd_problem(problem, &c_problem)
    return fwd_problem_dict(&c_problem)


def validate(problem) -> None:
    """Check shapes and strides in the C library; raises InvalidArgumentError."""
    cdef capi.ckfmha_fwd_problem c_problem
    fill_fwd_problem(problem, &c_problem)
    check(capi.ckfmha_fwd_problem_validate(&c_problem))


cdef int fill_bwd_problem(object problem, bint deterministic,
                          capi.ckfmha_bwd_problem* out) except -1:
    """The backward problem of a FwdProblem: its shapes and features, contiguous gradients."""
    cdef capi.ckfmha_fwd_problem forward
    fill_fwd_problem(problem, &forward)
    if forward.v_col_major:
        raise InvalidArgumentError("the backward takes row-major V (v_col_major=False)", 1)
    if forward.q_quant != capi.CKFMHA_KV_QUANT_NONE:
        raise InvalidArgumentError("the backward takes q in the problem's dtype; fp8 queries "
                                   "(q_dtype) are for inference, with no gradients", 1)
    if forward.kv_quant != capi.CKFMHA_KV_QUANT_NONE:
        raise InvalidArgumentError("the backward takes K/V in the problem's dtype; fp8 K/V "
                                   "(kv_dtype) is for inference, with no gradients", 1)
    check(capi.ckfmha_bwd_problem_init(
        out, forward.dtype, <capi.ckfmha_layout>problem.layout_code, forward.batch,
        forward.nhead_q, forward.nhead_k, forward.seqlen_q, forward.seqlen_k, forward.hdim_q,
        forward.hdim_v))
    out.mode = forward.mode
    out.mask = forward.mask
    out.window_left = forward.window_left
    out.window_right = forward.window_right
    out.scale = forward.scale
    out.softcap = forward.softcap
    out.bias = forward.bias
    # The forward's bias strides: a contiguous bias, or one row per sequence where the problem
    # says its rows broadcast (the Hopper main stage takes only those).
    out.bias_stride = forward.bias_stride
    # A forward with sinks: the backward also writes their gradient (the same kernels).
    out.has_sink = forward.has_sink
    out.dropout_p = forward.dropout_p
    out.deterministic = 1 if deterministic else 0
    out.total_q = forward.total_q
    out.total_k = forward.total_k
    return 0
