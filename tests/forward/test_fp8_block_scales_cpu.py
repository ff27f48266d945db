"""Per-block fp8 scales without a GPU: every argument error of fwd and fwd_varlen with 3-D
q_scale, k_scale and v_scale (raised before anything reaches a device), well-formed calls
reaching the C library with ``fp8_block_scales`` set, the rules alone, and the host helpers
the GPU tests quantise with (tests/support/fp8_blocks.py).

The calls run on ``ckfmha.device_ptr`` views at made-up addresses with an explicit ``out``, so
nothing is allocated or staged before the checks under test.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from support import fp8_blocks

import ckfmha
from ckfmha import _dtypes, errors, fp8
from ckfmha.fp8_attention import block_scale_shape, uses_block_scales

no_gpu = pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")

FP8 = "fp8_e4m3"
Q_SHAPE = (2, 8, 300, 128)  # bhsd: 2 sequences, 8 query heads, 300 queries (3 blocks), d128
KV_SHAPE = (2, 2, 1000, 128)  # 2 K/V heads (GQA groups of 4), 1000 keys (8 blocks)
Q_BLOCKS = (2, 8, 3)
KV_BLOCKS = (2, 2, 8)
SCALE_ADDRESSES = {"q_scale": 0xB00000, "k_scale": 0xB01000, "v_scale": 0xB02000}


def _ptr(shape: tuple[int, ...], dtype: str = "bf16", address: int = 0x400000,
         strides: tuple[int, ...] | None = None) -> Any:  # fmt: skip
    return ckfmha.device_ptr(address, shape, dtype, strides)


def _blocks(q: tuple[int, ...] = Q_BLOCKS, kv: tuple[int, ...] = KV_BLOCKS,
            k: tuple[int, ...] | None = None, dtype: str = "fp32") -> dict[str, Any]:  # fmt: skip
    """Device per-block scales of shapes ``q`` and ``kv`` (``k`` for k_scale alone)."""
    shapes = {"q_scale": q, "k_scale": kv if k is None else k, "v_scale": kv}
    return {
        name: _ptr(shape, dtype if name == "q_scale" else "fp32", SCALE_ADDRESSES[name])
        for name, shape in shapes.items()
    }


def _fwd(q: str = FP8, kv: str = FP8, o: str = "bf16", **kwargs: Any) -> Any:
    """fwd on device pointers: q, k and v arrays of dtypes ``q`` and ``kv``, an explicit out
    of dtype ``o``; ``kwargs`` go to fwd."""
    return ckfmha.fwd(
        _ptr(Q_SHAPE, q),
        _ptr(KV_SHAPE, kv, 0x500000),
        _ptr(KV_SHAPE, kv, 0x600000),
        out=_ptr(Q_SHAPE, o, 0x800000),
        **kwargs,
    )


# ---- argument errors: fwd ----

SHAPE_MESSAGE = r"must have shape \[batch, nhead_{}, ceil\(seqlen_{} / 128\)\] = \({}\)"
Q_SHAPE_MESSAGE = SHAPE_MESSAGE.format("q", "q", "2, 8, 3")
KV_SHAPE_MESSAGE = SHAPE_MESSAGE.format("k", "k", "2, 2, 8")
NEED_FP8_Q = r"\(per-block scales\), but q is {}: per-block scales need fp8 queries"
TOGETHER = r": per-block scales come for q, k and v together"
MIXED = r"(is|are) 3-D \(per-block scales\) but .*" + TOGETHER

# (arrays: q, kv and o (out) dtypes; fwd's keyword arguments; the message)
FWD_ERRORS: list[tuple[dict[str, str], dict[str, Any], str]] = [
    # A block too many or too few, a wrong head count or batch.
    ({}, _blocks(q=(2, 8, 4)), rf"q_scale {Q_SHAPE_MESSAGE} .*got shape \(2, 8, 4\)"),
    ({}, _blocks(q=(2, 8, 2)), rf"q_scale {Q_SHAPE_MESSAGE}"),
    ({}, _blocks(k=(2, 2, 9)), rf"k_scale {KV_SHAPE_MESSAGE} .*got shape \(2, 2, 9\)"),
    ({}, _blocks(kv=(2, 2, 7)), rf"k_scale {KV_SHAPE_MESSAGE}"),
    ({}, _blocks(q=(2, 2, 3)), rf"q_scale {Q_SHAPE_MESSAGE}"),  # nhead_k for q
    ({}, _blocks(kv=(2, 8, 8)), rf"k_scale {KV_SHAPE_MESSAGE}"),  # nhead_q for K/V
    ({}, _blocks(q=(1, 8, 3)), rf"q_scale {Q_SHAPE_MESSAGE}"),
    ({}, _blocks(q=(2, 3, 8)), rf"q_scale {Q_SHAPE_MESSAGE}"),  # axes swapped
    # Host arrays are checked before they are staged.
    (
        {},
        {**_blocks(), "v_scale": np.ones((2, 2, 9), np.float32)},
        rf"v_scale {KV_SHAPE_MESSAGE} .*got shape \(2, 2, 9\)",
    ),
    # Per-block scales come as three.
    (
        {},
        {**_blocks(), "q_scale": 0.5},
        r"k_scale and v_scale are 3-D \(per-block scales\) but q_scale is a number" + TOGETHER,
    ),
    ({}, {**_blocks(), "q_scale": None}, r"but q_scale is not given" + TOGETHER),
    (
        {},
        {**_blocks(), "q_scale": _ptr((8,), "fp32", 0xB00000)},
        r"but q_scale has shape \(8,\)" + TOGETHER,
    ),
    (
        {},
        {
            **_blocks(),
            "k_scale": _ptr((2,), "fp32", 0xB01000),
            "v_scale": _ptr((2,), "fp32", 0xB02000),
        },
        r"q_scale is 3-D .* but k_scale has shape \(2,\), v_scale has shape \(2,\)" + TOGETHER,
    ),
    # k_scale and v_scale of two kinds are refused as a pair first, before any array is read.
    ({}, {**_blocks(), "v_scale": 2.0}, r"k_scale is an array and v_scale a number"),
    # fp32 only, contiguous.
    ({}, _blocks(dtype="fp16"), r"q_scale must be fp32, got fp16"),
    (
        {},
        {**_blocks(), "k_scale": _ptr(KV_BLOCKS, "fp32", 0xB01000, strides=(32, 16, 1))},
        r"k_scale must be contiguous \(per-block scales are read as \[batch\]\[head\]\[block\]\)",
    ),
    # Per-block scales need fp8 queries.
    ({"q": "bf16"}, _blocks(), NEED_FP8_Q.format("bf16")),
    ({"q": "bf16"}, {**_blocks(), "q_scale": None}, NEED_FP8_Q.format("bf16")),
    ({"q": "bf16", "kv": "bf16"}, _blocks(), NEED_FP8_Q.format("bf16")),
    ({"q": "fp16", "o": "fp16"}, {**_blocks(), "q_scale": None}, NEED_FP8_Q.format("fp16")),
    ({"q": "uint8"}, _blocks(), r"q is uint8: if it holds e4m3 codes, say so with q_dtype"),
    # The output may not overlap a scale array.
    ({}, {**_blocks(), "q_scale": _ptr(Q_BLOCKS, "fp32", 0x800000)}, r"out .*q_scale"),
]


@pytest.mark.parametrize(("arrays", "kwargs", "message"), FWD_ERRORS)
def test_fwd_argument_errors(arrays: dict[str, str], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _fwd(**arrays, **kwargs)


def test_block_counts_round_up() -> None:
    # 300 queries need 3 blocks (256 + 44), 1000 keys 8 (896 + 104): one fewer is refused.
    with pytest.raises(errors.InvalidArgumentError, match=r"= \(2, 8, 3\)"):
        _fwd(**_blocks(q=(2, 8, 300 // 128)))
    with pytest.raises(errors.InvalidArgumentError, match=r"= \(2, 2, 8\)"):
        _fwd(**_blocks(kv=(2, 2, 1000 // 128)))


# ---- argument errors: fwd_varlen ----

VARLEN_Q_BLOCKS = (2, 8, 1)  # max_seqlen_q 20: one block
VARLEN_KV_BLOCKS = (2, 2, 2)  # max_seqlen_k 200: two blocks


def _varlen(q: str = FP8, kv: str = FP8, o: str = "bf16", *, tokens: tuple[int, int] = (40, 300),
            longest: tuple[int, int] = (20, 200), **kwargs: Any) -> Any:  # fmt: skip
    """fwd_varlen over 2 sequences (device offsets), d64, 8 query and 2 K/V heads: ``tokens``
    packed (queries, keys), the longest sequences ``longest`` (max_seqlen_q, max_seqlen_k)."""
    offsets = _ptr((3,), "int32", 0xC00000)
    k, v = (_ptr((tokens[1], 2, 64), kv, address) for address in (0x500000, 0x600000))
    out = _ptr((tokens[0], 8, 64), o, 0x800000)
    return ckfmha.fwd_varlen(_ptr((tokens[0], 8, 64), q), k, v, offsets, offsets,
                             max_seqlen_q=longest[0], max_seqlen_k=longest[1], out=out,
                             **kwargs)  # fmt: skip


def _varlen_blocks(q: tuple[int, ...] = VARLEN_Q_BLOCKS,
                   kv: tuple[int, ...] = VARLEN_KV_BLOCKS) -> dict[str, Any]:  # fmt: skip
    return _blocks(q=q, kv=kv)


VARLEN_Q_MESSAGE = r"q_scale must have shape \[batch, nhead_q, ceil\(max_seqlen_q / 128\)\]"
VARLEN_KV_MESSAGE = r"k_scale must have shape \[batch, nhead_k, ceil\(max_seqlen_k / 128\)\]"


@pytest.mark.parametrize(
    ("arrays", "kwargs", "message"),
    [
        ({}, _varlen_blocks(q=(2, 8, 2)), VARLEN_Q_MESSAGE + r" = \(2, 8, 1\)"),
        # Blocks counted over the packed tokens (300 keys: 3) rather than the longest sequence.
        ({}, _varlen_blocks(kv=(2, 2, 3)), VARLEN_KV_MESSAGE + r" = \(2, 2, 2\)"),
        ({}, _varlen_blocks(kv=(2, 2, 1)), VARLEN_KV_MESSAGE),
        # One row per sequence, not per offset.
        ({}, _varlen_blocks(q=(3, 8, 1)), VARLEN_Q_MESSAGE),
        ({}, _varlen_blocks(kv=(2, 8, 2)), VARLEN_KV_MESSAGE),
        ({}, {**_varlen_blocks(), "q_scale": 0.5}, MIXED),
        ({}, {**_varlen_blocks(), "k_scale": None, "v_scale": None}, r"q_scale is 3-D"),
        ({"q": "bf16"}, {**_varlen_blocks(), "q_scale": None}, NEED_FP8_Q.format("bf16")),
        ({}, _blocks(q=VARLEN_Q_BLOCKS, kv=VARLEN_KV_BLOCKS, dtype="fp16"), r"must be fp32"),
    ],
)
def test_fwd_varlen_argument_errors(arrays: dict[str, str], kwargs: dict[str, Any],
                                    message: str) -> None:  # fmt: skip
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _varlen(**arrays, **kwargs)


# ---- well-formed calls reach the C library ----

# What ckfmha_fwd_run says of per-block scales without all three device arrays: the call got
# past every Python check, and the problem reached the C library with fp8_block_scales set.
C_NEEDS_POINTERS = (
    r"per-block scales \(fp8_block_scales\) need args\.q_scale, args\.k_scale and "
    r"args\.v_scale, device arrays of one fp32 scale per 128-token block of each head"
)


@no_gpu
@pytest.mark.parametrize(
    ("arrays", "kwargs"),
    [
        ({}, {}),
        ({}, {"causal": True, "return_lse": True}),
        ({"o": "fp16"}, {"out_dtype": "fp16", "layout": "bhsd"}),
        ({"q": "uint8", "kv": "uint8"}, {"q_dtype": "e4m3", "kv_dtype": "e4m3"}),
    ],
)
def test_well_formed_block_scale_calls_reach_the_device(arrays: dict[str, str],
                                                        kwargs: dict[str, Any]) -> None:  # fmt: skip
    with pytest.raises(errors.NoDeviceError):
        _fwd(**arrays, **kwargs, **_blocks())
    kwargs = {k: v for k, v in kwargs.items() if k != "layout"}
    with pytest.raises(errors.NoDeviceError):
        _varlen(**arrays, **kwargs, **_varlen_blocks())


@no_gpu
def test_host_block_scales_of_the_right_shape_are_staged() -> None:
    # Past the checks, NumPy scales are staged like the other small host arrays: without a
    # device, staging is what fails.
    host = {
        "q_scale": np.ones(Q_BLOCKS, np.float32),
        "k_scale": np.ones(KV_BLOCKS, np.float32),
        "v_scale": np.ones(KV_BLOCKS, np.float32),
    }
    with pytest.raises(errors.NoDeviceError):
        _fwd(**host)


def _null(scales: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """``scales`` with the arrays ``names`` at address 0: right shapes, NULL pointers."""
    return {
        name: _ptr(tuple(scale.shape), "fp32", 0) if name in names else scale
        for name, scale in scales.items()
    }


@no_gpu
@pytest.mark.parametrize("missing", [("q_scale",), ("q_scale", "k_scale", "v_scale")])
def test_the_c_library_reads_the_block_scale_flag(missing: tuple[str, ...]) -> None:
    # Null device arrays pass the Python checks (their shapes and dtype are right) and leave
    # args pointers NULL, which ckfmha_fwd_run takes for "use the host scalars" unless the
    # problem says the scales are per block: its refusal shows the flag reached the C library.
    # (A NULL k_scale beside a v_scale is refused as a broken pair whatever the mode.)
    with pytest.raises(errors.InvalidArgumentError, match=C_NEEDS_POINTERS):
        _fwd(**_null(_blocks(), missing))
    with pytest.raises(errors.InvalidArgumentError, match=C_NEEDS_POINTERS):
        _varlen(**_null(_varlen_blocks(), missing))


@no_gpu
def test_empty_problems_take_empty_block_scales() -> None:
    # No tokens: no blocks, and nothing to launch.
    o = _varlen(tokens=(0, 0), longest=(0, 0), **_blocks(q=(2, 8, 0), kv=(2, 2, 0)))
    assert o.shape == (0, 8, 64)


# ---- the rules alone ----


def test_block_mode_rules() -> None:
    fp8_code, bf16 = _dtypes.FP8_E4M3, _dtypes.BF16
    three = np.ones((1, 1, 1), np.float32)
    assert uses_block_scales(fp8_code, three, three, three)
    assert not uses_block_scales(fp8_code, 0.5, None, None)
    assert not uses_block_scales(fp8_code, np.ones(8, np.float32), three[0, 0], three[0, 0])
    assert not uses_block_scales(bf16, None, 1.0, 2.0)
    with pytest.raises(errors.InvalidArgumentError, match=NEED_FP8_Q.format("bf16")):
        uses_block_scales(bf16, None, three, three)
    with pytest.raises(errors.InvalidArgumentError, match=r"q_scale and v_scale are 3-D"):
        uses_block_scales(fp8_code, three, None, three)
    block_scale_shape("k_scale", (2, 2, 8), (2, 2, 8), "nhead_k", "seqlen_k", 128)
    with pytest.raises(errors.InvalidArgumentError, match=KV_SHAPE_MESSAGE):
        block_scale_shape("k_scale", (2, 2, 7), (2, 2, 8), "nhead_k", "seqlen_k", 128)


# ---- the torch op ----


def test_the_torch_op_passes_block_scales() -> None:
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    import ckfmha.torch

    schema = str(torch.ops.ckfmha.fwd_fp8.default._schema)
    for argument in ("Tensor? q_scale=None", "Tensor? k_scale=None", "Tensor? v_scale=None"):
        assert argument in schema, schema
    with FakeTensorMode():
        q = torch.empty(Q_SHAPE, dtype=torch.float8_e4m3fn)
        k = torch.empty(KV_SHAPE, dtype=torch.float8_e4m3fn)
        scales = {
            "q_scale": torch.empty(Q_BLOCKS, dtype=torch.float32),
            "k_scale": torch.empty(KV_BLOCKS, dtype=torch.float32),
            "v_scale": torch.empty(KV_BLOCKS, dtype=torch.float32),
        }
        o, lse = ckfmha.torch.attention(q, k, k, return_lse=True, **scales)
        assert o.shape == Q_SHAPE and o.dtype == torch.bfloat16 and lse.shape == Q_SHAPE[:3]
    q = torch.zeros(1, 4, 8, 64, dtype=torch.float8_e4m3fn)
    blocks = torch.ones(1, 4, 1, requires_grad=True)
    with pytest.raises(errors.InvalidArgumentError, match=r"fp8 queries .* are for inference"):
        ckfmha.torch.attention(q, q, q, q_scale=blocks, k_scale=blocks, v_scale=blocks)


# ---- the host helpers (tests/support/fp8_blocks.py) ----

# Half the spacing of e4m3's 3 mantissa bits, relative to the value: the rounding bound of a
# normal e4m3 value; below 2**-6 (subnormals) the bound is absolute: half of 2**-9.
E4M3_RELATIVE = 2.0**-4
E4M3_SUBNORMAL_HALF_STEP = 2.0**-10


def _within_e4m3(x: np.ndarray, values: np.ndarray, token_scales: np.ndarray) -> None:
    bound = np.maximum(E4M3_RELATIVE * np.abs(x), E4M3_SUBNORMAL_HALF_STEP * token_scales)
    assert np.all(np.abs(values - x) <= bound * (1 + 1e-12))


def test_block_quantisation_round_trips_within_e4m3_precision() -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2, 3, 300, 16))
    x[1, 2, 140, 5] = 80.0  # an outlier: its block's scale alone grows
    codes, scales = fp8_blocks.quantize_e4m3_blocks(x)
    assert codes.dtype == np.uint8 and codes.shape == x.shape
    assert scales.dtype == np.float32 and scales.shape == (2, 3, 3)
    values = fp8_blocks.dequantize_e4m3_blocks(codes, scales)
    token_scales = np.repeat(scales.astype(np.float64), 128, axis=-1)[..., :300, None]
    _within_e4m3(x, values, token_scales)
    assert scales[1, 2, 1] == np.float32(80.0 / 448)
    assert np.all(scales[1, 2, [0, 2]] < 1.0)  # the outlier's neighbours keep theirs


def test_block_scales_are_amax_over_448() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, 2, 200, 8))
    x[0, 1, :128] = 0.0  # an all-zero block: scale 1.0
    _, scales = fp8_blocks.quantize_e4m3_blocks(x)
    first = np.abs(x[0, 0, :128]).max() / 448
    last = np.abs(x[0, 1, 128:]).max() / 448
    assert scales[0, 0, 0] == np.float32(first) and scales[0, 1, 1] == np.float32(last)
    assert scales[0, 1, 0] == 1.0
    # The largest value of a block takes e4m3's largest code (448).
    codes, _ = fp8_blocks.quantize_e4m3_blocks(np.full((1, 1, 3, 2), -5.0))
    assert np.all(fp8.decode_e4m3(codes) == -448.0)


def test_padding_takes_no_part_in_the_scales() -> None:
    x = np.ones((2, 1, 256, 4))
    x[:, :, 100:] = 1000.0  # padding past the lengths
    _, scales = fp8_blocks.quantize_e4m3_blocks(x, seqlens=[100, 200])
    assert scales[0, 0, 0] == np.float32(1 / 448) and scales[0, 0, 1] == 1.0
    assert scales[1, 0, 0] == np.float32(1000 / 448)


def test_the_shared_encoder_matches_ml_dtypes() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(11)
    # Within +-448: past it ml_dtypes gives NaN where the kernels' conversion saturates.
    x = np.concatenate([rng.normal(size=4000) * 10.0 ** rng.integers(-4, 3, 4000),
                        np.linspace(-448, 448, 997)]).clip(-448, 448)  # fmt: skip
    theirs = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(fp8.encode_e4m3(x), theirs)


def test_varlen_blocks_start_at_each_sequence() -> None:
    rng = np.random.default_rng(5)
    cu_seqlens = np.array([0, 100, 100, 390], np.int32)  # 100 tokens, none, 290
    x = rng.normal(size=(390, 2, 8))
    x[100 + 128, 1, 3] = 60.0  # the first token of the third sequence's second block
    codes, scales = fp8_blocks.quantize_e4m3_blocks_varlen(x, cu_seqlens, max_seqlen=290)
    assert codes.shape == x.shape and scales.shape == (3, 2, 3) and scales.dtype == np.float32
    assert scales[2, 1, 1] == np.float32(60.0 / 448)
    # Sequence by sequence, the blocks are batch mode's blocks of that sequence alone.
    for index, (start, end) in enumerate(itertools.pairwise(cu_seqlens)):
        alone = np.moveaxis(x[start:end], 0, 1)[None]
        _, expected = fp8_blocks.quantize_e4m3_blocks(alone)
        used = expected.shape[2]
        assert np.array_equal(scales[index, :, :used], expected[0])
        assert np.all(scales[index, :, used:] == 1.0)  # blocks past the sequence
    values = fp8_blocks.dequantize_e4m3_blocks_varlen(codes, scales, cu_seqlens)
    token_scales = np.ones((390, 2, 1))
    token_scales[:100, :, 0] = scales[0, :, 0]
    for block in range(3):
        rows = slice(100 + 128 * block, min(100 + 128 * (block + 1), 390))
        token_scales[rows, :, 0] = scales[2, :, block]
    _within_e4m3(x, values, token_scales)


def test_varlen_helpers_refuse_sequences_past_max_seqlen() -> None:
    with pytest.raises(ValueError, match=r"sequence 1 spans tokens 10\.\.50"):
        fp8_blocks.quantize_e4m3_blocks_varlen(np.zeros((50, 1, 4)), [0, 10, 50], max_seqlen=32)
