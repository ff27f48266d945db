"""ckfmha.torch.sdpa as a drop-in for F.scaled_dot_product_attention in a model compiled with
torch.compile(fullgraph=True), trained a few steps beside the same model on torch's SDPA.

python examples/torch_compile_sdpa.py
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

import ckfmha.torch


class Attention(torch.nn.Module):
    def __init__(self, sdpa: Callable[..., torch.Tensor], width: int = 512, heads: int = 8,
                 kv_heads: int = 2) -> None:  # fmt: skip
        super().__init__()
        self.sdpa, self.heads, self.kv_heads, self.head_dim = sdpa, heads, kv_heads, width // heads
        self.qkv = torch.nn.Linear(width, (heads + 2 * kv_heads) * self.head_dim)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.head_dim,
                                     self.kv_heads * self.head_dim,
                                     self.kv_heads * self.head_dim], dim=-1)  # fmt: skip
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        o = self.sdpa(q, k, v, is_causal=True, enable_gqa=True)  # the one line that differs
        return self.out(o.transpose(1, 2).reshape(b, s, -1))


def train(sdpa: Callable[..., torch.Tensor], compile_model: bool) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(1000, 512), Attention(sdpa),
                                torch.nn.Linear(512, 1000)).cuda().bfloat16()  # fmt: skip
    step_model = torch.compile(model, fullgraph=True) if compile_model else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator(device="cuda").manual_seed(1)
    losses = []
    for _ in range(20):
        tokens = torch.randint(0, 1000, (4, 257), device="cuda", generator=data)
        logits = step_model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    ours = train(ckfmha.torch.sdpa, compile_model=True)
    theirs = train(F.scaled_dot_product_attention, compile_model=False)
    for step in (0, 9, 19):
        print(f"step {step:2d}: loss {ours[step]:.4f} (ckfmha, compiled) "
              f"{theirs[step]:.4f} (torch SDPA, eager)")


if __name__ == "__main__":
    main()
