"""The torch integration on the GPU: opcheck for every op, each forward feature's gradients
against float64 autograd, torch.compile(fullgraph=True) against eager, and sdpa against
F.scaled_dot_product_attention."""

from __future__ import annotations

import math
from typing import Any

import pytest

import ckfmha

pytestmark = pytest.mark.gpu

if ckfmha.device_count() == 0:
    pytest.skip("no CUDA device", allow_module_level=True)
torch = pytest.importorskip("torch")

from support.torch_reference import attention_f64, keep_mask

import ckfmha.torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# Relative L2 error of a gradient against float64 autograd: the backward tests' bounds (bf16
# keeps 8 mantissa bits, fp16 11; dS is formed from P rounded to the input dtype).
GRAD_TOL = {"fp16": 4e-3, "bf16": 3e-2}
OUT_TOL = {"fp16": 2e-3, "bf16": 1.5e-2}


def _rel(got: Any, want: Any) -> float:
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def _leaf(t: Any) -> Any:
    return t.detach().clone().requires_grad_()


# (name, options): each feature a forward takes, with the mask its models use it with.
FEATURE_CASES = [
    ("causal_bottom_right", {"causal": True, "causal_alignment": "bottom_right"}),
    ("window", {"window": (32, 0)}),
    ("softcap_causal", {"causal": True, "softcap": 5.0}),
    ("softcap_window", {"window": (40, 0), "softcap": 4.0}),
    ("sink_causal", {"causal": True, "sink": True}),
    ("sink_window", {"window": (24, 0), "sink": True}),
    ("alibi_causal", {"causal": True, "alibi": True}),
    ("dropout_causal", {"causal": True, "dropout_p": 0.17}),
    ("dropout", {"dropout_p": 0.1}),
    ("bias_with_grad", {"bias": "grad"}),
    ("bias_as_mask", {"bias": "fixed"}),
    # A padded decoder batch: causal and one bias row per sequence (Hopper: row mode forward,
    # one value a key in the backward).
    ("padding_causal", {"causal": True, "bias": "padding"}),
]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("hdim", [64, 128])
@pytest.mark.parametrize(("name", "options"), FEATURE_CASES, ids=[c[0] for c in FEATURE_CASES])
def test_feature_gradients_match_float64_autograd(name: str, options: dict, dtype: str,
                                                  hdim: int) -> None:  # fmt: skip
    torch.manual_seed(hash((name, dtype, hdim)) % (1 << 31))
    b, hq, hk, sq, sk = 2, 12, 4, 77, 93
    dt = DTYPES[dtype]
    q = (torch.randn(b, hq, sq, hdim, device="cuda") * 1.5).to(dt).requires_grad_()
    k = (torch.randn(b, hk, sk, hdim, device="cuda") * 1.5).to(dt).requires_grad_()
    v = torch.randn(b, hk, sk, hdim, device="cuda").to(dt).requires_grad_()
    kwargs: dict[str, Any] = {key: options[key] for key in
                              ("causal", "causal_alignment", "window", "softcap") if key in options}
    ref_kwargs = dict(kwargs)
    leaves = {"q": q, "k": k, "v": v}
    if options.get("sink"):
        sink = (torch.randn(hq, device="cuda") * 2).requires_grad_()
        kwargs["sink"] = ref_kwargs["sink"] = leaves["sink"] = sink
    if options.get("alibi"):
        slopes = torch.tensor([2.0 ** (-8 * (i + 1) / hq) for i in range(hq)], device="cuda")
        kwargs["alibi_slopes"] = ref_kwargs["alibi_slopes"] = slopes
    if options.get("bias") == "padding":
        bias = torch.randn(b, 1, 1, sk, device="cuda").to(dt)
        bias[0, ..., sk - 4:] = float("-inf")
        bias[1, ..., 5] = float("-inf")
        kwargs["bias"] = ref_kwargs["bias"] = bias
    elif "bias" in options:
        bias = torch.randn(1, hq, sq, sk, device="cuda").to(dt)
        bias[..., 5] = float("-inf")  # a masked key, as a padding mask gives
        if options["bias"] == "grad":
            bias = torch.randn(1, hq, 1, sk, device="cuda").to(dt).requires_grad_()
            leaves["bias"] = bias
        kwargs["bias"] = ref_kwargs["bias"] = bias
    if "dropout_p" in options:
        seed = 1234 + hdim
        kwargs.update(dropout_p=options["dropout_p"], dropout_seed=seed)
        ref_kwargs.update(dropout_p=options["dropout_p"],
                          keep=keep_mask(seed, options["dropout_p"], b, hq, sq, sk, "cuda"))

    out = ckfmha.torch.attention(q, k, v, **kwargs)
    upstream = torch.randn_like(out)
    (out.float() * upstream.float()).sum().backward()

    ref_leaves = {key: _leaf(t) for key, t in leaves.items()}
    ref_inputs = {**ref_kwargs, **{key: t for key, t in ref_leaves.items()
                                   if key in ("sink", "bias")}}  # fmt: skip
    ref = attention_f64(ref_leaves["q"], ref_leaves["k"], ref_leaves["v"], **ref_inputs)
    (ref * upstream.double()).sum().backward()

    errors = {"out": _rel(out, ref)}
    assert errors["out"] < OUT_TOL[dtype] * 2, f"{name}: output error {errors['out']:.3e}"
    for key, leaf in leaves.items():
        assert leaf.grad is not None, f"{name}: no gradient for {key}"
        assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == leaf.dtype
        errors[key] = _rel(leaf.grad, ref_leaves[key].grad)
        assert errors[key] < GRAD_TOL[dtype], f"{name}: d{key} relative error {errors[key]:.3e}"
    print(f"{name} {dtype} d{hdim}: " + ", ".join(f"{k} {e:.2e}" for k, e in errors.items()))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 128])
