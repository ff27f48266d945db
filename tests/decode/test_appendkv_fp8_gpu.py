"""Appending into fp8 (e4m3) KV caches on the GPU: the written codes bit for bit against the
reference, then attention over the appended cache against the float64 reference on the
dequantised cache.

Covered: contiguous caches and linear pages of 1 and 16 tokens (scattered), RoPE none,
half-rotated and interleaved (where the build has it), fp16 and bf16 tokens, head dims 64 and
128, per-tensor scales as numbers and per-head scales as device arrays (small enough that some
codes saturate), cache lengths from 0 up to capacity minus the new tokens. Caches are filled
with random non-NaN codes first, so every slot the append does not own must come back
unchanged; inputs are fresh random values per case.

The codes are compared exactly: the kernel's contract is e4m3(x / scale) of x in the tokens'
dtype, the division correctly rounded in fp32. With RoPE, x is the rotated key rounded to the
dtype, which the plain (fp16/bf16) append of the same inputs writes; the codes are checked
against that, and that rotation against the float64 one within the plain append's tolerance.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from support.gpu_compare import compare, f64, torch_dtype

import ckfmha
from ckfmha import errors, fp8
from ckfmha.reference import attention_reference, paged_attention_reference
from ckfmha.reference_appendkv import append_kv_reference, rotate

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

FP8_ARCH = 89  # e4m3 conversions (cvt ... e4m3x2) start with sm_89
fp8_device = pytest.mark.skipif(
    ckfmha.device_count() == 0 or ckfmha.device_arch() < FP8_ARCH,
    reason=f"fp8 cache appends need sm_{FP8_ARCH} or later",
)

# The plain append's bound on rotated keys (computed in fp32, rounded once to the dtype).
ROTATION_TOL = {"fp16": 2e-3, "bf16": 1.6e-2}
BATCH, NHEAD_K, GROUP, SEQLEN_NEW = 3, 4, 2, 5
CAPACITY = 48  # tokens per sequence (contiguous), or pages * page_size


@dataclass
class Scales:
    """What append_kv and fwd take (numbers or device arrays) and the fp32 values per head."""

    k_arg: Any
    v_arg: Any
    k: np.ndarray  # [nhead_k] float32
    v: np.ndarray


def _scales(mode: str, generator: Any) -> Scales:
    """Scales about amax / 448 of unit normal data, so that some new codes saturate."""
    count = 1 if mode == "tensor" else NHEAD_K
    k, v = ((torch.rand(count, generator=generator) * 0.015 + 0.004).numpy().astype(np.float32)
            for _ in range(2))  # fmt: skip
    k, v = np.broadcast_to(k, NHEAD_K).copy(), np.broadcast_to(v, NHEAD_K).copy()
    if mode == "tensor":
        return Scales(float(k[0]), float(v[0]), k, v)
    return Scales(torch.from_numpy(k).cuda(), torch.from_numpy(v).cuda(), k, v)


def _random_codes(shape: tuple[int, ...], generator: Any) -> Any:
    """e4m3 codes of either sign, never NaN (0x7F, 0xFF): old tokens attention will read."""
    magnitude = torch.randint(0, 0x7F, shape, generator=generator, dtype=torch.uint8)
    sign = torch.randint(0, 2, shape, generator=generator, dtype=torch.uint8) << 7
    return (magnitude | sign).cuda().view(torch.float8_e4m3fn)


def _codes(cache: Any) -> np.ndarray:
    return cache.view(torch.uint8).cpu().numpy()


def _rows(cache: np.ndarray, table: np.ndarray | None, lengths: np.ndarray) -> np.ndarray:
    """The rows [batch, seqlen_new, heads, d] an append of SEQLEN_NEW tokens wrote."""
    rows = []
    for b, length in enumerate(lengths.tolist()):
        for pos in range(length, length + SEQLEN_NEW):
            if table is None:
                rows.append(cache[b, pos])
            else:
                page_size = cache.shape[1]
                rows.append(cache[table[b, pos // page_size], pos % page_size])
    return np.stack(rows).reshape(len(lengths), SEQLEN_NEW, *cache.shape[2:])


class Case:
    """One append: tokens, caches pre-filled with random codes, lengths, pages and RoPE."""

    def __init__(self, dtype: str, hdim: int, page_size: int, rope: str, seed: int) -> None:
        self.dtype, self.hdim, self.page_size, self.rope = dtype, hdim, page_size, rope
        self.generator = torch.Generator().manual_seed(seed)
        g = self.generator
        self.lengths = torch.randint(0, CAPACITY - SEQLEN_NEW + 1, (BATCH,), generator=g,
                                     dtype=torch.int32)  # fmt: skip
        self.lengths[0] = 0
        self.lengths[-1] = CAPACITY - SEQLEN_NEW
        self.table = None
        if page_size:
            pages_per_seq = CAPACITY // page_size
            num_pages = BATCH * pages_per_seq + 3  # a few pages no sequence owns
            order = torch.randperm(num_pages, generator=g)[: BATCH * pages_per_seq]
            self.table = order.reshape(BATCH, pages_per_seq).to(torch.int32)
            shape = (num_pages, page_size, NHEAD_K, hdim)
        else:
            shape = (BATCH, CAPACITY, NHEAD_K, hdim)
        self.k_cache, self.v_cache = _random_codes(shape, g), _random_codes(shape, g)
        self.before = (_codes(self.k_cache), _codes(self.v_cache))
        self.k_new, self.v_new = (
            torch.randn((BATCH, SEQLEN_NEW, NHEAD_K, hdim), generator=g).to("cuda",
                                                                         torch_dtype(dtype))
            for _ in range(2)
        )  # fmt: skip
        self.cos = self.sin = None
        if rope != "none":
            angles = torch.rand((CAPACITY + 1, hdim // 2), generator=g) * 40 - 20
            self.cos, self.sin = angles.cos().cuda(), angles.sin().cuda()

    @property
    def table_np(self) -> np.ndarray | None:
        return None if self.table is None else self.table.numpy()

    def options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.table is not None:
            options["block_table"] = self.table.cuda()
        if self.rope != "none":
            options.update(cos=self.cos, sin=self.sin,
                           rotary_interleaved=self.rope == "interleaved")  # fmt: skip
        return options

    def rotated_keys(self) -> np.ndarray:
        """The new keys as the kernels rotate them (in the dtype), from the plain append into a
        cache of that dtype; checked against the float64 rotation."""
        plain_k = torch.zeros(self.k_cache.shape, dtype=self.k_new.dtype, device="cuda")
        plain_v = torch.zeros_like(plain_k)
        ckfmha.append_kv(plain_k, plain_v, self.k_new, self.v_new, self.lengths,
                         **self.options())  # fmt: skip
        rotated = _rows(f64(plain_k), self.table_np, self.lengths.numpy())
        positions = self.lengths.numpy()[:, None] + np.arange(SEQLEN_NEW)
        exact = np.stack([
            rotate(f64(self.k_new[b]), positions[b], f64(self.cos), f64(self.sin),
                   self.rope == "interleaved")
            for b in range(BATCH)
        ])  # fmt: skip
        tol = ROTATION_TOL[self.dtype]
        np.testing.assert_allclose(rotated, exact, rtol=tol, atol=tol)
        return rotated


def _expected_codes(case: Case, scales: Scales) -> tuple[np.ndarray, np.ndarray]:
    keys = f64(case.k_new) if case.rope == "none" else case.rotated_keys()
    ref = append_kv_reference(*case.before, keys, f64(case.v_new), case.lengths.numpy(),
                              block_table=case.table_np, fp8_scales=(scales.k, scales.v),
                              dtype=case.dtype)  # fmt: skip
    assert not ref.overflow
    return ref.k_cache, ref.v_cache


def _check_codes(case: Case, expected: tuple[np.ndarray, np.ndarray], what: str) -> None:
    for name, cache, want, before in (
        ("k", case.k_cache, expected[0], case.before[0]),
        ("v", case.v_cache, expected[1], case.before[1]),
    ):
        got = _codes(cache)
        changed = got != want
        if changed.any():
            where = np.argwhere(changed)[:4].tolist()
            untouched = (want == before) & (got != before)
            raise AssertionError(
                f"{what}: {int(changed.sum())} {name} codes differ (first at {where}); "
                f"{int(untouched.sum())} of them in slots the append does not own"
            )


def _attend(case: Case, scales: Scales, what: str) -> None:
    """fwd_paged / fwd over the appended fp8 cache with the same scales."""
    dtype = torch_dtype(case.dtype)
    lengths = case.lengths.numpy() + SEQLEN_NEW
    q = torch.randn((BATCH, NHEAD_K * GROUP, 1, case.hdim), generator=case.generator).to(
        "cuda", dtype
    )
    head_scale = (1, 1, NHEAD_K, 1)
    k_ref = fp8.dequantize(_codes(case.k_cache), scales.k.reshape(head_scale))
    v_ref = fp8.dequantize(_codes(case.v_cache), scales.v.reshape(head_scale))
    if case.table is not None:
        out = ckfmha.fwd_paged(q, case.k_cache, case.v_cache, block_table=case.table.cuda(),
                               seqlens_k=torch.from_numpy(lengths).cuda(),
                               k_scale=scales.k_arg, v_scale=scales.v_arg)  # fmt: skip
        torch.cuda.synchronize()
        ref, _ = paged_attention_reference(f64(q), k_ref, v_ref, block_table=case.table_np,
                                           seqlens_k=lengths)  # fmt: skip
        compare({"dtype": case.dtype}, out, None, ref, None, what)
        return
    for b, length in enumerate(lengths.tolist()):
        k = case.k_cache[b : b + 1, :length].permute(0, 2, 1, 3)
        v = case.v_cache[b : b + 1, :length].permute(0, 2, 1, 3)
        out = ckfmha.fwd(q[b : b + 1], k, v, k_scale=scales.k_arg, v_scale=scales.v_arg)
        torch.cuda.synchronize()
        ref, _ = attention_reference(
            f64(q[b : b + 1]),
            k_ref[b : b + 1, :length].transpose(0, 2, 1, 3),
            v_ref[b : b + 1, :length].transpose(0, 2, 1, 3),
        )
        compare({"dtype": case.dtype}, out, None, ref, None, f"{what}, sequence {b}")


def _skip_without_kernel(case: Case) -> None:
    """Interleaved RoPE is checked where the build has a kernel for it."""
    if case.rope != "interleaved":
        return
    fields = {"dtype": case.dtype, "batch": BATCH, "nhead_k": NHEAD_K,
              "seqlen_new": SEQLEN_NEW, "hdim": case.hdim, "rope": case.rope,
              "kv_dtype": "fp8_e4m3"}  # fmt: skip
    if case.page_size:
        fields.update(page_size=case.page_size, max_pages_per_seq=CAPACITY // case.page_size)
    try:
        ckfmha.select_append_kv(**fields)
    except errors.UnsupportedError:
        pytest.skip("no fp8 append kernel with interleaved RoPE in this build")


@fp8_device
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("hdim", [64, 128])
@pytest.mark.parametrize("page_size", [0, 1, 16], ids=["contiguous", "pages1", "pages16"])
@pytest.mark.parametrize("rope", ["none", "half_rotated", "interleaved"])
@pytest.mark.parametrize("scale_mode", ["tensor", "per_head"])
def test_fp8_append_writes_exact_codes_and_attention_reads_them(
    dtype: str, hdim: int, page_size: int, rope: str, scale_mode: str
) -> None:
    seed = secrets.randbits(31)
    what = f"{dtype} d{hdim} pages {page_size} rope {rope} scales {scale_mode} seed {seed}"
    case = Case(dtype, hdim, page_size, rope, seed)
    _skip_without_kernel(case)
    scales = _scales(scale_mode, case.generator)
    expected = _expected_codes(case, scales)
    ckfmha.append_kv(case.k_cache, case.v_cache, case.k_new, case.v_new, case.lengths,
                     k_scale=scales.k_arg, v_scale=scales.v_arg, **case.options())  # fmt: skip
    torch.cuda.synchronize()
    _check_codes(case, expected, what)
    _attend(case, scales, what)


@fp8_device
def test_uint8_caches_with_kv_dtype_get_the_same_codes() -> None:
    seed = secrets.randbits(31)
    case = Case("bf16", 128, 16, "none", seed)
    scales = _scales("per_head", case.generator)
    expected = _expected_codes(case, scales)
    ckfmha.append_kv(case.k_cache.view(torch.uint8), case.v_cache.view(torch.uint8), case.k_new,
                     case.v_new, case.lengths, kv_dtype="fp8_e4m3", k_scale=scales.k_arg,
                     v_scale=scales.v_arg, **case.options())  # fmt: skip
    torch.cuda.synchronize()
    _check_codes(case, expected, f"uint8 caches, seed {seed}")


@pytest.mark.skipif(
    ckfmha.device_count() == 0 or ckfmha.device_arch() >= FP8_ARCH,
    reason="checks a device before sm_89",
)
def test_fp8_appends_are_refused_before_sm89() -> None:
    case = Case("fp16", 64, 0, "none", 0)
    with pytest.raises(errors.UnsupportedError):
        ckfmha.append_kv(case.k_cache, case.v_cache, case.k_new, case.v_new, case.lengths,
                         k_scale=0.01, v_scale=0.01)  # fmt: skip
