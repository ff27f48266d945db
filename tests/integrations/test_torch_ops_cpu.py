"""The torch.library ops without a GPU: schemas, fake implementations, autograd wiring and
torch.compile/export tracing, all on fake tensors (the real kernels need CUDA)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import ckfmha
import ckfmha.torch
from ckfmha.torch import attention_ops
from ckfmha.torch.sdpa import _as_bias

BF16 = torch.bfloat16


def _fake(*shape: int, dtype=BF16, grad: bool = False) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, requires_grad=grad)


@pytest.mark.parametrize("name", ["fwd", "bwd", "fwd_varlen", "bwd_varlen", "fwd_paged",
                                  "append_kv"])  # fmt: skip
def test_every_entry_point_is_a_registered_op(name: str) -> None:
    schema = str(getattr(torch.ops.ckfmha, name).default._schema)
    assert schema.startswith(f"ckfmha::{name}(")
    # Only append_kv writes its inputs, and it says so in the schema.
    assert ("(a!)" in schema) == (name == "append_kv")


@pytest.mark.parametrize(
    ("layout", "q_shape", "kv_shape", "hdim_v", "o_shape"),
    [
        ("bhsd", (2, 8, 77, 64), (2, 2, 101, 64), 64, (2, 8, 77, 64)),
        ("bshd", (3, 33, 12, 128), (3, 40, 4, 128), 128, (3, 33, 12, 128)),
        ("bhsd", (1, 40, 5, 192), (1, 8, 9, 192), 128, (1, 40, 5, 128)),
    ],
)
def test_fwd_fake_gives_exact_shapes(layout, q_shape, kv_shape, hdim_v, o_shape) -> None:
    with FakeTensorMode():
        q, k = _fake(*q_shape), _fake(*kv_shape)
        v = _fake(*kv_shape[:-1], hdim_v)
        o, lse = ckfmha.torch.attention(q, k, v, layout=layout, return_lse=True)
        assert tuple(o.shape) == o_shape and o.dtype == BF16 and o.is_contiguous()
        batch, heads, seqlen = (o_shape[0], o_shape[1], o_shape[2]) if layout == "bhsd" else (
            o_shape[0], o_shape[2], o_shape[1])
        assert tuple(lse.shape) == (batch, heads, seqlen) and lse.dtype == torch.float32


def test_varlen_and_paged_fakes_give_exact_shapes() -> None:
    with FakeTensorMode():
        q, k = _fake(300, 24, 64), _fake(410, 8, 64)
        cu = torch.empty(4, dtype=torch.int32)
        o, lse = ckfmha.torch.attention_varlen(q, k, k, cu, cu, max_seqlen_q=120,
                                               max_seqlen_k=200, return_lse=True)  # fmt: skip
        assert tuple(o.shape) == (300, 24, 64) and tuple(lse.shape) == (24, 300)
        cache = _fake(50, 16, 8, 128)
        table, lens = torch.empty(3, 7, dtype=torch.int32), torch.empty(3, dtype=torch.int32)
        o, lse = ckfmha.torch.fwd_paged(_fake(3, 32, 1, 128), cache, cache, block_table=table,
                                        seqlens_k=lens, max_seqlen_k=112, return_lse=True)
        assert tuple(o.shape) == (3, 32, 1, 128) and tuple(lse.shape) == (3, 32, 1)
        o = ckfmha.torch.fwd_paged(_fake(3, 4, 32, 128), cache, cache, block_table=table,
                                   seqlens_k=lens, layout="bshd")
        assert tuple(o.shape) == (3, 4, 32, 128)
        packed = ckfmha.torch.fwd_paged(_fake(11, 32, 128), cache, cache, block_table=table,
                                        seqlens_k=lens, cu_seqlens_q=cu, max_seqlen_q=5)
        assert tuple(packed.shape) == (11, 32, 128)
        vectorized_k, vectorized_v = _fake(50, 8, 16, 16, 8), _fake(50, 8, 128, 16)
        o = ckfmha.torch.fwd_paged(_fake(3, 32, 1, 128), vectorized_k, vectorized_v,
                                   block_table=table, seqlens_k=lens, page_layout="vectorized")
        assert tuple(o.shape) == (3, 32, 1, 128)


def test_append_kv_fake_returns_rotated_queries_or_nothing() -> None:
    with FakeTensorMode():
        cache, new = _fake(2, 64, 4, 64), _fake(2, 3, 4, 64)
        lens = torch.empty(2, dtype=torch.int32)
        assert ckfmha.torch.append_kv(cache, cache, new, new, lens) is None
        q = _fake(2, 3, 16, 64)
        rotated = ckfmha.torch.append_kv(cache, cache, new, new, lens, q=q)
        assert tuple(rotated.shape) == tuple(q.shape)


def test_autograd_gives_every_gradient_its_input_shape() -> None:
    with FakeTensorMode():
        q, k, v = _fake(2, 8, 77, 64, grad=True), _fake(2, 2, 90, 64, grad=True), _fake(
            2, 2, 90, 64, grad=True)
        bias = _fake(1, 8, 1, 90, grad=True)
        sink = _fake(8, grad=True)
        o = ckfmha.torch.attention(q, k, v, causal=True, bias=bias, sink=sink, softcap=30.0)
        o.sum().backward()
        for tensor in (q, k, v, bias, sink):
            assert tensor.grad is not None
            assert tensor.grad.shape == tensor.shape and tensor.grad.dtype == tensor.dtype


def test_lse_takes_no_gradient() -> None:
    with FakeTensorMode():
        q = _fake(1, 2, 16, 64, grad=True)
        o, lse = ckfmha.torch.attention(q, q, q, return_lse=True)
        assert o.requires_grad and not lse.requires_grad


def _train_step(q, k, v, bias):
    o = ckfmha.torch.attention(q, k, v, causal=True, bias=bias, dropout_p=0.1, dropout_seed=7)
    return torch.autograd.grad(o.float().square().sum(), (q, k, v))


def test_traced_training_step_calls_forward_and_backward_ops_once() -> None:
    q, k, v = (torch.randn(1, 4, 33, 64, dtype=BF16, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 4, 33, 33, dtype=BF16)  # takes no gradient: no dbias asked for
    graph = make_fx(_train_step, tracing_mode="fake")(q, k, v, bias)
    calls = [n for n in graph.graph.nodes if n.op == "call_function"]
    fwd = [n for n in calls if n.target == torch.ops.ckfmha.fwd.default]
    bwd = [n for n in calls if n.target == torch.ops.ckfmha.bwd.default]
    assert len(fwd) == 1 and len(bwd) == 1
    schema = torch.ops.ckfmha.bwd.default._schema
    args = dict(zip((a.name for a in schema.arguments), bwd[0].args))
    # The bias takes no gradient, so the backward asks for no dbias (a cheaper kernel).
    assert args["want_dbias"] is False and args["want_dsink"] is False
    # The backward replays the forward's dropout stream: it reads the forward's rng_state.
    rng_state = args["rng_state"]
    assert rng_state.op == "call_function" and rng_state.args[0] is fwd[0]
    assert rng_state.args[1] == 2 and args["dropout_p"] == 0.1


def test_compile_traces_the_gradient_function_in_one_graph() -> None:
    """ckfmha.torch.attention applies its gradient as a torch.autograd.Function when autograd
    records the call: Dynamo must trace it with fullgraph=True, both ops inside (the graph is
    captured, not run: the kernels need CUDA)."""
    graphs = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        return lambda *args: [torch.zeros(()) for _ in outputs]

    q, k, v = (torch.randn(1, 4, 33, 64, dtype=BF16, requires_grad=True) for _ in range(3))
    attention = lambda q, k, v: ckfmha.torch.attention(q, k, v, causal=True)
    torch.compile(attention, fullgraph=True, backend=capture)(q, k, v)
    assert len(graphs) == 1
    text = graphs[0].print_readable(print_output=False)
    assert "autograd_function_apply" in text
    assert "torch.ops.ckfmha.fwd(" in text and "torch.ops.ckfmha.bwd(" in text


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(64, 3 * 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).to(BF16).view(x.shape[0], x.shape[1], 3, 2, 32).unbind(2)
        o = ckfmha.torch.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                              is_causal=True)  # fmt: skip
        return o.transpose(1, 2).reshape(x.shape).float()


def test_export_traces_a_module_through_sdpa_with_no_graph_break() -> None:
    # torch.export traces with Dynamo and fails on any graph break.
    exported = torch.export.export(_Block(), (torch.randn(2, 17, 64),))
    targets = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert torch.ops.ckfmha.fwd.default in targets


def test_rng_state_follows_torch_manual_seed_and_given_seeds() -> None:
    torch.manual_seed(3)
    seed, first = attention_ops._rng_state(0.1, None)
    torch.manual_seed(3)
    assert torch.equal(first, attention_ops._rng_state(0.1, None)[1])
    assert first.tolist() == [seed, 0]
    assert attention_ops._rng_state(0.1, 1234)[1].tolist() == [1234, 0]
    assert attention_ops._rng_state(0.0, None)[0] == 0
    assert attention_ops._rng_state(0.0, None)[1].tolist() == [0, 0]
    # On the CPU whatever a device context says: the backward reads it without a sync.
    with torch.device("meta"):
        assert attention_ops._rng_state(0.1, 7)[1].device.type == "cpu"


def test_ops_refuse_cpu_tensors_naming_what_they_need() -> None:
    q = torch.randn(1, 2, 8, 64, dtype=torch.float16)
    with pytest.raises(ckfmha.InvalidArgumentError, match="runs on CUDA tensors"):
        ckfmha.torch.attention(q, q, q)


def test_sdpa_boolean_mask_becomes_minus_infinity_bias() -> None:
    q = torch.zeros(2, 3, 5, 64, dtype=torch.float16)
    mask = torch.tensor([[True, False, True, True]]).expand(5, 4)
    bias = _as_bias(mask, q, 4)
    assert bias.shape == (1, 1, 5, 4) and bias.dtype == torch.float16
    assert torch.isneginf(bias[..., 1]).all() and (bias[..., [0, 2, 3]] == 0).all()


def test_sdpa_float_mask_broadcasts_and_keys_are_expanded() -> None:
    q = torch.zeros(2, 3, 5, 64, dtype=BF16)
    per_head = torch.randn(3, 1, 4, dtype=BF16)
    bias = _as_bias(per_head, q, 4)
    assert bias.shape == (1, 3, 1, 4) and torch.equal(bias[0], per_head)
    per_query = torch.randn(5, 1, dtype=BF16)  # broadcast along keys: materialised
    bias = _as_bias(per_query, q, 4)
    assert bias.shape == (1, 1, 5, 4) and bias.stride(-1) == 1
    assert torch.equal(bias[0, 0, :, 3], per_query[:, 0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attn_mask": torch.ones(4, 4, dtype=torch.bool), "is_causal": True}, "not both"),
        ({"attn_mask": torch.ones(4, 4, dtype=torch.float32)}, "must be bool or"),
        ({"attn_mask": torch.ones(1, 1, 1, 4, 4, dtype=torch.bool)}, "at most 4 dims"),
    ],
)
def test_sdpa_argument_errors(kwargs, message: str) -> None:
    q = torch.zeros(1, 2, 4, 64, dtype=BF16)
    with pytest.raises(ckfmha.InvalidArgumentError, match=message):
        ckfmha.torch.sdpa(q, q, q, **kwargs)


def test_sdpa_needs_enable_gqa_for_grouped_heads() -> None:
    q, k = torch.zeros(1, 8, 4, 64, dtype=BF16), torch.zeros(1, 2, 4, 64, dtype=BF16)
    with pytest.raises(ckfmha.InvalidArgumentError, match="enable_gqa=True"):
        ckfmha.torch.sdpa(q, k, k)
    with FakeTensorMode():
        o = ckfmha.torch.sdpa(_fake(1, 8, 4, 64), _fake(1, 2, 4, 64), _fake(1, 2, 4, 64),
                              enable_gqa=True)  # fmt: skip
        assert tuple(o.shape) == (1, 8, 4, 64)
        o3 = ckfmha.torch.sdpa(_fake(3, 9, 64), _fake(3, 11, 64), _fake(3, 11, 32))
        assert tuple(o3.shape) == (3, 9, 32)