def test_varlen_gradients_match_float64_autograd(dtype: str, d: int) -> None:
    torch.manual_seed(5 + d)
    lengths_q, lengths_k = [50, 0, 127, 1], [61, 9, 127, 40]
    hq, hk, dt = 24, 8, DTYPES[dtype]
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")  # fmt: skip
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")  # fmt: skip
    q = torch.randn(sum(lengths_q), hq, d, device="cuda").to(dt).requires_grad_()
    k = torch.randn(sum(lengths_k), hk, d, device="cuda").to(dt).requires_grad_()
    v = torch.randn(sum(lengths_k), hk, d, device="cuda").to(dt).requires_grad_()
    out = ckfmha.torch.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=max(lengths_q),
                                        max_seqlen_k=max(lengths_k), causal=True,
                                        causal_alignment="bottom_right")  # fmt: skip
    upstream = torch.randn_like(out)
    (out.float() * upstream.float()).sum().backward()
    rq, rk, rv = _leaf(q), _leaf(k), _leaf(v)
    pieces = []
    for i in range(len(lengths_q)):
        sq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        sk = slice(int(cu_k[i]), int(cu_k[i + 1]))
        pieces.append(attention_f64(rq[sq].transpose(0, 1)[None], rk[sk].transpose(0, 1)[None],
                                    rv[sk].transpose(0, 1)[None], causal=True,
                                    causal_alignment="bottom_right")[0].transpose(0, 1))
    ref = torch.cat(pieces)
    (ref * upstream.double()).sum().backward()
    assert _rel(out, ref) < OUT_TOL[dtype] * 2
    for got, want, what in ((q, rq, "dq"), (k, rk, "dk"), (v, rv, "dv")):
        assert _rel(got.grad, want.grad) < GRAD_TOL[dtype], what


