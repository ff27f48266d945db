"""The torch entry points' eager route (``ckfmha.torch.eager``), on the CPU.

What decides the route is checked under each tracer and mode that must keep the ops. The
route's gradient Function is checked by running it with float64 stand-ins for the forward
op's CUDA implementation and for ckfmha.bwd: the gradients must reach the arguments they belong to, summed over a
bias's broadcast axes, with the gradients nobody asked for not computed.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import ckfmha
import ckfmha.torch
from ckfmha.torch import attention_ops, autograd, eager


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_nothing_intercepts_plain_eager_code() -> None:
    assert eager.nothing_intercepts()


@pytest.mark.parametrize("context", [
    lambda: torch.device("cpu"), FakeTensorMode, _Passthrough,
], ids=["device-context", "fake-tensor-mode", "dispatch-mode"])  # fmt: skip
def test_modes_keep_the_ops(context: Any) -> None:
    with context():
        assert not eager.nothing_intercepts()


def test_compiled_code_keeps_the_ops() -> None:
    flag = torch.compile(lambda x: x + float(eager.nothing_intercepts()), backend="eager")
    assert float(flag(torch.zeros(()))) == 0.0


def test_host_subclass_and_transformed_tensors_keep_the_ops() -> None:
    q = torch.randn(1, 2, 8, 64)
    assert not eager.untraced(q)  # on the CPU: the dispatcher would pick the CPU kernel
    assert not eager._plain(torch.nn.Parameter(q))
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(q)
    assert not eager._plain(fake)
    seen = []
    torch.vmap(lambda x: seen.append(eager._plain(x)) or x)(q)
    assert seen == [False]
    assert eager._plain(q)


# ---- the eager Function, with float64 stand-ins for the CUDA implementations ----


def _reference(q, k, v, bias, sink, causal: bool) -> tuple:
    """float64 attention: o and the LSE (the sink joins the denominator)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    if causal:
        visible = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        column = sink.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        scores = torch.cat([scores, column], dim=-1)
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - lse.unsqueeze(-1))[..., : k.shape[-2]]
    return p @ v, lse


class _StandIns:
    """run_fwd and ckfmha.bwd over float64 CPU tensors, recording what the backward was
    asked."""

    def __init__(self) -> None:
        self.forwards = 0
        self.asked: list[tuple[bool, bool]] = []

    def run_fwd(self, q, k, v, bias, alibi_slopes, sink, causal, *rest) -> tuple:
        self.forwards += 1
        o, lse = _reference(q, k, v, bias, sink, causal)
        return o, lse.float(), torch.zeros(2, dtype=torch.int64)

    def bwd(self, dout, q, k, v, out, lse, *, causal, bias, sink, return_dbias, return_dsink,
            **options) -> tuple:  # fmt: skip
        """ckfmha.bwd's results: (dq, dk, dv), then dbias and dsink where asked for."""
        want_dbias, want_dsink = return_dbias, return_dsink
        self.asked.append((want_dbias, want_dsink))
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            full = None if bias is None else bias.detach().expand(
                *q.shape[:3], k.shape[-2]).clone().requires_grad_()  # fmt: skip
            fp32_sink = None if sink is None else sink.detach().requires_grad_()
            o, _ = _reference(*leaves, full, fp32_sink, causal)
            wrt = leaves + [t for t in (full, fp32_sink) if t is not None]
            grads = list(torch.autograd.grad(o, wrt, dout))
        wanted = [grads[3]] if want_dbias else []
        if want_dsink:
            wanted.append(grads[-1].float())
        return (*grads[:3], *wanted)


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> _StandIns:
    fakes = _StandIns()
    monkeypatch.setattr(eager, "untraced", lambda *tensors: True)
    monkeypatch.setattr(attention_ops, "run_fwd", fakes.run_fwd)
    monkeypatch.setattr(ckfmha, "bwd", fakes.bwd)
    function = autograd._eager_function("AttentionEager", fakes.run_fwd, autograd._setup_fwd,
                                        autograd._prepare_fwd, autograd._backward_fwd)  # fmt: skip
    monkeypatch.setattr(autograd, "AttentionEager", function)
    return fakes


def _inputs(bias_grad: bool, sink_grad: bool) -> tuple:
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 9, 16, dtype=torch.float64, generator=generator)
               .requires_grad_() for _ in range(3))  # fmt: skip
    bias = torch.randn(1, 3, 1, 9, dtype=torch.float64, generator=generator)
    sink = torch.randn(3, dtype=torch.float32, generator=generator)
    return q, k, v, bias.requires_grad_(bias_grad), sink.requires_grad_(sink_grad)


@pytest.mark.parametrize("bias_grad,sink_grad", [(True, True), (False, True), (True, False),
                                                 (False, False)])  # fmt: skip
def test_eager_function_returns_each_gradient_to_its_argument(stand_ins: _StandIns,
                                                              bias_grad: bool,
                                                              sink_grad: bool) -> None:  # fmt: skip
    q, k, v, bias, sink = _inputs(bias_grad, sink_grad)
    o = ckfmha.torch.attention(q, k, v, causal=True, bias=bias, sink=sink)
    weights = torch.randn(o.shape, dtype=torch.float64)
    (o * weights).sum().backward()
    assert stand_ins.forwards == 1 and stand_ins.asked == [(bias_grad, sink_grad)]

    leaves = _inputs(bias_grad, sink_grad)
    expected, _ = _reference(*leaves, causal=True)
    (expected * weights).sum().backward()
    torch.testing.assert_close(o, expected.detach())
    for ours, theirs in zip((q, k, v, bias, sink), leaves):
        if not theirs.requires_grad:
            assert ours.grad is None
            continue
        assert ours.grad is not None and ours.grad.shape == ours.shape
        assert ours.grad.dtype == ours.dtype
        # A broadcast bias's gradient is summed in fp32, as the ops do.
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-6)


def test_eager_route_without_a_gradient_calls_the_implementation(stand_ins: _StandIns) -> None:
    q, k, v, bias, sink = (t.detach() for t in _inputs(False, False))
    o, lse = ckfmha.torch.attention(q, k, v, causal=True, bias=bias, sink=sink, return_lse=True)
    expected, expected_lse = _reference(q, k, v, bias, sink, True)
    assert stand_ins.forwards == 1 and not o.requires_grad
    torch.testing.assert_close(o, expected)
    torch.testing.assert_close(lse, expected_lse.float())
