"""fp8 (e4m3) queries without a GPU: every argument error of fwd and fwd_varlen over fp8 q
(raised before anything reaches a device), the problem struct and first-use key, the C
library's refusals of fp8-query problems it does not serve, and the torch op's schema, output
dtype and gradient refusal.

The calls run on ``ckfmha.device_ptr`` views at made-up addresses with an explicit ``out``, so
nothing is allocated or staged before the checks under test.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import ckfmha
from ckfmha import _dtypes, errors
from ckfmha._fwd import first_use_key
from ckfmha.fp8_attention import check_q_scale_heads, out_dtype_of, q_quant_of

no_gpu = pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")

FP8 = "fp8_e4m3"
Q_SHAPE = (2, 8, 33, 128)  # bhsd: 2 sequences, 8 query heads, 33 queries, d128
KV_SHAPE = (2, 2, 100, 128)  # 2 K/V heads (GQA groups of 4), 100 keys


def _ptr(shape: tuple[int, ...], dtype: str = "bf16", address: int = 0x400000,
         device: int = 0) -> Any:  # fmt: skip
    return ckfmha.device_ptr(address, shape, dtype, device=device)


def _fwd(q: str = FP8, kv: str = FP8, o: str = "bf16", **kwargs: Any) -> Any:
    """fwd on device pointers: q, k and v arrays of dtypes ``q`` and ``kv``, an explicit out
    of dtype ``o`` (fp8 q, k and v and a bf16 out by default); ``kwargs`` go to fwd."""
    kwargs.setdefault("out", _ptr(Q_SHAPE, o, 0x800000))
    return ckfmha.fwd(
        _ptr(Q_SHAPE, q),
        _ptr(KV_SHAPE, kv, 0x500000),
        _ptr(KV_SHAPE, kv, 0x600000),
        **kwargs,
    )


def _device_scales(q_count: int, kv_count: int, dtype: str = "fp32",
                   device: int = 0) -> dict[str, Any]:  # fmt: skip
    return {
        "q_scale": _ptr((q_count,), dtype, 0xB00200, device),
        "k_scale": _ptr((kv_count,), "fp32", 0xB00000),
        "v_scale": _ptr((kv_count,), "fp32", 0xB00100),
    }


# ---- argument errors: fwd ----

# (arrays: q, kv and o (out) dtypes; fwd's keyword arguments; the message)
FWD_ERRORS: list[tuple[dict[str, str], dict[str, Any], str]] = [
    ({"kv": "bf16"}, {}, r"q is fp8_e4m3 but k and v are bf16 and bf16: fp8 queries need fp8 K/V"),
    ({"kv": "fp16", "o": "fp16"}, {"kv_dtype": None}, r"fp8 queries need fp8 K/V"),
    (
        {"q": "bf16", "kv": "bf16"},
        {"q_scale": 0.5},
        r"q_scale is given, but q is bf16: it dequantises fp8 queries only",
    ),
    (
        {"q": "bf16"},
        {"q_scale": 0.5},
        r"q_scale is given, but q is bf16",
    ),
    ({"q": "uint8"}, {}, r"q is uint8: if it holds e4m3 codes, say so with q_dtype='fp8_e4m3'"),
    ({"q": "bf16"}, {"q_dtype": FP8}, r"q: dtype=fp8_e4m3 given, but the array holds bf16"),
    ({}, {"q_scale": 0.0}, r"q_scale is 0.0; fp8 q stands for q_scale \* value, so the scale"),
    ({}, {"q_scale": -1.0}, r"q_scale is -1.0.*positive and finite"),
    ({}, {"q_scale": math.inf}, r"q_scale is inf"),
    ({}, {"q_scale": math.nan}, r"q_scale is nan"),
    ({}, {"q_scale": 1e39}, r"q_scale is 1e\+39, outside the positive normal fp32 range"),
    ({}, {"q_scale": True}, r"q_scale must be a float, or an fp32 array of 1 or nhead_q"),
    ({}, {"q_scale": "2"}, r"q_scale must be a float"),
    (
        {},
        _device_scales(3, 2),
        r"q_scale must hold 1 or nhead_q=8 fp32 values \(one per query head\), got shape \(3,\)",
    ),
    (
        {},
        {"q_scale": _ptr((8,), "fp32", 0xB00200)},
        r"q_scale holds nhead_q=8 values .*k_scale and v_scale are not per-head",
    ),
    ({}, _device_scales(8, 1), r"k_scale and v_scale are not per-head device arrays"),
    ({}, _device_scales(1, 2), r"a device q_scale holds one per query head: nhead_q=8 values"),
    ({}, _device_scales(8, 2, "bf16"), r"q_scale must be fp32, got bf16"),
    ({}, _device_scales(8, 2, device=1), r"q_scale is on cuda:1 but q is on cuda:0"),
    ({}, {"q_scale": np.ones(3, np.float32)}, r"q_scale must hold 1 or nhead_q=8"),
    # K/V scales keep their own checks beside fp8 queries.
    ({}, {"k_scale": 0.0}, r"k_scale is 0.0; fp8 K/V stands for k_scale"),
    ({}, _device_scales(8, 3), r"k_scale must hold 1 or nhead_k=2"),
    ({"o": "fp32"}, {"out_dtype": "fp32"}, r"out_dtype is fp32, but fp8 queries write fp16"),
    ({"o": "fp16"}, {}, r"out is fp16, but this call writes bf16 \(fp8 queries write out_dtype"),
    ({"o": "bf16"}, {"out_dtype": "fp16"}, r"out is bf16, but this call writes fp16"),
    ({"o": FP8}, {}, r"out must be"),
    (
        {"q": "bf16", "kv": "bf16"},
        {"out_dtype": "fp16"},
        r"out_dtype is fp16 but q is bf16: the output has q's dtype unless q is fp8_e4m3",
    ),
    ({}, {"out_dtype": "int8"}, r"unsupported dtype 'int8'"),
    ({}, {"out": _ptr((2, 8, 33, 64), "bf16", 0x800000)}, r"out must have shape \(2, 8, 33, 128\)"),
    (
        {},
        {"q_scale": _ptr((1,), "fp32", 0x800000)},
        r"out .*q_scale",
    ),
]


@pytest.mark.parametrize(("arrays", "kwargs", "message"), FWD_ERRORS)
def test_fwd_argument_errors(arrays: dict[str, str], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _fwd(**arrays, **kwargs)


def _varlen(q: str = FP8, kv: str = FP8, o: str = "bf16", **kwargs: Any) -> Any:
    offsets = _ptr((3,), "int32", 0xC00000)
    return ckfmha.fwd_varlen(
        _ptr((40, 8, 64), q),
        _ptr((300, 2, 64), kv, 0x500000),
        _ptr((300, 2, 64), kv, 0x600000),
        offsets,
        offsets,
        max_seqlen_q=20,
        max_seqlen_k=200,
        out=_ptr((40, 8, 64), o, address=0x800000),
        **kwargs,
    )


@pytest.mark.parametrize(
    ("arrays", "kwargs", "message"),
    [
        ({"kv": "bf16"}, {}, r"fp8 queries need fp8 K/V"),
        ({"q": "bf16", "kv": "bf16"}, {"q_scale": 2.0}, r"q_scale is given, but q is bf16"),
        ({"q": "uint8"}, {}, r"q is uint8: .*q_dtype='fp8_e4m3'"),
        ({}, _device_scales(4, 2), r"q_scale must hold 1 or nhead_q=8"),
        ({}, _device_scales(1, 2), r"nhead_q=8 values, got 1"),
        ({"o": "fp16"}, {}, r"out is fp16, but this call writes bf16"),
        ({"q": "fp16", "kv": "fp16", "o": "fp16"}, {"out_dtype": "bf16"}, r"out_dtype is bf16"),
    ],
)
def test_fwd_varlen_checks_fp8_queries_alike(arrays: dict[str, str], kwargs: dict[str, Any],
                                              message: str) -> None:  # fmt: skip
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _varlen(**arrays, **kwargs)


@no_gpu
@pytest.mark.parametrize(
    ("arrays", "kwargs"),
    [
        ({}, {}),
        ({}, {"q_scale": 0.02, "k_scale": 0.5, "v_scale": 3.0, "causal": True}),
        ({"o": "fp16"}, {"out_dtype": "fp16", "q_scale": np.float32(0.25)}),
        ({"q": "uint8", "kv": "uint8"}, {"q_dtype": "e4m3", "kv_dtype": "e4m3", "q_scale": 1.5}),
        ({}, _device_scales(1, 1)),
        ({}, _device_scales(8, 2)),
        ({}, {"q_scale": 0.5, **{k: v for k, v in _device_scales(1, 2).items() if k != "q_scale"}}),
        ({}, {"window": (16, 0), "return_lse": True, "layout": "bhsd"}),
        ({"q": "bf16", "kv": "bf16"}, {"out_dtype": "bf16"}),  # out_dtype may repeat q's
    ],
)
def test_well_formed_fp8_query_calls_reach_the_device(arrays: dict[str, str],
                                                      kwargs: dict[str, Any]) -> None:  # fmt: skip
    with pytest.raises(errors.NoDeviceError):
        _fwd(**arrays, **kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k != "layout"}
    with pytest.raises(errors.NoDeviceError):
        _varlen(**arrays, **kwargs)


# ---- the rules alone ----


def test_q_quant_and_out_dtype_rules() -> None:
    bf16, fp16, fp8 = _dtypes.BF16, _dtypes.FP16, _dtypes.FP8_E4M3
    assert q_quant_of(fp8, fp8, fp8, q_scale_given=True) == 1
    assert q_quant_of(bf16, fp8, fp8, q_scale_given=False) == 0
    assert q_quant_of(bf16, bf16, bf16, q_scale_given=False) == 0
    assert out_dtype_of(fp8, 1, None) == bf16  # bf16 unless given
    assert out_dtype_of(fp8, 1, "fp16") == fp16
    assert out_dtype_of(fp8, 1, "torch.bfloat16") == bf16
    assert out_dtype_of(fp16, 0, None) == fp16 and out_dtype_of(fp16, 0, np.float16) == fp16
    check_q_scale_heads(1, 8, False)
    check_q_scale_heads(8, 8, True)
    check_q_scale_heads(1, 1, False)


# ---- problems and first use ----


def _problem(**changes: Any) -> ckfmha.FwdProblem:
    """A prefill over fp8 q, k and v with a bf16 output (b2, h32/8, 1000 keys, d128)."""
    fields: dict[str, Any] = {
        "batch": 2, "nhead_q": 32, "nhead_k": 8, "seqlen_q": 1000, "hdim": 128, "dtype": "bf16",
        "q_dtype": FP8, "kv_dtype": FP8,
    }  # fmt: skip
    fields.update(changes)
    return ckfmha.FwdProblem(**fields)


def test_problem_struct_carries_fp8_queries() -> None:
    fields = _problem(q_scale=0.125, k_scale=0.5, v_scale=2.0, kv_scale_per_head=True).to_c_dict()
    assert (fields["q_quant"], fields["kv_quant"], fields["kv_scale_per_head"]) == (1, 1, 1)
    assert (fields["q_scale"], fields["k_scale"], fields["v_scale"]) == (0.125, 0.5, 2.0)
    assert fields["dtype"] == _dtypes.BF16  # the output's
    plain = ckfmha.FwdProblem(batch=1, nhead_q=1, seqlen_q=1, hdim=64).to_c_dict()
    assert (plain["q_quant"], plain["q_scale"]) == (0, 1.0)
    # q_dtype equal to the problem's dtype is a plain q.
    same = ckfmha.FwdProblem(batch=1, nhead_q=1, seqlen_q=1, hdim=64, q_dtype="fp16")
    assert same.to_c_dict()["q_quant"] == 0
    with pytest.raises(errors.InvalidArgumentError, match=r"q_dtype must be None \(q in the"):
        _problem(q_dtype="int32").to_c_dict()


def test_well_formed_fp8_query_problems_are_valid() -> None:
    for changes in (
        {},
        {"hdim": 64, "causal": True, "lse": True},
        {"hdim": 256, "dtype": "fp16", "window": (128, 0), "nhead_k": 4},
        {"mode": "group", "seqlen_q": 777, "seqlen_k": 2049, "layout": "bshd"},
    ):
        _problem(**changes).validate()


# The C library's refusals of fp8-query problems (ckfmha_fwd_problem_validate): fp8 queries
# read fp8 K/V from contiguous memory, with none of the score features, and write fp16/bf16.
C_REFUSALS: list[tuple[dict[str, Any], str]] = [
    ({"kv_dtype": None}, r"fp8"),
    ({"dtype": "fp32"}, r"fp16 or bf16"),
    ({"hdim_v": 64}, r"hdim|head dim"),
    ({"bias": "elementwise"}, r"bias"),
    ({"bias": "alibi"}, r"alibi|ALiBi|bias"),
    ({"dropout_p": 0.1}, r"dropout"),
    ({"softcap": 30.0}, r"soft-?cap"),
    ({"sink": True}, r"sink"),
    ({"v_col_major": True}, r"V row-major|v_col_major"),
    ({"paged_kv": "block_table", "seqlen_q": 1}, r"page|paged|contiguous"),
    ({"q_scale": 0.0}, r"q_scale"),
    ({"q_scale": float("nan")}, r"q_scale"),
]


@pytest.mark.parametrize(("changes", "message"), C_REFUSALS)
def test_bad_fp8_query_problems_are_invalid(changes: dict[str, Any], message: str) -> None:
    with pytest.raises((errors.InvalidArgumentError, errors.UnsupportedError), match=message):
        _problem(**changes).validate()


@pytest.mark.parametrize("hdim", [128, 96])
def test_no_kernel_reads_fp8_queries_before_hopper(hdim: int) -> None:
    # hdim 96 passes validation: which head dims have kernels is the generator's to say (a
    # Hopper build or first use), not the problem check's.
    problem = _problem(hdim=hdim)
    with pytest.raises(errors.UnsupportedError):
        ckfmha.Dispatcher().select(problem, arch=80)
    text = ckfmha.Dispatcher().explain(problem, arch=80)
    assert "q=fp8_e4m3" in text.splitlines()[0] and "selected" not in text, text


def test_fp8_query_problems_have_no_backward() -> None:
    with pytest.raises(errors.InvalidArgumentError, match=r"fp8 queries \(q_dtype\) are for"):
        ckfmha.Dispatcher().select_bwd(_problem(), arch=90)


def test_fp8_query_problems_have_their_own_first_use_key() -> None:
    operation, fields = first_use_key(_problem())
    _, kv_only = first_use_key(_problem(q_dtype=None))
    # q_quant goes last, only when set: fp16/bf16 queries keep the key they had.
    assert operation == "fwd" and fields[:-1] == kv_only and fields[-1] == 1
    _, plain = first_use_key(_problem(q_dtype=None, kv_dtype=None))
    assert len(plain) == len(kv_only)


# ---- torch ops ----


def test_the_torch_op_takes_fp8_queries() -> None:
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    import ckfmha.torch

    schema = str(torch.ops.ckfmha.fwd_fp8.default._schema)
    for argument in (
        "str? q_dtype=None",
        "Tensor? q_scale=None",
        "float? q_scale_value=None",
        "ScalarType? out_dtype=None",
        "str? kv_dtype=None",
        "Tensor? k_scale=None",
    ):
        assert argument in schema, schema
    with FakeTensorMode():
        q = torch.empty(2, 8, 33, 128, dtype=torch.float8_e4m3fn)
        k = torch.empty(2, 2, 100, 128, dtype=torch.float8_e4m3fn)
        scales = torch.empty(2, dtype=torch.float32)
        o, lse = ckfmha.torch.attention(q, k, k, q_scale=0.5, k_scale=scales, v_scale=scales,
                                        return_lse=True)  # fmt: skip
        assert o.shape == q.shape and o.dtype == torch.bfloat16 and lse.shape == (2, 8, 33)
        o = ckfmha.torch.attention(q, k, k, layout="bshd", out_dtype=torch.float16)
        assert o.shape == q.shape and o.dtype == torch.float16
        codes = torch.empty(2, 8, 33, 128, dtype=torch.uint8)
        o = ckfmha.torch.attention(codes, k, k, q_dtype="e4m3", out_dtype="fp16")
        assert o.dtype == torch.float16


def test_gradients_through_fp8_queries_are_refused_at_the_call() -> None:
    torch = pytest.importorskip("torch")
    import ckfmha.torch

    q = torch.zeros(1, 4, 8, 64, dtype=torch.float8_e4m3fn)
    k = torch.zeros(1, 4, 8, 64, dtype=torch.float8_e4m3fn)
    message = r"fp8 queries \(float8_e4m3fn q\) are for inference: ckfmha has no backward"
    with pytest.raises(errors.InvalidArgumentError, match=message):
        ckfmha.torch.attention(q.clone().requires_grad_(), k, k)
    # A scale that requires a gradient would get none either.
    with pytest.raises(errors.InvalidArgumentError, match=message):
        ckfmha.torch.attention(q, k, k, q_scale=torch.ones(1, requires_grad=True))
    with torch.no_grad(), pytest.raises(errors.InvalidArgumentError, match=r"CPU tensors"):
        ckfmha.torch.attention(q, k, k)  # past the refusal: the op runs on CUDA tensors only


def test_fp8_query_options_are_refused_for_other_queries() -> None:
    torch = pytest.importorskip("torch")
    import ckfmha.torch

    q = torch.zeros(1, 4, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(errors.InvalidArgumentError, match=r"q_scale is given, but q is bf16"):
        ckfmha.torch.attention(q, q, q, q_scale=0.5)
    with pytest.raises(errors.InvalidArgumentError, match=r"out_dtype is fp16 but q is bf16"):
        ckfmha.torch.attention(q, q, q, out_dtype=torch.float16)


def test_the_varlen_torch_op_takes_fp8_queries() -> None:
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    import ckfmha.torch

    schema = str(torch.ops.ckfmha.fwd_varlen_fp8.default._schema)
    for argument in ("int max_seqlen_q", "str? q_dtype=None", "Tensor? q_scale=None",
                     "ScalarType? out_dtype=None", "Tensor? v_scale=None"):  # fmt: skip
        assert argument in schema, schema
    with FakeTensorMode():
        q = torch.empty(40, 8, 128, dtype=torch.float8_e4m3fn)
        k = torch.empty(70, 2, 128, dtype=torch.float8_e4m3fn)
        cu_q = torch.tensor([0, 30, 40], dtype=torch.int32)
        cu_k = torch.tensor([0, 50, 70], dtype=torch.int32)
        o, lse = ckfmha.torch.attention_varlen(
            q, k, k, cu_q, cu_k, max_seqlen_q=30, max_seqlen_k=50, q_scale=0.5, k_scale=2.0,
            v_scale=1.0, return_lse=True)  # fmt: skip
        assert o.shape == q.shape and o.dtype == torch.bfloat16 and lse.shape == (8, 40)
        o = ckfmha.torch.attention_varlen(q, k, k, cu_q, cu_k, max_seqlen_q=30, max_seqlen_k=50,
                                          out_dtype="fp16")  # fmt: skip
        assert o.dtype == torch.float16


def test_varlen_fp8_arguments_need_fp8_queries_and_no_gradients() -> None:
    torch = pytest.importorskip("torch")
    import ckfmha.torch

    cu = torch.tensor([0, 8], dtype=torch.int32)
    q8 = torch.zeros(8, 4, 64, dtype=torch.float8_e4m3fn)
    message = r"fp8 queries \(float8_e4m3fn q\) are for inference: ckfmha has no backward"
    with pytest.raises(errors.InvalidArgumentError, match=message):
        ckfmha.torch.attention_varlen(q8.clone().requires_grad_(), q8, q8, cu, cu,
                                      max_seqlen_q=8, max_seqlen_k=8)  # fmt: skip
    with torch.no_grad(), pytest.raises(errors.InvalidArgumentError, match=r"CPU tensors"):
        ckfmha.torch.attention_varlen(q8, q8, q8, cu, cu, max_seqlen_q=8, max_seqlen_k=8)
    q = torch.zeros(8, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"q_scale, out_dtype given, but q is torch.bfloat16"):  # fmt: skip
        ckfmha.torch.attention_varlen(q, q, q, cu, cu, max_seqlen_q=8, max_seqlen_k=8,
                                      q_scale=0.5, out_dtype="fp16")  # fmt: skip
