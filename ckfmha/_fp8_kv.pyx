# cython: language_level=3
"""fp8 (e4m3) K/V for the forward runners and appends, and fp8 queries for fwd and fwd_varlen:
the views of q, k and v, and the (de)quantisation scales in the C problem (numbers) or args
(device arrays: one value, one per head, or, with fp8 queries, one per 128-token block of each
head). The rules and messages are in ckfmha.fp8_kv and ckfmha.fp8_attention."""

cimport ckfmha as capi
from ckfmha._arrays cimport ArrayView

from ckfmha import _dtypes
from ckfmha._arrays import as_view
from ckfmha.errors import InvalidArgumentError
from ckfmha._memory import contiguous_strides
from ckfmha.fp8_attention import block_scale_shape, check_q_scale_heads, scale_shape
from ckfmha.fp8_kv import (
    KV_QUANT_NONE,
    is_scale_value,
    scale_count,
    scale_value,
    scales_per_head,
)

_Q_DTYPES = (_dtypes.FP16, _dtypes.BF16, _dtypes.FP32)
# fp8 (or uint8) q and uint8 K/V pass the views, so that ckfmha.fp8_attention.q_quant_of and
# ckfmha.fp8_kv.kv_quant_of say what to do instead of listing the dtypes.
_VIEWED_Q_DTYPES = _Q_DTYPES + (_dtypes.FP8_E4M3, _dtypes.UINT8)
_KV_DTYPES = _Q_DTYPES + (_dtypes.FP8_E4M3, _dtypes.UINT8)
_F32 = (_dtypes.FP32,)


cdef tuple attention_views(q, k, v, handle, dtype, kv_dtype, int q_ndim, int k_ndim,
                           int v_ndim, str k_name, str v_name, q_dtype=None):
    """Views of q, k and v. ``dtype`` overrides what q reports unless ``q_dtype`` (e.g.
    "fp8_e4m3" for uint8 codes) is given, and k and v's too unless ``kv_dtype`` is;
    ckfmha.fp8_attention.q_quant_of and ckfmha.fp8_kv.kv_quant_of then check the
    combination."""
    kv_override = dtype if kv_dtype is None else kv_dtype
    q_override = dtype if q_dtype is None else q_dtype
    cdef ArrayView qv = as_view(q, handle, q_override, "q", q_ndim, _VIEWED_Q_DTYPES)
    cdef ArrayView kv = as_view(k, handle, kv_override, k_name, k_ndim, _KV_DTYPES)
    cdef ArrayView vv = as_view(v, handle, kv_override, v_name, v_ndim, _KV_DTYPES)
    return qv, kv, vv


