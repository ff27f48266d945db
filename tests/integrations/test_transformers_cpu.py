"""ckfmha.transformers without a GPU: registration, the mapping of transformers' attention
calls and masks onto ckfmha options, and whole tiny models run through the integration
with ckfmha.torch.attention replaced by the float64 reference (the kernels need CUDA)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from support.hf_models import (
    CONFIGS,
    ReferenceKernel,
    build_model,
    left_padded_mask,
    variant,
)
from transformers import AttentionInterface, AttentionMaskInterface, AutoModelForCausalLM
from transformers.masking_utils import (
    bidirectional_mask_function,
    causal_mask_function,
    chunked_causal_mask_function,
    sliding_window_causal_mask_function,
)

import ckfmha
import ckfmha.torch
import ckfmha.transformers as hf
from ckfmha.transformers import routing

BF16 = torch.bfloat16
NEG_INF = float("-inf")


def _causal(seqlen_q: int, seqlen_k: int, alignment: str = "bottom_right") -> torch.Tensor:
    offset = seqlen_k - seqlen_q if alignment == "bottom_right" else 0
    rows = torch.arange(seqlen_q)[:, None] + offset
    return torch.arange(seqlen_k)[None, :] <= rows


def _options(mask: torch.Tensor | None, seqlen_q: int, seqlen_k: int, **kwargs) -> hf.KernelOptions:
    return hf.kernel_options(mask, seqlen_q=seqlen_q, seqlen_k=seqlen_k, dtype=BF16, **kwargs)


def _visibility(options: hf.KernelOptions) -> tuple:
    return options.causal, options.causal_alignment, options.window


# --- registration -------------------------------------------------------------------------


def test_register_is_idempotent_and_listed() -> None:
    assert hf.register() == "ckfmha"
    assert hf.register() == "ckfmha"
    assert "ckfmha" in AttentionInterface().valid_keys()
    assert AttentionInterface()["ckfmha"] is hf.ckfmha_attention_forward
    assert AttentionMaskInterface()["ckfmha"] is hf.ckfmha_mask
    assert hf.register("ckfmha_other") == "ckfmha_other"
    assert AttentionInterface()["ckfmha_other"] is hf.ckfmha_attention_forward


@pytest.mark.parametrize("name", ["sdpa", "eager", "flash_attention_2", "paged|ckfmha"])
def test_register_refuses_names_transformers_owns(name: str) -> None:
    with pytest.raises(ValueError, match=name.split("|")[0]):
        hf.register(name)


def test_import_ckfmha_alone_imports_neither_torch_nor_transformers() -> None:
    code = ("import sys, ckfmha; bad = {'torch', 'transformers'} & set(sys.modules); "
            "assert not bad, bad")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)


def test_models_accept_the_name() -> None:
    hf.register()
    model = build_model(CONFIGS["llama"]())
    model.set_attn_implementation("ckfmha")
    assert model.config._attn_implementation == "ckfmha"


# --- transformers' call arguments -> ckfmha options ---------------------------------------


def test_no_mask_is_causal_aligned_bottom_right() -> None:
    for seqlen_q, seqlen_k in [(77, 77), (1, 40), (5, 40)]:  # prefill, decode, chunked prefill
        options = _options(None, seqlen_q, seqlen_k)
        assert _visibility(options) == (True, "bottom_right", None) and options.bias is None


def test_no_mask_bidirectional_sees_every_key() -> None:
    assert _visibility(_options(None, 9, 9, is_causal=False)) == (False, "bottom_right", None)


def test_sliding_window_sees_itself_and_w_minus_1_keys_before() -> None:
    # transformers' sliding_window_overlay: kv_idx > q_idx - sliding_window.
    options = _options(None, 100, 100, sliding_window=32)
    assert _visibility(options) == (False, "bottom_right", (31, 0))
    assert _visibility(_options(None, 1, 32, sliding_window=32)) == (True, "bottom_right", None)
    assert _visibility(_options(None, 1, 33, sliding_window=32))[2] == (31, 0)


def test_bidirectional_sliding_window_is_symmetric() -> None:
    # sliding_window_bidirectional_overlay: abs(q_idx - kv_idx) <= sliding_window.
    assert _options(None, 50, 50, is_causal=False, sliding_window=8).window == (8, 8)
    assert _options(None, 9, 9, is_causal=False, sliding_window=8).window is None


def test_exactly_causal_masks_run_without_bias() -> None:
    bottom_right = _causal(5, 40)[None, None].expand(2, 1, 5, 40)
    options = _options(bottom_right, 5, 40)
    assert _visibility(options) == (True, "bottom_right", None) and options.bias is None
    # A static cache's prefill: rows aligned to the first slot, the slots after empty.
    top_left = _causal(5, 40, "top_left")[None, None].expand(2, 1, 5, 40)
    assert _visibility(_options(top_left, 5, 40)) == (True, "top_left", None)
    # eager's float masks: 0 to attend, the dtype's lowest value not to.
    eager = torch.zeros(1, 1, 7, 7).masked_fill(~_causal(7, 7), torch.finfo(torch.float32).min)
    options = _options(eager, 7, 7)
    assert _visibility(options) == (True, "bottom_right", None) and options.bias is None
    all_keys = torch.ones(2, 1, 1, 40, dtype=torch.bool)
    assert _visibility(_options(all_keys, 1, 40)) == (True, "bottom_right", None)


def test_exact_sliding_window_mask_runs_as_a_window() -> None:
    rows, cols = torch.arange(100)[:, None], torch.arange(100)[None, :]
    mask = ((cols <= rows) & (cols > rows - 32))[None, None]
    options = _options(mask, 100, 100, sliding_window=32)
    assert _visibility(options) == (False, "bottom_right", (31, 0)) and options.bias is None
    # Without the window argument the same mask can only be a bias.
    assert _options(mask, 100, 100).bias is not None


def test_causal_padding_mask_becomes_causal_and_one_bias_row_per_sequence() -> None:
    # A left-padded decoder batch: the causal pattern, and the keys each sequence holds as a
    # [b, 1, 1, sk] bias (the Hopper kernels' row mode), 0 where kept and -inf where padded.
    mask = _causal(6, 6)[None, None].repeat(2, 1, 1, 1)
    mask[0, :, :, :2] = False  # left padding in sequence 0
    options = _options(mask, 6, 6)
    assert _visibility(options) == (True, "bottom_right", None)
    bias = options.bias
    assert bias.dtype == BF16 and bias.shape == (2, 1, 1, 6) and bias.stride(-1) == 1
    assert torch.equal(bias[0, 0, 0] == 0, torch.tensor([False, False] + [True] * 4))
    assert bool((bias[1] == 0).all()) and bool((bias[0, ..., :2] == NEG_INF).all())
    # Decoding: queries aligned to the last keys, padding per sequence and head.
    step = _causal(3, 9)[None, None].repeat(2, 4, 1, 1)
    step[1, 2, :, 5] = False
    options = _options(step, 3, 9)
    assert _visibility(options) == (True, "bottom_right", None)
    assert options.bias.shape == (2, 4, 1, 9) and bool(options.bias[1, 2, 0, 5] == NEG_INF)


def test_sliding_window_padding_mask_becomes_a_window_and_one_bias_row() -> None:
    rows, cols = torch.arange(40)[:, None], torch.arange(40)[None, :]
    mask = ((cols <= rows) & (cols > rows - 8))[None, None].repeat(2, 1, 1, 1)
    mask[1, ..., :11] = False
    options = _options(mask, 40, 40, sliding_window=8)
    assert _visibility(options) == (False, "bottom_right", (7, 0))
    assert options.bias.shape == (2, 1, 1, 40)
    assert bool((options.bias[1, ..., :11] == NEG_INF).all()) and bool((options.bias[0] == 0).all())


def _applied(options: hf.KernelOptions, batch: int, heads: int, seqlen_q: int,
             seqlen_k: int) -> torch.Tensor:  # fmt: skip
    """bool [batch, heads, seqlen_q, seqlen_k]: the keys the kernels let each query see under
    `options`: its pattern and, where there is one, its bias's finite entries."""
    window = options.window
    pattern = hf.masks._Visibility(causal=options.causal,
                                   causal_alignment=options.causal_alignment, window=window)
    seen = pattern.visible_keys(seqlen_q, seqlen_k, torch.device("cpu"))
    seen = seen.expand(batch, heads, seqlen_q, seqlen_k)
    if options.bias is None:
        return seen
    return seen & torch.isfinite(options.bias).expand(batch, heads, seqlen_q, seqlen_k)


