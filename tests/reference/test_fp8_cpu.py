"""e4m3 (fp8) on the host (ckfmha.fp8): codes decode and values round exactly as torch's
float8_e4m3fn does, ties go to the even code, large values saturate, and the scales map a
tensor's largest magnitude to 448."""

from __future__ import annotations

import numpy as np
import pytest

from ckfmha import fp8

torch = pytest.importorskip("torch")


def _torch_codes(values: np.ndarray) -> np.ndarray:
    return torch.from_numpy(values).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def test_every_code_decodes_as_torch_does() -> None:
    codes = np.arange(256, dtype=np.uint8)
    ours = fp8.decode_e4m3(codes)
    theirs = torch.from_numpy(codes).view(torch.float8_e4m3fn).to(torch.float64).numpy()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    np.testing.assert_array_equal(ours[~np.isnan(ours)], theirs[~np.isnan(theirs)])
    assert np.nanmax(ours) == fp8.E4M3_MAX and ours[1] == 2.0**-9
    assert np.isnan(ours[0x7F]) and np.isnan(ours[0xFF])


def test_rounding_matches_torch_on_random_ties_subnormals_and_saturation() -> None:
    rng = np.random.default_rng(3)
    values = np.concatenate([
        rng.standard_normal(20000) * np.exp2(rng.uniform(-14, 10, 20000)),  # every binade
        (fp8.decode_e4m3(np.arange(126, dtype=np.uint8)) +
         fp8.decode_e4m3(np.arange(1, 127, dtype=np.uint8))) / 2,  # midpoints: ties
        [0.0, -0.0, 2.0**-10, 2.0**-11, 447.9, 448.0, 464.0, 1e6, -1e6],
    ])  # fmt: skip
    values = np.concatenate([values, -values])
    np.testing.assert_array_equal(fp8.encode_e4m3(values), _torch_codes(values))


def test_ties_go_to_the_even_code_and_nan_stays_nan() -> None:
    # 1.0625 lies halfway between 1.0 (code 0x38) and 1.125 (0x39): the even code wins.
    assert fp8.encode_e4m3([1.0625])[0] == 0x38
    assert fp8.encode_e4m3([1.1875])[0] == 0x3A  # between 0x39 and 0x3A
    assert fp8.encode_e4m3([np.nan])[0] == 0x7F and fp8.encode_e4m3([-np.nan])[0] == 0xFF
    assert fp8.round_e4m3([500.0, -1e9])[0] == 448.0 and fp8.round_e4m3([-1e9])[0] == -448.0


def test_a_tensor_scale_maps_the_largest_magnitude_to_448() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 50, 64)) * 7.0
    scale = fp8.tensor_scale(x)
    codes = fp8.quantize(x, scale)
    assert np.abs(fp8.decode_e4m3(codes)).max() == fp8.E4M3_MAX
    back = fp8.dequantize(codes, scale)
    # Normal values keep 3 mantissa bits: within 2**-4 of themselves; the smallest within half
    # a subnormal step.
    bound = np.maximum(np.abs(x) * 2.0**-4, scale * 2.0**-10)
    assert np.all(np.abs(back - x) <= bound + 1e-15)
    assert fp8.tensor_scale(np.zeros(5)) == 1.0
    with pytest.raises(ValueError, match="inf or NaN"):
        fp8.tensor_scale([1.0, np.inf])


def test_block_scales_take_one_scale_per_block_of_rows() -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 300, 16))  # [batch, heads, seqlen, hdim]
    scales = fp8.block_scales(x, rows=128)
    assert scales.shape == (2, 3, 3)  # 128 + 128 + 44 rows
    np.testing.assert_allclose(scales[1, 2, 2], np.abs(x[1, 2, 256:]).max() / 448)
    per_row = fp8.expand_block_scales(scales, 128, 300)
    assert per_row.shape == (2, 3, 300) and per_row[0, 1, 130] == scales[0, 1, 1]
    codes = fp8.quantize(x, per_row[..., None])
    # Each block's largest element lands on 448.
    assert np.all(np.abs(fp8.decode_e4m3(codes)).reshape(2, 3, -1).max(axis=-1) == 448)
    with pytest.raises(ValueError, match="rows is 0"):
        fp8.block_scales(x, rows=0)


def test_decode_takes_uint8_codes_only() -> None:
    with pytest.raises(TypeError, match="e4m3 codes are uint8, got int64"):
        fp8.decode_e4m3(np.arange(4))