def test_bshd_layout_and_deterministic_backward() -> None:
    torch.manual_seed(9)
    q = torch.randn(2, 130, 40, 64, device="cuda", dtype=torch.bfloat16).requires_grad_()
    k = torch.randn(2, 150, 8, 64, device="cuda", dtype=torch.bfloat16).requires_grad_()
    v = torch.randn(2, 150, 8, 64, device="cuda", dtype=torch.bfloat16).requires_grad_()
    upstream = torch.randn(2, 130, 40, 64, device="cuda", dtype=torch.bfloat16)
    grads = []
    for _ in range(2):
        out = ckfmha.torch.attention(q, k, v, causal=True, layout="bshd", deterministic=True)
        grads.append(torch.autograd.grad(out, (q, k, v), upstream))
    for first, second in zip(*grads):
        assert torch.equal(first, second), "deterministic backward differs between runs"
    rq, rk, rv = (_leaf(t.transpose(1, 2)) for t in (q, k, v))
    ref = attention_f64(rq, rk, rv, causal=True).transpose(1, 2)
    (ref * upstream.double()).sum().backward()
    for got, want in zip(grads[0], (rq, rk, rv)):
        assert _rel(got, want.grad.transpose(1, 2)) < GRAD_TOL["bf16"]


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "padding_bias"])
def test_eager_route_matches_the_ops(bias: bool) -> None:
    """Plain CUDA tensors take the eager route (the ops' implementations without the
    dispatcher); its outputs and gradients equal the ops' through the traced route's Function,
    and both match float64 autograd."""
    from ckfmha.torch import autograd, eager

    torch.manual_seed(21 + bias)
    q, k, v = _qkv(2, 12, 4, 77, 90, 64, grad=True)
    mask = None
    if bias:
        mask = torch.zeros(2, 1, 1, 90, device="cuda", dtype=torch.bfloat16)
        mask[0, ..., 70:] = float("-inf")
    assert eager.untraced(q, k, v, mask)
    upstream = torch.randn(2, 12, 77, 64, device="cuda", dtype=torch.bfloat16)
    eager_out = ckfmha.torch.attention(q, k, v, causal=True, bias=mask)
    eager_grads = torch.autograd.grad(eager_out, (q, k, v), upstream)
    fp8_kv_defaults = (None,) * 5
    op_out, _, _ = autograd.Attention.apply(*_fwd_args(q, k, v, causal=True, bias=mask),
                                            *fp8_kv_defaults)  # fmt: skip
    op_grads = torch.autograd.grad(op_out, (q, k, v), upstream)
    assert torch.equal(eager_out, op_out)
    rq, rk, rv = (_leaf(t) for t in (q, k, v))
    ref = attention_f64(rq, rk, rv, causal=True, bias=None if mask is None else mask.double())
    (ref * upstream.double()).sum().backward()
    assert _rel(eager_out, ref) < OUT_TOL["bf16"]
    for ours, theirs, want in zip(eager_grads, op_grads, (rq, rk, rv)):
        # dQ is summed with atomics across key blocks: equal up to their order.
        assert _rel(ours, theirs) < 1e-3
        assert _rel(ours, want.grad) < GRAD_TOL["bf16"]


# ---- opcheck: schema, fake tensors, autograd registration and AOT dispatch ----


def _qkv(b: int, hq: int, hk: int, sq: int, sk: int, d: int, grad: bool = False) -> tuple:
    make = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)
    q, k, v = make(b, hq, sq, d), make(b, hk, sk, d), make(b, hk, sk, d)
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def _fwd_args(q, k, v, **overrides) -> tuple:
    options = {"bias": None, "alibi_slopes": None, "sink": None, "causal": False,
               "causal_alignment": "top_left", "window": None, "scale": None, "softcap": 0.0,
               "dropout_p": 0.0, "dropout_seed": None, "layout": "bhsd",
               "deterministic": False}  # fmt: skip
    options.update(overrides)
    return (q, k, v, *options.values())


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize(
    "overrides",
    [
        {"causal": True},
        {"causal": True, "softcap": 5.0},
        {"window": [16, 0], "sink": "sink"},
        {"causal": True, "dropout_p": 0.2, "dropout_seed": 77},
    ],
    ids=["causal", "softcap", "sink_window", "dropout"],
)
def test_opcheck_fwd(overrides: dict, grad: bool) -> None:
    q, k, v = _qkv(2, 8, 2, 33, 47, 64, grad)
    if overrides.get("sink") == "sink":
        overrides = {**overrides, "sink": torch.randn(8, device="cuda").requires_grad_(grad)}
    torch.library.opcheck(torch.ops.ckfmha.fwd.default, _fwd_args(q, k, v, **overrides))


