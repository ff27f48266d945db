"""The selection oracle (benchmarks/oracle.py, oracle_shapes.py) without a GPU: its problems
cover what the issue asks and hold out whole head counts and a length band, the candidates it
times are the ones the dispatcher's explain output lists (parsed by ckfmha.tuning, which
``python -m ckfmha tune`` shares), and its summary compares the dispatcher's time with the
fastest candidate's."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest
from support.paths import REPO_ROOT

import ckfmha
from ckfmha import tuning

BENCHMARKS = REPO_ROOT / "benchmarks"


@pytest.fixture(scope="module")
def modules() -> Iterator[tuple[ModuleType, ModuleType]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        yield importlib.import_module("oracle_shapes"), importlib.import_module("oracle")


def test_draws_cover_the_asked_counts_and_shapes(modules: tuple[ModuleType, ModuleType]) -> None:
    shapes, _ = modules
    fwd, decode, bwd = shapes.draw("fwd", 1000), shapes.draw("decode", 300), shapes.draw("bwd", 300)
    assert (len(set(fwd)), len(set(decode)), len(set(bwd))) == (1000, 300, 300)
    for problems in (fwd, bwd):
        assert {(p.hdim, p.hdim_v) for p in problems} == set(shapes.HDIMS)
        assert {p.group for p in problems} == set(shapes.GROUPS)
        assert {p.causal for p in problems} == {False, True}
        assert min(p.seqlen_k for p in problems) < 100 and max(p.seqlen_k for p in problems) > 30000
        assert any(p.seqlen_q != p.seqlen_k for p in problems)
    assert all(p.seqlen_q == 1 and not p.causal for p in decode)
    assert max(p.seqlen_k for p in decode) > 100_000 and max(p.batch for p in decode) >= 128
    # Held out: whole head counts and a band of lengths, and at least 300 shapes in all.
    held = [p for p in fwd + decode + bwd if shapes.held_out(p)]
    assert len(held) >= 300
    assert {p.nhead_q for p in held} >= shapes.HELD_OUT_HEADS
    kept = [p for p in fwd + decode + bwd if not shapes.held_out(p)]
    assert not any(p.nhead_q in shapes.HELD_OUT_HEADS for p in kept)
    low, high = shapes.HELD_OUT_KEYS
    assert not any(low <= p.seqlen_k < high for p in kept) and len(kept) >= 1000


def test_varlen_draws_pack_sequences_of_their_own_lengths(
        modules: tuple[ModuleType, ModuleType]) -> None:  # fmt: skip
    shapes, oracle = modules
    varlen = shapes.draw("varlen", 300)
    assert len(set(varlen)) == 300
    assert {(p.hdim, p.hdim_v) for p in varlen} == set(shapes.VARLEN_HDIMS)
    decode = [p for p in varlen if p.seqlen_q == 1]
    prefill = [p for p in varlen if p.seqlens_q == p.seqlens_k]
    assert len(decode) > 50 and len(prefill) > 150 and len(decode) + len(prefill) == 300
    assert all(not p.causal for p in decode) and {p.causal for p in prefill} == {False, True}
    # Lengths differ within a batch: the mean is below the longest.
    assert sum(p.total_k < p.batch * p.seqlen_k for p in varlen if p.batch > 1) > 200
    fields = shapes.problem_fields(varlen[0])
    assert fields["mode"] == "group" and fields["total_k"] == sum(fields["seqlens_k"])
    record = shapes.problem_record(varlen[0])
    assert set(record) <= set(oracle.CSV_FIELDS) and record["mode"] == "group"
    assert sum(shapes.held_out(p) for p in varlen) >= 60


def test_draws_are_reproducible_and_seeded(modules: tuple[ModuleType, ModuleType]) -> None:
    shapes, _ = modules
    assert shapes.draw("fwd", 50) == shapes.draw("fwd", 50)
    assert shapes.draw("fwd", 50, seed=1) != shapes.draw("fwd", 50)
    with pytest.raises(ValueError, match="kind 'conv'"):
        shapes.draw("conv", 1)


def test_causal_problems_with_unequal_lengths_align_bottom_right(
        modules: tuple[ModuleType, ModuleType]) -> None:  # fmt: skip
    shapes, _ = modules
    p = shapes.BroadCase("fwd", 1, 8, 8, 100, 300, 64, 64, True)
    assert shapes.mask_options(p) == {"causal": True, "causal_alignment": "bottom_right"}
    assert shapes.problem_fields(p)["causal_alignment"] == "bottom_right"
    assert shapes.mask_options(shapes.BroadCase("fwd", 1, 8, 8, 300, 300, 64, 64, False)) == {}


def _plain(kernel: dict, family: str) -> bool:
    """A batch-mode kernel of `family` with no mask or a causal one and no feature: one the
    problems of these tests (which set no feature) can run."""
    return (kernel["family"] == family and kernel["mode"] == "batch"
            and kernel["mask"] in ("none", "causal") and kernel["bias"] == "none"
            and not (kernel["dropout"] or kernel["softcap"] or kernel["sink"]
                     or kernel["v_col_major"] or kernel["dbias"]))  # fmt: skip


def _plain_problem(family: str) -> tuple[dict, dict]:
    """The registry's first plain kernel of `family` and the dispatcher fields of a small
    problem it runs."""
    kernel = next(k for k in ckfmha.Registry().kernels() if _plain(k, family))
    fields = {"batch": 2, "nhead_q": 4, "seqlen_q": 300, "hdim": kernel["hdim_q"],
              "hdim_v": kernel["hdim_v"], "dtype": kernel["dtype"],
              "causal": kernel["mask"] == "causal"}  # fmt: skip
    return kernel, fields


def test_forward_candidates_are_what_explain_lists() -> None:
    kernel, fields = _plain_problem("fwd")
    explain = ckfmha.Dispatcher().explain(**fields, arch=kernel["arch"])
    candidates, choice = tuning.fwd_candidates(explain)
    assert tuning.Candidate(kernel["name"]) in candidates
    assert choice.kernel == ckfmha.Dispatcher().select(**fields, arch=kernel["arch"])
    assert all(c.num_splits == 0 for c in candidates if not c.kernel.startswith("fwd_splitkv_"))


def test_split_kernels_are_tried_at_every_count() -> None:
    lines = [
        "problem: fwd bf16 batch ...",
        "  selected  fwd_bf16_batch_d128x128_none_lse__one",
        "  rejected  fwd_fp16_batch_d128x128_none_lse__two: dtype fp16, problem is bf16",
        "  selected  fwd_splitkv_bf16_batch_d128x128_none_lse__split",
        "  fits      fwd_splitkv_bf16_batch_d128x128_none_lse__other",
        "  selected  fwd_splitkv_combine_bf16_batch_d128x128_none_lse__combine",
        ("plan: split-KV, fwd_splitkv_bf16_batch_d128x128_none_lse__split then "
         "fwd_splitkv_combine_bf16_batch_d128x128_none_lse__combine, num_splits=24, workspace 1 "
         "bytes (132 SMs): the wave model"),
    ]  # fmt: skip
    candidates, choice = tuning.fwd_candidates("\n".join(lines))
    assert choice == tuning.Choice("fwd_splitkv_bf16_batch_d128x128_none_lse__split", 24)
    names = {c.kernel for c in candidates}
    assert names == {"fwd_bf16_batch_d128x128_none_lse__one",
                     "fwd_splitkv_bf16_batch_d128x128_none_lse__split",
                     "fwd_splitkv_bf16_batch_d128x128_none_lse__other"}  # fmt: skip
    counts = {c.num_splits for c in candidates if c.kernel.endswith("__split")}
    assert counts == {*tuning.SPLIT_COUNTS, 24}
    with pytest.raises(ValueError, match="no plan"):
        tuning.fwd_candidates("problem: fwd\n  selected  x\n")


def test_backward_candidates_are_the_main_stages() -> None:
    kernel, fields = _plain_problem("bwd_dq_dk_dv")
    explain = ckfmha.Dispatcher().explain_bwd(**fields, arch=kernel["arch"])
    candidates, choice = tuning.bwd_candidates(explain)
    assert candidates and all(c.kernel.startswith("bwd_dq_dk_dv_") for c in candidates)
    assert choice.kernel == ckfmha.Dispatcher().select_bwd(**fields, arch=kernel["arch"])[1]


def test_summary_rates_the_dispatcher_against_the_fastest(
        modules: tuple[ModuleType, ModuleType]) -> None:  # fmt: skip
    _, oracle = modules

    def row(problem: int, candidate: str, ms: float | None, held: bool = False,
            chosen: str = "a", splits: int = 0) -> dict:  # fmt: skip
        return {"kind": "fwd", "problem": problem, "label": f"p{problem}", "held_out": held,
                "candidate": candidate, "num_splits": splits, "chosen": chosen,
                "chosen_splits": 4, "ms": "" if ms is None else ms}  # fmt: skip

    # Problem 0 chooses b (4 splits, 2x the fastest), problem 1 its fastest, problem 2 a
    # 0.8x one; a candidate without a time (an error row) counts for nothing.
    rows = [row(0, "a", 1.0, chosen="b"), row(0, "b", 2.0, chosen="b", splits=4),
            row(0, "b", 1.5, chosen="b", splits=8),
            row(1, "a", 1.0, True, splits=4), row(1, "b", None, True),
            row(2, "a", 1.0, chosen="c"), row(2, "c", 1.25, chosen="c", splits=4)]  # fmt: skip
    summary = oracle.efficiency_summary(rows)["fwd"]
    assert summary["all"]["problems"] == 3
    assert summary["all"]["mean"] == pytest.approx((0.5 + 1.0 + 0.8) / 3)
    assert summary["all"]["worst"] == 0.5 and summary["all"]["worst_problem"] == "p0"
    assert summary["all"]["p10"] == 0.5 and summary["all"]["median"] == 0.8
    assert summary["held_out"]["problems"] == 1 and summary["held_out"]["mean"] == 1.0
    # Another selection's picks: here always candidate a.
    picked_a = oracle.efficiency_summary(rows, lambda r: r["candidate"] == "a")["fwd"]["all"]
    assert picked_a["mean"] == 1.0
