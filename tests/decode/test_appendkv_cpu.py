"""Appending to a KV cache without a GPU: generator rules and instances, the C API's checks
(through ctypes, with stand-in device pointers: every check runs before the device is
touched), kernel selection and explanations, the Python layer's argument errors and the
float64 reference.

Selection expectations use whatever fwd_appendkv kernels the library was built with (the ci
set holds two per arch); tests needing one skip when the build has none.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest
from support.kernel_cases import make_config, rule_reasons

import ckfmha
from ckfmha import errors
from ckfmha.reference_appendkv import append_kv_reference, rope_tables, rotate
from generator.emit import render_instance, render_table
from generator.enumerate import select
from generator.receipts import get_receipt
from generator.signature import AppendKvSignature, KernelConfig
from generator.specs import load_specs

ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90a")
no_gpu = pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")


def _config(arch: str = "sm_80", **changes: object) -> KernelConfig:
    sig_fields: dict[str, object] = {
        "dtype": "bf16", "hdim_q": 128, "hdim_v": 128, "rope": "half_rotated", "paged": True,
    }  # fmt: skip
    alg_fields: dict[str, object] = {
        "arch": arch, "pipeline": "appendkv", "tile_m": 16, "tile_n": 0, "tile_k": 128,
        "warps": 4, "stages": 1,
    }  # fmt: skip
    return make_config(AppendKvSignature, sig_fields, alg_fields, changes)


# ---- generator ----


@pytest.mark.parametrize("arch", ARCHES)
def test_default_builds_every_append_variant(arch: str) -> None:
    selection = select(get_receipt("default"), load_specs()[arch])
    built = {(c.signature.dtype, c.signature.hdim_q, c.signature.rope, c.signature.paged,
              c.signature.kv_quant)
             for c in selection.accepted if c.signature.family == "fwd_appendkv"}
    shapes = [(d, h, "none") for d in ("fp16", "bf16") for h in (32, 64, 96, 128, 256)]
    shapes += [("fp32", 64, "none"), ("fp32", 128, "none")]
    # Appends into fp8 caches need sm_89's e4m3 conversions: rejected on older archs, for that.
    fp8 = load_specs()[arch].arch_number >= 89
    if fp8:
        shapes += [(d, h, "e4m3") for d in ("fp16", "bf16") for h in (64, 128)]
    expected = {(d, h, rope, paged, quant) for d, h, quant in shapes
                for rope in ("none", "interleaved", "half_rotated") for paged in (False, True)}
    assert built == expected
    rejected = [r for r in selection.rejected if r.signature.family == "fwd_appendkv"]
    assert all(r.signature.kv_quant == "e4m3" and not fp8 for r in rejected), rejected
    assert all(any("fp8 K/V needs sm_89" in why for why in r.reasons) for r in rejected)


def test_ci_set_holds_two_appends_per_arch() -> None:
    for arch in ("sm_80", "sm_90a"):
        names = [c.name for c in select(get_receipt("ci"), load_specs()[arch]).accepted
                 if c.signature.family == "fwd_appendkv"]
        tail = f"__{arch}_appendkv_"
        assert names == [
            f"fwd_appendkv_bf16_d128x128_rope_half_rotated_paged{tail}m16k128_w4s1",
            f"fwd_appendkv_fp16_d64x64_rope_interleaved{tail}m32k64_w4s1",
        ]


def test_full_adds_the_decode_tiles() -> None:
    names = [c.name for c in select(get_receipt("full"), load_specs()["sm_80"]).accepted
             if c.signature.family == "fwd_appendkv"]
    assert "fwd_appendkv_fp16_d128x128_rope_none__sm_80_appendkv_m2k128_w2s1" in names
    assert "fwd_appendkv_fp16_d128x128_rope_none__sm_80_appendkv_m16k128_w4s1" in names


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rope": "yarn"}, r"rope 'yarn' is unknown; supported: none, interleaved, half_rotated"),
        ({"tile_n": 64}, r"no key tile, stages or occupancy knob: tile_n=0, stages=1"),
        ({"stages": 2}, r"tile_n=0, stages=1, ctas_per_sm=1 \(got 0, 2, 1\)"),
        ({"tile_m": 128}, r"32 vectors per thread .* exceeds 16 held in registers"),
        ({"tile_m": 0}, r"tile_m=0 tokens and warps=4 must be positive"),
        ({"tile_k": 64}, r"tile_k=64 must equal hdim_q=128"),
        ({"hdim_q": 80, "tile_k": 80}, r"head dims 80x128 have no tile table for fwd_appendkv"),
        ({"pipeline": "sm80_cpasync_mma"},
         r"family 'fwd_appendkv' has no 'sm80_cpasync_mma' template; it runs on appendkv"),
    ],
)
def test_append_rules_say_why(changes: dict[str, object], message: str) -> None:
    assert re.search(message, rule_reasons(_config(**changes)))


def test_fp32_and_every_rope_mode_are_valid() -> None:
    for rope in ("none", "interleaved", "half_rotated"):
        for paged in (False, True):
            assert rule_reasons(_config(rope=rope, paged=paged)) == ""
    assert rule_reasons(_config(dtype="fp32")) == ""
    assert rule_reasons(_config(arch="sm_90a"), "sm_90a") == ""


def test_other_families_do_not_meet_the_append_pipeline() -> None:
    from generator.signature import FwdSignature

    config = KernelConfig(FwdSignature("fp16", "batch", 128, 128, "none", True),
                          _config().algorithm)
    assert "family 'fwd' has no 'appendkv' template" in rule_reasons(config)


def test_instance_and_table_entry() -> None:
    config = _config()
    text = render_instance(config)
    assert '#include "ckfmha/kernel/appendkv/launch.cuh"' in text
    assert ("FwdAppendKvTraits<cutlass::bfloat16_t, /*HeadDimK=*/128, /*HeadDimV=*/128,\n"
            "    ckfmha::kernel::RopeMode::kHalfRotated, /*Paged=*/true, /*TokensPerCta=*/16, "
            "/*Warps=*/4>") in text
    assert "launch_fwd_appendkv<ckfmha_instance_" in text and "::Traits>(problem, args, context, stream)" in text
    assert config.name == ("fwd_appendkv_bf16_d128x128_rope_half_rotated_paged"
                           "__sm_80_appendkv_m16k128_w4s1")
    table = render_table([config], load_specs())
    assert "CKFMHA_FAMILY_FWD_APPENDKV" in table
    assert "CKFMHA_ROPE_HALF_ROTATED, /*paged_kv=*/1," in table
    plain = render_table([_config(rope="none", paged=False, dtype="fp32")], load_specs())
    assert "CKFMHA_ROPE_NONE, /*paged_kv=*/0," in plain
    assert "float, /*HeadDimK=*/128" in render_instance(_config(dtype="fp32"))


# ---- the C API through ctypes ----


class Problem(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_int),
        ("batch", ctypes.c_int32),
        ("nhead_k", ctypes.c_int32),
        ("seqlen_new", ctypes.c_int32),
        ("hdim_k", ctypes.c_int32),
        ("hdim_v", ctypes.c_int32),
        ("max_seqlen_cache", ctypes.c_int32),
        ("paged_kv", ctypes.c_int32),
        ("page_size", ctypes.c_int32),
        ("num_pages", ctypes.c_int32),
        ("max_pages_per_seq", ctypes.c_int32),
        ("block_table_stride", ctypes.c_int64),
        ("page_layout", ctypes.c_int),
        ("rope", ctypes.c_int),
        ("rotary_dim", ctypes.c_int32),
        ("rope_dtype", ctypes.c_int),
        ("rope_max_pos", ctypes.c_int32),
        ("cos_stride", ctypes.c_int64),
        ("sin_stride", ctypes.c_int64),
        ("rotate_q", ctypes.c_int32),
        ("nhead_q", ctypes.c_int32),
        ("seqlen_q", ctypes.c_int32),
        ("k_new_stride", ctypes.c_int64 * 3),
        ("v_new_stride", ctypes.c_int64 * 3),
        ("k_cache_stride", ctypes.c_int64 * 3),
        ("v_cache_stride", ctypes.c_int64 * 3),
        ("q_stride", ctypes.c_int64 * 3),
        ("q_out_stride", ctypes.c_int64 * 3),
        ("cache_quant", ctypes.c_int),
        ("scale_per_head", ctypes.c_int32),
        ("k_scale", ctypes.c_float),
        ("v_scale", ctypes.c_float),
    ]


class Args(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_void_p)
        for name in ("k_new", "v_new", "k_cache", "v_cache", "cache_seqlens",
                     "cache_seqlens_host", "block_table", "cos", "sin", "q", "q_out",
                     "overflow", "k_scale", "v_scale")
    ]


SUCCESS, INVALID, UNSUPPORTED, CUDA, NO_DEVICE, TOO_SMALL, NOT_FOUND = range(7)
BHSD, BSHD = 0, 1
NONE, INTERLEAVED, HALF = 0, 1, 2
FP16, BF16, FP32 = 0, 1, 2
# Stand-in device addresses: 16-byte aligned, never dereferenced (checks fail first).
FAKE = 1 << 20


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    library = ctypes.CDLL(str(Path(ckfmha.get_library_dir()) / "libckfmha.so"))
    library.ckfmha_last_error.restype = ctypes.c_char_p
    return library


def _error(lib: ctypes.CDLL) -> str:
    return lib.ckfmha_last_error().decode()


def _problem(lib: ctypes.CDLL, dtype: int = FP16, layout: int = BSHD, batch: int = 2,
             nhead_k: int = 4, seqlen_new: int = 8, capacity: int = 1024, hdim: int = 128,
             hdim_v: int | None = None) -> Problem:
    problem = Problem()
    status = lib.ckfmha_appendkv_problem_init(
        ctypes.byref(problem), dtype, layout, batch, nhead_k, seqlen_new, capacity, hdim,
        hdim_v or hdim)
    assert status == SUCCESS, _error(lib)
    return problem


def _with_rope(problem: Problem, rope: int = HALF, rotary_dim: int = 64,
               max_pos: int = 4096) -> Problem:
    problem.rope = rope
    problem.rotary_dim = rotary_dim
    problem.rope_dtype = FP32
    problem.rope_max_pos = max_pos
    problem.cos_stride = problem.sin_stride = rotary_dim // 2
    return problem


def _paged(problem: Problem, page_size: int = 16, pages: int = 8) -> Problem:
    problem.paged_kv = 1
    problem.page_size = page_size
    problem.num_pages = pages
    problem.max_pages_per_seq = pages // 2
    problem.block_table_stride = pages // 2
    return problem


def _args(**changes: int | None) -> Args:
    fields = {name: FAKE + 4096 * i for i, (name, _) in enumerate(Args._fields_)}
    # Optional pointers, off unless a test sets them (device scales are for fp8 caches only).
    fields.update(cache_seqlens_host=None, overflow=None, k_scale=None, v_scale=None)
    fields.update(changes)
    return Args(**fields)


def _run(lib: ctypes.CDLL, problem: Problem, args: Args, kernel: bytes | None = None) -> int:
    return lib.ckfmha_appendkv_run(ctypes.byref(problem), ctypes.byref(args), kernel, None)


def test_init_fills_contiguous_strides(lib: ctypes.CDLL) -> None:
    bshd = _problem(lib, layout=BSHD, batch=2, nhead_k=4, seqlen_new=8, capacity=100, hdim=64,
                    hdim_v=128)
    assert list(bshd.k_new_stride) == [8 * 4 * 64, 64, 4 * 64]
    assert list(bshd.v_new_stride) == [8 * 4 * 128, 128, 4 * 128]
    assert list(bshd.k_cache_stride) == [100 * 4 * 64, 64, 4 * 64]
    bhsd = _problem(lib, layout=BHSD, capacity=100, hdim=64)
    assert list(bhsd.k_cache_stride) == [4 * 100 * 64, 100 * 64, 64]
    assert list(bhsd.k_new_stride) == [8 * 4 * 64, 64, 4 * 64]  # new tokens stay BSHD
    assert (bshd.rope, bshd.paged_kv, bshd.rotate_q) == (NONE, 0, 0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: setattr(p, "batch", -1), "batch (-1) and seqlen_new (8) must be >= 0"),
        (lambda p: setattr(p, "seqlen_new", -2), "seqlen_new (-2) must be >= 0"),
        (lambda p: setattr(p, "dtype", 7), "dtype 7 is not one of fp16 (0), bf16 (1), fp32 (2)"),
        (lambda p: setattr(p, "max_seqlen_cache", 0), "a contiguous cache holds at least 1"),
        (lambda p: setattr(p, "paged_kv", 1), "paged cache: page_size is 0"),
        (lambda p: setattr(p, "paged_kv", 2), "paged_kv must be 0"),
        (lambda p: setattr(p, "rope", 5), "rope 5 is not one of none (0), interleaved (1)"),
        (lambda p: _with_rope(p, rotary_dim=63),
         "rotary_dim is 63; it must be even and in 2..hdim_k (128)"),
        (lambda p: _with_rope(p, rotary_dim=130), "rotary_dim is 130"),
        (lambda p: setattr(_with_rope(p), "rope_dtype", BF16),
         "cos/sin tables are fp32 or fp16 (the cache's dtype)"),
        (lambda p: setattr(_with_rope(p), "rope_max_pos", 0), "cos/sin need at least one row"),
        (lambda p: setattr(_with_rope(p), "cos_stride", 16), "must hold rotary_dim / 2 = 32"),
        (lambda p: (setattr(p, "rotate_q", 1), setattr(p, "nhead_q", 4), setattr(
            p, "seqlen_q", 1)), "rotate_q needs a RoPE mode"),
        (lambda p: setattr(_with_rope(p), "rotate_q", 1),
         "rotate_q: nhead_q (0) must be at least 1 and seqlen_q (0) at least 0"),
        (lambda p: setattr(p, "nhead_k", 70000), "must each be at most 65535"),
        (lambda p: p.k_cache_stride.__setitem__(2, -8), "k_cache stride 2 is -8"),
        (lambda p: setattr(p, "page_layout", 1), "page_layout applies to a paged cache"),
        (lambda p: (_paged(p), setattr(p, "page_layout", 7)),
         "page_layout 7 is not one of linear (0), vectorized (1)"),
        (lambda p: (_paged(p), setattr(p, "dtype", FP32), setattr(p, "page_layout", 1)),
         "page_layout vectorized is for fp16/bf16 caches"),
    ],
)
def test_validate_says_what_is_wrong(lib: ctypes.CDLL, change, message: str) -> None:
    problem = _problem(lib)
    change(problem)
    assert lib.ckfmha_appendkv_problem_validate(ctypes.byref(problem)) == INVALID
    assert message in _error(lib)
    # run checks the problem first, whatever the arguments.
    assert _run(lib, problem, _args()) == INVALID
    assert message in _error(lib)


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("k_new", "k_new is NULL"),
        ("v_cache", "v_cache is NULL"),
        ("cache_seqlens", "cache_seqlens is NULL"),
        ("block_table", "a paged cache needs args.block_table"),
        ("cos", "RoPE needs args.cos"),
        ("q_out", "args.q_out is NULL (pass q itself to rotate in place)"),
    ],
)
def test_run_names_missing_pointers(lib: ctypes.CDLL, field: str, message: str) -> None:
    problem = _with_rope(_problem(lib))
    problem.paged_kv, problem.page_size, problem.num_pages = 1, 16, 128
    problem.max_pages_per_seq, problem.block_table_stride = 64, 64
    problem.rotate_q, problem.nhead_q, problem.seqlen_q = 1, 8, 8
    assert _run(lib, problem, _args(**{field: None})) == INVALID
    assert message in _error(lib)


def _lengths(*values: int) -> tuple[ctypes.Array, int]:
    array = (ctypes.c_int32 * len(values))(*values)
    return array, ctypes.addressof(array)


def test_host_lengths_past_capacity_are_rejected(lib: ctypes.CDLL) -> None:
    problem = _problem(lib, batch=3, seqlen_new=8, capacity=1024)
    _keep, address = _lengths(0, 1020, 5)
    assert _run(lib, problem, _args(cache_seqlens_host=address)) == INVALID
    assert _error(lib) == ("sequence 1: cache_seqlens 1020 + seqlen_new 8 = 1028 exceeds the "
                           "cache capacity of 1024 tokens (max_seqlen_cache)")
    _keep, address = _lengths(0, 3, -1)
    assert _run(lib, problem, _args(cache_seqlens_host=address)) == INVALID
    assert "sequence 2: cache_seqlens is -1" in _error(lib)


def test_paged_capacity_and_angle_rows_are_checked(lib: ctypes.CDLL) -> None:
    problem = _with_rope(_problem(lib, batch=2, seqlen_new=4), max_pos=100)
    problem.paged_kv, problem.page_size, problem.num_pages = 1, 16, 64
    problem.max_pages_per_seq, problem.block_table_stride = 4, 4
    _keep, address = _lengths(60, 61)
    assert _run(lib, problem, _args(cache_seqlens_host=address)) == INVALID
    assert ("sequence 1: cache_seqlens 61 + seqlen_new 4 = 65 exceeds the cache capacity of 64 "
            "tokens (max_pages_per_seq x page_size)") in _error(lib)
    problem.max_pages_per_seq = problem.block_table_stride = 8
    _keep, address = _lengths(10, 97)
    assert _run(lib, problem, _args(cache_seqlens_host=address)) == INVALID
    assert "sequence 1: positions up to 100 need cos/sin rows" in _error(lib)
    # Rotated queries extend the positions that need rows: 94 + 4 keys fit, 94 + 7 queries not.
    _keep, address = _lengths(10, 94)
    # (A misaligned cache stops the call right after the length checks: nothing launches.)
    assert _run(lib, problem, _args(cache_seqlens_host=address, k_cache=FAKE + 8)) == UNSUPPORTED
    problem.rotate_q, problem.nhead_q, problem.seqlen_q = 1, 8, 7
    assert _run(lib, problem, _args(cache_seqlens_host=address)) == INVALID
    assert "sequence 1: positions up to 100 need cos/sin rows, but the tables hold " \
           "rope_max_pos = 100" in _error(lib)


def test_misaligned_pointers_are_unsupported(lib: ctypes.CDLL) -> None:
    problem = _problem(lib)
    assert _run(lib, problem, _args(k_cache=FAKE + 8)) == UNSUPPORTED
    assert "k_cache is not 16-byte aligned" in _error(lib)
    assert _run(lib, problem, _args(cache_seqlens=FAKE + 2)) == UNSUPPORTED
    assert "cache_seqlens is not 4-byte aligned" in _error(lib)


def test_forced_kernels_must_exist_and_append(lib: ctypes.CDLL) -> None:
    problem = _problem(lib)
    assert _run(lib, problem, _args(), b"no_such_kernel") == NOT_FOUND
    assert "no registered kernel named no_such_kernel" in _error(lib)
    others = [k for k in ckfmha.Registry().kernels() if k["family"] != "fwd_appendkv"]
    if others:
        assert _run(lib, problem, _args(), others[0]["name"].encode()) == INVALID
        assert "ckfmha_appendkv_run runs fwd_appendkv kernels" in _error(lib)


@no_gpu
def test_run_without_a_device(lib: ctypes.CDLL) -> None:
    _keep, address = _lengths(0, 3)
    assert _run(lib, _problem(lib), _args(cache_seqlens_host=address)) == NO_DEVICE


# ---- selection and explanations ----


def _append_kernels() -> list[dict]:
    return [k for k in ckfmha.Registry().kernels() if k["family"] == "fwd_appendkv"]


@pytest.fixture(scope="module")
def append_kernel() -> dict:
    kernels = _append_kernels()
    if not kernels:
        pytest.skip("library built without fwd_appendkv kernels")
    return kernels[0]


def _fields(kernel: dict, **changes: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "dtype": kernel["dtype"], "batch": 2, "nhead_k": 8, "seqlen_new": 5,
        "hdim": kernel["hdim_q"], "hdim_v": kernel["hdim_v"], "rope": kernel["rope"],
        "max_seqlen_cache": 4096,
    }  # fmt: skip
    if kernel["paged_kv"]:
        fields.update(page_size=16, num_pages=1000, max_pages_per_seq=256)
    fields.update(changes)
    return fields


def test_registry_reports_rope_and_paging(append_kernel: dict) -> None:
    assert append_kernel["rope"] in ("none", "interleaved", "half_rotated")
    assert isinstance(append_kernel["paged_kv"], bool)
    assert append_kernel["pipeline"] == "appendkv" and append_kernel["tile_n"] == 0
    others = [k for k in ckfmha.Registry().kernels() if k["family"] != "fwd_appendkv"]
    assert all(k["rope"] == "none" and k["paged_kv"] is False for k in others)


def test_select_and_explain(append_kernel: dict) -> None:
    arch = append_kernel["arch"]
    fields = _fields(append_kernel)
    assert ckfmha.select_append_kv(arch=arch, **fields) == append_kernel["name"]
    text = ckfmha.explain_append_kv(arch=arch, **fields)
    assert f"selected  {append_kernel['name']}" in text
    assert re.search(r"plan: one stage, \S+: SASS for this arch, \d+ tokens per CTA for 5 rows",
                     text), text
    for kernel in _append_kernels():
        assert kernel["name"] in text


def test_explain_names_each_mismatch(append_kernel: dict) -> None:
    arch = append_kernel["arch"]
    other_rope = "none" if append_kernel["rope"] != "none" else "interleaved"
    text = ckfmha.explain_append_kv(arch=arch, **_fields(append_kernel, rope=other_rope))
    assert f"rope {append_kernel['rope']}, problem needs {other_rope}" in text
    paged = not append_kernel["paged_kv"]
    changes: dict[str, object] = (
        {"page_size": 16, "num_pages": 64, "max_pages_per_seq": 8} if paged
        else {"page_size": None, "num_pages": None, "max_pages_per_seq": None})
    text = ckfmha.explain_append_kv(arch=arch, **_fields(append_kernel, **changes))
    cache = ("writes a contiguous cache, problem has a paged" if paged
             else "writes a paged cache, problem has a contiguous")
    assert cache in text
    # A head dim no kernel set builds, so the selection fails in any build.
    text = ckfmha.explain_append_kv(arch=arch, **_fields(append_kernel, hdim=160, hdim_v=160))
    assert f"head dims {append_kernel['hdim_q']}x{append_kernel['hdim_v']}, problem has " \
           "160x160" in text
    with pytest.raises(errors.UnsupportedError) as caught:
        ckfmha.select_append_kv(arch=arch, **_fields(append_kernel, hdim=160, hdim_v=160))
    assert "no compiled fwd_appendkv kernel fits" in str(caught.value)
    assert "Available on sm_" in str(caught.value)


def test_half_rotated_needs_whole_vector_halves() -> None:
    rotating = [k for k in _append_kernels() if k["rope"] == "half_rotated"]
    if not rotating:
        pytest.skip("build has no half-rotated append kernel")
    append_kernel = rotating[0]
    vector = 4 if append_kernel["dtype"] == "fp32" else 8
    with pytest.raises(errors.UnsupportedError) as caught:
        ckfmha.select_append_kv(arch=append_kernel["arch"],
                                **_fields(append_kernel, rotary_dim=vector + 2))
    assert f"rotary_dim / 2 = {vector // 2 + 1} must be a multiple of {vector}" in str(
        caught.value)


def test_misaligned_strides_reject_the_kernel(lib: ctypes.CDLL, append_kernel: dict) -> None:
    dtype = {"fp16": FP16, "bf16": BF16, "fp32": FP32}[append_kernel["dtype"]]
    problem = _problem(lib, dtype=dtype, hdim=append_kernel["hdim_q"],
                       hdim_v=append_kernel["hdim_v"])
    problem.rope = {"none": NONE, "interleaved": INTERLEAVED, "half_rotated": HALF}[
        append_kernel["rope"]]
    if problem.rope != NONE:
        _with_rope(problem, problem.rope, rotary_dim=append_kernel["hdim_q"])
    if append_kernel["paged_kv"]:
        problem.paged_kv, problem.page_size, problem.num_pages = 1, 16, 64
        problem.max_pages_per_seq = problem.block_table_stride = 8
    vector = 4 if append_kernel["dtype"] == "fp32" else 8
    problem.k_new_stride[2] += vector // 2
    buf = ctypes.create_string_buffer(1 << 16)
    needed = ctypes.c_size_t()
    status = lib.ckfmha_appendkv_explain(ctypes.byref(problem), append_kernel["arch"], buf,
                                         len(buf), ctypes.byref(needed))
    assert status == SUCCESS, _error(lib)
    text = buf.value.decode()
    assert (f"rejected  {append_kernel['name']}: k_new seq stride {problem.k_new_stride[2]} "
            f"is not a multiple of {vector} elements (16-byte vectors)") in text
    assert "plan: none: no compiled fwd_appendkv kernel fits" in text
    assert f"Kernel {append_kernel['name']} computes this signature but: k_new seq" in text


def test_unknown_fields_are_type_errors() -> None:
    with pytest.raises(TypeError, match="unknown append problem fields: heads"):
        ckfmha.select_append_kv(arch=80, batch=1, nhead_k=1, seqlen_new=1, hdim=64, heads=3)
    with pytest.raises(TypeError, match="missing append problem field 'nhead_k'"):
        ckfmha.select_append_kv(arch=80, batch=1, seqlen_new=1, hdim=64)
    with pytest.raises(errors.InvalidArgumentError, match="rope must be one of"):
        ckfmha.select_append_kv(arch=80, batch=1, nhead_k=1, seqlen_new=1, hdim=64, rope="x")


# ---- the Python layer's argument errors (stand-in device arrays) ----


def _device(shape: tuple[int, ...], dtype: str = "fp16", offset: int = 0) -> ckfmha.DeviceArray:
    return ckfmha.device_ptr(FAKE + (offset << 24), shape, dtype)


def _call(**changes: object) -> None:
    arrays: dict[str, object] = {
        "k_cache": _device((2, 64, 4, 128), offset=1),
        "v_cache": _device((2, 64, 4, 128), offset=2),
        "k_new": _device((2, 3, 4, 128), offset=3),
        "v_new": _device((2, 3, 4, 128), offset=4),
        "cache_seqlens": _device((2,), "int32", offset=5),
    }
    arrays.update(changes)
    options = {k: arrays.pop(k) for k in list(arrays) if k not in (
        "k_cache", "v_cache", "k_new", "v_new", "cache_seqlens")}
    ckfmha.append_kv(arrays["k_cache"], arrays["v_cache"], arrays["k_new"], arrays["v_new"],
                     arrays["cache_seqlens"], **options)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"v_new": _device((2, 3, 4, 128), "bf16", 4)}, "must share one dtype"),
        ({"v_new": _device((2, 5, 4, 128), offset=4)}, "v_new is (2, 5, 4, 128) but k_new"),
        ({"k_cache": _device((3, 64, 4, 128), offset=1), "v_cache": _device(
            (3, 64, 4, 128), offset=2)}, "the cache holds 3 sequences but k_new has batch 2"),
        ({"v_cache": _device((2, 64, 2, 128), offset=2)}, "do not hold 4 heads"),
        ({"cache_layout": "hbsd"}, "cache_layout must be 'bshd' or 'bhsd'"),
        ({"cos": _device((100, 32), "fp32", 6)}, "pass both cos and sin"),
        ({"q": _device((2, 3, 8, 128), offset=7)}, "pass cos and sin with it"),
        ({"q_out": _device((2, 3, 8, 128), offset=7)}, "q_out given without q"),
        ({"cos": _device((100, 32), "fp32", 6), "sin": _device((100, 16), "fp32", 7)},
         "must match"),
        ({"cos": _device((100, 80), "fp32", 6), "sin": _device((100, 80), "fp32", 7)},
         "rotary_dim is 160; it must be even and in 2..hdim_k (128)"),
        ({"block_table": _device((3, 8), "int32", 6)}, "block_table must be int32 [2, max_pages]"),
        ({"k_cache": np.zeros((2, 64, 4, 128), np.float16)}, "k_cache is on cpu, v_cache is on"),
        ({"overflow": _device((2,), "int32", 6)}, "overflow must be a device int32 [1] array"),
        ({"cache_seqlens": [1, 2, 3]}, "cache_seqlens must be 2 integers"),
        ({"cache_seqlens": np.array([1, 2**40])}, "cache_seqlens do not fit in int32"),
        ({"page_layout": "paged"}, "page_layout must be 'linear' or 'vectorized'"),
        ({"page_layout": "vectorized"}, "page_layout 'vectorized' describes pages"),
        ({"page_layout": "vectorized", "block_table": _device((2, 4), "int32", 6),
          "k_cache": _device((8, 4, 32, 16, 4), offset=1),
          "v_cache": _device((8, 4, 128, 16), offset=2)}, "k_cache's last axis holds 8 channels"),
        ({"page_layout": "vectorized", "block_table": _device((2, 4), "int32", 6),
          "k_cache": _device((8, 4, 16, 16, 8), offset=1),
          "v_cache": _device((8, 4, 128, 8), offset=2)}, "(vectorized pages) do not hold"),
    ],
)
def test_append_kv_argument_errors(changes: dict[str, object], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError) as caught:
        _call(**changes)
    assert message in str(caught.value)


@no_gpu
def test_append_kv_reaches_the_device_check() -> None:
    cos = _device((100, 32), "fp32", 6)
    sin = _device((100, 32), "fp32", 7)
    with pytest.raises(errors.NoDeviceError):
        _call(cos=cos, sin=sin, q=_device((2, 3, 8, 128), offset=8),
              q_out=_device((2, 3, 8, 128), offset=9))


# ---- the reference ----


def test_rotation_is_a_rotation() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 2, 16))
    cos, sin = rope_tables(50, 8)
    positions = np.array([0, 1, 7, 30, 49])
    for interleaved in (False, True):
        y = rotate(x, positions, cos, sin, interleaved)
        # Position 0 is the identity; columns past rotary_dim are untouched.
        np.testing.assert_allclose(y[0], x[0])
        np.testing.assert_array_equal(y[..., 8:], x[..., 8:])
        # Each pair keeps its length.
        pairs = ([(2 * i, 2 * i + 1) for i in range(4)] if interleaved
                 else [(i, i + 4) for i in range(4)])
        for a, b in pairs:
            np.testing.assert_allclose(np.hypot(y[..., a], y[..., b]),
                                       np.hypot(x[..., a], x[..., b]))
    # Interleaved is the half-rotated rotation of the de-interleaved columns.
    order = np.r_[0:8:2, 1:8:2, 8:16]
    np.testing.assert_allclose(rotate(x, positions, cos, sin, True)[..., order],
                               rotate(x[..., order], positions, cos, sin, False))


def test_half_rotated_matches_the_complex_form() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 1, 8))
    cos, sin = rope_tables(10, 8)
    positions = np.array([2, 5, 9])
    y = rotate(x, positions, cos, sin, False)
    z = (x[..., :4] + 1j * x[..., 4:]) * np.exp(1j * np.angle(cos + 1j * sin))[positions][:, None]
    np.testing.assert_allclose(y[..., :4], z.real)
    np.testing.assert_allclose(y[..., 4:], z.imag)


def test_append_reference_contiguous_and_paged_agree() -> None:
    rng = np.random.default_rng(2)
    batch, capacity, heads, hdim, new = 3, 12, 2, 8, 4
    k_new = rng.standard_normal((batch, new, heads, hdim))
    v_new = rng.standard_normal((batch, new, heads, hdim))
    lengths = np.array([0, 5, 8])
    cos, sin = rope_tables(12, 4)
    contiguous = append_kv_reference(np.zeros((batch, capacity, heads, hdim)),
                                     np.zeros((batch, capacity, heads, hdim)), k_new, v_new,
                                     lengths, cos=cos, sin=sin)
    assert not contiguous.overflow
    # Pages of 4 tokens, scattered: sequence b's page j is table[b, j].
    table = np.array([[5, 0, 7], [1, 8, 3], [2, 6, 4]])
    paged = append_kv_reference(np.zeros((9, 4, heads, hdim)), np.zeros((9, 4, heads, hdim)),
                                k_new, v_new, lengths, cos=cos, sin=sin, block_table=table)
    gathered = paged.k_cache[table].reshape(batch, capacity, heads, hdim)
    np.testing.assert_array_equal(gathered, contiguous.k_cache)
    np.testing.assert_array_equal(paged.v_cache[table].reshape(batch, capacity, heads, hdim),
                                  contiguous.v_cache)
    np.testing.assert_allclose(contiguous.k_cache[1, 5:9], rotate(
        k_new[1], np.arange(5, 9), cos, sin, False))
    np.testing.assert_array_equal(contiguous.v_cache[2, 8:12], v_new[2])
    assert not contiguous.k_cache[0, 4:].any()


def test_append_reference_reports_skipped_tokens() -> None:
    k_new = np.ones((1, 3, 1, 8))
    result = append_kv_reference(np.zeros((1, 4, 1, 8)), np.zeros((1, 4, 1, 8)), k_new, k_new,
                                 np.array([2]))
    assert result.overflow
    np.testing.assert_array_equal(result.k_cache[0, :, 0, 0], [0, 0, 1, 1])
    table = np.array([[0, 9]])
    result = append_kv_reference(np.zeros((2, 2, 1, 8)), np.zeros((2, 2, 1, 8)), k_new, k_new,
                                 np.array([0]), block_table=table)
    assert result.overflow and result.k_cache[0].all() and not result.k_cache[1].any()