def test_opcheck_bwd() -> None:
    q, k, v = _qkv(2, 8, 2, 33, 47, 64)
    o, lse, rng = torch.ops.ckfmha.fwd(*_fwd_args(q, k, v, causal=True, dropout_p=0.1,
                                                  dropout_seed=5))  # fmt: skip
    sink = torch.randn(8, device="cuda")
    args = (torch.randn_like(o), q, k, v, o, lse, rng, None, None, None, True, "top_left", None,
            None, 0.0, 0.1, "bhsd", False, False, False)  # fmt: skip
    torch.library.opcheck(torch.ops.ckfmha.bwd.default, args)
    o, lse, rng = torch.ops.ckfmha.fwd(*_fwd_args(q, k, v, causal=True, sink=sink))
    args = (torch.randn_like(o), q, k, v, o, lse, rng, None, None, sink, True, "top_left", None,
            None, 0.0, 0.0, "bhsd", False, False, True)  # fmt: skip
    torch.library.opcheck(torch.ops.ckfmha.bwd.default, args)


def _varlen_inputs(grad: bool = False) -> tuple:
    cu_q = torch.tensor([0, 20, 20, 63], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 31, 40, 90], dtype=torch.int32, device="cuda")
    q = torch.randn(63, 8, 64, device="cuda", dtype=torch.bfloat16).requires_grad_(grad)
    k = torch.randn(90, 2, 64, device="cuda", dtype=torch.bfloat16).requires_grad_(grad)
    v = torch.randn(90, 2, 64, device="cuda", dtype=torch.bfloat16).requires_grad_(grad)
    return q, k, v, cu_q, cu_k


def test_opcheck_varlen_ops() -> None:
    q, k, v, cu_q, cu_k = _varlen_inputs(grad=True)
    features = (None, None, None, True, "bottom_right", None, None, 0.0, 0.0)
    torch.library.opcheck(torch.ops.ckfmha.fwd_varlen.default,
                          (q, k, v, cu_q, cu_k, 43, 50, *features, None, False))  # fmt: skip
    q, k, v = (t.detach() for t in (q, k, v))
    o, lse, rng = torch.ops.ckfmha.fwd_varlen(q, k, v, cu_q, cu_k, 43, 50, *features, None,
                                              False)  # fmt: skip
    torch.library.opcheck(torch.ops.ckfmha.bwd_varlen.default,
                          (torch.randn_like(o), q, k, v, o, lse, rng, cu_q, cu_k, 43, 50,
                           *features, False, False, False))  # fmt: skip


