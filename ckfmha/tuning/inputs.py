"""Random device tensors for one problem, as a forced ``fwd`` or ``bwd`` call takes them.

Problems are the dispatcher's keyword fields (``Dispatcher.explain(**fields)``): batch,
nhead_q, nhead_k, seqlen_q, seqlen_k, hdim, hdim_v, dtype, causal, causal_alignment; the
optional ones default as FwdProblem's do. A group-mode (varlen) forward problem adds mode
"group" and its sequences' lengths, seqlens_q and seqlens_k (which Dispatcher.explain does not
take: ``explain_fields`` drops them). torch is imported inside the functions, so the package
imports without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _size(fields: Mapping[str, Any], name: str, fallback: str) -> int:
    value = fields.get(name)
    return int(fields[fallback] if value is None else value)


# Fields that describe the inputs only.
INPUT_ONLY_FIELDS = ("seqlens_q", "seqlens_k")


def explain_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields Dispatcher.explain takes (the problem without its sequences' lengths)."""
    return {k: v for k, v in fields.items() if k not in INPUT_ONLY_FIELDS}


def is_varlen(fields: Mapping[str, Any]) -> bool:
    return fields.get("mode") == "group"


def mask_options(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The mask as ckfmha.fwd/bwd take it: nothing for an unmasked problem."""
    if not fields.get("causal"):
        return {}
    return {"causal": True, "causal_alignment": fields.get("causal_alignment", "top_left")}


def problem_inputs(kind: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """q, k, v ([batch, heads, seqlen, hdim]) and, for "bwd", do plus the forward's o and lse."""
    import torch

    import ckfmha

    name = fields.get("dtype", "fp16")  # FwdProblem's default
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]
    b, hq, hk = int(fields["batch"]), int(fields["nhead_q"]), _size(fields, "nhead_k", "nhead_q")
    sq, sk = int(fields["seqlen_q"]), _size(fields, "seqlen_k", "seqlen_q")
    hdim, hdim_v = int(fields["hdim"]), _size(fields, "hdim_v", "hdim")

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", dtype=dtype)

    if is_varlen(fields):
        if kind != "fwd":
            raise ValueError("group-mode (varlen) problems are timed for the forward only")
        return _packed_inputs(fields, randn)
    tensors = {"q": randn(b, hq, sq, hdim), "k": randn(b, hk, sk, hdim),
               "v": randn(b, hk, sk, hdim_v)}  # fmt: skip
    if kind == "bwd":
        tensors["do"] = randn(b, hq, sq, hdim_v)
        tensors["o"], tensors["lse"] = ckfmha.fwd(tensors["q"], tensors["k"], tensors["v"],
                                                  return_lse=True, **mask_options(fields))
    return tensors


def _offsets(lengths: list[int]) -> Any:
    """Device int32 offsets [0, l0, l0 + l1, ...] of packed sequences."""
    import itertools

    import torch

    return torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)


def _packed_inputs(fields: Mapping[str, Any], randn: Any) -> dict[str, Any]:
    """q [total_q, nhead_q, hdim], k and v [total_k, nhead_k, hdim / hdim_v] and the offsets."""
    lengths_q, lengths_k = list(fields["seqlens_q"]), list(fields["seqlens_k"])
    if len(lengths_q) != len(lengths_k) or len(lengths_q) != int(fields["batch"]):
        raise ValueError("seqlens_q and seqlens_k need one length per sequence of the batch")
    hq, hk = int(fields["nhead_q"]), _size(fields, "nhead_k", "nhead_q")
    hdim, hdim_v = int(fields["hdim"]), _size(fields, "hdim_v", "hdim")
    return {"q": randn(sum(lengths_q), hq, hdim), "k": randn(sum(lengths_k), hk, hdim),
            "v": randn(sum(lengths_k), hk, hdim_v), "cu_seqlens_q": _offsets(lengths_q),
            "cu_seqlens_k": _offsets(lengths_k), "max_seqlen_q": max(lengths_q),
            "max_seqlen_k": max(lengths_k)}  # fmt: skip
