"""Decode and prefill over a paged KV cache (vLLM block tables and SGLang indptr), checked
against torch SDPA on the gathered keys.

python examples/paged_decode.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import ckfmha


def gathered(cache: torch.Tensor, pages: torch.Tensor, length: int) -> torch.Tensor:
    """One sequence's keys [heads, length, hdim] from its pages."""
    return cache[pages].flatten(0, 1)[:length].transpose(0, 1)


def main() -> None:
    heads, kv_heads, hdim, page_size = 32, 8, 128, 16
    lengths = [1000, 17, 4096]  # keys already cached per sequence
    pages_per_seq = [-(-n // page_size) for n in lengths]
    num_pages = sum(pages_per_seq) + 8
    dtype = torch.bfloat16
    # The cache, vLLM's flash layout: [num_pages, page_size, kv_heads, hdim]; pages are handed
    # out in a scattered order, as an allocator would after a while.
    k_cache = torch.randn(num_pages, page_size, kv_heads, hdim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    order = torch.randperm(num_pages, device="cuda").to(torch.int32)
    starts = [sum(pages_per_seq[:b]) for b in range(len(lengths))]
    pages = [order[s : s + n] for s, n in zip(starts, pages_per_seq)]
    block_table = torch.zeros(len(lengths), max(pages_per_seq), device="cuda", dtype=torch.int32)
    for b, p in enumerate(pages):
        block_table[b, : p.numel()] = p
    seqlens_k = torch.tensor(lengths, device="cuda", dtype=torch.int32)

    # A decode step: one new query per sequence, attending to its whole cache.
    q = torch.randn(len(lengths), heads, 1, hdim, device="cuda", dtype=dtype)
    out = ckfmha.fwd_paged(q, k_cache, v_cache, block_table=block_table, seqlens_k=seqlens_k,
                           causal=True, causal_alignment="bottom_right")
    # The same pages as SGLang describes them: flat page ids and offsets.
    kv_indices = torch.cat(pages)
    kv_indptr = torch.tensor([0, *torch.tensor(pages_per_seq).cumsum(0).tolist()],
                             device="cuda", dtype=torch.int32)
    out_sglang = ckfmha.fwd_paged(q, k_cache, v_cache, kv_indices=kv_indices,
                                  kv_indptr=kv_indptr, seqlens_k=seqlens_k, causal=True,
                                  causal_alignment="bottom_right")
    print(ckfmha.Dispatcher().explain(
        batch=len(lengths), nhead_q=heads, nhead_k=kv_heads, seqlen_q=1, seqlen_k=max(lengths),
        hdim=hdim, dtype="bf16", causal=True, causal_alignment="bottom_right",
        paged_kv="block_table", page_size=page_size).rstrip().splitlines()[-1])

    group = heads // kv_heads
    worst = 0.0
    for b, length in enumerate(lengths):
        k = gathered(k_cache, pages[b], length).repeat_interleave(group, 0)
        v = gathered(v_cache, pages[b], length).repeat_interleave(group, 0)
        expected = F.scaled_dot_product_attention(q[b : b + 1], k[None], v[None])
        worst = max(worst, (out[b : b + 1].float() - expected.float()).abs().max().item())
    print("decode: max |ckfmha - sdpa| =", worst,
          "| block table vs indptr identical:", torch.equal(out, out_sglang))

    # Prefill after a cached prefix: ragged new queries (packed), causal aligned bottom-right,
    # so each sequence's last new query sees its last key (cache lengths include the new keys).
    new_tokens = [5, 17, 64]
    cu_seqlens_q = torch.tensor([0, *torch.tensor(new_tokens).cumsum(0).tolist()],
                                device="cuda", dtype=torch.int32)
    q_new = torch.randn(sum(new_tokens), heads, hdim, device="cuda", dtype=dtype)
    out_new = ckfmha.fwd_paged(q_new, k_cache, v_cache, block_table=block_table,
                               seqlens_k=seqlens_k, cu_seqlens_q=cu_seqlens_q,
                               max_seqlen_q=max(new_tokens), causal=True,
                               causal_alignment="bottom_right")
    b = 2
    rows = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
    k = gathered(k_cache, pages[b], lengths[b]).repeat_interleave(group, 0)
    v = gathered(v_cache, pages[b], lengths[b]).repeat_interleave(group, 0)
    mask = torch.ones(new_tokens[b], lengths[b], device="cuda", dtype=torch.bool).tril(
        lengths[b] - new_tokens[b])
    expected = F.scaled_dot_product_attention(q_new[rows].transpose(0, 1)[None], k[None],
                                              v[None], attn_mask=mask)
    diff = (out_new[rows].transpose(0, 1).float() - expected[0].float()).abs().max().item()
    print("prefill: max |ckfmha - sdpa| =", diff)


if __name__ == "__main__":
    main()