def _paged_cache(num_pages: int = 24, page_size: int = 16, heads: int = 2, d: int = 128):
    k_cache = torch.randn(num_pages, page_size, heads, d, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn(num_pages, page_size, heads, d, device="cuda", dtype=torch.bfloat16)
    table = torch.randperm(num_pages, device="cuda").to(torch.int32)[:18].view(3, 6)
    lens = torch.tensor([70, 1, 96], dtype=torch.int32, device="cuda")
    return k_cache, v_cache, table, lens


def test_opcheck_paged_and_append_ops() -> None:
    k_cache, v_cache, table, lens = _paged_cache()
    q = torch.randn(3, 16, 1, 128, device="cuda", dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.ckfmha.fwd_paged.default,
                          (q, k_cache, v_cache, table, lens, None, None, None, None, 96, True,
                           "bottom_right", None, None, 0.0, "bhsd", "linear", 0))  # fmt: skip
    cache = torch.randn(2, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    new = torch.randn(2, 3, 2, 128, device="cuda", dtype=torch.bfloat16)
    lengths = torch.tensor([5, 40], dtype=torch.int32, device="cuda")
    qn = torch.randn(2, 3, 16, 128, device="cuda", dtype=torch.bfloat16)
    angles = torch.rand(64, 64, device="cuda") * 6.0
    torch.library.opcheck(torch.ops.ckfmha.append_kv.default,
                          (cache.clone(), cache.clone(), new, new, lengths, angles.cos(),
                           angles.sin(), False, qn, None, "bshd", "linear"))  # fmt: skip
    torch.library.opcheck(torch.ops.ckfmha.append_kv.default,
                          (cache.clone(), cache.clone(), new, new, lengths, None, None, False,
                           None, None, "bshd", "linear"))  # fmt: skip


def test_paged_and_append_ops_match_the_python_api() -> None:
    k_cache, v_cache, table, lens = _paged_cache()
    q = torch.randn(3, 16, 1, 128, device="cuda", dtype=torch.bfloat16)
    want = ckfmha.fwd_paged(q, k_cache, v_cache, block_table=table, seqlens_k=lens,
                            max_seqlen_k=96, causal=True, causal_alignment="bottom_right")
    got = torch.compile(ckfmha.torch.fwd_paged, fullgraph=True)(
        q, k_cache, v_cache, block_table=table, seqlens_k=lens, max_seqlen_k=96, causal=True,
        causal_alignment="bottom_right")  # fmt: skip
    assert torch.equal(got, want)
    cache_a = torch.randn(2, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    cache_b = cache_a.clone()
    new = torch.randn(2, 3, 2, 128, device="cuda", dtype=torch.bfloat16)
    lengths = torch.tensor([5, 40], dtype=torch.int32, device="cuda")
    ckfmha.append_kv(cache_a, cache_a.clone(), new, new, lengths)

    def step(cache: Any) -> Any:
        ckfmha.torch.append_kv(cache, torch.empty_like(cache), new, new, lengths)
        return cache.sum()

    torch.compile(step, fullgraph=True)(cache_b)
    assert torch.equal(cache_a, cache_b), "the compiled append wrote a different cache"


# ---- torch.compile(fullgraph=True) against eager ----


class TinyGPT(torch.nn.Module):
    """Two pre-norm decoder blocks with GQA attention through ckfmha (or SDPA)."""

    def __init__(self, use_ckfmha: bool, vocab: int = 256, width: int = 256, heads: int = 4,
                 kv_heads: int = 2) -> None:  # fmt: skip
        super().__init__()
        self.use_ckfmha, self.heads, self.kv_heads = use_ckfmha, heads, kv_heads
        self.head_dim = width // heads
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict({
                "norm1": torch.nn.LayerNorm(width),
                "qkv": torch.nn.Linear(width, (heads + 2 * kv_heads) * self.head_dim),
                "proj": torch.nn.Linear(width, width),
                "norm2": torch.nn.LayerNorm(width),
                "mlp": torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                           torch.nn.Linear(4 * width, width)),
            })
            for _ in range(2)
        )  # fmt: skip
        self.head = torch.nn.Linear(width, vocab)

    def attend(self, q: Any, k: Any, v: Any) -> Any:
        if self.use_ckfmha:
            return ckfmha.torch.attention(q, k, v, causal=True)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                enable_gqa=True)  # fmt: skip

    def forward(self, tokens: Any) -> Any:
        x = self.embed(tokens)
        b, s, _ = x.shape
        for block in self.blocks:
            qkv = block["qkv"](block["norm1"](x)).to(torch.bfloat16)
            q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                                 self.kv_heads * self.head_dim], dim=-1)  # fmt: skip
            q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
            o = self.attend(q, k, v).transpose(1, 2).reshape(b, s, -1).float()
            x = x + block["proj"](o)
            x = x + block["mlp"](block["norm2"](x))
        return self.head(x)


def test_compiled_model_matches_eager_outputs_and_gradients() -> None:
    torch.manual_seed(0)
    model = TinyGPT(use_ckfmha=True).cuda()
    tokens = torch.randint(0, 256, (3, 77), device="cuda")
    compiled = torch.compile(model, fullgraph=True)
    eager_logits = model(tokens)
    eager_logits.float().square().mean().backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled_logits = compiled(tokens)
    compiled_logits.float().square().mean().backward()
    worst = max(_rel(p.grad, g) for p, g in zip(model.parameters(), eager_grads))
    print(f"compiled vs eager: logits {_rel(compiled_logits, eager_logits):.2e}, worst "
          f"parameter gradient {worst:.2e} (relative L2)")
    assert _rel(compiled_logits, eager_logits) < 1e-2
    assert worst < 3e-2, f"compiled gradients differ from eager by {worst:.3e}"


