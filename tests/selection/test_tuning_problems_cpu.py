"""The problems file of ``python -m ckfmha tune`` (ckfmha.tuning.problems): a JSON list or JSON
Lines, the defaults of the optional fields, and an error naming the entry and the field for
each kind of bad entry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import ckfmha
from ckfmha.tuning.inputs import explain_fields
from ckfmha.tuning.problems import ACCEPTED, VARLEN, TuningProblem, parse_problems, read_problems

PREFILL = {"batch": 2, "nhead_q": 32, "nhead_k": 8, "seqlen_q": 4096, "hdim": 128,
           "causal": True}  # fmt: skip
DECODE = {"batch": 64, "nhead_q": 32, "nhead_k": 8, "seqlen_q": 1, "seqlen_k": 8192,
          "hdim": 128}  # fmt: skip
BACKWARD = {"kind": "bwd", "batch": 2, "nhead_q": 16, "seqlen_q": 2048, "hdim": 192,
            "hdim_v": 128, "dtype": "fp16"}  # fmt: skip
EXPECTED = [
    TuningProblem("fwd", 2, 32, 8, 4096, 4096, 128, 128, "bf16", True, "top_left"),
    TuningProblem("fwd", 64, 32, 8, 1, 8192, 128, 128, "bf16", False, "top_left"),
    TuningProblem("bwd", 2, 16, 16, 2048, 2048, 192, 128, "fp16", False, "top_left"),
]


def test_a_json_list_takes_the_defaults() -> None:
    assert parse_problems(json.dumps([PREFILL, DECODE, BACKWARD], indent=2)) == EXPECTED


def test_json_lines_skip_blank_lines() -> None:
    text = "\n".join([json.dumps(PREFILL), "", json.dumps(DECODE), "  ", json.dumps(BACKWARD)])
    assert parse_problems(text + "\n") == EXPECTED
    # One object alone is a JSON Lines file of one line; null takes the default.
    nulls = {"kind": None, "nhead_k": 8, "hdim_v": None, "dtype": None, "causal": None}
    assert parse_problems(json.dumps({**DECODE, **nulls})) == EXPECTED[1:2]


def test_explicit_fields_and_labels() -> None:
    entry = {"kind": "fwd", "batch": 1, "nhead_q": 8, "nhead_k": 8, "seqlen_q": 100,
             "seqlen_k": 300, "hdim": 64, "hdim_v": 64, "dtype": "fp32", "causal": True,
             "causal_alignment": "bottom_right"}  # fmt: skip
    (problem,) = parse_problems(json.dumps([entry]))
    assert problem.fields() == {k: v for k, v in entry.items() if k != "kind"}
    assert problem.label == "fwd b1 h8 q100 k300 d64 fp32 causal bottom_right"
    assert EXPECTED[0].label == "fwd b2 h32/8 s4096 d128 bf16 causal"
    assert EXPECTED[2].label == "bwd b2 h16 s2048 d192x128 fp16"


def test_fields_are_the_dispatchers_keywords() -> None:
    # explain needs no GPU when it is given an arch: the fields must be ones it accepts.
    kernel = next(k for k in ckfmha.Registry().kernels() if k["family"] == "fwd")
    fields = EXPECTED[0].fields()
    assert set(fields) == set(ACCEPTED) - {"kind", *VARLEN}
    assert ckfmha.Dispatcher().explain(**fields, arch=kernel["arch"]).startswith("problem: fwd")


def test_a_varlen_entry_gives_its_sequences_lengths() -> None:
    entry = {"nhead_q": 32, "nhead_k": 8, "seqlens_q": [700, 1500, 90], "hdim": 128,
             "causal": True}  # fmt: skip
    (problem,) = parse_problems(json.dumps([entry]))
    assert (problem.batch, problem.seqlen_q, problem.seqlen_k) == (3, 1500, 1500)
    assert problem.seqlens_k == problem.seqlens_q == (700, 1500, 90)
    fields = problem.fields()
    assert (fields["mode"], fields["total_q"], fields["total_k"]) == ("group", 2290, 2290)
    assert "varlen q2290/max1500" in problem.label
    # The lengths make the inputs; explain takes the rest.
    kernel = next(k for k in ckfmha.Registry().kernels() if k["family"] == "fwd")
    explain = ckfmha.Dispatcher().explain(**explain_fields(fields), arch=kernel["arch"])
    assert explain.startswith("problem: fwd") and "group" in explain.splitlines()[0]


@pytest.mark.parametrize(("change", "message"), [
    ({"seqlens_q": [700, 0]}, r"field 'seqlens_q' is \[700, 0\]; accepted: a non-empty list"),
    ({"batch": 3}, r"field 'batch' comes from seqlens_q/k; leave it out"),
    ({"kind": "bwd"}, r"seqlens_q/k describe a varlen forward; kind must be 'fwd'"),
    ({"seqlens_k": [1, 2]}, r"seqlens_q has 3 sequences and seqlens_k 2"),
])  # fmt: skip
def test_bad_varlen_entries_name_the_flaw(change: dict, message: str) -> None:
    entry = {"nhead_q": 8, "seqlens_q": [7, 9, 4], "hdim": 64, **change}
    with pytest.raises(ValueError, match=message):
        parse_problems(json.dumps([entry]))


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([PREFILL, {**DECODE, "hdim": None}],
         r"entry 1: missing field 'hdim' \(required: batch, nhead_q, seqlen_q, hdim\)"),
        ([{**PREFILL, "heads": 8}], r"entry 0: unknown field 'heads'; accepted: kind, batch"),
        ([{**DECODE, "kind": "decode"}],
         r"entry 0: field 'kind' is 'decode'; accepted: 'fwd', 'bwd' \(a decode step is 'fwd'"),
        ([{**PREFILL, "dtype": "fp8"}], r"field 'dtype' is 'fp8'; accepted: 'bf16', 'fp16'"),
        ([{**PREFILL, "causal_alignment": "top"}], r"field 'causal_alignment' is 'top'"),
        ([{**PREFILL, "causal": 1}], r"field 'causal' is 1; accepted: true, false"),
        ([{**PREFILL, "causal": "yes"}], r"field 'causal' is 'yes'"),
        ([{**PREFILL, "seqlen_q": 0}], r"field 'seqlen_q' is 0; accepted: an integer >= 1"),
        ([{**PREFILL, "batch": True}], r"field 'batch' is True"),
        ([{**PREFILL, "hdim": 128.0}], r"field 'hdim' is 128.0"),
        ([{**PREFILL, "nhead_k": "8"}], r"field 'nhead_k' is '8'"),
        ([{**PREFILL, "nhead_k": 5}], r"entry 0: nhead_q 32 is not a multiple of nhead_k 5"),
        ([PREFILL, [1, 2]], r"entry 1: a problem is a JSON object, got list"),
    ],
)  # fmt: skip
def test_bad_entries_name_the_entry_and_field(entries: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_problems(json.dumps(entries))


def test_json_lines_errors_name_the_line() -> None:
    text = f"{json.dumps(PREFILL)}\n\n{json.dumps({**DECODE, 'dtype': 'int8'})}\n"
    with pytest.raises(ValueError, match=r"entry 1 \(line 3\): field 'dtype' is 'int8'"):
        parse_problems(text)
    with pytest.raises(ValueError, match=r"line 2: not JSON .*JSON Lines: one object per line"):
        parse_problems(f"{json.dumps(PREFILL)}\n{{batch: 2}}\n")


@pytest.mark.parametrize("text", ["", "\n  \n", "[]"])
def test_an_empty_file_is_an_error(text: str) -> None:
    with pytest.raises(ValueError, match="no problems"):
        parse_problems(text)


def test_a_broken_json_list_is_reported_as_one() -> None:
    with pytest.raises(ValueError, match=r"not a JSON list: .*line 2"):
        parse_problems('[{"batch": 2,\n "hdim": }]')


def test_read_problems_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "problems.json"
    path.write_text(json.dumps([PREFILL]))
    assert read_problems(path) == EXPECTED[:1]
    path.write_text(json.dumps([{**PREFILL, "dtype": "fp8"}]))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: entry 0: field 'dtype'"):
        read_problems(path)
    with pytest.raises(ValueError, match="cannot read the problems file .*missing.json"):
        read_problems(tmp_path / "missing.json")


def test_the_example_problems_file_parses() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "tune_problems.json"
    problems = read_problems(example)
    assert {p.kind for p in problems} == {"fwd", "bwd"}
    assert any(p.seqlens_q is not None for p in problems)  # a varlen entry among them
