"""The learned conv selection without a GPU: the shipped conv model evaluates as LightGBM trained
it, the dispatcher weighs the candidates ckfmha.conv_selection lists with the features it
computes and picks as the model says, and a conv model loads beside the attention model, not
over it."""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from support.paths import REPO_ROOT

import ckfmha
from ckfmha import errors
from ckfmha.conv_problem import ConvProblem
from ckfmha.conv_selection import conv_candidate_plans, conv_features, problem_record

PACKAGED = REPO_ROOT / "ckfmha" / "data" / "selection_conv_sm90.model"
CHECK = REPO_ROOT / "tests" / "data" / "conv_selection_check.json"
FAMILIES = ("conv_fwd", "conv_bwd_data", "conv_bwd_weight")
REFERENCE_SMS = {80: 108, 90: 132}  # what the dispatcher assumes without such a device
_PREDICTED = re.compile(r"^  predicted (\S+)x the rules' plan  (\S+)(?: splits=(\d+))?$",
                        re.MULTILINE)  # fmt: skip
# Dense, grouped and depthwise layers, a stride-2 one (four backward-data phases).
PROBLEMS = [
    ConvProblem(8, (28, 28), 1, 64, 128, (3, 3), 1, 1, dtype="bf16"),
    ConvProblem(2, (17, 23), 4, 32, 32, (3, 3), 2, 1, dtype="bf16"),
    ConvProblem(32, (14, 14), 1, 256, 64, (1, 1), dtype="bf16"),
    ConvProblem(4, (56, 56), 96, 1, 1, (3, 3), 1, 1, dtype="bf16"),
]


@pytest.fixture(scope="module")
def model_module() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO_ROOT / "benchmarks"))
        yield importlib.import_module("selection_model")


def _conv_kernels(arch: int) -> list[dict]:
    return [k for k in ckfmha.Registry().kernels()
            if k["family"].startswith("conv_") and k["arch"] == arch]  # fmt: skip


@pytest.fixture
def model(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """The shipped conv trees for the arch this build has conv kernels of (relabelled for sm_80
    when it has no sm_90a ones), loaded; the shipped model is loaded back afterwards."""
    arch = 90 if _conv_kernels(90) else 80
    path = tmp_path / f"conv_sm{arch}.model"
    path.write_text(PACKAGED.read_text().replace("\narch 90\n", f"\narch {arch}\n", 1))
    ckfmha.load_selection_model(path)
    yield path, arch
    ckfmha.load_selection_model(PACKAGED)


def test_python_evaluator_reproduces_lightgbm(model_module: ModuleType) -> None:
    model = model_module.read_model(PACKAGED)
    assert model.arch == 90 and all(model.trees[f] for f in FAMILIES)
    rows = json.loads(CHECK.read_text())
    assert {r["family"] for r in rows} == set(FAMILIES)
    for row in rows:
        assert model.predict_log(row["family"], row["x"]) == pytest.approx(row["prediction"],
                                                                              abs=1e-9)  # fmt: skip


def test_check_rows_recompute_from_their_problems() -> None:
    """The features training read are conv_features of the sampled problem and candidate (its
    algorithm taken from the kernel's name, its packing the one it was timed with)."""
    for row in json.loads(CHECK.read_text()):
        match = re.search(r"_(sm80_cpasync_mma|sm90_cpasync_wgmma|conv_direct)_m(\d+)n(\d+)"
                          r"k(\d+)_w(\d+)s(\d+)$", row["kernel"])  # fmt: skip
        assert match, row["kernel"]
        bucket = re.search(r"_c(\d+)__", row["kernel"])
        kernel = {"pipeline": match[1], "tile_m": match[2], "tile_n": match[3],
                  "tile_k": match[4], "warps": match[5], "stages": match[6],
                  "conv_max_channels": bucket[1] if bucket else 0}  # fmt: skip
        direction = row["family"].removeprefix("conv_")
        x = conv_features(row["problem"], direction, kernel, row["splits"], row["num_sms"],
                          row.get("pack"))  # fmt: skip
        assert x == pytest.approx(row["x"], rel=1e-12), row


@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_weight"])
@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"g{p.groups}c{p.in_channels}")
def test_dispatcher_predicts_and_picks_as_the_model(model_module: ModuleType,
                                                    model: tuple[Path, int], direction: str,
                                                    problem: ConvProblem) -> None:  # fmt: skip
    path, arch = model
    with ckfmha.selection("learned"):
        text = ckfmha.conv_explain(problem, arch=arch, direction=direction)
        chosen = ckfmha.conv_select(problem, arch=arch, direction=direction)
    predicted = _PREDICTED.findall(text)
    if not predicted:
        pytest.skip(f"this build has no sm_{arch} kernel for {direction} of this problem")
    records = {k["name"]: k for k in ckfmha.Registry().kernels()}
    record = problem_record(problem)
    trees = model_module.read_model(path)
    family = f"conv_{direction}"
    sms = REFERENCE_SMS[arch]
    listed = set()
    for ratio, name, splits in predicted:
        x = conv_features(record, direction, records[name], int(splits or 0), sms)
        assert float(ratio) == pytest.approx(math.exp(trees.predict_log(family, x)), rel=1e-5)
        listed.add((name, int(splits or 0)))
    # The same candidates as the oracle timed (less direct kernels whose tile would not fit).
    python = set(conv_candidate_plans(record, direction, records.values(), sms, arch, "bf16"))
    assert listed <= python and {c for c in python - listed if "_conv_direct_" not in c[0]} == set()
    best_ratio, best, _ = predicted[0]
    margin = trees.margins[family]
    if "no timings of the TMA template" in text:
        # The rules' plan runs on the TMA forward, which the model cannot weigh: it stands.
        assert "_sm90_tma_wgmma_" in chosen and "learned: predicted" not in text, text
        with ckfmha.selection("heuristic"):
            assert chosen == ckfmha.conv_select(problem, arch=arch, direction=direction)
    elif float(best_ratio) < 1 - margin:
        assert chosen == best, text
        assert "learned: predicted" in text, text
    else:
        with ckfmha.selection("heuristic"):
            assert chosen == ckfmha.conv_select(problem, arch=arch, direction=direction)


