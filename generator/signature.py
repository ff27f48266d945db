"""Kernel keys: what a kernel computes (signature) and how (algorithm)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The name becomes part of a C symbol (ckfmha_kernel_<name>) and a file name.
_IDENTIFIER_TAIL = re.compile(r"^[A-Za-z0-9_]+$")


def _checked(name: str) -> str:
    if not _IDENTIFIER_TAIL.match(name):
        raise ValueError(f"kernel name {name!r} must contain only [A-Za-z0-9_]")
    return name


@dataclass(frozen=True, order=True)
class FwdSignature:
    """What a forward kernel computes; the runtime matches problems against these fields."""

    dtype: str
    mode: str  # "batch" | "group" (varlen with cu_seqlens)
    hdim_q: int
    hdim_v: int
    mask: str  # "none" | "causal" | "window"
    lse: bool
    family: str = "fwd"
    bias: str = "none"  # "none" | "elementwise" | "alibi"
    dropout: bool = False
    softcap: bool = False
    sink: bool = False
    v_col_major: bool = False  # V stored [.., hdim_v, seqlen_k]
    # Paged families (fwd_pagedkv, batch_prefill): how a page holds its keys, "linear"
    # [num_pages, page_size, nhead_k, hdim] or "vectorized" (vLLM's older layout: K [pages,
    # nhead_k, hdim / 8, page_size, 8], V [pages, nhead_k, hdim, page_size]).
    page_layout: str = "linear"
    # Split-KV and paged families: "e4m3" when K/V are fp8 (float8_e4m3fn) caches read with a
    # dequantisation scale, "none" when they are in dtype like Q.
    kv_quant: str = "none"
    # The Hopper fp8 forward (family fwd on sm90_tma_wgmma): "e4m3" when Q is fp8 too, so both
    # products run in e4m3; O stays in dtype.
    q_quant: str = "none"

    @property
    def name(self) -> str:
        # Feature tokens appear only when on, so feature-free names stay short and stable.
        bias = {"none": "", "elementwise": "_bias", "alibi": "_alibi"}.get(self.bias, self.bias)
        lse = "lse" if self.lse else "nolse"
        extras = "".join(
            token
            for token, on in (
                ("_drop", self.dropout),
                ("_softcap", self.softcap),
                ("_sink", self.sink),
                ("_vcol", self.v_col_major),
                ("_vecpages", self.page_layout == "vectorized"),
            )
            if on
        )
        return _checked(
            f"{self.family}_{self.dtype}_{self.mode}_d{self.hdim_q}x{self.hdim_v}_{self.mask}"
            f"{bias}_{lse}{extras}{quant_token(self.q_quant, self.kv_quant)}"
        )


def quant_token(q_quant: str, kv_quant: str) -> str:
    """The name's fp8 token: "_qkve4m3" when Q, K and V share one fp8 format, else "_q<fmt>"
    and "_kv<fmt>" for whichever is quantised ("" when none is)."""
    if q_quant != "none" and q_quant == kv_quant:
        return f"_qkv{q_quant}"
    q = f"_q{q_quant}" if q_quant != "none" else ""
    kv = f"_kv{kv_quant}" if kv_quant != "none" else ""
    return q + kv


# Split-KV bodies that read K/V through page tables: decode over a paged cache (batch-mode
# queries) and batch prefill (ragged group-mode queries). Page size and table kind (vLLM block
# table or SGLang indptr) are run-time values, not part of the signature.
FWD_PAGEDKV = "fwd_pagedkv"
BATCH_PREFILL = "batch_prefill"
PAGED_FAMILIES = (FWD_PAGEDKV, BATCH_PREFILL)
PAGE_LAYOUTS = ("linear", "vectorized")
# How K/V caches may be stored apart from the queries' dtype: in dtype, or fp8 e4m3.
KV_QUANTS = ("none", "e4m3")
# How queries may be stored: in dtype, or fp8 e4m3 (with fp8 K/V, on the Hopper forward).
Q_QUANTS = ("none", "e4m3")

# The three stages of the backward plan.
BWD_DOT_DO_O = "bwd_dot_do_o"
BWD_DQ_DK_DV = "bwd_dq_dk_dv"
BWD_CONVERT_DQ = "bwd_convert_dq"
BWD_FAMILIES = (BWD_DOT_DO_O, BWD_DQ_DK_DV, BWD_CONVERT_DQ)
# Stages that pass over rows only: D = rowsum(dO * O) (head dim hdim_v) and the dQ conversion
# (head dim hdim_q). Their signatures carry that one head dim in both fields.
BWD_ROWWISE_FAMILIES = (BWD_DOT_DO_O, BWD_CONVERT_DQ)


@dataclass(frozen=True, order=True)
class BwdSignature:
    """What a backward-stage kernel computes.

    bwd_dq_dk_dv carries the forward's features (mask, bias, dropout, soft-cap) and whether it
    writes dbias; the row-wise stages (bwd_dot_do_o, bwd_convert_dq) only dtype, mode and the
    one head dim they pass over (hdim_q == hdim_v). Determinism is a run-time switch, not part
    of the signature: one kernel serves both modes.
    """

    family: str  # one of BWD_FAMILIES
    dtype: str
    mode: str  # "batch" | "group"
    hdim_q: int
    hdim_v: int
    mask: str = "none"  # "none" | "causal" | "window"
    bias: str = "none"  # "none" | "elementwise" | "alibi"
    dropout: bool = False
    softcap: bool = False
    dbias: bool = False

    # Forward-only features, so code that reads any signature finds them (always off).
    @property
    def lse(self) -> bool:
        return False

    @property
    def sink(self) -> bool:
        return False

    @property
    def v_col_major(self) -> bool:
        return False

    @property
    def kv_quant(self) -> str:
        return "none"

    @property
    def q_quant(self) -> str:
        return "none"

    @property
    def is_rowwise(self) -> bool:
        return self.family in BWD_ROWWISE_FAMILIES

    @property
    def name(self) -> str:
        if self.is_rowwise:
            return _checked(f"{self.family}_{self.dtype}_{self.mode}_d{self.hdim_q}")
        bias = {"none": "", "elementwise": "_bias", "alibi": "_alibi"}.get(self.bias, self.bias)
        extras = "".join(
            token
            for token, on in (
                ("_drop", self.dropout),
                ("_softcap", self.softcap),
                ("_dbias", self.dbias),
            )
            if on
        )
        return _checked(
            f"{self.family}_{self.dtype}_{self.mode}_d{self.hdim_q}x{self.hdim_v}_{self.mask}"
            f"{bias}{extras}"
        )


class NoAttentionFeatures:
    """The attention features of a signature whose kernels have none (appends, convolutions),
    so code that reads any signature finds them, always off."""

    @property
    def mode(self) -> str:
        return "batch"

    @property
    def mask(self) -> str:
        return "none"

    @property
    def bias(self) -> str:
        return "none"

    @property
    def lse(self) -> bool:
        return False

    @property
    def dropout(self) -> bool:
        return False

    @property
    def softcap(self) -> bool:
        return False

    @property
    def sink(self) -> bool:
        return False

    @property
    def v_col_major(self) -> bool:
        return False

    @property
    def q_quant(self) -> str:
        return "none"


APPENDKV = "fwd_appendkv"
# Rotary embeddings of appended keys: none, pairs (2i, 2i+1) (GPT-J), pairs (i, i + d/2) (NeoX).
ROPE_MODES = ("none", "interleaved", "half_rotated")


@dataclass(frozen=True, order=True)
class AppendKvSignature(NoAttentionFeatures):
    """What a fwd_appendkv kernel computes: new K/V tokens written into a KV cache.

    hdim_q is the key head dim (the field name every signature shares), hdim_v the value one.
    `rope` rotates the keys (and queries, when a problem asks) at their cache positions;
    `paged` writes through a block table into fixed-size pages instead of a contiguous cache.
    """

    dtype: str
    hdim_q: int
    hdim_v: int
    rope: str = "none"
    paged: bool = False
    family: str = APPENDKV
    # "e4m3": the caches are fp8, written as e4m3(value / scale) for the split-KV body's fp8 K/V.
    kv_quant: str = "none"

    @property
    def name(self) -> str:
        paged = "_paged" if self.paged else ""
        return _checked(
            f"{self.family}_{self.dtype}_d{self.hdim_q}x{self.hdim_v}_rope_{self.rope}{paged}"
            f"{quant_token('none', self.kv_quant)}"
        )


# Grouped convolution: the forward pass and the weight gradient, families of their own on the
# same signature. The data gradient has no family: its plan runs forward kernels over dy (a
# convolution per stride phase with the flipped, transposed filter).
CONV_FWD = "conv_fwd"
CONV_BWD_WEIGHT = "conv_bwd_weight"
CONV_FAMILIES = (CONV_FWD, CONV_BWD_WEIGHT)
# 2D (NHWGC) and 3D (NDHWGC) problems.
CONV_SPATIAL_DIMS = (2, 3)
# Channels each global load and store moves at once: 8 is a 16-byte vector of fp16/bf16, the
# narrower ones serve channel counts, strides or pointers that 16 bytes do not divide.
CONV_VECTORS = (8, 4, 2, 1)
# Channel buckets of the direct kernel (groups of few channels on the CUDA cores): a kernel of
# bucket c runs groups whose input and output channels are both at most c. 0 is no bucket: the
# implicit-GEMM kernels, which take any channel count. conv_fwd builds buckets 1, 2 and 4,
# conv_bwd_weight 1 and 2 (generator.receipts).
CONV_MAX_CHANNELS = (1, 2, 4, 8)


@dataclass(frozen=True, order=True)
class ConvSignature(NoAttentionFeatures):
    """What a grouped-convolution kernel computes: its pass (`family`: y from x and w, or dw
    from x and dy), the element type, 2D or 3D, the channel vector its loads assume (the runtime
    picks the widest one the problem's channel count, strides and pointers allow, so every width
    is a kernel of its own) and, for a direct kernel (forward or weight gradient), the most
    input and output channels a group may have."""

    dtype: str  # "fp16" | "bf16"
    spatial_dims: int  # 2 | 3
    vector: int  # 8 | 4 | 2 | 1
    max_channels: int = 0  # 0: any (implicit GEMM); 1 | 2 | 4 | 8: the direct kernel
    family: str = CONV_FWD  # one of CONV_FAMILIES

    # Head dims and storage features, so code that reads any signature finds them (neutral).
    @property
    def hdim_q(self) -> int:
        return 0

    @property
    def hdim_v(self) -> int:
        return 0

    @property
    def page_layout(self) -> str:
        return "linear"

    @property
    def kv_quant(self) -> str:
        return "none"

    @property
    def name(self) -> str:
        # The channel bucket appears only on direct kernels, so implicit-GEMM names stay stable.
        bucket = f"_c{self.max_channels}" if self.max_channels else ""
        return _checked(f"{self.family}_{self.dtype}_{self.spatial_dims}d_v{self.vector}{bucket}")


Signature = FwdSignature | BwdSignature | AppendKvSignature | ConvSignature


@dataclass(frozen=True, order=True)
class Algorithm:
    """How a kernel computes: target arch, pipeline and tiling."""

    arch: str  # e.g. "sm_90a"
    pipeline: str  # e.g. "sm80_cpasync_mma"
    tile_m: int
    tile_n: int
    tile_k: int
    warps: int
    stages: int
    # CTAs per SM the kernel's register budget must allow (__launch_bounds__'s
    # second argument): ptxas caps registers per thread at 64K / (threads * this).
    ctas_per_sm: int = 1

    @property
    def name(self) -> str:
        # The occupancy token appears only when set, so existing names stay stable. Row-wise
        # backward stages have no key tile (tile_n = 0) and say so by leaving it out.
        occupancy = f"c{self.ctas_per_sm}" if self.ctas_per_sm != 1 else ""
        key_tile = f"n{self.tile_n}" if self.tile_n else ""
        return _checked(
            f"{self.arch}_{self.pipeline}_m{self.tile_m}{key_tile}k{self.tile_k}"
            f"_w{self.warps}s{self.stages}{occupancy}"
        )


@dataclass(frozen=True, order=True)
class KernelConfig:
    signature: Signature
    algorithm: Algorithm

    @property
    def name(self) -> str:
        """Stable and readable; `ckfmha_kernel_` + name is the instance's C symbol."""
        return f"{self.signature.name}__{self.algorithm.name}"

    @property
    def symbol(self) -> str:
        return f"ckfmha_kernel_{self.name}"