@pytest.mark.parametrize("seed", range(40))
def test_random_padded_masks_keep_exactly_their_visible_keys(seed: int) -> None:
    # Random decoder and encoder masks: causal (either alignment), sliding windows or none,
    # with left or right padding per sequence (or per head), as bool or eager float masks.
    # Whatever the plan, pattern and bias together hide exactly what the mask hides, and a
    # padded batch under a known pattern takes one bias row per sequence.
    g = torch.Generator().manual_seed(seed)

    def draw(high: int) -> int:
        return int(torch.randint(0, high, (1,), generator=g))

    batch, heads = 1 + draw(3), 1 + draw(2)
    seqlen_k = 1 + draw(40)
    seqlen_q = seqlen_k if draw(2) else 1 + draw(seqlen_k)
    kind = ["causal", "top_left", "window", "none"][draw(4)]
    sliding = 1 + draw(12) if kind == "window" else None
    if kind == "top_left":
        rows = _causal(seqlen_q, seqlen_k, "top_left")
    else:
        visibility = hf.masks._layer_visibility(kind != "none", sliding, seqlen_q, seqlen_k,
                                                "bottom_right")
        rows = visibility.visible_keys(seqlen_q, seqlen_k, torch.device("cpu"))
    keys = torch.ones(batch, heads, 1, seqlen_k, dtype=torch.bool)
    for b in range(batch):
        pad = draw(seqlen_k)
        if draw(2):
            keys[b, ..., :pad] = False  # left padding
        else:
            keys[b, ..., seqlen_k - pad:] = False  # right padding
    if heads > 1 and draw(2):
        keys[0, 1, 0, draw(seqlen_k)] = False  # one head hides one more key
    mask = rows[None, None] & keys
    if draw(2):
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    options = _options(mask, seqlen_q, seqlen_k, is_causal=kind != "none",
                       sliding_window=sliding)  # fmt: skip
    visible = mask if mask.dtype == torch.bool else mask == 0
    assert torch.equal(_applied(options, batch, heads, seqlen_q, seqlen_k), visible)
    if options.bias is not None:
        assert options.bias.shape[-2] == 1, "padding under a known pattern is one row"


