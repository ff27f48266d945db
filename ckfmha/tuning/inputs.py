"""Random device tensors for one problem, as a forced ``fwd`` or ``bwd`` call takes them.

Problems are the dispatcher's keyword fields (``Dispatcher.explain(**fields)``): batch,
nhead_q, nhead_k, seqlen_q, seqlen_k, hdim, hdim_v, dtype, causal, causal_alignment; the
optional ones default as FwdProblem's do. torch is imported inside the functions, so the
package imports without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _size(fields: Mapping[str, Any], name: str, fallback: str) -> int:
    value = fields.get(name)
    return int(fields[fallback] if value is None else value)


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

    tensors = {"q": randn(b, hq, sq, hdim), "k": randn(b, hk, sk, hdim),
               "v": randn(b, hk, sk, hdim_v)}  # fmt: skip
    if kind == "bwd":
        tensors["do"] = randn(b, hq, sq, hdim_v)
        tensors["o"], tensors["lse"] = ckfmha.fwd(tensors["q"], tensors["k"], tensors["v"],
                                                  return_lse=True, **mask_options(fields))
    return tensors
