"""Tiny randomly initialised transformers models (built from configs, nothing downloaded) for
the tests of ckfmha.transformers, and a float64 stand-in for ckfmha.torch.attention that
lets the CPU tests run whole models through the integration.

Import only after ``pytest.importorskip("transformers")``."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoModelForCausalLM, Gemma2Config, LlamaConfig, PreTrainedConfig

from ckfmha.reference import attention_reference

VOCAB = 1024


def llama_config(head_dim: int = 128) -> PreTrainedConfig:
    """GQA: 8 query heads over 2 K/V heads."""
    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=head_dim,
    )  # fmt: skip


def gemma2_config(head_dim: int = 128, sliding_window: int = 32) -> PreTrainedConfig:
    """Sliding-window layers alternate with full ones. With the default initializer range
    the attention logits stay far below any cap; at 0.1 a cap of 5 changes the model's
    logits by about 40% (relative L2), so a lost soft-cap cannot pass."""
    return Gemma2Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
        query_pre_attn_scalar=head_dim, sliding_window=sliding_window,
        attn_logit_softcapping=5.0, initializer_range=0.1,
    )  # fmt: skip


def gpt_oss_config(sliding_window: int = 32) -> PreTrainedConfig | None:
    """gpt-oss (sinks, alternating sliding windows), or None where the installed transformers
    lacks it. Every token uses both experts: a top-k router switches experts on tiny logit
    differences, which would swamp the comparison in 16-bit."""
    try:
        from transformers import GptOssConfig
    except ImportError:
        return None
    return GptOssConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64, num_local_experts=2,
        num_experts_per_tok=2, sliding_window=sliding_window,
    )  # fmt: skip


CONFIGS = {"llama": llama_config, "gemma2": gemma2_config, "gpt_oss": gpt_oss_config}


def build_model(config: PreTrainedConfig, *, seed: int = 0) -> Any:
    """A float32 eager model with seeded weights, in eval mode. Sinks are redrawn with
    std 1 (the default 0.02 leaves them near 0), so that they change the output."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for module in model.modules():
            sinks = getattr(module, "sinks", None)
            if isinstance(sinks, torch.nn.Parameter):
                sinks.normal_(0.0, 1.0)
    return model


def variant(model: Any, attn_implementation: str, dtype: torch.dtype, device: str) -> Any:
    """A copy of ``model`` with the same weights in ``dtype`` on ``device``."""
    other = copy.deepcopy(model).to(device=device, dtype=dtype)
    other.set_attn_implementation(attn_implementation)
    return other


@dataclass
class ReferenceKernel:
    """Stands in for ``ckfmha.torch.attention`` on the CPU: the same arguments, computed by
    ckfmha.reference in float64; records the options of every call."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options: Any) -> Any:
        self.calls.append(options)
        assert options.get("alibi_slopes") is None and not options.get("dropout_p")

        def f64(t: torch.Tensor | None) -> Any:
            return None if t is None else t.detach().to("cpu", torch.float64).numpy()

        out, _ = attention_reference(
            f64(q), f64(k), f64(v), causal=options.get("causal", False),
            causal_alignment=options.get("causal_alignment", "top_left"),
            window=options.get("window"), scale=options.get("scale"),
            softcap=options.get("softcap", 0.0), bias=f64(options.get("bias")),
            sink=f64(options.get("sink")), layout=options.get("layout", "bhsd"),
        )  # fmt: skip
        return torch.from_numpy(out).to(device=q.device, dtype=q.dtype)


def left_padded_mask(batch: int, seqlen: int, pads: list[int], device: str) -> torch.Tensor:
    """A 2-D attention mask whose row i starts with pads[i] padding positions."""
    mask = torch.ones(batch, seqlen, dtype=torch.long, device=device)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    return mask