def test_a_mask_that_is_no_pattern_and_padding_stays_a_full_bias() -> None:
    mask = _causal(6, 6)[None, None].repeat(2, 1, 1, 1)
    mask[0, :, :, :2] = False
    mask[1, 0, 4, 2] = False  # one query row hides a key the later rows see
    options = _options(mask, 6, 6)
    assert _visibility(options) == (False, "bottom_right", None)
    bias = options.bias
    assert bias.shape == (2, 1, 6, 6) and bias.stride(-1) == 1
    assert torch.equal(bias == 0, mask) and bool((bias[~mask] == NEG_INF).all())
    # A mask that takes a gradient keeps its full bias even where it is causal and padding.
    trained = torch.zeros(2, 1, 6, 6).masked_fill(~_causal(6, 6), torch.finfo(torch.float32).min)
    trained[0, ..., :2] = torch.finfo(torch.float32).min
    trained.requires_grad_(True)
    assert _options(trained, 6, 6).bias.shape == (2, 1, 6, 6)


def test_float_padding_mask_is_used_as_it_is() -> None:
    mask = torch.zeros(2, 1, 4, 4)
    mask[0, :, :, 0] = torch.finfo(torch.float32).min
    mask = mask.masked_fill(~_causal(4, 4), torch.finfo(torch.float32).min)
    # eager's float masks (0 or the lowest value) are patterns too: causal and one row.
    options = _options(mask, 4, 4)
    assert options.causal and options.bias.dtype == BF16 and options.bias.shape == (2, 1, 1, 4)
    assert torch.equal(options.bias.expand(2, 1, 4, 4), mask[..., 3:, :].expand(2, 1, 4, 4).to(BF16))
    # Any other value makes the mask a bias, used as it is.
    mask[1, 0, 2, 1] = -5.0
    options = _options(mask, 4, 4)
    assert torch.equal(options.bias, mask.to(BF16)) and not options.causal
    # Values that are neither 0 nor the lowest (an ALiBi-like mask) are a bias too; its rows
    # are all equal, so one row of it serves.
    slopes = -torch.arange(4.0)[None, None, None, :].expand(1, 1, 4, 4)
    assert torch.equal(_options(slopes, 4, 4).bias, slopes[..., :1, :].to(BF16))


