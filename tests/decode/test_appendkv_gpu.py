"""Appending to a KV cache on the GPU against the float64 reference.

Every registered fwd_appendkv kernel of this device is forced by name over cases with fresh
random inputs: random cache lengths including 0 and exactly at capacity, odd numbers of new
tokens (1, more than a CTA's token tile), GQA query heads rotated with the keys (in place and
out of place), partial rotary dims (also ones that end inside a 16-byte vector, for
interleaved RoPE), cos/sin tables in fp32 and in the cache dtype, strided k_new/v_new views,
BSHD and BHSD caches, and paged caches with scattered pages of several sizes.

The caches are filled with random old values and the destination rows poisoned with NaN
first: destinations must match the reference, everything else must be bit-for-bit unchanged.
Device-side lengths past capacity and bad page numbers must skip their tokens and raise the
overflow flag.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
import pytest
from support.device_kernels import device_kernels

import ckfmha
from ckfmha.reference_appendkv import append_kv_reference

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None


KERNELS = device_kernels("fwd_appendkv")
# Rotated values are computed in fp32 from inputs of the cache dtype and rounded once.
TOLERANCE = {"fp16": 2e-3, "bf16": 1.6e-2, "fp32": 2e-6}

# (batch, seqlen_new, nhead_k, query heads per K/V head, capacity or None for pages,
#  page_size, layout, rotary fraction, seqlen_q)
CASES = [
    (3, 1, 4, 4, 64, 0, "bshd", 1.0, 1),
    (2, 7, 2, 2, 40, 0, "bhsd", 0.5, 7),
    (4, 37, 1, 8, 100, 0, "bshd", 1.0, 37),
    (2, 5, 3, 1, None, 16, "bshd", 0.5, 5),
    (3, 19, 2, 4, None, 5, "bhsd", 1.0, 19),
    (5, 2, 8, 1, None, 1, "bshd", 1.0, 3),
]


def _torch_dtype(name: str) -> Any:
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


def _f64(t: Any) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def _rotary_dim(kernel: dict[str, Any], fraction: float, index: int) -> int:
    hdim = kernel["hdim_q"]
    vector = 4 if kernel["dtype"] == "fp32" else 8
    if kernel["rope"] == "half_rotated":
        # Halves of whole 16-byte vectors.
        return max(2 * vector, int(hdim * fraction) // (2 * vector) * (2 * vector))
    rotary_dim = int(hdim * fraction)
    # Interleaved: every other case ends the rotary columns inside a vector.
    return rotary_dim - 2 if index % 2 and rotary_dim > 2 else rotary_dim


class Case:
    """One problem: inputs on the GPU and their float64 reference."""

    def __init__(self, kernel: dict[str, Any], index: int, case: tuple[Any, ...]) -> None:
        b, s_new, hk, group, capacity, page_size, layout, fraction, s_q = case
        self.kernel, self.layout = kernel, layout
        # Fresh inputs every run; the seed is part of every failure message.
        self.seed = secrets.randbits(62)
        self.generator = torch.Generator().manual_seed(self.seed)
        dtype = self.dtype = _torch_dtype(kernel["dtype"])
        d, dv = kernel["hdim_q"], kernel["hdim_v"]
        self.paged = bool(kernel["paged_kv"])
        if self.paged:
            page_size = page_size or 16
            max_pages = -(-(s_new + 50) // page_size)
            capacity = max_pages * page_size
            num_pages = b * max_pages + 3
            # Scattered pages: a random permutation, a few pages owned by nobody.
            order = torch.randperm(num_pages, generator=self.generator)[: b * max_pages]
            self.block_table = order.reshape(b, max_pages).to(torch.int32)
            slabs, tokens = num_pages, page_size
        else:
            capacity = capacity or s_new + 50
            slabs, tokens = b, capacity
        self.capacity = capacity
        # Lengths: 0, exactly at capacity for the new tokens, the rest random.
        lengths = torch.randint(0, capacity - s_new + 1, (b,), generator=self.generator)
        lengths[0] = 0
        lengths[-1] = capacity - s_new
        self.lengths = lengths.to(torch.int32)

        def cache(hdim: int) -> Any:
            return torch.randn((slabs, tokens, hk, hdim), generator=self.generator)

        self.k_cache64, self.v_cache64 = cache(d), cache(dv)
        # The new tokens, strided views into wider buffers every other case (packed QKV).
        width = 3 if index % 2 else 1
        k_buf = torch.randn((b, s_new, hk * width, d), generator=self.generator)
        v_buf = torch.randn((b, s_new, hk * width, dv), generator=self.generator)
        self.k_new = k_buf.to("cuda", dtype)[:, :, :hk]
        self.v_new = v_buf.to("cuda", dtype)[:, :, hk : 2 * hk] if width > 1 else \
            v_buf.to("cuda", dtype)
        self.rope = kernel["rope"] != "none"
        self.cos = self.sin = self.q = None
        if self.rope:
            rotary_dim = _rotary_dim(kernel, fraction, index)
            max_pos = capacity + s_q + 3
            angles = torch.rand((max_pos, rotary_dim // 2), generator=self.generator) * 40 - 20
            table_dtype = torch.float32 if index % 2 == 0 else dtype
            self.cos = angles.cos().to("cuda", table_dtype)
            self.sin = angles.sin().to("cuda", table_dtype)
            self.q = torch.randn((b, s_q, hk * group, d), generator=self.generator).to(
                "cuda", dtype)

    def caches(self, poison: bool = True) -> tuple[Any, Any]:
        """The caches on the GPU in the case's layout, destinations poisoned with NaN."""
        k, v = self.k_cache64.clone(), self.v_cache64.clone()
        if poison:
            for b, length in enumerate(self.lengths.tolist()):
                for t in range(self.k_new.shape[1]):
                    slab, row = self.slot(b, length + t)
                    k[slab, row] = float("nan")
                    v[slab, row] = float("nan")
        k, v = k.to("cuda", self.dtype), v.to("cuda", self.dtype)
        if self.layout == "bhsd":
            # Heads outer in memory; the view handed over is BHSD.
            k = k.transpose(1, 2).contiguous()
            v = v.transpose(1, 2).contiguous()
        return k, v

    def slot(self, b: int, pos: int) -> tuple[int, int]:
        if not self.paged:
            return b, pos
        page_size = self.k_cache64.shape[1]
        return int(self.block_table[b, pos // page_size]), pos % page_size

    def bshd(self, cache: Any) -> Any:
        return cache.transpose(1, 2) if self.layout == "bhsd" else cache

    def run(self, k_cache: Any, v_cache: Any, lengths: Any, **options: Any) -> Any:
        if self.paged:
            options["block_table"] = self.block_table.cuda()
        if self.rope:
            options.update(cos=self.cos, sin=self.sin,
                           rotary_interleaved=self.kernel["rope"] == "interleaved")
        return ckfmha.append_kv(k_cache, v_cache, self.k_new, self.v_new, lengths,
                                cache_layout=self.layout, kernel=self.kernel["name"], **options)

    def reference(self, k_cache: Any, v_cache: Any, lengths: Any, q: Any = None) -> Any:
        return append_kv_reference(
            _f64(self.bshd(k_cache)), _f64(self.bshd(v_cache)), _f64(self.k_new),
            _f64(self.v_new), np.asarray(lengths),
            cos=_f64(self.cos) if self.rope else None, sin=_f64(self.sin) if self.rope else None,
            rotary_interleaved=self.kernel["rope"] == "interleaved",
            q=None if q is None else _f64(q),
            block_table=self.block_table.numpy() if self.paged else None)


def _check_cache(case: Case, before: Any, after: Any, ref: np.ndarray, what: str,
                 exact: bool) -> None:
    got = _f64(case.bshd(after))
    written = ~np.isnan(ref) & np.isnan(_f64(case.bshd(before)))
    untouched = ~np.isnan(_f64(case.bshd(before)))
    assert not np.isnan(got).any(), f"{what}: a destination row was not written"
    # Bit for bit: rows nobody appends to, and the head-dim columns of written rows' neighbours.
    same = case.bshd(after).contiguous().view(torch.uint8) == \
        case.bshd(before).contiguous().view(torch.uint8)
    elem = before.element_size()
    untouched_bytes = torch.from_numpy(np.repeat(untouched, elem, axis=-1)).cuda()
    assert bool(same[untouched_bytes].all()), f"{what}: entries outside the new tokens changed"
    if exact:
        assert np.array_equal(got[written], ref[written]), f"{what}: copied values differ"
    else:
        tol = TOLERANCE[case.kernel["dtype"]]
        np.testing.assert_allclose(got[written], ref[written], rtol=tol, atol=tol, err_msg=what)


def _ids(kernels: list[dict[str, Any]]) -> list[str]:
    return [k["name"] for k in kernels]


@pytest.mark.parametrize("kernel", KERNELS, ids=_ids(KERNELS))
@pytest.mark.parametrize("index", range(len(CASES)))
def test_append_matches_reference(kernel: dict[str, Any], index: int) -> None:
    case = Case(kernel, index, CASES[index])
    k_cache, v_cache = case.caches()
    k_before, v_before = k_cache.clone(), v_cache.clone()
    overflow = torch.zeros(1, dtype=torch.int32, device="cuda")
    # Host lengths (checked before the launch) and device lengths alternate.
    lengths = case.lengths.numpy() if index % 2 else case.lengths.cuda()
    q_out = None
    in_place = index % 3 == 2
    if case.rope:
        q = case.q.clone()
        q_out = case.run(k_cache, v_cache, lengths, q=q, q_out=q if in_place else None,
                         overflow=overflow)
        assert (q_out is q) == in_place
    else:
        assert case.run(k_cache, v_cache, lengths, overflow=overflow) is None
    torch.cuda.synchronize()
    ref = case.reference(k_before, v_before, case.lengths.numpy(),
                         q=case.q if case.rope else None)
    assert not ref.overflow and int(overflow.item()) == 0
    what = f"{kernel['name']} case {index} seed {case.seed}"
    _check_cache(case, k_before, k_cache, ref.k_cache, what + " K", exact=not case.rope)
    _check_cache(case, v_before, v_cache, ref.v_cache, what + " V", exact=True)
    if case.rope:
        tol = TOLERANCE[kernel["dtype"]]
        np.testing.assert_allclose(_f64(q_out), ref.q, rtol=tol, atol=tol, err_msg=what + " q")
        if not in_place:
            assert torch.equal(q, case.q), "q changed although q_out was separate"


VECTORIZED_KERNELS = [k for k in KERNELS if k["paged_kv"] and k["dtype"] != "fp32"]


@pytest.mark.parametrize("kernel", VECTORIZED_KERNELS, ids=_ids(VECTORIZED_KERNELS))
@pytest.mark.parametrize("index", range(len(CASES)))
def test_append_into_vectorized_pages(kernel: dict[str, Any], index: int) -> None:
    """The same appends into the same pages re-laid out in vLLM's vectorized layout."""
    case = Case(kernel, index, CASES[index])
    k_cache, v_cache = case.caches()
    k_before, v_before = k_cache.clone(), v_cache.clone()
    k_vec, v_vec = ckfmha.to_vectorized_pages(case.bshd(k_cache), case.bshd(v_cache))
    overflow = torch.zeros(1, dtype=torch.int32, device="cuda")
    lengths = case.lengths.numpy() if index % 2 else case.lengths.cuda()
    assert case.run(k_vec, v_vec, lengths, overflow=overflow, page_layout="vectorized") is None
    torch.cuda.synchronize()
    ref = case.reference(k_before, v_before, case.lengths.numpy())
    assert not ref.overflow and int(overflow.item()) == 0
    k_after, v_after = (case.bshd(t) for t in ckfmha.to_linear_pages(k_vec, v_vec))
    what = f"{kernel['name']} vectorized case {index} seed {case.seed}"
    _check_cache(case, k_before, k_after, ref.k_cache, what + " K", exact=not case.rope)
    _check_cache(case, v_before, v_after, ref.v_cache, what + " V", exact=True)


@pytest.mark.parametrize("kernel", KERNELS, ids=_ids(KERNELS))
def test_device_lengths_past_capacity_are_skipped_and_flagged(kernel: dict[str, Any]) -> None:
    case = Case(kernel, 1, CASES[1 if not kernel["paged_kv"] else 3])
    k_cache, v_cache = case.caches(poison=False)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    # Sequence 0 runs 3 tokens past the end; the rest fit.
    lengths = case.lengths.clone()
    lengths[0] = case.capacity - case.k_new.shape[1] + 3
    overflow = torch.zeros(1, dtype=torch.int32, device="cuda")
    case.run(k_cache, v_cache, lengths.cuda(), overflow=overflow)
    torch.cuda.synchronize()
    assert int(overflow.item()) == 1
    ref = case.reference(k_before, v_before, lengths.numpy())
    assert ref.overflow
    tol = 0 if not case.rope else TOLERANCE[kernel["dtype"]]
    what = f"seed {case.seed}"
    np.testing.assert_allclose(_f64(case.bshd(k_cache)), ref.k_cache, rtol=tol, atol=tol,
                               err_msg=what)
    np.testing.assert_array_equal(_f64(case.bshd(v_cache)), ref.v_cache, err_msg=what)
    # Host-visible lengths are refused before anything runs.
    # Paged: the host check names the table row; contiguous: the C API names the sequence.
    with pytest.raises(ckfmha.InvalidArgumentError,
                       match=r"(sequence 0: cache_seqlens|cache_seqlens\[0\] =) \d+ \+ seqlen_new"):
        case.run(k_cache, v_cache, lengths.numpy())


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k["paged_kv"]],
                         ids=_ids([k for k in KERNELS if k["paged_kv"]]))
