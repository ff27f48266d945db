"""A paged KV cache filled by a prompt and then one token per decode step, keys and queries
rotated with GPT-NeoX style RoPE, checked against the float64 reference.

python examples/append_kv_rope.py
"""

from __future__ import annotations

import numpy as np
import torch

import ckfmha
from ckfmha.reference_appendkv import append_kv_reference, rope_tables, rotate


def main() -> None:
    batch, heads, kv_heads, hdim, page_size, max_tokens = 3, 16, 4, 128, 16, 256
    pages_per_seq = max_tokens // page_size
    dtype = torch.bfloat16
    # vLLM layout: pages [num_pages, page_size, kv_heads, hdim], scattered over the pool.
    num_pages = batch * pages_per_seq
    k_cache = torch.zeros(num_pages, page_size, kv_heads, hdim, device="cuda", dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    block_table = torch.randperm(num_pages, device="cuda").int().reshape(batch, pages_per_seq)
    cos, sin = (torch.from_numpy(t).float().cuda() for t in rope_tables(max_tokens, hdim))

    lengths = torch.zeros(batch, dtype=torch.int32, device="cuda")
    overflow = torch.zeros(1, dtype=torch.int32, device="cuda")
    history_k, history_v = [], []
    for step, new_tokens in enumerate([37, 1, 1, 1]):
        k_new = torch.randn(batch, new_tokens, kv_heads, hdim, device="cuda", dtype=dtype)
        v_new = torch.randn_like(k_new)
        q = torch.randn(batch, new_tokens, heads, hdim, device="cuda", dtype=dtype)
        # Keys and queries rotated at positions lengths + t; q rotated into a new tensor.
        q_rot = ckfmha.append_kv(k_cache, v_cache, k_new, v_new, lengths, cos=cos, sin=sin,
                                 q=q, block_table=block_table, overflow=overflow)
        q_ref = np.stack([
            rotate(q[b].float().cpu().numpy(), int(lengths[b]) + np.arange(new_tokens),
                   cos.cpu().numpy(), sin.cpu().numpy(), interleaved=False)
            for b in range(batch)])
        kernel = ckfmha.select_append_kv(
            dtype="bf16", batch=batch, nhead_k=kv_heads, seqlen_new=new_tokens, hdim=hdim,
            page_size=page_size, num_pages=num_pages, max_pages_per_seq=pages_per_seq,
            rope="half_rotated", nhead_q=heads)
        q_err = np.abs(q_rot.float().cpu().numpy() - q_ref).max()
        print(f"step {step}: {new_tokens} token(s), {kernel}, max |q - reference| {q_err:.1e}")
        history_k.append(k_new)
        history_v.append(v_new)
        lengths += new_tokens  # the caller advances the lengths
    torch.cuda.synchronize()

    # The whole cache against the reference run over the same appends.
    ref_k = np.zeros(tuple(k_cache.shape))
    ref_v = np.zeros(tuple(v_cache.shape))
    table = block_table.cpu().numpy()
    start = np.zeros(batch, dtype=np.int32)
    for k_new, v_new in zip(history_k, history_v):
        result = append_kv_reference(ref_k, ref_v, k_new.float().cpu().numpy(),
                                     v_new.float().cpu().numpy(), start, cos=cos.cpu().numpy(),
                                     sin=sin.cpu().numpy(), block_table=table)
        ref_k, ref_v = result.k_cache, result.v_cache
        start += k_new.shape[1]
    print("max |k_cache - reference|:", np.abs(k_cache.float().cpu().numpy() - ref_k).max())
    print("max |v_cache - reference|:", np.abs(v_cache.float().cpu().numpy() - ref_v).max())
    print("overflow flag:", int(overflow.item()))


if __name__ == "__main__":
    main()