def test_expanded_mask_gives_a_bias_with_contiguous_rows() -> None:
    mask = torch.tensor([True, False, True])[None, None, None, :].expand(2, 1, 3, 3)
    assert _options(mask, 3, 3, is_causal=False).bias.stride(-1) == 1


def test_padding_without_causality_becomes_one_bias_row_per_sequence() -> None:
    # An encoder's padded batch: every query row of a sequence sees the same keys, so the
    # bias is [b, 1, 1, sk] (the Hopper kernels' row mode) and equals the mask's rows.
    mask = torch.ones(3, 1, 5, 5, dtype=torch.bool)
    mask[0, ..., 3:] = False
    mask[2, ..., 1:] = False
    bias = _options(mask, 5, 5, is_causal=False).bias
    assert bias.shape == (3, 1, 1, 5)
    assert torch.equal(bias.expand(3, 1, 5, 5) == 0, mask)
    # One row that differs, or a mask that takes a gradient, keeps the full bias.
    mask[1, 0, 4, 0] = False
    assert _options(mask, 5, 5, is_causal=False).bias.shape == (3, 1, 5, 5)
    trained = torch.randn(2, 1, 1, 4, requires_grad=True).expand(2, 1, 4, 4)
    assert _options(trained, 4, 4, is_causal=False).bias.shape == (2, 1, 4, 4)


def test_mask_shape_must_cover_queries_and_keys() -> None:
    with pytest.raises(ValueError, match="does not cover"):
        _options(torch.ones(1, 1, 4, 5, dtype=torch.bool), 4, 6)


def test_mask_plan_is_remembered_on_the_mask_until_it_changes() -> None:
    mask = _causal(6, 6)[None, None].clone()
    first = _options(mask, 6, 6)
    assert first.causal and mask._ckfmha_plans
    mask[..., 0, 0] = False  # in place: the version moves, the plan is redone
    second = _options(mask, 6, 6)
    assert not second.causal and second.bias is not None


def test_masks_made_in_inference_mode_are_planned_too() -> None:
    with torch.inference_mode():
        mask = _causal(6, 6)[None, None].clone()
        assert _options(mask, 6, 6).causal and _options(mask, 6, 6).bias is None


def test_softcap_scale_sink_dropout_and_position_bias() -> None:
    sink = torch.randn(8)
    position_bias = torch.randn(1, 8, 3, 3)
    options = _options(None, 3, 3, softcap=50.0, scaling=0.125, sink=sink, dropout_p=0.1,
                       position_bias=position_bias)  # fmt: skip
    assert options.softcap == 50.0 and options.scale == 0.125 and options.sink is sink
    assert options.dropout_p == 0.1 and options.causal
    assert torch.equal(options.bias, position_bias.to(BF16))
    assert _options(None, 3, 3, softcap=None).softcap == 0.0
    # T5 builds its position bias by permuting an embedding: keys are not contiguous.
    permuted = torch.randn(3, 3, 8).permute(2, 0, 1)[None]
    assert _options(None, 3, 3, position_bias=permuted).bias.stride(-1) == 1


# --- masks transformers is asked for --------------------------------------------------------


def _native(**kwargs) -> bool:
    args = {"q_length": 10, "kv_length": 10, "q_offset": 0, "kv_offset": 0,
            "mask_function": causal_mask_function, "attention_mask": None}  # fmt: skip
    return hf.mask_is_native(**(args | kwargs))


def test_no_mask_is_asked_for_without_padding() -> None:
    assert _native()
    assert _native(attention_mask=torch.ones(2, 10, dtype=torch.bool))
    assert _native(q_length=1, kv_length=11, q_offset=10)  # decode against a cache
    assert _native(mask_function=bidirectional_mask_function, allow_is_bidirectional_skip=True)