def test_heuristic_mode_lists_no_predictions(model: tuple[Path, int]) -> None:
    _, arch = model
    with ckfmha.selection("heuristic"):
        text = ckfmha.conv_explain(PROBLEMS[0], arch=arch, direction="bwd_weight")
    assert "predicted" not in text and "learned" not in text


def test_a_model_for_another_arch_leaves_the_rules(model: tuple[Path, int]) -> None:
    _, arch = model
    other = 80 if arch == 90 else 90
    with ckfmha.selection("learned"):
        text = ckfmha.conv_explain(PROBLEMS[0], arch=other, direction="fwd")
    assert f"learned selection not used: the conv cost model is for sm_{arch}, not sm_{other}" in text


def test_conv_model_loads_beside_the_attention_model(model: tuple[Path, int]) -> None:
    attention = ckfmha.selection_model_info()
    conv = ckfmha.conv_selection_model_info()
    assert conv.startswith("cost model for sm_") and "conv_bwd_weight" in conv, conv
    assert ckfmha.load_selection_model(PACKAGED).startswith("cost model for sm_90")
    assert ckfmha.selection_model_info() == attention


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("features spatial_dims log_batch", "features spatial_dims batch", 1),
         "feature 1 is 'batch'; this library computes 'log_batch'"),
        (lambda t: t.replace("model conv_fwd ", "model fwd ", 1),
         "expected 'model conv_fwd|conv_bwd_data|conv_bwd_weight <trees> [margin]'"),
    ],
)
def test_broken_conv_models_are_refused(tmp_path: Path, edit: Callable[[str], str],
                                        message: str) -> None:  # fmt: skip
    before = ckfmha.conv_selection_model_info()
    path = tmp_path / "broken.model"
    path.write_text(edit(PACKAGED.read_text()))
    with pytest.raises(errors.InvalidArgumentError, match=re.escape(message)):
        ckfmha.load_selection_model(path)
    assert ckfmha.conv_selection_model_info() == before
