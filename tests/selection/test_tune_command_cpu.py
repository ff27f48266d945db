"""``python -m ckfmha tune`` without a GPU: the exit status and message when no device is
there, and, with the timing and the library's tuning table replaced by fakes, what it records,
prints and saves."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import ckfmha
from ckfmha.__main__ import main as cli_main
from ckfmha.tuning import Candidate, CandidateTime, Choice, ProblemTiming, command

PREFILL = {"batch": 2, "nhead_q": 8, "nhead_k": 2, "seqlen_q": 300, "hdim": 128, "causal": True}
DECODE = {"batch": 4, "nhead_q": 32, "nhead_k": 4, "seqlen_q": 1, "seqlen_k": 4000, "hdim": 128}


def _fields(entry: dict[str, Any]) -> dict[str, Any]:
    """The dispatcher fields the command passes on for a problem entry (defaults filled)."""
    return {"batch": entry["batch"], "nhead_q": entry["nhead_q"], "nhead_k": entry["nhead_k"],
            "seqlen_q": entry["seqlen_q"], "seqlen_k": entry.get("seqlen_k", entry["seqlen_q"]),
            "hdim": entry["hdim"], "hdim_v": entry["hdim"], "dtype": "bf16",
            "causal": entry.get("causal", False), "causal_alignment": "top_left"}  # fmt: skip


# Fake timings: the prefill problem's fastest is a second one-stage kernel, the decode
# problem's a split kernel at another count than the hand rules' own.
TIMINGS = {
    300: ProblemTiming((CandidateTime(Candidate("fwd_a"), 1.0, 3),
                        CandidateTime(Candidate("fwd_b"), 0.5, 3)), Choice("fwd_a", 0)),
    1: ProblemTiming((CandidateTime(Candidate("fwd_splitkv_s", 4), 0.2, 3),
                      CandidateTime(Candidate("fwd_splitkv_s", 8), 0.3, 3),
                      CandidateTime(Candidate("fwd_splitkv_s", 64), None, 0, "refused")),
                     Choice("fwd_splitkv_s", 8)),
}  # fmt: skip


class FakeLibrary:
    """The tuning table and selection mode of ckfmha, recorded instead of kept."""

    def __init__(self, default_path: Path) -> None:
        self.default_path = default_path
        self.mode = "tuned"  # as if CKFMHA_SELECTION=tuned: tune must time against the rules
        self.entries: list[tuple[Any, ...]] = []
        self.calls: list[str] = []
        self.loadable = True

    def tuning_add(self, kind: str, kernel: str, num_splits: int, ms: float,
                   **fields: Any) -> None:  # fmt: skip
        self.entries.append((kind, kernel, num_splits, ms, fields))

    def save_tuning(self, path: str) -> int:
        self.calls.append(f"save {path}")
        return len(self.entries)

    def load_tuning(self, path: str) -> int:
        self.calls.append(f"load {path}")
        if not self.loadable:
            raise ckfmha.InvalidArgumentError("table written by ckfmha 0.0.1 on another device")
        return 3

    def clear_tuning(self) -> None:
        self.calls.append("clear")
        self.entries.clear()

    def default_tuning_path(self) -> Path:
        return self.default_path

    @contextmanager
    def selection(self, mode: str) -> Iterator[None]:
        previous, self.mode = self.mode, mode
        try:
            yield
        finally:
            self.mode = previous

    def time_candidates(self, kind: str, fields: dict[str, Any], *, warmup: int, iters: int,
                        repeats: int) -> ProblemTiming:  # fmt: skip
        self.calls.append(f"time {kind} sq={fields['seqlen_q']} mode={self.mode} "
                          f"{warmup}/{iters}/{repeats}")  # fmt: skip
        if fields["seqlen_q"] not in TIMINGS:
            raise ValueError("no plan in the explain text: 'plan: none: no kernel fits'")
        return TIMINGS[fields["seqlen_q"]]


@pytest.fixture
def library(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeLibrary:
    """A device as far as the command checks (ckfmha and torch see one), the fake library."""
    torch = pytest.importorskip("torch")
    fake = FakeLibrary(tmp_path / "cache" / "tuning" / "sm_90.txt")
    for name in ("tuning_add", "save_tuning", "load_tuning", "clear_tuning",
                 "default_tuning_path", "selection"):  # fmt: skip
        monkeypatch.setattr(ckfmha, name, getattr(fake, name), raising=False)
    monkeypatch.setattr(command, "time_candidates", fake.time_candidates)
    monkeypatch.setattr(ckfmha, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return fake


def _loads(library: FakeLibrary) -> list[str]:
    return [call for call in library.calls if call.startswith("load ")]


def _problems_file(tmp_path: Path, *entries: dict[str, Any]) -> str:
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return str(path)


def test_tune_records_the_fastest_plan_of_each_problem(
        library: FakeLibrary, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    output = tmp_path / "table.txt"
    argv = ["tune", "--problems", _problems_file(tmp_path, PREFILL, DECODE), "--output",
            str(output), "--warmup", "1", "--iters", "7", "--repeats", "4"]  # fmt: skip
    assert cli_main(argv) == 0
    assert library.entries == [("fwd", "fwd_b", 0, 0.5, _fields(PREFILL)),
                               ("fwd", "fwd_splitkv_s", 4, 0.2, _fields(DECODE))]  # fmt: skip
    # The table starts empty, each problem is timed under the hand rules, then it is saved.
    assert library.calls == ["clear", "time fwd sq=300 mode=heuristic 1/7/4",
                             "time fwd sq=1 mode=heuristic 1/7/4", f"save {output}"]  # fmt: skip
    assert library.mode == "tuned"
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        ("[1/2] fwd b2 h8/2 s300 d128 bf16 causal: fastest fwd_b 0.5000 ms; "
         "hand rules fwd_a 1.0000 ms"),
        ("[2/2] fwd b4 h32/4 q1 k4000 d128 bf16: fastest fwd_splitkv_s (4 splits) 0.2000 ms; "
         "hand rules fwd_splitkv_s (8 splits) 0.3000 ms"),
        f"wrote 2 entries to {output}",
    ]


def test_tune_writes_the_default_table(library: FakeLibrary, tmp_path: Path) -> None:
    assert cli_main(["tune", "--problems", _problems_file(tmp_path, DECODE)]) == 0
    assert library.calls[-1] == f"save {library.default_path}"
    assert library.default_path.parent.is_dir()  # the cache's tuning folder is made


def test_merge_loads_the_existing_table_first(
        library: FakeLibrary, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    output = tmp_path / "table.txt"
    problems = _problems_file(tmp_path, PREFILL)
    assert cli_main(["tune", "--problems", problems, "--output", str(output), "--merge"]) == 0
    assert not _loads(library)  # no table there yet: nothing to merge
    output.write_text("a table\n")
    library.calls.clear()
    assert cli_main(["tune", "--problems", problems, "--output", str(output), "--merge"]) == 0
    assert library.calls[:2] == ["clear", f"load {output}"]
    assert f"merging 3 entries of {output}" in capsys.readouterr().out
    # Without --merge the existing table is replaced, not read.
    library.calls.clear()
    assert cli_main(["tune", "--problems", problems, "--output", str(output)]) == 0
    assert not _loads(library)


def test_merge_refuses_a_stale_table_before_timing(
        library: FakeLibrary, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    output = tmp_path / "table.txt"
    output.write_text("a table\n")
    library.loadable = False
    argv = ["tune", "--problems", _problems_file(tmp_path, PREFILL), "--output", str(output),
            "--merge"]  # fmt: skip
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert f"--merge: cannot load {output}: table written by ckfmha 0.0.1" in err
    assert "tune without --merge" in err
    assert not [call for call in library.calls if call.startswith(("time", "save"))]


def test_a_problem_without_a_plan_is_skipped(
        library: FakeLibrary, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    unsupported = {**PREFILL, "seqlen_q": 77, "hdim": 72}
    output = tmp_path / "table.txt"
    argv = ["tune", "--problems", _problems_file(tmp_path, unsupported, DECODE), "--output",
            str(output)]  # fmt: skip
    assert cli_main(argv) == 1
    assert [entry[1] for entry in library.entries] == ["fwd_splitkv_s"]
    assert library.calls[-1] == f"save {output}"
    captured = capsys.readouterr()
    assert "[1/2] fwd b2 h8/2 s77 d72 bf16 causal: skipped: no plan in the explain" in captured.err
    assert "1 of 2 problems have no entry" in captured.err
    assert f"wrote 1 entries to {output}" in captured.out


def test_a_problem_whose_candidates_all_fail_gets_no_entry(
        library: FakeLibrary, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    failed = ProblemTiming((CandidateTime(Candidate("fwd_a"), None, 0, "refused"),),
                           Choice("fwd_a", 0))  # fmt: skip
    monkeypatch.setitem(TIMINGS, 300, failed)
    argv = ["tune", "--problems", _problems_file(tmp_path, PREFILL), "--output",
            str(tmp_path / "table.txt")]  # fmt: skip
    assert cli_main(argv) == 1
    assert not library.entries
    assert "s300 d128 bf16 causal: no candidate ran; hand rules fwd_a" in capsys.readouterr().out


@pytest.mark.skipif(ckfmha.device_count() > 0, reason="checks behaviour without a GPU")
def test_tune_without_a_device_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["tune", "--problems", _problems_file(tmp_path, PREFILL)]) == 2
    assert "error: no CUDA device: ckfmha sees none" in capsys.readouterr().err


def test_tune_without_a_torch_device_exits_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(ckfmha, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli_main(["tune", "--problems", _problems_file(tmp_path, PREFILL)]) == 2
    assert "error: no CUDA device: torch sees no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "entry", "message"),
    [
        ([], {**PREFILL, "dtype": "fp8"}, "entry 0 (line 1): field 'dtype' is 'fp8'"),
        (["--repeats", "0"], PREFILL, "--iters and --repeats >= 1"),
    ],
)
def test_bad_input_exits_2_before_the_device_check(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
        entry: dict[str, Any], message: str) -> None:  # fmt: skip
    assert cli_main(["tune", "--problems", _problems_file(tmp_path, entry), *extra]) == 2
    assert message in capsys.readouterr().err
