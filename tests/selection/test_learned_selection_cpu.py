"""The learned selection without a GPU: the shipped cost model evaluates as LightGBM trained it,
the dispatcher's predictions and choice follow the model, a model for another arch or a broken
file falls back or fails with a clear message, and the selection mode is one for the process."""

from __future__ import annotations

import importlib
import json
import math
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from support.paths import REPO_ROOT

import ckfmha

PACKAGED = REPO_ROOT / "ckfmha" / "data" / "selection_sm90.model"
CHECK = REPO_ROOT / "tests" / "data" / "selection_check.json"
# The SM counts the dispatcher assumes without such a device (reference_sm_count).
REFERENCE_SMS = {80: 108, 90: 132}
FAMILIES = ("fwd", "decode", "varlen", "bwd")
# A prediction: a multiple of the hand rules' plan's time (the shipped model's target).
_PREDICTED = re.compile(r"^  predicted (\S+)x the rules' plan  (\S+)(?: num_splits=(\d+))?$",
                        re.MULTILINE)  # fmt: skip


@pytest.fixture(scope="module")
def model_module() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO_ROOT / "benchmarks"))
        yield importlib.import_module("selection_model")


def _arch() -> int:
    """sm_90 when this build registers sm_90a split-KV kernels (the shipped model's arch), else
    sm_80."""
    return 90 if _plain_kernels("fwd_splitkv", 90) else 80