cdef class KvScales:
    """The scales of one launch: numbers go to problem.k_scale / v_scale (q_scale), device
    arrays to args.k_scale / v_scale (q_scale) (zero-copy; host arrays are staged like the
    other small ones)."""

    def __cinit__(self):
        self.views = []
        self.regions = []
        self.per_head = False

    cdef ArrayView _view(self, scale, handle, str name, int nhead_k, str heads="nhead_k",
                         str head="K/V head"):
        shape = scale_shape(scale)
        # The length is checked from the shape, so a wrong one is not staged first.
        count = scale_count(shape, nhead_k, name, heads, head)
        cdef ArrayView view = as_view(scale, handle, None, name, len(shape), _F32)
        if count > 1 and view.strides[0] != 1:
            raise InvalidArgumentError(f"{name} must be contiguous, got strides {view.strides}",
                                       1)
        self.views.append(view)
        self.regions.append(view.region(name))
        return view

    cdef int resolve(self, k_scale, v_scale, handle, int nhead_k) except -1:
        """Reads k_scale and v_scale into k_value / v_value (numbers; 1 when not given) or
        k_ptr / v_ptr with per_head (device arrays). ckfmha.fp8_kv.check_scale_args has
        checked the numbers and that arrays come as a pair."""
        cdef ArrayView kv, vv
        self.k_value = 1.0
        self.v_value = 1.0
        self.per_head = False
        self.k_ptr = NULL
        self.v_ptr = NULL
        if _number(k_scale) and _number(v_scale):
            if k_scale is not None:
                self.k_value = scale_value(k_scale, "k_scale")
            if v_scale is not None:
                self.v_value = scale_value(v_scale, "v_scale")
            return 0
        kv = self._view(k_scale, handle, "k_scale", nhead_k)
        vv = self._view(v_scale, handle, "v_scale", nhead_k)
        self.per_head = scales_per_head(_count(kv), _count(vv), nhead_k)
        self.k_ptr = <const float*>kv.ptr
        self.v_ptr = <const float*>vv.ptr
        return 0

    cdef int apply(self, capi.ckfmha_fwd_problem* problem, capi.ckfmha_fwd_args* args,
                   int kv_quant, k_scale, v_scale, handle, int nhead_k) except -1:
        """Sets problem.kv_quant and the scales (kv_quant from ckfmha.fp8_kv.kv_quant_of,
        which refused scales for K/V that are not fp8)."""
        problem.kv_quant = <capi.ckfmha_kv_quant>kv_quant
        if kv_quant == KV_QUANT_NONE:
            return 0  # ckfmha_fwd_problem_init set both scales to 1
        self.resolve(k_scale, v_scale, handle, nhead_k)
        problem.k_scale = self.k_value
        problem.v_scale = self.v_value
        problem.kv_scale_per_head = 1 if self.per_head else 0
        args.k_scale = self.k_ptr
        args.v_scale = self.v_ptr
        return 0

    cdef int apply_query(self, capi.ckfmha_fwd_problem* problem, capi.ckfmha_fwd_args* args,
                         int q_quant, q_scale, handle, int nhead_q) except -1:
        """Sets problem.q_quant and q's scale (q_quant from ckfmha.fp8_attention.q_quant_of,
        which refused q_scale for a q that is not fp8). Runs after ``apply``: a device q_scale
        must agree with the K/V scales' per-head flag, which the problem holds once."""
        problem.q_quant = <capi.ckfmha_kv_quant>q_quant
        if q_quant == KV_QUANT_NONE:
            return 0  # ckfmha_fwd_problem_init set the scale to 1
        if _number(q_scale):
            if q_scale is not None:
                problem.q_scale = scale_value(q_scale, "q_scale", "q")
            return 0
        cdef ArrayView view = self._view(q_scale, handle, "q_scale", nhead_q, "nhead_q",
                                         "query head")
        check_q_scale_heads(_count(view), nhead_q, self.per_head)
        args.q_scale = <const float*>view.ptr
        return 0

    cdef ArrayView _block_view(self, scale, handle, str name):
        """A per-block scale array's fp32 view (shape checked by the caller): contiguous,
        since the kernels index it as [batch][head][block]."""
        cdef ArrayView view = as_view(scale, handle, None, name, 3, _F32)
        if not _contiguous(view):
            raise InvalidArgumentError(f"{name} must be contiguous (per-block scales are read "
                                       f"as [batch][head][block]), got strides {view.strides} "
                                       f"for shape {view.shape}", 1)
        self.views.append(view)
        self.regions.append(view.region(name))
        return view

    cdef int apply_blocks(self, capi.ckfmha_fwd_problem* problem, capi.ckfmha_fwd_args* args,
                          int kv_quant, int q_quant, q_scale, k_scale, v_scale, handle,
                          str seqlen_q_name, str seqlen_k_name) except -1:
        """Sets q_quant, kv_quant and per-block scales (ckfmha.fp8_attention.uses_block_scales
        chose them; q_quant_of made q and K/V fp8). Their shapes follow the problem's batch,
        heads and seqlens, which in group mode are the sequence count and the longest
        sequences; the seqlen names are the caller's arguments, for the messages."""
        problem.q_quant = <capi.ckfmha_kv_quant>q_quant
        problem.kv_quant = <capi.ckfmha_kv_quant>kv_quant
        cdef int block = capi.CKFMHA_FP8_SCALE_BLOCK
        q_shape = (problem.batch, problem.nhead_q,
                   capi.CKFMHA_FP8_SCALE_BLOCKS(problem.seqlen_q))
        kv_shape = (problem.batch, problem.nhead_k,
                    capi.CKFMHA_FP8_SCALE_BLOCKS(problem.seqlen_k))
        # Every shape is checked before any array is viewed, so a wrong one stages nothing.
        block_scale_shape("q_scale", scale_shape(q_scale), q_shape, "nhead_q", seqlen_q_name,
                          block)
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            block_scale_shape(name, scale_shape(scale), kv_shape, "nhead_k", seqlen_k_name, block)
        cdef ArrayView qv = self._block_view(q_scale, handle, "q_scale")
        cdef ArrayView kv = self._block_view(k_scale, handle, "k_scale")
        cdef ArrayView vv = self._block_view(v_scale, handle, "v_scale")
        # Block scales are per head already; the host scalars stay at ckfmha_fwd_problem_init's 1.
        problem.fp8_block_scales = 1
        problem.kv_scale_per_head = 0
        args.q_scale = <const float*>qv.ptr
        args.k_scale = <const float*>kv.ptr
        args.v_scale = <const float*>vv.ptr
        return 0

    cdef int apply_append(self, capi.ckfmha_appendkv_problem* problem,
                          capi.ckfmha_appendkv_args* args, int cache_quant, k_scale, v_scale,
                          handle, int nhead_k) except -1:
        """``apply`` for an append: the scales the caches' codes are divided by
        (cache_quant from ckfmha.fp8_kv.append_quant_of)."""
        problem.cache_quant = <capi.ckfmha_kv_quant>cache_quant
        if cache_quant == KV_QUANT_NONE:
            return 0  # ckfmha_appendkv_problem_init set both scales to 1
        self.resolve(k_scale, v_scale, handle, nhead_k)
        problem.k_scale = self.k_value
        problem.v_scale = self.v_value
        problem.scale_per_head = 1 if self.per_head else 0
        args.k_scale = self.k_ptr
        args.v_scale = self.v_ptr
        return 0


cdef bint _number(scale):
    return scale is None or is_scale_value(scale)


cdef int _count(ArrayView view):
    return view.shape[0] if view.shape else 1


cdef bint _contiguous(ArrayView view):
    """Row-major over the axes that hold more than one value (a size-1 axis's stride is
    never used, and producers report various ones)."""
    return all(extent == 1 or stride == expected for extent, stride, expected in
               zip(view.shape, view.strides, contiguous_strides(view.shape)))