def test_compiled_training_tracks_sdpa() -> None:
    """A small GPT trained through the compiled ckfmha model keeps the loss of the same model
    trained through torch's SDPA (same initialisation, same batches)."""
    losses = {}
    for use_ckfmha in (True, False):
        torch.manual_seed(1)
        model = TinyGPT(use_ckfmha=use_ckfmha).cuda()
        step_model = torch.compile(model, fullgraph=True) if use_ckfmha else model
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        data = torch.Generator(device="cuda").manual_seed(2)
        history = []
        for _ in range(40):
            tokens = torch.randint(0, 256, (4, 97), device="cuda", generator=data)
            # A learnable sequence: each token predicts the one it follows by a fixed shift.
            logits = step_model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256),
                                                     ((tokens[:, :-1] + 7) % 256).reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            history.append(float(loss))
        losses[use_ckfmha] = history
    gap = max(abs(a - b) for a, b in zip(losses[True], losses[False]))
    print(f"largest loss gap over 40 steps: {gap:.2e} (final {losses[True][-1]:.4f})")
    assert losses[True][-1] < 0.5 * losses[True][0], "the model did not train"
    assert gap < 2e-2


# ---- sdpa against F.scaled_dot_product_attention ----


SDPA_CASES = [
    ("is_causal", {"is_causal": True}, (2, 12, 12, 77, 77, 64)),
    ("gqa", {"is_causal": True, "enable_gqa": True}, (2, 24, 8, 100, 100, 128)),
    ("bool_padding_mask", {"mask": "bool"}, (2, 12, 12, 65, 80, 64)),
    ("float_mask_grad", {"mask": "float"}, (2, 8, 8, 40, 57, 128)),
    ("scale", {"scale": 0.3}, (1, 40, 40, 33, 129, 64)),
]


@pytest.mark.parametrize(("name", "options", "shape"), SDPA_CASES,
                         ids=[c[0] for c in SDPA_CASES])  # fmt: skip
def test_sdpa_matches_torch_sdpa(name: str, options: dict, shape: tuple) -> None:
    torch.manual_seed(len(name))
    b, hq, hk, sq, sk, d = shape
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
               for h, s in ((hq, sq), (hk, sk), (hk, sk)))  # fmt: skip
    kwargs: dict[str, Any] = {key: options[key] for key in ("is_causal", "enable_gqa", "scale")
                              if key in options}  # fmt: skip
    leaves = [q, k, v]
    if options.get("mask") == "bool":
        lengths = torch.tensor([sk, sk - 23], device="cuda")
        kwargs["attn_mask"] = (torch.arange(sk, device="cuda")[None, :] < lengths[:, None]
                               )[:, None, None, :]  # fmt: skip
    elif options.get("mask") == "float":
        mask = torch.randn(1, hq, sq, sk, device="cuda", dtype=torch.bfloat16).requires_grad_()
        kwargs["attn_mask"] = mask
        leaves.append(mask)
    out = ckfmha.torch.sdpa(q, k, v, **kwargs)
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, upstream)
    ref_leaves = [_leaf(t.double()) for t in leaves]
    ref_kwargs = dict(kwargs)
    if "attn_mask" in kwargs and kwargs["attn_mask"].dtype != torch.bool:
        ref_kwargs["attn_mask"] = ref_leaves[3]
    ref = torch.nn.functional.scaled_dot_product_attention(*ref_leaves[:3], **ref_kwargs)
    ref_grads = torch.autograd.grad(ref, ref_leaves, upstream.double())
    assert _rel(out, ref) < OUT_TOL["bf16"], f"{name}: output"
    for got, want, what in zip(grads, ref_grads, ("dq", "dk", "dv", "dmask")):
        assert _rel(got, want) < GRAD_TOL["bf16"], f"{name}: {what} {_rel(got, want):.3e}"


def test_sdpa_three_dimensional_inputs_and_dropout() -> None:
    q = torch.randn(3, 50, 64, device="cuda", dtype=torch.float16)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), q.double(), q.double())
    assert _rel(ckfmha.torch.sdpa(q, q, q), ref) < OUT_TOL["fp16"]
    # Dropout: the expectation over masks is the undropped output; a fresh seed per call.
    first = ckfmha.torch.sdpa(q, q, q, dropout_p=0.5)
    second = ckfmha.torch.sdpa(q, q, q, dropout_p=0.5)
    assert not torch.equal(first, second)
    mean = torch.stack([ckfmha.torch.sdpa(q, q, q, dropout_p=0.5) for _ in range(64)]).mean(0)
    assert _rel(mean, ref) < 0.2 and math.isfinite(float(mean.abs().max()))
