"""``python -m ckfmha tune`` on a GPU: it times a forward and a decode problem, writes a table
that loads back, and with selection "tuned" the dispatcher runs the recorded plans, whose
outputs match the float64 reference as the hand rules' do."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.gpu_compare import Inputs, compare, compare_packed, f64, torch_dtype

import ckfmha
from ckfmha.__main__ import main as cli_main
from ckfmha.reference import attention_reference
from ckfmha.tuning import Choice, fwd_candidates
from ckfmha.tuning.inputs import explain_fields, mask_options
from ckfmha.tuning.problems import TuningProblem, problem_from_entry

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch") if ckfmha.device_count() > 0 else None

PREFILL = {"batch": 2, "nhead_q": 8, "nhead_k": 2, "seqlen_q": 300, "hdim": 128, "causal": True}
DECODE = {"batch": 4, "nhead_q": 32, "nhead_k": 4, "seqlen_q": 1, "seqlen_k": 4000, "hdim": 128}
ENTRIES = [PREFILL, DECODE]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Choice]]]:
    """The table tune wrote for ENTRIES, and the plan it recorded for each."""
    # The first switch to "tuned" loads this machine's default table: take it now, so the
    # table loaded below is the only one.
    with ckfmha.selection("tuned"):
        pass
    folder = tmp_path_factory.mktemp("tune")
    problems, table = folder / "problems.json", folder / "table.txt"
    problems.write_text(json.dumps(ENTRIES))
    recorded: list[Choice] = []
    add = ckfmha.tuning_add

    def record(kind: str, kernel: str, num_splits: int, ms: float, **fields: Any) -> None:
        recorded.append(Choice(kernel, num_splits))
        add(kind, kernel, num_splits, ms, **fields)

    argv = ["tune", "--problems", str(problems), "--output", str(table), "--warmup", "1",
            "--iters", "2", "--repeats", "2"]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ckfmha, "tuning_add", record)
        assert cli_main(argv) == 0
    assert len(recorded) == len(ENTRIES)
    yield table, recorded
    ckfmha.clear_tuning()


def test_tune_writes_a_table_that_loads(tuned: tuple[Path, list[Choice]]) -> None:
    table, _ = tuned
    ckfmha.clear_tuning()
    assert ckfmha.load_tuning(table) == 2


def _run(problem: TuningProblem, tensors: tuple[Any, Any, Any]) -> Any:
    """One automatic forward call into a NaN-poisoned output, so an unwritten element shows."""
    q, k, v = tensors
    out = torch.full((problem.batch, problem.nhead_q, problem.seqlen_q, problem.hdim_v),
                     float("nan"), device="cuda", dtype=q.dtype)  # fmt: skip
    ckfmha.fwd(q, k, v, out=out, **mask_options(problem.fields()))
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("index", range(len(ENTRIES)), ids=["prefill", "decode"])
def test_tuned_plans_match_the_reference(tuned: tuple[Path, list[Choice]], index: int) -> None:
    table, recorded = tuned
    ckfmha.clear_tuning()
    assert ckfmha.load_tuning(table) == 2
    problem = problem_from_entry(ENTRIES[index], f"entry {index}")
    fields, dtype = problem.fields(), torch_dtype(problem.dtype)
    inputs, b = Inputs(index), problem.batch
    tensors = (inputs.normal((b, problem.nhead_q, problem.seqlen_q, problem.hdim), dtype),
               inputs.normal((b, problem.nhead_k, problem.seqlen_k, problem.hdim), dtype),
               inputs.normal((b, problem.nhead_k, problem.seqlen_k, problem.hdim_v), dtype))
    ref, _ = attention_reference(*(f64(t) for t in tensors), **mask_options(fields))
    with ckfmha.selection("tuned"):
        # The dispatcher's plan is the one tune recorded for this exact problem.
        assert fwd_candidates(ckfmha.Dispatcher().explain(**fields))[1] == recorded[index]
        tuned_out = _run(problem, tensors)
    with ckfmha.selection("heuristic"):
        heuristic_out = _run(problem, tensors)
    for mode, out in (("tuned", tuned_out), ("heuristic", heuristic_out)):
        compare({"dtype": problem.dtype}, out, None, ref, None, f"{problem.label}, {mode}")


def test_tune_times_a_varlen_problem_and_tuned_runs_its_plan(tmp_path: Path) -> None:
    # A decode step over four cached sequences of their own lengths.
    entry = {"nhead_q": 24, "nhead_k": 8, "seqlens_q": [1, 1, 1, 1],
             "seqlens_k": [900, 4001, 17, 2500], "hdim": 128}  # fmt: skip
    problems, table = tmp_path / "problems.json", tmp_path / "table.txt"
    problems.write_text(json.dumps([entry]))
    ckfmha.clear_tuning()
    assert cli_main(["tune", "--problems", str(problems), "--output", str(table), "--warmup", "1",
                     "--iters", "2", "--repeats", "2"]) == 0  # fmt: skip
    ckfmha.clear_tuning()
    assert ckfmha.load_tuning(table) == 1
    problem = problem_from_entry(entry, "varlen entry")
    lengths_q, lengths_k = list(entry["seqlens_q"]), list(entry["seqlens_k"])
    inputs, dtype = Inputs(7), torch_dtype("bf16")
    q = inputs.normal((sum(lengths_q), 24, 128), dtype)
    k, v = (inputs.normal((sum(lengths_k), 8, 128), dtype) for _ in range(2))
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], device="cuda", dtype=torch.int32)
                  for n in (lengths_q, lengths_k))  # fmt: skip
    out = torch.full(q.shape, float("nan"), device="cuda", dtype=q.dtype)
    with ckfmha.selection("tuned"):
        explain = ckfmha.Dispatcher().explain(**explain_fields(problem.fields()))
        ckfmha.fwd_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=1, max_seqlen_k=max(lengths_k),
                          out=out)  # fmt: skip
    torch.cuda.synchronize()
    assert "tuned: the tuning table's plan" in explain, explain
    compare_packed(out, None, q, k, v, lengths_q, lengths_k, problem.label)
    ckfmha.clear_tuning()
