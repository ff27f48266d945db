"""The tuning table without a GPU: an entry decides the "tuned" plan of its exact problem and no
other, a saved table loads back, a table of another library version or build, driver or
device is refused, and entries that name a missing or unfit kernel fail or fall back with a reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import ckfmha


@pytest.fixture(autouse=True)
def empty_table() -> Iterator[None]:
    ckfmha.clear_tuning()
    yield
    ckfmha.clear_tuning()


def _split_kernel() -> dict:
    for k in ckfmha.Registry().kernels():
        if (k["family"] == "fwd_splitkv" and k["mode"] == "batch"
                and k["mask"] == "none" and k["bias"] == "none" and k["dtype"] == "bf16"
                and not (k["softcap"] or k["sink"] or k["v_col_major"])):  # fmt: skip
            return k
    pytest.skip("this build registers no plain bf16 batch split-KV kernel")


def _fields(kernel: dict, seqlen_k: int = 3000) -> dict:
    return {"batch": 2, "nhead_q": 8, "nhead_k": 2, "seqlen_q": 1, "seqlen_k": seqlen_k,
            "hdim": kernel["hdim_q"], "hdim_v": kernel["hdim_v"], "dtype": "bf16",
            "causal": kernel["mask"] == "causal", "arch": kernel["arch"]}  # fmt: skip


def _problem(fields: dict) -> dict:
    """The problem fields alone (tuning_add takes no arch: entries are per device)."""
    return {k: v for k, v in fields.items() if k != "arch"}


def _plan(fields: dict, selection: str) -> str:
    explain = ckfmha.Dispatcher().explain(**fields, selection=selection)
    return next(line for line in explain.splitlines() if line.startswith("plan: "))


def test_an_entry_decides_its_problem_only(tmp_path: Path) -> None:
    kernel = _split_kernel()
    fields = _fields(kernel)
    ckfmha.tuning_add("fwd", kernel["name"], 3, 0.25, **_problem(fields))
    plan = _plan(fields, "tuned")
    assert kernel["name"] in plan and "num_splits=3" in plan and "tuned:" in plan, plan
    assert "tuned:" not in _plan(fields, "heuristic")
    other = _plan(_fields(kernel, seqlen_k=3001), "tuned")
    assert "tuned:" not in other and "no entry for this problem" in other, other
    # Saved and loaded back into an empty table: the same plan.
    path = tmp_path / "table.txt"
    assert ckfmha.save_tuning(path) == 1
    ckfmha.clear_tuning()
    assert "tuned:" not in _plan(fields, "tuned")
    assert ckfmha.load_tuning(path) == 1
    assert "num_splits=3" in _plan(fields, "tuned")


def test_group_mode_entries_are_told_apart_by_their_token_counts(tmp_path: Path) -> None:
    kernel = next((k for k in ckfmha.Registry().kernels()
                   if k["family"] == "fwd" and k["mode"] == "group" and k["bias"] == "none"
                   and k["dtype"] == "bf16" and k["mask"] in ("none", "causal")
                   and not (k["softcap"] or k["sink"] or k["v_col_major"] or k["dropout"])),
                  None) or pytest.skip("no plain bf16 group-mode forward kernel")  # fmt: skip
    # Three sequences, the longest 1000 tokens: 1320 in all, or 2000 in all.
    fields = {"mode": "group", "batch": 3, "nhead_q": 8, "seqlen_q": 1000, "total_q": 1320,
              "total_k": 1320, "hdim": kernel["hdim_q"], "hdim_v": kernel["hdim_v"],
              "dtype": "bf16", "causal": kernel["mask"] == "causal",
              "arch": kernel["arch"]}  # fmt: skip
    ckfmha.tuning_add("fwd", kernel["name"], 0, 0.5, **_problem(fields))
    assert "tuned:" in _plan(fields, "tuned")
    other = _plan({**fields, "total_q": 2000, "total_k": 2000}, "tuned")
    assert "no entry for this problem" in other, other
    path = tmp_path / "table.txt"
    assert ckfmha.save_tuning(path) == 1
    ckfmha.clear_tuning()
    assert ckfmha.load_tuning(path) == 1
    assert "tuned:" in _plan(fields, "tuned")


@pytest.mark.parametrize("line", ["library", "build", "driver", "device"])
def test_a_stale_table_is_refused(tmp_path: Path, line: str) -> None:
    kernel = _split_kernel()
    ckfmha.tuning_add("fwd", kernel["name"], 2, 0.5, **_problem(_fields(kernel)))
    path = tmp_path / "table.txt"
    ckfmha.save_tuning(path)
    text = "\n".join(f"{line} elsewhere-9" if l.startswith(f"{line} ") else l
                     for l in path.read_text().splitlines())  # fmt: skip
    path.write_text(text + "\n")
    ckfmha.clear_tuning()
    with pytest.raises(ckfmha.InvalidArgumentError, match="stale table"):
        ckfmha.load_tuning(path)
    path.write_text("\n".join(l for l in text.splitlines() if not l.startswith(f"{line} ")))
    with pytest.raises(ckfmha.InvalidArgumentError, match="does not name its library, build"):
        ckfmha.load_tuning(path)


def test_entries_name_registered_kernels_of_the_right_family() -> None:
    kernel = _split_kernel()
    with pytest.raises(ckfmha.NotFoundError, match="no registered kernel named nope"):
        ckfmha.tuning_add("fwd", "nope", 0, 1.0, **_problem(_fields(kernel)))
    with pytest.raises(ckfmha.InvalidArgumentError, match="tuning entries name a bwd_dq_dk_dv"):
        ckfmha.tuning_add("bwd", kernel["name"], 0, 1.0, **_problem(_fields(kernel)))
    with pytest.raises(ValueError, match="kind 'conv'"):
        ckfmha.tuning_add("conv", kernel["name"], 0, 1.0, **_problem(_fields(kernel)))


def test_an_entry_that_does_not_fit_falls_back_with_its_reason() -> None:
    kernel = _split_kernel()
    fields = _fields(kernel)
    # A causal kernel recorded for the unmasked problem: registered, but it does not fit.
    causal = next((k["name"] for k in ckfmha.Registry().kernels()
                   if k["family"] == "fwd_splitkv" and k["mask"] == "causal"
                   and k["arch"] == kernel["arch"] and k["dtype"] == "bf16"
                   and k["mode"] == "batch" and k["hdim_q"] == kernel["hdim_q"]), None)  # fmt: skip
    if causal is None or kernel["mask"] != "none":
        pytest.skip("needs unmasked and causal split-KV kernels of one shape")
    ckfmha.tuning_add("fwd", causal, 2, 0.5, **_problem(fields))
    plan = _plan(fields, "tuned")
    assert "tuned:" not in plan
    assert f"the tuning table's kernel {causal} mask causal, problem needs none" in plan, plan
