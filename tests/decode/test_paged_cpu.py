"""Paged K/V without a GPU: generator rules and emission, plans and explanations, problem checks
and argument errors through the C API and the Cython layer, and the paged reference.

Plan expectations use whatever paged kernels the library was built with (the ci set holds a
bf16 d128 window batch_prefill pair); tests needing one skip when the build has none.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from support.kernel_cases import make_config, problem_fields, rule_reasons

import ckfmha
from ckfmha import errors
from ckfmha.reference import attention_reference, paged_attention_reference
from generator.emit import render_instance
from generator.enumerate import select
from generator.receipts import get_receipt
from generator.signature import FwdSignature, KernelConfig
from generator.specs import load_specs

ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90a")
PAGED = ("fwd_pagedkv", "batch_prefill")

no_gpu = pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")


def _config(family: str = "fwd_pagedkv", **changes: object) -> KernelConfig:
    sig_fields: dict[str, object] = {
        "dtype": "bf16", "mode": "group" if family == "batch_prefill" else "batch",
        "hdim_q": 128, "hdim_v": 128, "mask": "causal", "lse": True, "family": family,
    }  # fmt: skip
    alg_fields: dict[str, object] = {
        "arch": "sm_80", "pipeline": "sm80_cpasync_mma", "tile_m": 16, "tile_n": 64,
        "tile_k": 128, "warps": 1, "stages": 2,
    }  # fmt: skip
    return make_config(FwdSignature, sig_fields, alg_fields, changes)


# ---- generator ----


@pytest.mark.parametrize("arch", ARCHES)
def test_default_builds_both_paged_families_on_every_split_tile(arch: str) -> None:
    spec = load_specs()[arch]
    selection = select(get_receipt("default"), spec)
    built = {(c.signature.family, c.signature.dtype, c.signature.hdim_v, c.signature.mask,
              c.algorithm.tile_m) for c in selection.accepted}
    split_tiles = spec.tiles["fwd_splitkv"]["sm80_cpasync_mma"]
    for family in PAGED:
        for (_, hdim), tiles in split_tiles.items():
            for dtype in ("fp16", "bf16"):
                for mask in ("none", "causal", "window"):
                    for tile in tiles:
                        assert (family, dtype, hdim, mask, tile.tile_m) in built
    # fp8 K/V variants are rejected where the arch has no e4m3 conversion (before sm_89).
    assert not [r for r in selection.rejected
                if r.signature.family in PAGED and r.signature.kv_quant == "none"]
    modes = {c.signature.mode for c in selection.accepted if c.signature.family == "fwd_pagedkv"}
    assert modes == {"batch"}


def test_paged_families_share_the_split_tile_table() -> None:
    spec = load_specs()["sm_90a"]
    for family in PAGED:
        assert spec.tiles_for(family, "sm80_cpasync_mma", 128) == spec.tiles_for(
            "fwd_splitkv", "sm80_cpasync_mma", 128)
        assert spec.hdims_for(family, "sm80_cpasync_mma") == ((64, 64), (128, 128))


def test_ci_set_adds_one_paged_pair_per_arch_and_page_layout() -> None:
    # The rest of the set: 9 forward kernels, a split-KV plan, two backward plans and two
    # KV-cache appends, plus sm_90a's Hopper forward and backward kernels.
    # sm_90a's third split tile (16x32 keys) adds a split kernel and a paged pair, and its Hopper
    # template also builds the set's three fp16/bf16 feature kernels.
    for arch, total, tiles in (("sm_80", 24, 2), ("sm_90a", 36, 3)):
        accepted = select(get_receipt("ci"), load_specs()[arch]).accepted
        paged = [c for c in accepted if c.signature.family in PAGED]
        assert len(paged) == 2 * tiles and all(
            c.name.startswith("batch_prefill_bf16_group_d128x128_window") for c in paged), paged
        assert sorted(c.signature.page_layout for c in paged) == (
            ["linear"] * tiles + ["vectorized"] * tiles)
        assert len(accepted) == total


@pytest.mark.parametrize(
    ("family", "changes", "message"),
    [
        ("fwd_pagedkv", {"mode": "group"},
         r"fwd_pagedkv takes batch-mode queries; batch_prefill serves group-mode"),
        ("batch_prefill", {"mode": "batch"},
         r"batch_prefill takes group-mode queries; fwd_pagedkv serves batch-mode"),
        ("fwd_pagedkv", {"hdim_q": 64}, r"share one page lookup.*hdim_q must equal hdim_v"),
        ("fwd_pagedkv", {"stages": 1}, r"stages=1: the paged body loads.*stages=2"),
        ("batch_prefill", {"page_layout": "vectorized", "tile_n": 48},
         r"tile_n=48 with vectorized pages.*multiple of 32"),
        ("fwd_pagedkv", {"page_layout": "blocked"}, r"page_layout 'blocked' is unknown"),
        ("fwd_pagedkv", {"bias": "alibi"}, r"bias 'alibi'.*not implemented by fwd_pagedkv"),
        ("batch_prefill", {"dropout": True}, r"dropout.*not implemented by batch_prefill"),
        ("fwd_pagedkv", {"sink": True}, r"sink.*not implemented by fwd_pagedkv"),
        ("fwd_pagedkv", {"pipeline": "sm90_tma_wgmma", "arch": "sm_90a", "tile_m": 128},
         r"no 'sm90_tma_wgmma' template; it runs on sm80_cpasync_mma"),
        ("fwd", {"page_layout": "vectorized", "tile_m": 128, "warps": 4, "stages": 1},
         r"applies to the paged families.*fwd reads contiguous K/V"),
    ],
)
def test_paged_rules_say_why(family: str, changes: dict[str, object], message: str) -> None:
    arch = str(changes.get("arch", "sm_80"))
    assert re.search(message, rule_reasons(_config(family, **changes), arch))


def test_paged_configs_with_softcap_and_windows_are_valid() -> None:
    assert rule_reasons(_config("fwd_pagedkv", softcap=True, mask="window")) == ""
    assert rule_reasons(_config("batch_prefill", dtype="fp16", hdim_q=64, hdim_v=64, tile_k=64,
                            tile_m=64, warps=4)) == ""


def test_paged_instances_set_the_paged_switch() -> None:
    for family in PAGED:
        text = render_instance(_config(family))
        assert "sm80/fwd_splitkv_launch.cuh" in text
        assert "/*SplitKv=*/true, /*PagedKv=*/true>" in text
        assert "launch_fwd_splitkv_sm80<ckfmha_instance_" in text
    assert "PagedKv" not in render_instance(_config("fwd_splitkv", mode="batch"))


def test_paged_names_are_stable() -> None:
    assert _config().name == (
        "fwd_pagedkv_bf16_batch_d128x128_causal_lse__sm_80_sm80_cpasync_mma_m16n64k128_w1s2")
    assert _config(page_layout="vectorized").signature.name.endswith("_lse_vecpages")


# ---- problems, plans and explanations through the C API ----


def _paged_kernels(family: str | None = None) -> list[dict]:
    return [k for k in ckfmha.Registry().kernels()
            if k["family"] in PAGED and (family is None or k["family"] == family)]


@pytest.fixture(scope="module")
def paged_kernel() -> dict:
    kernels = _paged_kernels()
    if not kernels:
        pytest.skip("library built without paged kernels")
    return kernels[0]


def _problem(kernel: dict, **changes: object) -> ckfmha.FwdProblem:
    fields: dict[str, object] = {
        "batch": 3, "nhead_q": 32, "nhead_k": 8, "seqlen_q": 1, "seqlen_k": 4096,
        **problem_fields(kernel), "causal_alignment": "bottom_right",
        "paged_kv": "block_table", "page_size": 16, "page_layout": kernel["page_layout"],
    }  # fmt: skip
    fields.update(changes)
    return ckfmha.FwdProblem(**fields)  # type: ignore[arg-type]


def _workspace(splits: int, batch: int, heads: int, seqlen_q: int, hdim_v: int) -> int:
    if splits == 1:
        return 0  # one split writes O and LSE directly
    lse_bytes = 4 * splits * batch * heads * seqlen_q
    return (lse_bytes + 255) // 256 * 256 + lse_bytes * hdim_v


def test_problem_struct_carries_the_pages() -> None:
    fields = ckfmha.FwdProblem(batch=2, nhead_q=8, nhead_k=2, seqlen_q=1, seqlen_k=100, hdim=64,
                               paged_kv="kv_indptr", page_size=16).to_c_dict()
    assert (fields["kv_storage"], fields["page_layout"], fields["page_size"]) == (2, 0, 16)
    assert fields["max_pages_per_seq"] == 7 == fields["block_table_stride"]
    # (page, head, token in page) strides of a contiguous [pages, 16, 2, 64] cache.
    assert fields["k_stride"] == (16 * 2 * 64, 64, 2 * 64) == fields["v_stride"]
    assert ckfmha.FwdProblem(batch=1, nhead_q=1, seqlen_q=1, hdim=64).to_c_dict()[
        "kv_storage"] == 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"page_size": 12}, r"page_size is 12; paged K/V takes a power of two"),
        ({"page_size": 0}, r"page_size is 0"),
        ({"max_pages_per_seq": 0}, r"max_pages_per_seq must be >= 1"),
        ({"v_col_major": True}, r"v_col_major does not apply to a paged K/V cache"),
    ],
)
def test_bad_page_fields_are_invalid(changes: dict[str, object], message: str) -> None:
    problem = ckfmha.FwdProblem(batch=2, nhead_q=8, seqlen_q=1, seqlen_k=100, hdim=64,
                                paged_kv="block_table", **changes)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgumentError, match=message):
        problem.validate()


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"paged_kv": "table"}, "paged_kv must be None, 'block_table' or 'kv_indptr'"),
     ({"page_layout": "blocked"}, "page_layout must be 'linear' or 'vectorized'")],
)
def test_bad_paged_names_are_invalid(changes: dict[str, object], message: str) -> None:
    fields = {"paged_kv": "block_table", **changes}
    with pytest.raises(errors.InvalidArgumentError, match=message):
        ckfmha.FwdProblem(batch=1, nhead_q=1, seqlen_q=1, hdim=64, **fields).validate()  # type: ignore[arg-type]


def test_paged_problem_gets_a_paged_split_plan(paged_kernel: dict) -> None:
    dispatcher = ckfmha.Dispatcher()
    arch = paged_kernel["arch"]
    problem = _problem(paged_kernel)
    text = dispatcher.explain(problem, arch=arch)
    family = paged_kernel["family"]
    plan = re.search(rf"plan: split-KV, ({family}_\S+) then (fwd_splitkv_combine_\S+), "
                     rf"num_splits=(\d+), workspace (\d+) bytes \(\d+ SMs\): paged K/V cache "
                     rf"\(block table, page_size 16\) runs {family}", text)
    assert plan, text
    split, combine, splits, size = plan.groups()
    assert f"selected  {split}" in text and f"selected  {combine}" in text
    layout = ", vectorized" if paged_kernel["page_layout"] == "vectorized" else ""
    assert f"paged_kv(block_table, page_size=16{layout})" in text.splitlines()[0]
    # 4 packed rows per K/V head: the 16-row tile.
    assert split.endswith(f"m16n64k{paged_kernel['hdim_q']}_w1s2")
    assert dispatcher.select(problem, arch=arch) == split
    assert dispatcher.workspace_size(problem, arch=arch) == int(size) == _workspace(
        int(splits), 3, 32, 1, paged_kernel["hdim_v"])
    # Contiguous split kernels are listed with the reason they do not fit.
    # (Those built for another arch are rejected for that first.)
    for kernel in ckfmha.Registry().kernels():
        if kernel["family"] == "fwd_splitkv" and kernel["arch"] == arch:
            assert f"rejected  {kernel['name']}: reads contiguous K/V, problem has a paged" in text


def test_paged_split_counts_and_one_split(paged_kernel: dict) -> None:
    arch = paged_kernel["arch"]
    for splits in (1, 3, 200):
        problem = _problem(paged_kernel, seqlen_q=5, num_splits=splits)
        size = ckfmha.Dispatcher().workspace_size(problem, arch=arch)
        assert size == _workspace(splits, 3, 32, 5, paged_kernel["hdim_v"])
        text = ckfmha.Dispatcher().explain(problem, arch=arch)
        assert f"num_splits={splits} as asked" in text, text


def test_sglang_tables_plan_like_block_tables(paged_kernel: dict) -> None:
    arch = paged_kernel["arch"]
    table = _problem(paged_kernel, page_size=1)
    indptr = _problem(paged_kernel, paged_kv="kv_indptr", page_size=1)
    dispatcher = ckfmha.Dispatcher()
    assert dispatcher.select(table, arch=arch) == dispatcher.select(indptr, arch=arch)
    assert "(kv_indptr, page_size 1)" in dispatcher.explain(indptr, arch=arch)


def test_contiguous_problems_never_take_paged_kernels(paged_kernel: dict) -> None:
    problem = _problem(paged_kernel, paged_kv=None)
    text = ckfmha.Dispatcher().explain(problem, arch=paged_kernel["arch"])
    assert (f"rejected  {paged_kernel['name']}: reads a paged K/V cache, problem has contiguous "
            "K/V") in text
    assert f"selected  {paged_kernel['name']}" not in text


def test_page_layouts_select_their_own_kernels() -> None:
    kernels = _paged_kernels()
    for layout in ("linear", "vectorized"):
        ours = [k for k in kernels if k["page_layout"] == layout]
        if not ours:
            pytest.skip(f"library built without {layout} paged kernels")
        kernel, other = ours[0], "vectorized" if layout == "linear" else "linear"
        dispatcher = ckfmha.Dispatcher()
        selected = dispatcher.select(_problem(kernel), arch=kernel["arch"])
        assert selected.endswith("_w1s2") and ("_vecpages_" in selected) == (layout != "linear")
        text = dispatcher.explain(_problem(kernel, page_layout=other), arch=kernel["arch"])
        assert (f"rejected  {kernel['name']}: reads {layout} pages, problem has {other} "
                "pages") in text


def test_vectorized_fp32_pages_are_invalid() -> None:
    problem = ckfmha.FwdProblem(batch=2, nhead_q=8, seqlen_q=1, seqlen_k=100, hdim=64,
                                dtype="fp32", paged_kv="block_table", page_layout="vectorized")
    with pytest.raises(errors.InvalidArgumentError,
                       match=r"vectorized is for fp16/bf16 caches.*store an fp32 cache linear"):
        problem.validate()


def test_problem_struct_has_vectorized_page_strides() -> None:
    fields = ckfmha.FwdProblem(batch=2, nhead_q=8, nhead_k=2, seqlen_q=1, seqlen_k=100, hdim=64,
                               paged_kv="block_table", page_size=16,
                               page_layout="vectorized").to_c_dict()
    assert fields["page_layout"] == 1
    # k [pages, 2, 64 / 8, 16, 8]: (page, head, chunk); v [pages, 2, 64, 16]: (page, head, channel).
    assert fields["k_stride"] == (2 * 64 * 16, 64 * 16, 16 * 8)
    assert fields["v_stride"] == (2 * 64 * 16, 64 * 16, 16)


def test_paged_features_it_lacks_are_unsupported(paged_kernel: dict) -> None:
    problem = _problem(paged_kernel, sink=True)
    with pytest.raises(errors.UnsupportedError, match=r"no sink, problem has one") as caught:
        ckfmha.Dispatcher().select(problem, arch=paged_kernel["arch"])
    assert f"no {paged_kernel['family']} kernel fits" in str(caught.value)


def test_missing_paged_family_names_what_is_covered() -> None:
    built = {k["family"] for k in _paged_kernels()}
    for family, mode in (("fwd_pagedkv", "batch"), ("batch_prefill", "group")):
        if family in built:
            continue
        problem = ckfmha.FwdProblem(batch=2, nhead_q=8, nhead_k=2, seqlen_q=1, seqlen_k=64,
                                    hdim=128, dtype="bf16", mode=mode, paged_kv="block_table")
        with pytest.raises(errors.UnsupportedError,
                           match=rf"no {family} kernel fits: none is registered.*paged K/V"):
            ckfmha.Dispatcher().select(problem, arch=80)


# ---- Cython argument errors and C API rejections ----


def _ptr(shape: tuple[int, ...], dtype: str = "bf16", address: int = 0x400000) -> object:
    return ckfmha.device_ptr(address, shape, dtype)


_CACHE = (40, 16, 2, 128)


def _paged_call(q_shape: tuple[int, ...] = (2, 8, 1, 128), k_shape: tuple[int, ...] = _CACHE,
                v_shape: tuple[int, ...] = _CACHE, **kwargs: object) -> object:
    """fwd_paged on device pointers with an explicit out, so nothing is allocated before the
    checks under test; a vLLM block table unless the call says otherwise."""
    if "kv_indices" not in kwargs and "kv_indptr" not in kwargs:
        kwargs.setdefault("block_table", _ptr((2, 20), "int32", 0x900000))
        kwargs.setdefault("seqlens_k", _ptr((2,), "int32", 0xA00000))
    out_shape = q_shape[:-1] + (v_shape[-1],)
    kwargs.setdefault("out", _ptr(out_shape, address=0x800000))
    return ckfmha.fwd_paged(_ptr(q_shape), _ptr(k_shape, address=0x500000),
                            _ptr(v_shape, address=0x600000), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kv_indices": _ptr((9,), "int32"), "kv_indptr": _ptr((3,), "int32"),
          "block_table": _ptr((2, 20), "int32")}, "not both and not neither"),
        ({"block_table": None, "seqlens_k": None}, "not both and not neither"),
        ({"kv_indices": _ptr((9,), "int32")}, "kv_indices and kv_indptr go together"),
        ({"seqlens_k": None}, r"block_table needs seqlens_k"),
        ({"k_shape": (40, 16, 2, 2, 64)}, r"k_cache and v_cache must be 4-D"),
        ({"v_shape": (40, 8, 2, 128)}, r"must agree on pages, page size and heads"),
        ({"block_table": _ptr((2, 3, 4), "int32")}, r"block_table must be 2-D"),
        ({"q_shape": (3, 8, 1, 128)}, r"q holds 3 sequences but the page table 2"),
        ({"q_shape": (2, 8, 1, 64)}, r"k_cache head dim 128 differs from q head dim 64"),
        ({"q_shape": (2, 8, 128)}, r"q must be 4-D"),
        ({"cu_seqlens_q": _ptr((2,), "int32")}, r"with cu_seqlens_q, q must be 3-D"),
        ({"q_shape": (7, 8, 128), "cu_seqlens_q": _ptr((2,), "int32")},
         r"cu_seqlens_q must hold batch \+ 1 = 3 offsets"),
        ({"q_shape": (7, 8, 128), "cu_seqlens_q": _ptr((3,), "int32")},
         r"max_seqlen_q is needed when cu_seqlens_q is a device array"),
        ({"kv_indices": _ptr((9,), "int32"), "kv_indptr": _ptr((3, 1), "int32")},
         r"kv_indptr must be 1-D with batch \+ 1 >= 1 offsets"),
        ({"page_layout": "blocked"}, r"page_layout must be 'linear' or 'vectorized'"),
        ({"page_layout": "vectorized"}, r"vectorized pages: k_cache must be 5-D"),
        ({"page_layout": "vectorized", "k_shape": (40, 2, 32, 16, 4), "v_shape": (40, 2, 128, 16)},
         r"k_cache's last axis holds 8 channels"),
        ({"page_layout": "vectorized", "k_shape": (40, 2, 16, 16, 8), "v_shape": (40, 2, 128, 8)},
         r"must agree on pages, heads and page size"),
        ({"seqlens_k": _ptr((3,), "int32")}, r"seqlens_k must have shape \(2,\)"),
        ({"k_shape": (40, 12, 2, 128), "v_shape": (40, 12, 2, 128)},
         r"page_size is 12; paged K/V takes a power of two"),
        ({"q_shape": (2, 7, 1, 128)}, r"nhead_q \(7\) must be a multiple of nhead_k \(2\)"),
    ],
)
def test_fwd_paged_argument_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _paged_call(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_table": ckfmha.device_ptr(0, (2, 20), "int32")},
         r"kv_storage paged_table needs args.block_table"),
        ({"seqlens_k": ckfmha.device_ptr(0, (2,), "int32")},
         r"kv_storage paged_table needs args.seqlens_k"),
        ({"kv_indices": ckfmha.device_ptr(0, (9,), "int32"), "kv_indptr": _ptr((3,), "int32")},
         r"kv_storage paged_indptr needs args.kv_indices"),
        ({"kv_indices": _ptr((9,), "int32"), "kv_indptr": ckfmha.device_ptr(0, (3,), "int32")},
         r"kv_storage paged_indptr needs args.kv_indptr"),
    ],
)
def test_null_page_tables_are_rejected_by_the_c_api(kwargs: dict[str, object],
                                                     message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=message):
        _paged_call(**kwargs)  # type: ignore[arg-type]


@no_gpu
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"kv_indices": _ptr((9,), "int32"), "kv_indptr": _ptr((3,), "int32")},
        {"causal": True, "causal_alignment": "bottom_right", "softcap": 20.0, "num_splits": 3},
        {"q_shape": (7, 8, 128), "cu_seqlens_q": np.array([0, 3, 7], np.int32),
         "window": (32, 0)},
        {"q_shape": (2, 1, 8, 128), "layout": "bshd", "max_seqlen_k": 77},
    ],
)
def test_well_formed_paged_calls_reach_the_device(kwargs: dict[str, object]) -> None:
    # Host-side offsets would be staged to the device: without one, that is where they stop.
    with pytest.raises(errors.NoDeviceError):
        _paged_call(**kwargs)  # type: ignore[arg-type]


# ---- the reference ----


def test_paged_reference_matches_the_contiguous_one() -> None:
    rng = np.random.default_rng(5)
    batch, hq, hk, sq, d, page_size = 3, 4, 2, 3, 32, 4
    lens = [9, 0, 16]
    pages_needed = [-(-n // page_size) for n in lens]
    ids = rng.permutation(sum(pages_needed) + 2)
    k_cache = rng.standard_normal((ids.size, page_size, hk, d))
    v_cache = rng.standard_normal((ids.size, page_size, hk, d))
    table = np.full((batch, 5), 10**6)
    indptr = np.concatenate([[0], np.cumsum(pages_needed)])
    for b in range(batch):
        table[b, : pages_needed[b]] = ids[indptr[b] : indptr[b + 1]]
    q = rng.standard_normal((batch, hq, sq, d))
    options = {"causal": True, "causal_alignment": "bottom_right"}
    o_table, lse_table = paged_attention_reference(q, k_cache, v_cache, block_table=table,
                                                   seqlens_k=lens, **options)
    o_indptr, lse_indptr = paged_attention_reference(
        q, k_cache, v_cache, kv_indices=ids[: indptr[-1]], kv_indptr=indptr, seqlens_k=lens,
        **options)
    np.testing.assert_array_equal(o_table, o_indptr)
    np.testing.assert_array_equal(lse_table, lse_indptr)
    for b in (0, 2):
        keys = k_cache[table[b, : pages_needed[b]]].reshape(-1, hk, d)[: lens[b]]
        values = v_cache[table[b, : pages_needed[b]]].reshape(-1, hk, d)[: lens[b]]
        o_b, lse_b = attention_reference(q[b : b + 1], keys.transpose(1, 0, 2)[None],
                                         values.transpose(1, 0, 2)[None], **options)
        np.testing.assert_allclose(o_table[b], o_b[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse_table[b], lse_b[0], rtol=1e-12, atol=1e-12)
    # No keys: zero output, LSE -inf.
    assert np.all(o_table[1] == 0) and np.all(np.isneginf(lse_table[1]))
    with pytest.raises(ValueError, match="need 3 pages, the table lists 2"):
        paged_attention_reference(q, k_cache, v_cache, kv_indices=ids[:2],
                                  kv_indptr=np.array([0, 2, 2, 2]), seqlens_k=[9, 0, 0])


# ---- re-laying out pages between vLLM's layouts ----


def _linear_caches(pages: int = 5, page_size: int = 4, heads: int = 3, hdim: int = 16,
                   hdim_v: int = 24) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    k = rng.standard_normal((pages, page_size, heads, hdim)).astype(np.float16)
    v = rng.standard_normal((pages, page_size, heads, hdim_v)).astype(np.float16)
    return k, v


def test_vectorized_pages_hold_each_key_where_vllm_puts_it() -> None:
    k, v = _linear_caches()
    k_vec, v_vec = ckfmha.to_vectorized_pages(k, v)
    assert k_vec.shape == (5, 3, 2, 4, 8) and v_vec.shape == (5, 3, 24, 4)
    assert k_vec.flags["C_CONTIGUOUS"] and v_vec.flags["C_CONTIGUOUS"]
    for page, slot, head, channel in [(0, 0, 0, 0), (4, 3, 2, 15), (2, 1, 1, 9), (3, 2, 0, 7)]:
        assert k_vec[page, head, channel // 8, slot, channel % 8] == k[page, slot, head, channel]
    for page, slot, head, channel in [(0, 0, 0, 0), (4, 3, 2, 23), (1, 2, 1, 17)]:
        assert v_vec[page, head, channel, slot] == v[page, slot, head, channel]
    k_back, v_back = ckfmha.to_linear_pages(k_vec, v_vec)
    np.testing.assert_array_equal(k_back, k)
    np.testing.assert_array_equal(v_back, v)
    assert k_back.flags["C_CONTIGUOUS"] and v_back.flags["C_CONTIGUOUS"]


@pytest.mark.parametrize(
    ("convert", "shapes", "message"),
    [
        ("to_vectorized_pages", [(5, 4, 3, 12), (5, 4, 3, 12)], r"chunks of 8 channels; hdim 12 is not"),
        ("to_vectorized_pages", [(5, 4, 3, 16), (5, 2, 3, 16)], r"must agree on pages, page size"),
        ("to_vectorized_pages", [(5, 4, 16), (5, 4, 3, 16)], r"k_cache and v_cache must be 4-D"),
        ("to_linear_pages", [(5, 3, 2, 4, 4), (5, 3, 16, 4)], r"holds 8 channels .* got 4"),
        ("to_linear_pages", [(5, 3, 2, 4, 8), (5, 3, 16, 2)], r"must agree on pages, heads"),
        ("to_linear_pages", [(5, 3, 16, 4), (5, 3, 16, 4)], r"k_cache must be 5-D"),
    ],
)
def test_page_layout_conversions_reject_bad_shapes(convert: str, shapes: list[tuple[int, ...]],
                                                    message: str) -> None:
    k, v = (np.zeros(shape, np.float16) for shape in shapes)
    with pytest.raises(errors.InvalidArgumentError, match=message):
        getattr(ckfmha, convert)(k, v)
