"""fp8 (e4m3) K/V without a GPU: how e4m3 arrays are recognised, every argument error of fwd,
fwd_varlen and fwd_paged (raised before anything reaches a device), the problem struct and
first-use keys, what the dispatcher says of fp8 problems on an arch without fp8 kernels, the
serving planners, and the torch ops' schemas and gradient refusal.

The calls run on ``ckfmha.device_ptr`` views at made-up addresses with an explicit ``out``, so
nothing is allocated or staged before the checks under test.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest

import ckfmha
from ckfmha import _dtypes, errors, first_use, jit
from ckfmha._arrays import as_view
from ckfmha._fwd import first_use_key
from ckfmha.fp8_kv import check_scale_args, kv_quant_of, scale_count, scales_per_head
from ckfmha.serving import BatchDecode

no_gpu = pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")

FP8 = "fp8_e4m3"
Q_SHAPE = (2, 8, 1, 128)  # bhsd: 2 sequences, 8 query heads, a decode row, d128
KV_SHAPE = (2, 2, 100, 128)  # 2 K/V heads (GQA groups of 4), 100 keys


def _ptr(shape: tuple[int, ...], dtype: str = "bf16", address: int = 0x400000,
         device: int = 0) -> Any:  # fmt: skip
    return ckfmha.device_ptr(address, shape, dtype, device=device)


def _fwd(q_dtype: str = "bf16", k_dtype: str = FP8, v_dtype: str = FP8,
         v_shape: tuple[int, ...] = KV_SHAPE, **kwargs: Any) -> Any:  # fmt: skip
    """fwd on device pointers with an explicit out."""
    kwargs.setdefault("out", _ptr(Q_SHAPE, q_dtype, 0x800000))
    return ckfmha.fwd(
        _ptr(Q_SHAPE, q_dtype),
        _ptr(KV_SHAPE, k_dtype, 0x500000),
        _ptr(v_shape, v_dtype, 0x600000),
        **kwargs,
    )


_CACHE = (40, 16, 2, 128)  # [pages, page_size, nhead_k, hdim]


def _paged(k_dtype: str = FP8, v_dtype: str = FP8, **kwargs: Any) -> Any:
    kwargs.setdefault("block_table", _ptr((2, 20), "int32", 0x900000))
    kwargs.setdefault("seqlens_k", _ptr((2,), "int32", 0xA00000))
    kwargs.setdefault("out", _ptr(Q_SHAPE, address=0x800000))
    return ckfmha.fwd_paged(
        _ptr(Q_SHAPE), _ptr(_CACHE, k_dtype, 0x500000), _ptr(_CACHE, v_dtype, 0x600000), **kwargs
    )


def _scales(count: int = 2, dtype: str = "fp32", device: int = 0) -> dict[str, Any]:
    return {
        "k_scale": _ptr((count,), dtype, 0xB00000, device),
        "v_scale": _ptr((count,), dtype, 0xB00100, device),
    }


# ---- recognising e4m3 arrays ----


def test_every_spelling_of_e4m3_is_one_auxiliary_code() -> None:
    for name in ("fp8_e4m3", "e4m3", "float8_e4m3fn", "torch.float8_e4m3fn", "E4M3"):
        assert _dtypes.dtype_code(name) == _dtypes.FP8_E4M3 == 5
    assert _dtypes.ITEMSIZE[_dtypes.FP8_E4M3] == 1 and _dtypes.NAMES[5] == FP8
    # It is no C dtype: a problem "of" fp8 is refused; fp8 is K/V storage (kv_dtype).
    with pytest.raises(errors.InvalidArgumentError):
        ckfmha.FwdProblem(batch=1, nhead_q=1, seqlen_q=1, hdim=64, dtype=FP8).validate()


def test_framework_float8_dtypes_are_recognised() -> None:
    torch = pytest.importorskip("torch")
    from ckfmha._torch_fast import DTYPE_CODES

    assert _dtypes.dtype_code(torch.float8_e4m3fn) == _dtypes.FP8_E4M3
    assert DTYPE_CODES[torch.float8_e4m3fn] == _dtypes.FP8_E4M3
    # What the DLPack path reads: torch exports float8_e4m3fn as DLPack 1.1's code 10, 8 bits.
    capsule = torch.zeros(4, dtype=torch.float8_e4m3fn).__dlpack__()
    assert _legacy_dlpack_dtype(capsule) == (10, 8, 1)


def _legacy_dlpack_dtype(capsule: Any) -> tuple[int, int, int]:
    """(code, bits, lanes) of an unversioned DLPack capsule, read with ctypes."""
    import ctypes

    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    address = get_pointer(capsule, b"dltensor")
    # DLTensor: data (8 bytes), device (8), ndim (4), then dtype {uint8 code, uint8 bits,
    # uint16 lanes}.
    code, bits, lanes_lo, lanes_hi = (ctypes.c_uint8 * 24).from_address(address)[20:24]
    return code, bits, lanes_lo | lanes_hi << 8


def test_ml_dtypes_float8_host_arrays_are_e4m3() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert _dtypes.dtype_code(np.dtype(ml_dtypes.float8_e4m3fn)) == _dtypes.FP8_E4M3
    assert _dtypes.numpy_dtype(_dtypes.FP8_E4M3) == np.dtype(ml_dtypes.float8_e4m3fn)


class _DLPackOnly:
    """Exposes an array through DLPack alone, as a framework tensor would."""

    def __init__(self, array: Any) -> None:
        self.array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.array.__dlpack_device__()


def test_device_arrays_export_and_read_e4m3_through_dlpack_and_cai() -> None:
    array = _ptr((3, 16), FP8)
    assert array.dtype == FP8 and array.itemsize == 1
    view = as_view(_DLPackOnly(array), 0, None, "k", 2)
    assert view.dtype == _dtypes.FP8_E4M3 and view.protocol == "dlpack"
    # CAI has no fp8 letter: the codes travel as uint8, and kv_dtype reads them back as e4m3.
    assert array.__cuda_array_interface__["typestr"] == "|u1"
    assert as_view(_ptr((3, 16), "uint8"), 0, FP8, "k", 2).dtype == _dtypes.FP8_E4M3
    with pytest.raises(errors.InvalidArgumentError, match=r"fp8_e4m3 given, but the array holds"):
        as_view(_ptr((3, 16)), 0, FP8, "k", 2)


# ---- argument errors: fwd ----


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"v_dtype": "bf16"}, r"k is fp8_e4m3 but v is bf16: fp8 K/V needs both k and v in e4m3"),
        ({"k_dtype": "bf16"}, r"k is bf16 but v is fp8_e4m3"),
        (
            {"k_dtype": "uint8", "v_dtype": "uint8"},
            r"k is uint8: if it holds e4m3 codes, say so with kv_dtype='fp8_e4m3'",
        ),
        (
            {"k_dtype": "bf16", "v_dtype": "bf16", "kv_dtype": FP8},
            r"k: dtype=fp8_e4m3 given, but the array holds bf16",
        ),
        (
            {"k_dtype": "bf16", "v_dtype": "bf16", "k_scale": 0.5},
            r"k_scale/v_scale are given, but k and v are bf16: the scales dequantise fp8 K/V only",
        ),
        ({"k_dtype": "bf16", "v_dtype": "bf16", **_scales()}, r"k_scale/v_scale are given"),
        ({"k_scale": 0.0}, r"k_scale is 0.0; fp8 K/V stands for k_scale \* value, so the scale"),
        ({"v_scale": -2.0}, r"v_scale is -2.0.*positive and finite"),
        ({"k_scale": math.inf}, r"k_scale is inf"),
        ({"v_scale": math.nan}, r"v_scale is nan"),
        ({"k_scale": 1e39}, r"k_scale is 1e\+39, outside the positive normal fp32 range"),
        ({"k_scale": True}, r"k_scale must be a float, or an fp32 array of 1 or nhead_k"),
        ({"k_scale": "0.5"}, r"k_scale must be a float"),
        (
            {"k_scale": _ptr((2,), "fp32", 0xB00000), "v_scale": 0.5},
            r"k_scale is an array and v_scale a number: pass both as fp32 device arrays",
        ),
        ({"v_scale": _ptr((1,), "fp32", 0xB00000)}, r"k_scale is not given and v_scale an array"),
        (
            _scales(3),
            r"k_scale must hold 1 or nhead_k=2 fp32 values \(one per K/V head\), got shape \(3,\)",
        ),
        (
            {"k_scale": _ptr((1, 2), "fp32", 0xB00000), "v_scale": _ptr((2,), "fp32", 0xB00100)},
            r"k_scale must hold 1 or nhead_k=2 .*got shape \(1, 2\)",
        ),
        (_scales(2, "bf16"), r"k_scale must be fp32, got bf16"),
        (
            {"k_scale": _ptr((1,), "fp32", 0xB00000), "v_scale": _ptr((2,), "fp32", 0xB00100)},
            r"k_scale has 1 values and v_scale 2: device scales are both one value or both",
        ),
        (
            {"k_scale": np.ones(2, np.float64), "v_scale": np.ones(2, np.float32)},
            r"k_scale: NumPy dtype float64 is not fp32",
        ),
        (
            {"k_scale": np.ones(3, np.float32), "v_scale": np.ones(3, np.float32)},
            r"k_scale must hold 1 or nhead_k=2",
        ),
        (_scales(2, device=1), r"k_scale is on cuda:1 but q is on cuda:0"),
        # The C problem check: fp8 K/V widens to the queries' 2-byte dtype.
        ({"q_dtype": "fp32"}, r"fp8 K/V .* takes fp16 or bf16 queries"),
        ({"v_shape": (2, 2, 128, 100), "v_col_major": True}, r"fp8 K/V takes V row-major"),
    ],
)
def test_fwd_argument_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _fwd(**kwargs)


def test_fwd_varlen_checks_fp8_kv_alike() -> None:
    def call(k_dtype: str, v_dtype: str, **kwargs: Any) -> Any:
        offsets = _ptr((3,), "int32", 0xC00000)
        return ckfmha.fwd_varlen(
            _ptr((5, 8, 64)),
            _ptr((300, 2, 64), k_dtype, 0x500000),
            _ptr((300, 2, 64), v_dtype, 0x600000),
            offsets,
            offsets,
            max_seqlen_q=4,
            max_seqlen_k=200,
            out=_ptr((5, 8, 64), address=0x800000),
            **kwargs,
        )

    with pytest.raises(errors.InvalidArgumentError, match=r"k is fp8_e4m3 but v is bf16"):
        call(FP8, "bf16")
    with pytest.raises(errors.InvalidArgumentError, match=r"k_scale/v_scale are given"):
        call("bf16", "bf16", v_scale=2.0)
    with pytest.raises(errors.InvalidArgumentError, match=r"must hold 1 or nhead_k=2"):
        call(FP8, FP8, **_scales(4))


# ---- argument errors: fwd_paged ----


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"v_dtype": "bf16"},
            r"k_cache is fp8_e4m3 but v_cache is bf16: fp8 K/V needs both k_cache",
        ),
        ({"k_dtype": "uint8", "v_dtype": "uint8"}, r"k_cache is uint8: .*kv_dtype='fp8_e4m3'"),
        (
            {"k_dtype": "bf16", "v_dtype": "bf16", "k_scale": 2.0},
            r"k_scale/v_scale are given, but k_cache and v_cache are bf16",
        ),
        ({"k_scale": -1.0}, r"k_scale is -1.0.*positive and finite"),
        (_scales(5), r"k_scale must hold 1 or nhead_k=2"),
        ({"k_scale": _ptr((2,), "fp32", 0xB00000)}, r"k_scale is an array and v_scale not given"),
        (_scales(2, device=3), r"k_scale is on cuda:3 but q is on cuda:0"),
    ],
)
def test_fwd_paged_argument_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _paged(**kwargs)


def test_vectorized_pages_cannot_hold_fp8() -> None:
    with pytest.raises(errors.InvalidArgumentError, match=r"fp8 K/V is read from linear pages"):
        ckfmha.fwd_paged(
            _ptr(Q_SHAPE),
            _ptr((40, 2, 16, 16, 8), FP8, 0x500000),
            _ptr((40, 2, 128, 16), FP8, 0x600000),
            page_layout="vectorized",
            block_table=_ptr((2, 20), "int32", 0x900000),
            seqlens_k=_ptr((2,), "int32", 0xA00000),
            out=_ptr(Q_SHAPE, address=0x800000),
        )


@no_gpu
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"k_scale": 0.02, "v_scale": 3.5},
        {"k_dtype": "uint8", "v_dtype": "uint8", "kv_dtype": "e4m3", "k_scale": 1.5},
        _scales(1),
        _scales(2),
        {
            "k_scale": np.float32(0.25),
            "v_scale": 4,
            "num_splits": 3,
            "return_lse": True,
            "lse_out": _ptr((2, 8, 1), "fp32", 0xD00000),
        },
    ],
)
def test_well_formed_fp8_calls_reach_the_device(kwargs: dict[str, Any]) -> None:
    with pytest.raises(errors.NoDeviceError):
        _fwd(**kwargs)
    kwargs.pop("lse_out", None)
    with pytest.raises(errors.NoDeviceError):
        _paged(**kwargs)


def test_outputs_may_not_overlap_the_scales() -> None:
    scales = {"k_scale": _ptr((1,), "fp32", 0x800000), "v_scale": _ptr((1,), "fp32", 0xB00100)}
    with pytest.raises(errors.InvalidArgumentError, match=r"out .*k_scale"):
        _fwd(**scales)


# ---- the rules alone ----


def test_kv_quant_of_pairs_q_k_and_v() -> None:
    bf16, fp8 = _dtypes.BF16, _dtypes.FP8_E4M3
    assert kv_quant_of(bf16, fp8, fp8, scales_given=True) == 1
    assert kv_quant_of(_dtypes.FP16, fp8, fp8, scales_given=False) == 1
    assert kv_quant_of(bf16, bf16, bf16, scales_given=False) == 0
    with pytest.raises(errors.InvalidArgumentError, match=r"q, k and v must have one dtype"):
        kv_quant_of(bf16, _dtypes.FP16, _dtypes.FP16, scales_given=False)


def test_scale_shapes_and_pairs() -> None:
    assert scale_count((), 8, "k_scale") == 1  # a 0-d tensor (vLLM keeps its scales so)
    assert scale_count((1,), 8, "k_scale") == 1 and scale_count((8,), 8, "k_scale") == 8
    assert scales_per_head(8, 8, 8) and not scales_per_head(1, 1, 8)
    check_scale_args(None, None)
    check_scale_args(0.5, None)  # v_scale defaults to 1.0
    check_scale_args(np.float64(2.0), 7)


# ---- problems, plans and first use ----


def _fp8_problem(**changes: Any) -> ckfmha.FwdProblem:
    """A bf16 decode problem over fp8 K/V (b2, h32/8, 8192 keys, d128), with `changes`."""
    fields: dict[str, Any] = {
        "batch": 2, "nhead_q": 32, "nhead_k": 8, "seqlen_q": 1, "seqlen_k": 8192, "hdim": 128,
        "dtype": "bf16", "kv_dtype": FP8,
    }  # fmt: skip
    fields.update(changes)
    return ckfmha.FwdProblem(**fields)


def test_problem_struct_carries_fp8_kv() -> None:
    problem = _fp8_problem(k_scale=0.5, v_scale=2.0)
    fields = problem.to_c_dict()
    assert (fields["kv_quant"], fields["kv_scale_per_head"]) == (1, 0)
    assert (fields["k_scale"], fields["v_scale"]) == (0.5, 2.0)
    problem.validate()
    plain = ckfmha.FwdProblem(batch=1, nhead_q=1, seqlen_q=1, hdim=64).to_c_dict()
    assert (plain["kv_quant"], plain["k_scale"], plain["v_scale"]) == (0, 1.0, 1.0)
    # kv_dtype equal to the problem's dtype is plain K/V.
    same = ckfmha.FwdProblem(batch=1, nhead_q=1, seqlen_q=1, hdim=64, kv_dtype="fp16")
    assert same.to_c_dict()["kv_quant"] == 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kv_dtype": "int32"}, r"kv_dtype must be None \(K/V in the problem's dtype, bf16\)"),
        ({"k_scale": 0.0}, r"k_scale is 0"),
        ({"v_scale": float("inf")}, r"v_scale is inf"),
        ({"dtype": "fp32"}, r"takes fp16 or bf16 queries"),
        (
            {"kv_dtype": None, "kv_scale_per_head": True},
            r"kv_scale_per_head is set, but K/V are not",
        ),
    ],
)
def test_bad_fp8_problems_are_invalid(changes: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {
        "batch": 2,
        "nhead_q": 8,
        "nhead_k": 2,
        "seqlen_q": 1,
        "seqlen_k": 100,
        "hdim": 128,
        "dtype": "bf16",
        "kv_dtype": FP8,
    }
    fields.update(changes)
    with pytest.raises(errors.InvalidArgumentError, match=message):
        ckfmha.FwdProblem(**fields).validate()


def test_fp8_problems_have_no_backward() -> None:
    problem = ckfmha.FwdProblem(batch=1, nhead_q=4, seqlen_q=64, hdim=64, kv_dtype=FP8)
    with pytest.raises(errors.InvalidArgumentError, match=r"fp8 K/V \(kv_dtype\) is for inference"):
        ckfmha.Dispatcher().select_bwd(problem, arch=80)


def test_fp8_problems_have_their_own_first_use_key_and_split_plan() -> None:
    problem = _fp8_problem()
    plain = first_use.key_of(first_use_key(_fp8_problem(kv_dtype=None)))
    key = first_use.key_of(first_use_key(problem))
    assert key.kv_quant == 1 and plain.kv_quant == 0 and key != plain
    gen = jit.generator_modules()
    # One plan, the split-KV one, even for a prefill shape: only split kernels read fp8 K/V.
    for shaped in (key, first_use.FwdKey(**{**key.__dict__, "decode_shaped": False})):
        (plan,) = first_use.plans_for(shaped, gen)
        split, combine = plan
        assert (split.family, split.kv_quant, combine.kv_quant) == ("fwd_splitkv", "e4m3", "none")
    paged = first_use.key_of(first_use_key(_fp8_problem(paged_kv="block_table")))
    ((split, _),) = first_use.plans_for(paged, gen)
    assert (split.family, split.kv_quant) == ("fwd_pagedkv", "e4m3")


@pytest.mark.parametrize("paged_kv", [None, "block_table"])
def test_no_kernel_reads_fp8_kv_on_sm80(paged_kv: str | None) -> None:
    problem = _fp8_problem(
        batch=4, seqlen_k=4096, paged_kv=paged_kv, causal=True, causal_alignment="bottom_right"
    )
    dispatcher = ckfmha.Dispatcher()
    with pytest.raises(errors.UnsupportedError) as caught:
        dispatcher.select(problem, arch=80)
    # A build with sm_80 kernels names what they read; one without any says none is there.
    if any(k["arch"] == 80 for k in ckfmha.Registry().kernels()):
        assert "fp8" in str(caught.value), caught.value
    text = dispatcher.explain(problem, arch=80)
    assert "kv=fp8_e4m3" in text.splitlines()[0], text
    assert "selected" not in text, text
    # The same problem with bf16 K/V has a plan wherever the build has kernels for it.
    assert "kv=fp8" not in dispatcher.explain(
        ckfmha.FwdProblem(**{**problem.__dict__, "kv_dtype": None}), arch=80
    )


@pytest.mark.parametrize(
    ("batch", "nhead_k", "seqlen_k", "tile"),
    [
        # 512 CTAs: the 16x16 tile with two byte stages holds twice that many at once (132 SMs x
        # 8-10 slots), with four only 7 a SM, 16x32 only 4: the first keeps the most at work.
        (64, 8, 32768, "m16n16k128_w1s1"),
        # 2048 CTAs overflow every tile: all of its slots at work.
        (64, 32, 32768, "m16n16k128_w1s1"),
        # 4 CTAs of at most 64 splits (64 keys each) fill no tile's slots: a tie, and the longest
        # key tile wins it.
        (1, 4, 4096, "m16n64k128_w1s2"),
        # 16 CTAs of at most 40 splits fill 16x32's 4 slots a SM, not either 16x16 tile's: a tie
        # between those, and the deeper loads (four byte stages) win it.
        (2, 8, 2560, "m16n16k128_w1s2"),
    ],
)
def test_fp8_kv_tiles_rank_by_ctas_at_work(batch: int, nhead_k: int, seqlen_k: int,
                                          tile: str) -> None:  # fmt: skip
    names = [k["name"] for k in ckfmha.Registry().kernels()
             if k["family"] == "fwd_splitkv" and k["arch"] == 90 and k["dtype"] == "bf16"
             and k["hdim_q"] == 128 and "kve4m3" in k["name"] and "_causal_lse_" in k["name"]]  # fmt: skip
    wanted = ("m16n16k128_w1s1", "m16n16k128_w1s2", "m16n32k128_w1s2", "m16n64k128_w1s2")
    if not all(any(f"_{t}" in n for n in names) for t in wanted):
        pytest.skip("library built without sm_90a's 16-row fp8 K/V tiles at d128")
    problem = _fp8_problem(batch=batch, nhead_k=nhead_k, seqlen_k=seqlen_k, causal=True,
                           causal_alignment="bottom_right")  # fmt: skip
    dispatcher = ckfmha.Dispatcher()
    plan = dispatcher.explain(problem, arch=90).split("plan: ")[-1]
    assert dispatcher.select(problem, arch=90).endswith(f"_{tile}"), plan
    count = int(re.search(r"num_splits=(\d+)", plan).group(1))  # type: ignore[union-attr]
    assert count > 1, plan
    assert re.search(r"\d+ resident CTAs per SM \((occupancy of the compiled kernel|estimated at "
                     r"256 registers a thread)\)", plan), plan  # fmt: skip


# ---- serving ----


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dtype": "fp32"}, r"takes fp16 or bf16 queries"),
        ({"kv_dtype": "int32"}, r"kv_dtype must be None"),
        ({"page_layout": "vectorized"}, r"fp8 K/V is read from linear pages"),
    ],
)
def test_serving_plans_check_fp8_problems_on_the_host(
    changes: dict[str, Any], message: str
) -> None:
    decode = BatchDecode(max_batch=4, max_pages=64, max_seqlen_k=1024)
    options: dict[str, Any] = {
        "block_table": np.zeros((2, 4), np.int32),
        "seqlens_k": [10, 20],
        "nhead_q": 8,
        "nhead_k": 2,
        "head_dim": 128,
        "page_size": 16,
        "dtype": "bf16",
        "kv_dtype": FP8,
        **changes,
    }
    with pytest.raises(errors.InvalidArgumentError, match=message):
        decode.plan(**options)


# ---- torch ops ----


def test_torch_ops_take_fp8_kv_and_scales() -> None:
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    import ckfmha.torch

    for name in ("fwd", "fwd_paged"):
        schema = str(getattr(torch.ops.ckfmha, name).default._schema)
        for argument in (
            "str? kv_dtype=None",
            "Tensor? k_scale=None",
            "Tensor? v_scale=None",
            "float? k_scale_value=None",
            "float? v_scale_value=None",
        ):
            assert argument in schema, schema
    with FakeTensorMode():
        q = torch.empty(2, 8, 1, 128, dtype=torch.bfloat16)
        k = torch.empty(2, 2, 100, 128, dtype=torch.float8_e4m3fn)
        scales = torch.empty(2, dtype=torch.float32)
        o, lse = ckfmha.torch.attention(q, k, k, k_scale=scales, v_scale=scales, return_lse=True)
        assert o.shape == q.shape and o.dtype == torch.bfloat16 and lse.shape == (2, 8, 1)
        cache = torch.empty(40, 16, 2, 128, dtype=torch.float8_e4m3fn)
        o = ckfmha.torch.fwd_paged(
            q,
            cache,
            cache,
            block_table=torch.empty(2, 20, dtype=torch.int32),
            seqlens_k=torch.empty(2, dtype=torch.int32),
            max_seqlen_k=320,
            k_scale=0.5,
            v_scale=0.25,
        )
        assert o.shape == q.shape and o.dtype == torch.bfloat16


def test_gradients_through_fp8_kv_are_refused_at_the_call() -> None:
    torch = pytest.importorskip("torch")
    import ckfmha.torch

    q = torch.zeros(1, 4, 1, 64, dtype=torch.bfloat16, requires_grad=True)
    k = torch.zeros(1, 4, 8, 64, dtype=torch.float8_e4m3fn)
    message = r"fp8 K/V \(float8_e4m3fn k and v\) is for inference: ckfmha has no backward for"
    with pytest.raises(errors.InvalidArgumentError, match=message):
        ckfmha.torch.attention(q, k, k)
    codes = torch.zeros(1, 4, 8, 64, dtype=torch.uint8)
    with pytest.raises(errors.InvalidArgumentError, match=r"no backward"):
        ckfmha.torch.attention(q, codes, codes, kv_dtype="e4m3")