def test_bad_page_numbers_are_skipped_and_flagged(kernel: dict[str, Any]) -> None:
    case = Case(kernel, 0, CASES[3])
    case.block_table[1, :] = -1
    case.block_table[0, -1] = case.k_cache64.shape[0]  # one past the last page
    k_cache, v_cache = case.caches(poison=False)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    overflow = torch.zeros(1, dtype=torch.int32, device="cuda")
    case.run(k_cache, v_cache, case.lengths.cuda(), overflow=overflow)
    torch.cuda.synchronize()
    ref = case.reference(k_before, v_before, case.lengths.numpy())
    assert ref.overflow and int(overflow.item()) == 1
    tol = 0 if not case.rope else TOLERANCE[kernel["dtype"]]
    what = f"seed {case.seed}"
    np.testing.assert_allclose(_f64(k_cache), ref.k_cache, rtol=tol, atol=tol, err_msg=what)
    np.testing.assert_array_equal(_f64(v_cache), ref.v_cache, err_msg=what)


@pytest.mark.parametrize("kernel", KERNELS[:1], ids=_ids(KERNELS[:1]))
def test_automatic_selection_runs(kernel: dict[str, Any]) -> None:
    """No kernel forced: the dispatcher's choice for the kernel's signature runs."""
    case = Case(kernel, 0, CASES[0])
    k_cache, v_cache = case.caches()
    k_before, v_before = k_cache.clone(), v_cache.clone()
    options: dict[str, Any] = {}
    if case.paged:
        options["block_table"] = case.block_table.cuda()
    if case.rope:
        options.update(cos=case.cos, sin=case.sin,
                       rotary_interleaved=kernel["rope"] == "interleaved")
    ckfmha.append_kv(k_cache, v_cache, case.k_new, case.v_new, case.lengths.cuda(),
                     cache_layout=case.layout, **options)
    torch.cuda.synchronize()
    ref = case.reference(k_before, v_before, case.lengths.numpy())
    _check_cache(case, v_before, v_cache, ref.v_cache, "automatic V", exact=True)
