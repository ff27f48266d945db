"""ckfmha.transformers on the GPU: tiny randomly initialised Llama (GQA), Gemma 2 (soft-cap,
sliding windows on alternate layers) and gpt-oss (sinks, sliding windows) models, built from
configs, run with attn_implementation="ckfmha" beside transformers' own implementation:
"sdpa" for Llama, "eager" for Gemma 2 (transformers' sdpa path drops the soft-cap) and for
gpt-oss (no sdpa path: sinks).

Logits (bf16, batch 2, 77 tokens, with and without left padding) are judged against the same
weights in float32 with eager attention: ckfmha's relative L2 error must stay within twice
the reference implementation's own bf16 error (plus 1e-3) and below 5%. bf16 keeps 8
mantissa bits, so both land near 1% (a float64 attention in place of the kernels measures
0.7-1.6% on these models), while a wrong mask, window, cap or sink moves the logits by
20-100%.

Greedy generation (16 new tokens on the KV cache, past the windows of 32) runs in fp16: with
11 mantissa bits the two implementations' logits differ about 8x less than in bf16, where
near-ties in a random model's flat logits flip tokens (one prompt in six for Llama, four in
six for gpt-oss, in a float64-attention emulation; none in fp16). A token may still differ
where the reference's own top two logits lie within 5% of the logits' spread: the sequences
are compared up to such a tie, and any other difference fails.

The first run compiles the kernels these problems need on first use (soft-cap, sinks, bias
and window variants: minutes); runs after it find them in the cache.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from support.hf_models import CONFIGS, build_model, left_padded_mask, variant

import ckfmha.torch
import ckfmha.transformers as hf

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
]

MODELS = ["llama", "gemma2", "gpt_oss"]
REFERENCE = {"llama": "sdpa", "gemma2": "eager", "gpt_oss": "eager"}
SEQLEN = 77
PADS = [13, 0]  # left padding of each batch row in the padded cases
NEW_TOKENS = 16
# Relative L2 error bounds of bf16 logits against the float32 model (module docstring).
ERROR_RATIO, ERROR_FLOOR, ERROR_MAX = 2.0, 1e-3, 5e-2
# A token may differ only where the reference's top two logits lie this close, as a
# fraction of the standard deviation of that step's logits.
TIE_FRACTION = 0.05


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Runs the real kernels and records the options of each call."""
    calls: list[dict[str, Any]] = []
    attention = ckfmha.torch.attention

    def recording(*args: Any, **options: Any) -> Any:
        calls.append(options)
        return attention(*args, **options)

    monkeypatch.setattr(ckfmha.torch, "attention", recording)
    return calls


def _base_model(name: str) -> Any:
    config = CONFIGS[name]()
    if config is None:
        pytest.skip(f"{name} is not in the installed transformers")
    hf.register()
    return build_model(config)


def _token_ids(seed: int) -> torch.Tensor:
    ids = torch.randint(0, 1024, (2, SEQLEN), generator=torch.Generator().manual_seed(seed))
    return ids.cuda()


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left_padded"])
@pytest.mark.parametrize("name", MODELS)
def test_logits_match_the_reference(name: str, padded: bool, kernel_calls: list) -> None:
    base = _base_model(name)
    ids = _token_ids(seed=1)
    mask = left_padded_mask(2, SEQLEN, PADS if padded else [0, 0], "cuda")
    real = mask.bool()
    logits = {}
    for impl, dtype in (("eager", torch.float32), (REFERENCE[name], torch.bfloat16),
                        ("ckfmha", torch.bfloat16)):  # fmt: skip
        model = variant(base, impl, dtype, "cuda")
        with torch.no_grad():
            logits[impl, dtype] = model(ids, attention_mask=mask).logits[real]
    truth = logits["eager", torch.float32]
    ours = _relative_error(logits["ckfmha", torch.bfloat16], truth)
    theirs = _relative_error(logits[REFERENCE[name], torch.bfloat16], truth)
    print(f"{name} {'left-padded' if padded else 'unpadded'}: bf16 logits relative L2 error "
          f"{ours:.2e} (the {REFERENCE[name]} implementation's own: {theirs:.2e})")
    assert ours <= ERROR_RATIO * theirs + ERROR_FLOOR and ours < ERROR_MAX, (ours, theirs)
    # Without padding every layer runs a mask the kernels have, with no bias.
    assert kernel_calls and all((call["bias"] is not None) == padded for call in kernel_calls)


def _assert_same_greedy_tokens(got: Any, want: Any, prompt_len: int) -> None:
    new_got, new_want = got.sequences[:, prompt_len:], want.sequences[:, prompt_len:]
    for row in range(new_want.shape[0]):
        for step in range(new_want.shape[1]):
            ours, theirs = int(new_got[row, step]), int(new_want[row, step])
            if ours == theirs:
                continue
            step_logits = want.logits[step][row].float()
            margin = float(step_logits[theirs] - step_logits[ours])
            tie = TIE_FRACTION * float(step_logits.std())
            assert margin <= tie, (
                f"row {row} step {step}: token {ours}, reference {theirs} whose logit leads "
                f"by {margin:.4f} (a near-tie is within {tie:.4f})"
            )
            break  # after a near-tie the sequences go separate ways


@pytest.mark.parametrize(
    ("name", "padded"),
    [("llama", False), ("gemma2", False), ("gpt_oss", False), ("llama", True)],
    ids=["llama", "gemma2", "gpt_oss", "llama-left_padded"],
)
def test_greedy_generate_matches_the_reference(name: str, padded: bool,
                                               kernel_calls: list) -> None:  # fmt: skip
    base = _base_model(name)
    ids = _token_ids(seed=2)
    mask = left_padded_mask(2, SEQLEN, PADS if padded else [0, 0], "cuda")
    # min_new_tokens keeps both at 16 tokens (no end-of-sequence stop); output_logits are
    # the raw logits, before that rule.
    kwargs = {"attention_mask": mask, "max_new_tokens": NEW_TOKENS,
              "min_new_tokens": NEW_TOKENS, "do_sample": False, "use_cache": True,
              "pad_token_id": 0, "output_logits": True, "return_dict_in_generate": True}  # fmt: skip
    outputs = {}
    for impl in (REFERENCE[name], "ckfmha"):
        model = variant(base, impl, torch.float16, "cuda")
        with torch.no_grad():
            outputs[impl] = model.generate(ids, **kwargs)
    same = (outputs["ckfmha"].sequences == outputs[REFERENCE[name]].sequences).all(dim=1)
    print(f"{name}: {int(same.sum())} of {same.numel()} greedy sequences identical")
    _assert_same_greedy_tokens(outputs["ckfmha"], outputs[REFERENCE[name]], SEQLEN)
    # Prefill and one call per layer and decode step; unpadded ones all run without a bias.
    assert len(kernel_calls) >= NEW_TOKENS
    assert padded or all(call["bias"] is None for call in kernel_calls)