def test_a_mask_is_asked_for_where_the_pattern_needs_one() -> None:
    padded = torch.ones(2, 10, dtype=torch.bool)
    padded[0, :3] = False
    assert not _native(attention_mask=padded)
    assert not _native(allow_is_causal_skip=False)  # compiled decode, or a caller's choice
    assert not _native(kv_length=16)  # a static cache: queries are not the last keys
    assert not _native(q_offset=torch.tensor(0))
    assert not _native(mask_function=bidirectional_mask_function)
    assert not _native(mask_function=lambda b, h, q, kv: kv <= q)  # an overlay


def test_padding_before_the_keys_in_range_does_not_count() -> None:
    padded = torch.ones(1, 20, dtype=torch.bool)
    padded[0, :3] = False  # left the sliding cache already
    window = sliding_window_causal_mask_function(8)
    assert _native(q_length=1, kv_length=8, q_offset=19, kv_offset=12, mask_function=window,
                   local_size=8, sliding_window=8, attention_mask=padded)  # fmt: skip


def test_sliding_and_chunked_masks_are_native_only_where_they_exclude_nothing() -> None:
    window = sliding_window_causal_mask_function(8)
    common = {"mask_function": window, "local_size": 8, "sliding_window": 8}
    assert _native(q_length=8, kv_length=8, **common)
    assert not _native(q_length=9, kv_length=9, **common)
    assert _native(q_length=1, kv_length=8, q_offset=30, kv_offset=23, **common)
    chunked = chunked_causal_mask_function(8, torch.zeros(1, dtype=torch.long))
    common = {"mask_function": chunked, "local_size": 8, "chunk_size": 8}
    assert _native(q_length=8, kv_length=8, **common)
    assert not _native(q_length=1, kv_length=8, q_offset=30, kv_offset=23, **common)


def test_mask_function_builds_sdpa_masks_when_one_is_needed() -> None:
    padded = torch.ones(2, 6, dtype=torch.bool)
    padded[0, :2] = False
    assert hf.ckfmha_mask(2, 6, 6, attention_mask=padded, dtype=BF16) is not None
    mask = hf.ckfmha_mask(2, 6, 6, attention_mask=padded, dtype=BF16)
    expected = _causal(6, 6)[None, None] & padded[:, None, None, :]
    assert mask.dtype == torch.bool and torch.equal(mask, expected)
    assert hf.ckfmha_mask(2, 6, 6, attention_mask=torch.ones(2, 6, dtype=torch.bool)) is None


# --- the attention function ---------------------------------------------------------------


class _Module(torch.nn.Module):
    is_causal = True


def test_attention_function_runs_bshd_and_returns_b_s_h_d(monkeypatch) -> None:
    kernel = ReferenceKernel()
    monkeypatch.setattr(ckfmha.torch, "attention", kernel)
    q, k = torch.randn(2, 8, 5, 64), torch.randn(2, 2, 9, 64)
    out, weights = hf.ckfmha_attention_forward(_Module(), q, k, k, None, scaling=0.5)
    assert weights is None and out.shape == (2, 5, 8, 64) and out.is_contiguous()
    assert kernel.calls[0]["layout"] == "bshd" and kernel.calls[0]["scale"] == 0.5
    assert kernel.calls[0]["causal_alignment"] == "bottom_right"


