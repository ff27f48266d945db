"""Forward attention on torch tensors: zero-copy in, torch out, checked against torch SDPA.

python examples/fwd_torch.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import ckfmha


def main() -> None:
    batch, heads, kv_heads, seqlen, hdim = 2, 16, 4, 2048, 128
    q = torch.randn(batch, heads, seqlen, hdim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, kv_heads, seqlen, hdim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)

    out, lse = ckfmha.fwd(q, k, v, causal=True, return_lse=True)

    # torch's reference needs K/V repeated per query head for GQA.
    group = heads // kv_heads
    expected = F.scaled_dot_product_attention(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal=True
    )
    print(
        "kernel:",
        ckfmha.Dispatcher().select(
            dtype="bf16",
            batch=batch,
            nhead_q=heads,
            nhead_k=kv_heads,
            seqlen_q=seqlen,
            hdim=hdim,
            causal=True,
        ),
    )
    print("max |ckfmha - sdpa|:", (out.float() - expected.float()).abs().max().item())
    print("lse shape:", tuple(lse.shape))


if __name__ == "__main__":
    main()
