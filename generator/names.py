"""Kernel names back to kernel configs: a name is the whole key, so any kernel can be asked for
by name (``python -m ckfmha build --kernels NAME``), in a kernel set or not."""

from __future__ import annotations

import re

from .signature import (
    APPENDKV,
    BWD_DQ_DK_DV,
    CONV_BWD_WEIGHT,
    CONV_FWD,
    Algorithm,
    AppendKvSignature,
    BwdSignature,
    ConvSignature,
    FwdSignature,
    KernelConfig,
    Signature,
)

_ALGORITHM = re.compile(
    r"(?P<arch>sm_\d+a?)_(?P<pipeline>[a-z0-9_]+?)_m(?P<m>\d+)(?:n(?P<n>\d+))?k(?P<k>\d+)"
    r"_w(?P<w>\d+)s(?P<s>\d+)(?:c(?P<c>\d+))?"
)
_FWD = re.compile(
    r"(?P<family>fwd_splitkv_combine|fwd_splitkv|fwd_pagedkv|batch_prefill|fwd)"
    r"_(?P<dtype>fp16|bf16|fp32)_(?P<mode>batch|group)_d(?P<q>\d+)x(?P<v>\d+)"
    r"_(?P<mask>none|causal|window)(?:_(?P<bias>bias|alibi))?_(?P<lse>lse|nolse)"
    r"(?P<drop>_drop)?(?P<softcap>_softcap)?(?P<sink>_sink)?(?P<vcol>_vcol)?"
    r"(?P<vecpages>_vecpages)?"
    # signature.quant_token: one token when Q, K and V share an fp8 format, else one each.
    r"(?:_qkv(?P<qkv_quant>e4m3)|(?:_q(?P<q_quant>e4m3))?(?:_kv(?P<kv_quant>e4m3))?)"
)
_BWD_ROWWISE = re.compile(
    r"(?P<family>bwd_dot_do_o|bwd_convert_dq)_(?P<dtype>fp16|bf16|fp32)_(?P<mode>batch|group)"
    r"_d(?P<q>\d+)"
)
_BWD_MAIN = re.compile(
    rf"{BWD_DQ_DK_DV}_(?P<dtype>fp16|bf16|fp32)_(?P<mode>batch|group)_d(?P<q>\d+)x(?P<v>\d+)"
    r"_(?P<mask>none|causal|window)(?:_(?P<bias>bias|alibi))?(?P<drop>_drop)?"
    r"(?P<softcap>_softcap)?(?P<dbias>_dbias)?"
)
_APPENDKV = re.compile(
    rf"{APPENDKV}_(?P<dtype>fp16|bf16|fp32)_d(?P<q>\d+)x(?P<v>\d+)"
    r"_rope_(?P<rope>none|interleaved|half_rotated)(?P<paged>_paged)?(?:_kv(?P<kv_quant>e4m3))?"
)
# Any dims, vector and channel bucket read back, so that the rules can say what is supported.
_CONV = re.compile(
    rf"(?P<family>{CONV_FWD}|{CONV_BWD_WEIGHT})_(?P<dtype>fp16|bf16|fp32)"
    r"_(?P<dims>\d+)d_v(?P<vector>\d+)(?:_c(?P<max_channels>\d+))?"
)
_BIAS = {None: "none", "bias": "elementwise", "alibi": "alibi"}


def _signature(text: str) -> Signature | None:
    if match := _CONV.fullmatch(text):
        return ConvSignature(
            dtype=match["dtype"], spatial_dims=int(match["dims"]), vector=int(match["vector"]),
            max_channels=int(match["max_channels"] or 0), family=match["family"],
        )  # fmt: skip
    if match := _APPENDKV.fullmatch(text):
        return AppendKvSignature(
            dtype=match["dtype"], hdim_q=int(match["q"]), hdim_v=int(match["v"]),
            rope=match["rope"], paged=bool(match["paged"]), kv_quant=match["kv_quant"] or "none",
        )  # fmt: skip
    if match := _BWD_ROWWISE.fullmatch(text):
        hdim = int(match["q"])
        return BwdSignature(match["family"], match["dtype"], match["mode"], hdim, hdim)
    if match := _BWD_MAIN.fullmatch(text):
        return BwdSignature(
            BWD_DQ_DK_DV, match["dtype"], match["mode"], int(match["q"]), int(match["v"]),
            match["mask"], _BIAS[match["bias"]], bool(match["drop"]), bool(match["softcap"]),
            bool(match["dbias"]),
        )  # fmt: skip
    if match := _FWD.fullmatch(text):
        return FwdSignature(
            dtype=match["dtype"], mode=match["mode"], hdim_q=int(match["q"]),
            hdim_v=int(match["v"]), mask=match["mask"], lse=match["lse"] == "lse",
            family=match["family"], bias=_BIAS[match["bias"]], dropout=bool(match["drop"]),
            softcap=bool(match["softcap"]), sink=bool(match["sink"]),
            v_col_major=bool(match["vcol"]),
            page_layout="vectorized" if match["vecpages"] else "linear",
            kv_quant=match["qkv_quant"] or match["kv_quant"] or "none",
            q_quant=match["qkv_quant"] or match["q_quant"] or "none",
        )  # fmt: skip
    return None


def parse_kernel_name(name: str) -> KernelConfig | None:
    """The config whose name is ``name``, or None if ``name`` is not a kernel name. Whether the
    config can be built is for the generator's rules to say (rules.check)."""
    signature_text, separator, algorithm_text = name.partition("__")
    match = _ALGORITHM.fullmatch(algorithm_text)
    signature = _signature(signature_text)
    if not separator or match is None or signature is None:
        return None
    algorithm = Algorithm(
        arch=match["arch"], pipeline=match["pipeline"], tile_m=int(match["m"]),
        tile_n=int(match["n"] or 0), tile_k=int(match["k"]), warps=int(match["w"]),
        stages=int(match["s"]), ctas_per_sm=int(match["c"] or 1),
    )  # fmt: skip
    config = KernelConfig(signature, algorithm)
    # Names are canonical: a spelling the generator would not write is no kernel name.
    return config if config.name == name else None