def test_dropout_applies_only_while_training(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(ckfmha.torch, "attention", lambda q, k, v, **o: calls.append(o) or q)
    module = _Module()
    q = torch.randn(1, 2, 3, 64)
    hf.ckfmha_attention_forward(module.eval(), q, q, q, None, dropout=0.1)
    hf.ckfmha_attention_forward(module.train(), q, q, q, None, dropout=0.1)
    assert [c["dropout_p"] for c in calls] == [0.0, 0.1]


def test_attention_weights_are_unsupported() -> None:
    q = torch.randn(1, 2, 3, 64)
    with pytest.raises(ckfmha.UnsupportedError, match="output_attentions"):
        hf.ckfmha_attention_forward(_Module(), q, q, q, None, output_attentions=True)


def test_unsupported_problems_name_the_layer(monkeypatch) -> None:
    def no_kernel(*args, **kwargs):
        raise ckfmha.UnsupportedError("no kernel for head dim 80")

    monkeypatch.setattr(ckfmha.torch, "attention", no_kernel)
    q = torch.randn(1, 2, 3, 80)
    with pytest.raises(ckfmha.UnsupportedError, match="_Module .*head dim 80.*sdpa"):
        hf.ckfmha_attention_forward(_Module(), q, q, q, None)


# --- whole models on the float64 stand-in ---------------------------------------------------

# Both sides in float32 with exact attention: what is left is float32 rounding (the logits
# are ~0.3 in size, their differences ~1e-6).
LOGITS_ATOL = 1e-4


def _pair(name: str, monkeypatch) -> tuple:
    config = CONFIGS[name]()
    if config is None:
        pytest.skip(f"{name} is not in the installed transformers")
    hf.register()
    kernel = ReferenceKernel()
    monkeypatch.setattr(ckfmha.torch, "attention", kernel)
    eager = build_model(config)
    return eager, variant(eager, "ckfmha", torch.float32, "cpu"), kernel


@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt_oss"])
def test_model_logits_match_eager(name: str, monkeypatch) -> None:
    eager, model, kernel = _pair(name, monkeypatch)
    ids = torch.randint(0, 1024, (2, 45), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, eager(ids).logits, atol=LOGITS_ATOL, rtol=0)
    # No padding: no call carries a bias; Gemma 2 and gpt-oss slide on alternate layers.
    assert all(call["bias"] is None for call in kernel.calls)
    windows = {call["window"] for call in kernel.calls}
    assert windows == ({None} if name == "llama" else {None, (31, 0)})
    assert all((call["sink"] is not None) == (name == "gpt_oss") for call in kernel.calls)
    assert all(call["softcap"] == (5.0 if name == "gemma2" else 0.0) for call in kernel.calls)


@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt_oss"])
def test_padded_batch_matches_eager(name: str, monkeypatch) -> None:
    eager, model, kernel = _pair(name, monkeypatch)
    ids = torch.randint(0, 1024, (2, 45), generator=torch.Generator().manual_seed(2))
    mask = left_padded_mask(2, 45, [13, 0], "cpu")
    with torch.no_grad():
        got = model(ids, attention_mask=mask).logits
        want = eager(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=LOGITS_ATOL, rtol=0)
    # Every layer keeps its pattern and takes the padding as one bias row per sequence.
    assert all(call["bias"].shape == (2, 1, 1, 45) for call in kernel.calls)
    assert all(call["causal"] or call["window"] == (31, 0) for call in kernel.calls)


@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt_oss"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left_padded"])
def test_greedy_generate_matches_eager(name: str, padded: bool, monkeypatch) -> None:
    # 40 prompt tokens + 16 new ones pass Gemma 2's and gpt-oss's window of 32: the sliding
    # caches drop keys, and left padding leaves the window during decoding.
    eager, model, kernel = _pair(name, monkeypatch)
    ids = torch.randint(0, 1024, (2, 40), generator=torch.Generator().manual_seed(3))
    mask = left_padded_mask(2, 40, [7 if padded else 0, 0], "cpu")
    kwargs = {"attention_mask": mask, "max_new_tokens": 16, "do_sample": False,
              "use_cache": True, "pad_token_id": 0}  # fmt: skip
    with torch.no_grad():
        want = eager.generate(ids, **kwargs)
        got = model.generate(ids, **kwargs)
    assert torch.equal(got, want)
    biased = [call["bias"] is not None for call in kernel.calls]
    assert any(biased) if padded else not any(biased)


def test_static_cache_prefill_runs_causal_top_left(monkeypatch) -> None:
    eager, model, kernel = _pair("llama", monkeypatch)
    ids = torch.randint(0, 1024, (2, 20), generator=torch.Generator().manual_seed(4))
    kwargs = {"attention_mask": torch.ones_like(ids), "max_new_tokens": 4, "do_sample": False,
              "cache_implementation": "static", "pad_token_id": 0}  # fmt: skip
    with torch.no_grad():
        want = eager.generate(ids, **kwargs)
        got = model.generate(ids, **kwargs)
    assert torch.equal(got, want)
    prefill = kernel.calls[0]
    assert (prefill["causal"], prefill["causal_alignment"]) == (True, "top_left")
    assert prefill["bias"] is None


