"""Problem descriptions built from shapes alone, for selection and explanation on any machine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ckfmha import _dtypes
from ckfmha.errors import InvalidArgumentError

Layout = Literal["bhsd", "bshd"]
CausalAlignment = Literal["top_left", "bottom_right"]

# Values of the C enums ckfmha_layout and ckfmha_mask.
LAYOUTS = {"bhsd": 0, "bshd": 1}
MASK_NONE = 0
MASK_CAUSAL_TOP_LEFT = 1
MASK_CAUSAL_BOTTOM_RIGHT = 2
MASK_WINDOW_TOP_LEFT = 3
MASK_WINDOW_BOTTOM_RIGHT = 4
CAUSAL_ALIGNMENTS = {"top_left": MASK_CAUSAL_TOP_LEFT, "bottom_right": MASK_CAUSAL_BOTTOM_RIGHT}
WINDOW_ALIGNMENTS = {"top_left": MASK_WINDOW_TOP_LEFT, "bottom_right": MASK_WINDOW_BOTTOM_RIGHT}
# Values of the C enums ckfmha_bias and ckfmha_mode.
BIASES = {"none": 0, "elementwise": 1, "alibi": 2}
MODES = {"batch": 0, "group": 1}
# Values of the C enums ckfmha_kv_storage and ckfmha_page_layout.
KV_STORAGES = {None: 0, "block_table": 1, "kv_indptr": 2}
PAGE_LAYOUTS = {"linear": 0, "vectorized": 1}
# Values of the C enum ckfmha_kv_quant, by the generator's spelling of the signature field.
KV_QUANTS = {"none": 0, "e4m3": 1}


def layout_code(layout: str) -> int:
    if layout not in LAYOUTS:
        raise InvalidArgumentError(f"layout must be 'bhsd' or 'bshd', got {layout!r}", 1)
    return LAYOUTS[layout]


def mask_code(causal: bool, causal_alignment: str, window: tuple[int, int] | None = None) -> int:
    """The C mask for a causal flag or a (left, right) window; alignment applies to both."""
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise InvalidArgumentError(
            f"causal_alignment must be 'top_left' or 'bottom_right', got {causal_alignment!r}", 1
        )
    if window is not None:
        if causal:
            raise InvalidArgumentError(
                "pass causal=True or window=(left, right), not both (causal is window (-1, 0))", 1
            )
        return WINDOW_ALIGNMENTS[causal_alignment]
    return CAUSAL_ALIGNMENTS[causal_alignment] if causal else MASK_NONE


def window_bounds(window: tuple[int, int] | None) -> tuple[int, int]:
    """(left, right) key counts, -1 meaning unbounded."""
    if window is None:
        return (-1, -1)
    try:
        left, right = (int(x) for x in window)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"window must be a (left, right) pair of ints, got {window!r}", 1
        ) from None
    return left, right


def bias_code(bias: str) -> int:
    if bias not in BIASES:
        raise InvalidArgumentError(f"bias must be one of {', '.join(BIASES)}, got {bias!r}", 1)
    return BIASES[bias]


def kv_storage_code(paged_kv: str | None) -> int:
    if paged_kv not in KV_STORAGES:
        raise InvalidArgumentError(
            f"paged_kv must be None, 'block_table' or 'kv_indptr', got {paged_kv!r}", 1
        )
    return KV_STORAGES[paged_kv]


def page_layout_code(page_layout: str) -> int:
    if page_layout not in PAGE_LAYOUTS:
        raise InvalidArgumentError(
            f"page_layout must be 'linear' or 'vectorized', got {page_layout!r}", 1
        )
    return PAGE_LAYOUTS[page_layout]


def kv_quant_code(kv_dtype: Any, dtype: Any) -> int:
    """The C ckfmha_kv_quant of K/V stored as ``kv_dtype`` in a problem of ``dtype``: 0 for None
    (K/V in dtype, like q) or dtype itself, 1 for fp8 e4m3 ("fp8_e4m3", "e4m3",
    float8_e4m3fn)."""
    return _quant_code(kv_dtype, dtype, "kv_dtype", "K/V")


def q_quant_code(q_dtype: Any, dtype: Any) -> int:
    """The C problem's q_quant for queries stored as ``q_dtype`` in a problem whose output is
    ``dtype``: 0 for None or dtype itself, 1 for fp8 e4m3 (which needs fp8 K/V)."""
    return _quant_code(q_dtype, dtype, "q_dtype", "q")


def _quant_code(stored: Any, dtype: Any, field: str, what: str) -> int:
    if stored is None:
        return KV_QUANTS["none"]
    code = _dtypes.dtype_code(stored)
    if code == _dtypes.FP8_E4M3:
        return KV_QUANTS["e4m3"]
    if code != _dtypes.dtype_code(dtype):
        raise InvalidArgumentError(
            f"{field} must be None ({what} in the problem's dtype, {dtype}) or 'fp8_e4m3', got "
            f"{stored!r}",
            1,
        )
    return KV_QUANTS["none"]


def mode_code(mode: str) -> int:
    if mode not in MODES:
        raise InvalidArgumentError(f"mode must be 'batch' or 'group', got {mode!r}", 1)
    return MODES[mode]


@dataclass(frozen=True)
class FwdProblem:
    """A forward attention problem described by shapes, with contiguous strides.

    q is [batch, nhead_q, seqlen_q, hdim] (or bshd), k/v [batch, nhead_k,
    seqlen_k, hdim / hdim_v]. Unset nhead_k, seqlen_k and hdim_v default to
    nhead_q, seqlen_q and hdim. The feature fields say what ``fwd`` would be
    asked for (``window`` (left, right) with -1 unbounded, ``bias`` "none",
    "elementwise" or "alibi", ``sink``, ``dropout_p``, ``mode`` "batch" or
    "group"), so selection and explanation work without arrays or a GPU. In group
    mode ``total_q``/``total_k`` are the packed tensors' token counts (None: ``batch``
    sequences of the longest length); kernels check every sequence range against them.
    ``kv_dtype="fp8_e4m3"`` describes fp8 K/V (``fwd``'s float8_e4m3fn k and v), dequantised
    by ``k_scale``/``v_scale`` (one per K/V head with ``kv_scale_per_head``, which stands for
    device scale arrays). ``q_dtype="fp8_e4m3"`` (with fp8 K/V) describes fp8 queries,
    dequantised by ``q_scale`` (one per query head with ``kv_scale_per_head``); ``dtype`` is
    then the output's (fp16 or bf16). Validation happens in the C library, so the errors match those of
    ``fwd``.
    """

    batch: int
    nhead_q: int
    seqlen_q: int
    hdim: int
    nhead_k: int | None = None
    seqlen_k: int | None = None
    hdim_v: int | None = None
    dtype: str = "fp16"
    causal: bool = False
    causal_alignment: CausalAlignment = "top_left"
    lse: bool = False
    layout: Layout = "bhsd"
    scale: float | None = None
    window: tuple[int, int] | None = None
    softcap: float = 0.0
    bias: str = "none"  # "none" | "elementwise" | "alibi"
    # An elementwise bias broadcast over the query rows ([b, 1 or h, 1, sk]: key-padding
    # masks), which some kernels take only in that form.
    bias_rows_broadcast: bool = False
    sink: bool = False
    dropout_p: float = 0.0
    mode: str = "batch"  # "batch" | "group" (varlen; seqlens are then the longest sequence)
    skip_min_seqlen_q: int = 0
    v_col_major: bool = False  # v is [batch, nhead_k, hdim_v, seqlen_k]
    total_q: int | None = None  # group mode: tokens in the packed q
    total_k: int | None = None  # group mode: tokens in the packed k/v
    num_splits: int = 0  # 0: the dispatcher decides; 1: one stage; n > 1: split-KV with n splits
    # Paged K/V cache: None (contiguous), "block_table" (vLLM) or "kv_indptr" (SGLang); pages
    # of page_size tokens, laid out "linear" or "vectorized"; a block table holds
    # max_pages_per_seq entries per row (None: enough for seqlen_k); the caches hold num_pages
    # pages (None: batch * max_pages_per_seq), against which kernels check every page id.
    paged_kv: str | None = None
    page_size: int = 16
    page_layout: str = "linear"
    max_pages_per_seq: int | None = None
    num_pages: int | None = None
    # fp8 K/V: None (k, v in dtype) or "fp8_e4m3"; the values stand for k_scale * k and
    # v_scale * v. kv_scale_per_head: nhead_k scales each (device arrays in fwd).
    kv_dtype: str | None = None
    k_scale: float = 1.0
    v_scale: float = 1.0
    kv_scale_per_head: bool = False
    # fp8 queries: None (q in dtype) or "fp8_e4m3"; the values stand for q_scale * q, and
    # dtype is the output's.
    q_dtype: str | None = None
    q_scale: float = 1.0

    @property
    def kv_heads(self) -> int:
        return self.nhead_q if self.nhead_k is None else self.nhead_k

    @property
    def kv_seqlen(self) -> int:
        return self.seqlen_q if self.seqlen_k is None else self.seqlen_k

    @property
    def value_hdim(self) -> int:
        return self.hdim if self.hdim_v is None else self.hdim_v

    @property
    def dtype_code(self) -> int:
        return _dtypes.dtype_code(self.dtype)

    @property
    def layout_code(self) -> int:
        return layout_code(self.layout)

    @property
    def kv_quant_code(self) -> int:
        return kv_quant_code(self.kv_dtype, self.dtype)

    @property
    def q_quant_code(self) -> int:
        return q_quant_code(self.q_dtype, self.dtype)

    @property
    def mask_code(self) -> int:
        return mask_code(self.causal, self.causal_alignment, self.window)

    def flops(self) -> float:
        """FLOPs by the usual attention convention: 2 GEMMs, halved when causal."""
        qk = 2.0 * self.batch * self.nhead_q * self.seqlen_q * self.kv_seqlen * self.hdim
        pv = 2.0 * self.batch * self.nhead_q * self.seqlen_q * self.kv_seqlen * self.value_hdim
        return (qk + pv) / (2.0 if self.causal else 1.0)

    def validate(self) -> None:
        """Raise InvalidArgumentError when the C library rejects the shapes."""
        from ckfmha._problem import validate

        validate(self)

    def to_c_dict(self) -> dict[str, Any]:
        """The C struct ckfmha_fwd_problem this problem becomes, as a dict."""
        from ckfmha._problem import as_dict

        return as_dict(self)
