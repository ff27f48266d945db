"""A decode step over a paged KV cache captured once in a CUDA graph and replayed as the
sequences grow, checked against torch SDPA on the gathered keys.

python examples/serving_cuda_graph.py
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import ckfmha.serving

BATCH, HEADS, KV_HEADS, HDIM, PAGE, POOL, MAX_KEYS = 8, 32, 8, 128, 16, 1024, 2048


def reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              table: np.ndarray, lens: np.ndarray) -> torch.Tensor:  # fmt: skip
    """SDPA over each sequence's keys gathered from its pages (one query token each)."""
    rows = []
    for b in range(BATCH):
        pages = torch.as_tensor(table[b], device="cuda", dtype=torch.long)
        k = k_cache[pages].flatten(0, 1)[: lens[b]].transpose(0, 1)  # [kv_heads, keys, d]
        v = v_cache[pages].flatten(0, 1)[: lens[b]].transpose(0, 1)
        rows.append(F.scaled_dot_product_attention(q[b], k, v, enable_gqa=True))
    return torch.stack(rows)


def main() -> None:
    rng = np.random.default_rng(0)
    k_cache = torch.randn(POOL, PAGE, KV_HEADS, HDIM, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    pages_per_seq = MAX_KEYS // PAGE
    shape = {"nhead_q": HEADS, "nhead_k": KV_HEADS, "head_dim": HDIM, "page_size": PAGE,
             "dtype": "bf16", "num_pages": POOL}  # fmt: skip

    def step_tables() -> tuple[np.ndarray, np.ndarray]:
        table = rng.permutation(POOL)[: BATCH * pages_per_seq].reshape(BATCH, pages_per_seq)
        return table.astype(np.int32), rng.integers(1, MAX_KEYS + 1, BATCH).astype(np.int32)

    decode = ckfmha.serving.BatchDecode(max_batch=BATCH, max_pages=BATCH * pages_per_seq,
                                        max_seqlen_k=MAX_KEYS)  # fmt: skip
    table, lens = step_tables()
    decode.plan(block_table=table, seqlens_k=lens, **shape)
    q = torch.randn(BATCH, HEADS, 1, HDIM, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    decode.run(q, k_cache, v_cache, out=out)  # warm-up, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode.run(q, k_cache, v_cache, out=out)

    for step in range(4):
        if step:
            table, lens = step_tables()
            decode.plan(block_table=table, seqlens_k=lens, **shape)
        q.copy_(torch.randn_like(q))
        graph.replay()
        expected = reference(q, k_cache, v_cache, table, lens)
        error = (out.float() - expected.float()).norm() / expected.float().norm()
        print(f"step {step}: keys {lens.tolist()}, relative error vs SDPA {error:.2e}")


if __name__ == "__main__":
    main()