@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt_oss"])
def test_the_real_op_takes_every_call_under_fake_tensors(name: str) -> None:
    # ckfmha.torch's fake implementations check the arguments and give the output shapes
    # without running a kernel: the calls the models make are well-formed.
    from torch._subclasses.fake_tensor import FakeTensorMode

    config = CONFIGS[name]()
    if config is None:
        pytest.skip(f"{name} is not in the installed transformers")
    hf.register()
    model = variant(build_model(config), "ckfmha", BF16, "cpu")
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        ids = torch.randint(0, 1024, (2, 77))
        mask = torch.ones(2, 77, dtype=torch.long)
        mask[0, :13] = 0
        for attention_mask in (None, mask):
            logits = model(ids, attention_mask=attention_mask).logits
            assert logits.shape == (2, 77, 1024) and logits.dtype == BF16


def test_t5_position_bias_and_cross_attention_match_eager(monkeypatch) -> None:
    # T5 passes its relative position bias as position_bias; its encoder and cross-attention
    # are bidirectional, and the encoder's padding reaches both.
    from transformers import AutoModelForSeq2SeqLM, T5Config

    hf.register()
    kernel = ReferenceKernel()
    monkeypatch.setattr(ckfmha.torch, "attention", kernel)
    config = T5Config(vocab_size=512, d_model=128, d_kv=64, d_ff=256, num_layers=2,
                      num_decoder_layers=2, num_heads=4)  # fmt: skip
    models = {}
    for impl in ("eager", "ckfmha"):
        torch.manual_seed(0)
        models[impl] = AutoModelForSeq2SeqLM.from_config(config, attn_implementation=impl).eval()
    ids = torch.randint(0, 512, (2, 19), generator=torch.Generator().manual_seed(5))
    decoder_ids = torch.randint(0, 512, (2, 7), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(2, 19, dtype=torch.long)
    mask[0, -4:] = 0
    with torch.no_grad():
        got, want = (models[impl](input_ids=ids, attention_mask=mask,
                                  decoder_input_ids=decoder_ids).logits
                     for impl in ("ckfmha", "eager"))  # fmt: skip
    torch.testing.assert_close(got, want, atol=LOGITS_ATOL, rtol=0)
    # Older transformers (5.4) ran T5's own attention code: no calls, eager's masks.
    assert all(call["bias"] is not None for call in kernel.calls)


def test_models_outside_the_attention_interface_get_eager_masks(monkeypatch) -> None:
    # transformers takes attn_implementation="ckfmha" for Bloom too, whose own attention
    # code adds the masks it is given: skipping one would lose causality.
    from transformers import BloomConfig

    hf.register()
    kernel = ReferenceKernel()
    monkeypatch.setattr(ckfmha.torch, "attention", kernel)
    config = BloomConfig(vocab_size=512, hidden_size=128, n_layer=2, n_head=4)
    assert not routing._attention_routed(config)
    ids = torch.randint(0, 512, (2, 19), generator=torch.Generator().manual_seed(7))
    logits = {}
    for impl in ("eager", "ckfmha"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()
        with torch.no_grad():
            logits[impl] = model(ids).logits
    torch.testing.assert_close(logits["ckfmha"], logits["eager"], atol=LOGITS_ATOL, rtol=0)
    assert not kernel.calls


def test_a_model_that_does_not_declare_the_interface_proves_it_with_a_call(monkeypatch) -> None:
    hf.register()
    monkeypatch.setattr(ckfmha.torch, "attention", ReferenceKernel())
    llama = CONFIGS["llama"]()
    build_model(llama)  # loads modeling_llama, where LlamaPreTrainedModel declares it
    assert routing._attention_routed(llama)

    class Undeclared(type(llama)):
        pass

    config = Undeclared(**llama.to_dict())
    padding = torch.ones(2, 6, dtype=torch.bool)
    before = hf.ckfmha_mask(2, 6, 6, attention_mask=padding, config=config, dtype=BF16)
    assert before is not None and before.dtype == BF16  # eager's float mask

    module = _Module()
    module.config = config
    q = torch.randn(2, 8, 6, 64)
    hf.ckfmha_attention_forward(module, q, q[:, :2], q[:, :2], before)
    assert hf.ckfmha_mask(2, 6, 6, attention_mask=padding, config=config, dtype=BF16) is None