@pytest.fixture
def model(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """The shipped trees for the arch this build has kernels of (relabelled for sm_80 when it has
    no sm_90a ones), loaded; the shipped model is loaded back afterwards."""
    arch = _arch()
    path = tmp_path / f"sm{arch}.model"
    path.write_text(PACKAGED.read_text().replace("\narch 90\n", f"\narch {arch}\n", 1))
    ckfmha.load_selection_model(path)
    yield path, arch
    ckfmha.load_selection_model(PACKAGED)


def _plain_kernels(family: str, arch: int, mode: str = "batch",
                   mask: str = "none") -> list[dict]:  # fmt: skip
    return [k for k in ckfmha.Registry().kernels()
            if k["family"] == family and k["arch"] == arch and k["mode"] == mode
            and k["mask"] == mask and k["bias"] == "none" and k["dtype"] in ("fp16", "bf16")
            and not (k["dropout"] or k["softcap"] or k["sink"] or k["v_col_major"]
                     or k["dbias"])]  # fmt: skip


def test_python_evaluator_reproduces_lightgbm(model_module: ModuleType) -> None:
    model = model_module.read_model(PACKAGED)
    assert model.arch == 90 and all(model.trees[f] for f in FAMILIES)
    rows = json.loads(CHECK.read_text())
    assert len(rows) >= 30 and {r["family"] for r in rows} == set(FAMILIES)
    for row in rows:
        assert model.predict_log(row["family"], row["x"]) == pytest.approx(row["prediction"],
                                                                              abs=1e-9)  # fmt: skip


# A decode step (one query row) is ranked by the decode trees, a longer query by the forward's.
@pytest.mark.parametrize(("seqlen_q", "family"), [(1, "decode"), (48, "fwd")])
def test_dispatcher_predicts_and_picks_as_the_model(model_module: ModuleType,
                                                    model: tuple[Path, int], seqlen_q: int,
                                                    family: str) -> None:  # fmt: skip
    path, arch = model
    splits = _plain_kernels("fwd_splitkv", arch)
    if not splits:
        pytest.skip(f"this build registers no plain sm_{arch} split-KV kernel")
    kernel = splits[0]
    problem = {"batch": 3, "nhead_q": 8, "nhead_k": 2, "seqlen_q": seqlen_q, "seqlen_k": 5000,
               "hdim": kernel["hdim_q"], "hdim_v": kernel["hdim_v"], "causal": False}  # fmt: skip
    explain = ckfmha.Dispatcher().explain(**problem, dtype=kernel["dtype"], arch=arch,
                                          selection="learned")  # fmt: skip
    assert f"\n  trees     {family}\n" in explain, explain
    predicted = _PREDICTED.findall(explain)
    assert len(predicted) >= 8, explain  # split counts 1..64 and the rules' count, at least
    records = {k["name"]: k for k in ckfmha.Registry().kernels()}
    trees = model_module.read_model(path)
    for ms, name, count in predicted:
        x = model_module.candidate_features(problem, records[name], int(count or 0),
                                            REFERENCE_SMS[arch])  # fmt: skip
        assert float(ms) == pytest.approx(math.exp(trees.predict_log(family, x)), rel=1e-5)
    # The plan is the fastest prediction, unless the rules' plan is within the margin.
    plan = next(line for line in explain.splitlines() if line.startswith("plan: "))
    _fastest_ms, fastest, fastest_count = predicted[0]
    if "within the model's margin" not in plan:
        assert "learned: predicted" in plan and fastest in plan, plan
        if fastest_count and int(fastest_count) > 1:
            assert f"num_splits={fastest_count}" in plan, plan


def test_group_mode_is_ranked_by_the_varlen_trees(model_module: ModuleType,
                                                  model: tuple[Path, int]) -> None:  # fmt: skip
    path, arch = model
    # CI's core build has causal group-mode kernels only.
    kernels = _plain_kernels("fwd", arch, mode="group", mask="causal")
    if not kernels:
        pytest.skip(f"this build registers no plain sm_{arch} group-mode forward kernel")
    kernel = kernels[0]
    # Three sequences of 300, 20 and 1000 tokens: the longest sizes the grid, the mean the work.
    problem = {"mode": "group", "batch": 3, "nhead_q": 8, "nhead_k": 8, "seqlen_q": 1000,
               "seqlen_k": 1000, "total_q": 1320, "total_k": 1320, "hdim": kernel["hdim_q"],
               "hdim_v": kernel["hdim_v"], "causal": True}  # fmt: skip
    explain = ckfmha.Dispatcher().explain(**problem, dtype=kernel["dtype"], lse=True, arch=arch,
                                          selection="learned")  # fmt: skip
    assert "\n  trees     varlen\n" in explain, explain
    predicted = _PREDICTED.findall(explain)
    assert predicted, explain
    records = {k["name"]: k for k in ckfmha.Registry().kernels()}
    trees = model_module.read_model(path)
    for ratio, name, count in predicted:
        x = model_module.candidate_features(problem, records[name], int(count or 0),
                                            REFERENCE_SMS[arch])  # fmt: skip
        assert x[-1] == pytest.approx(1320 / 3 / 1000)  # the grid's fill
        assert float(ratio) == pytest.approx(math.exp(trees.predict_log("varlen", x)), rel=1e-5)


def test_backward_main_stage_follows_the_model(model: tuple[Path, int]) -> None:
    _, arch = model
    mains = _plain_kernels("bwd_dq_dk_dv", arch)
    if not mains:
        pytest.skip(f"this build registers no plain sm_{arch} backward kernel")
    k = mains[0]
    explain = ckfmha.Dispatcher().explain_bwd(
        batch=2, nhead_q=4, seqlen_q=700, hdim=k["hdim_q"], hdim_v=k["hdim_v"],
        dtype=k["dtype"], causal=k["mask"] == "causal", arch=arch, selection="learned")  # fmt: skip
    assert _PREDICTED.findall(explain), explain
    assert re.search(r"^main stage: learned: ", explain, re.MULTILINE), explain


def test_a_model_for_another_arch_leaves_the_hand_rules(model: tuple[Path, int]) -> None:
    ckfmha.load_selection_model(PACKAGED)  # sm_90: does not rank sm_80 plans
    kernel = (_plain_kernels("fwd", 80) or pytest.skip("no plain sm_80 forward kernel"))[0]
    fields = {"batch": 2, "nhead_q": 4, "seqlen_q": 300, "hdim": kernel["hdim_q"],
              "hdim_v": kernel["hdim_v"], "dtype": kernel["dtype"], "arch": 80}  # fmt: skip
    explain = ckfmha.Dispatcher().explain(**fields, selection="learned")
    assert "the cost model is for sm_90, not sm_80" in explain
    dispatcher = ckfmha.Dispatcher()
    assert dispatcher.select(**fields, selection="learned") == dispatcher.select(**fields)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t.replace("ckfmha-selection-model 1", "something else", 1), "not a ckfmha cost"),
    (lambda t: t.replace(" log_work", " log_flops", 1), "feature 19 is 'log_flops'"),
    (lambda t: t.replace("\nend\n", "\n"), "ends before 'end'"),
    (lambda t: t.replace("\nmodel decode ", "\nmodel prefill ", 1), "model fwd|decode|bwd"),
    (lambda t: re.sub(r"\ntree (\d+)\n(\d+) (\S+) \d+ ", r"\ntree \1\n\2 \3 0 ", t, count=1),
     "links to node 0"),
])  # fmt: skip
def test_broken_model_files_fail_with_the_line(tmp_path: Path, edit: object,
                                               message: str) -> None:  # fmt: skip
    path = tmp_path / "broken.model"
    path.write_text(edit(PACKAGED.read_text()))  # type: ignore[operator]
    before = ckfmha.selection_model_info()
    with pytest.raises(ckfmha.InvalidArgumentError, match=message):
        ckfmha.load_selection_model(path)
    assert ckfmha.selection_model_info() == before  # a failed load keeps the old model
    with pytest.raises(ckfmha.NotFoundError, match="cannot read cost model"):
        ckfmha.load_selection_model(tmp_path / "missing.model")


def test_each_family_has_its_margin_and_a_file_wide_one_fills_in(tmp_path: Path) -> None:
    text = PACKAGED.read_text()
    own = re.search(r"^model fwd (\d+) \S+$", text, re.MULTILINE)
    assert own, "the shipped model gives each family its own margin"
    # A model line without a margin takes the file's `margin` line (older files have only it).
    edited = text.replace(own.group(0), f"model fwd {own.group(1)}").replace(
        "\nfeatures ", "\nmargin 0.25\nfeatures ", 1)
    path = tmp_path / "file_margin.model"
    path.write_text(edited)
    before = ckfmha.selection_model_info()
    try:
        ckfmha.load_selection_model(path)
        info = ckfmha.selection_model_info()
        margins = dict(re.findall(r"(\w+) \d+ trees, margin (\S+?)(?:;|$)", info))
        assert margins["fwd"] == "0.25", info
        assert margins["decode"] != "0.25" and margins["bwd"] != "0.25", info
    finally:
        ckfmha.load_selection_model(PACKAGED)
    assert ckfmha.selection_model_info() == before


def test_selection_mode_is_process_wide_and_scoped() -> None:
    assert ckfmha.get_selection() == "heuristic"
    with ckfmha.selection("learned"):
        assert ckfmha.get_selection() == "learned"
        assert ckfmha.selection_model_info().startswith("cost model for sm_90")
        # Another thread (torch's autograd worker, say) plans in the same mode.
        seen: list[str] = []
        thread = threading.Thread(target=lambda: seen.append(ckfmha.get_selection()))
        thread.start()
        thread.join()
        assert seen == ["learned"]
        with ckfmha.selection("tuned"):
            assert ckfmha.get_selection() == "tuned"
        assert ckfmha.get_selection() == "learned"
    assert ckfmha.get_selection() == "heuristic"
    with pytest.raises(ValueError, match="'fastest': one of heuristic, learned, tuned"):
        ckfmha.set_selection("fastest")


def test_neighbouring_lengths_reuse_the_learned_choice(model: tuple[Path, int]) -> None:
    _, arch = model
    kernel = (_plain_kernels("fwd_splitkv", arch) or pytest.skip("no split-KV kernel"))[0]
    fields = {"batch": 2, "nhead_q": 8, "nhead_k": 2, "seqlen_q": 1, "hdim": kernel["hdim_q"],
              "hdim_v": kernel["hdim_v"], "dtype": kernel["dtype"], "arch": arch,
              "selection": "learned"}  # fmt: skip

    def plan(seqlen_k: int) -> str:
        explain = ckfmha.Dispatcher().explain(seqlen_k=seqlen_k, **fields)
        return next(line for line in explain.splitlines() if line.startswith("plan: "))

    first = plan(20_000)
    assert "learned: " in first and "remembered" not in first, first
    # 0.5% more keys: the same step of lengths, the same choice, no trees walked.
    neighbour = plan(20_100)
    assert "(remembered for this shape)" in neighbour, neighbour
    assert first.split(":")[1] == neighbour.split(":")[1]  # same plan kind and kernel
    # Twice the keys: another step, decided afresh.
    assert "remembered" not in plan(40_000)


def test_the_shipped_model_loads_without_a_call() -> None:
    # A C caller that sets "learned" without loading a model gets the one shipped beside the
    # library; a fresh process shows it before anything is loaded.
    code = "import ckfmha; print(ckfmha.selection_model_info())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=REPO_ROOT)  # fmt: skip
    assert result.stdout.startswith("cost model for sm_90 trained on"), result.stdout
