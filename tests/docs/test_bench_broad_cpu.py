"""The broad benchmark suite's cases (benchmarks/broad_cases.py, timed by bench_broad.py).

The suite is there so that no weak corner hides behind the 18 standard cases: these tests keep
its coverage (GQA groups, head counts, head dims, masks, unequal and non-power-of-two lengths,
decode batches and groups), keep its cases distinct and the standard ones among them, and check
the FLOP count of causal cases with unequal lengths against a brute-force count. The case list
needs no torch; the checks against bench_fwd.py and bench_bwd.py import it and skip without it.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from support.paths import REPO_ROOT, child_env

BENCHMARKS = REPO_ROOT / "benchmarks"


@pytest.fixture(scope="module")
def benchmarks_importable() -> Iterator[None]:
    # The benchmarks are scripts that import each other by name, as when run from benchmarks/.
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        yield


@pytest.fixture(scope="module")
def cases(benchmarks_importable: None) -> ModuleType:
    return importlib.import_module("broad_cases")


@pytest.fixture(scope="module")
def bench_broad(benchmarks_importable: None) -> ModuleType:
    pytest.importorskip("torch")
    return importlib.import_module("bench_broad")


def _is_power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


@pytest.mark.parametrize("kind", ["fwd", "bwd"])
def test_fwd_bwd_coverage(cases: ModuleType, kind: str) -> None:
    own = [c for c in cases.broad_cases() if c.kind == kind]
    assert {c.hdim_label for c in own} >= {"d64", "d96", "d128", "d192x128", "d256"}
    assert {c.causal for c in own} == {False, True}
    # Each head count with every group it divides into: 12 heads by 1 and 4, 24 and 40 by 1, 4, 8.
    pairs = {(c.nhead_q, c.group) for c in own}
    assert pairs >= {(12, 1), (12, 4), (24, 1), (24, 4), (24, 8), (40, 1), (40, 4), (40, 8)}
    lengths = {c.seqlen_q for c in own} | {c.seqlen_k for c in own}
    odd = {s for s in lengths if not _is_power_of_two(s)}
    assert min(odd) <= 1000 and max(odd) >= 12000, sorted(odd)
    assert any(c.causal and c.seqlen_q != c.seqlen_k for c in own)
    # About constant work per token: every case holds 16k-32k query tokens.
    assert all(16384 <= c.tokens <= 32768 for c in own), [c.label for c in own]


def test_decode_coverage(cases: ModuleType) -> None:
    own = [c for c in cases.broad_cases() if c.kind == "decode"]
    assert all(c.seqlen_q == 1 and not c.causal for c in own)
    assert {(c.batch, c.group) for c in own} >= {(b, g) for b in (1, 4, 32, 64) for g in (1, 4, 8)}
    assert {c.nhead_q for c in own} >= {32, 64}
    seqlens = [c.seqlen_k for c in own]
    assert min(seqlens) <= 1024 and max(seqlens) >= 32768
    assert any(not _is_power_of_two(s) for s in seqlens)


def test_no_case_repeats(cases: ModuleType) -> None:
    counts = Counter(c.key for c in cases.broad_cases())
    assert not [key for key, n in counts.items() if n > 1]


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(5, 13), (13, 5), (1, 9), (9, 1), (64, 200)])
def test_causal_unequal_lengths_count_visible_pairs(cases: ModuleType, seqlen_q: int,
                                                    seqlen_k: int) -> None:  # fmt: skip
    # Bottom-right alignment: query row i sees key j when j <= i + seqlen_k - seqlen_q.
    brute = sum(j <= i + seqlen_k - seqlen_q for i in range(seqlen_q) for j in range(seqlen_k))
    assert cases.visible_pairs(seqlen_q, seqlen_k, True) == brute
    fwd = cases.BroadCase("fwd", 2, 6, 2, seqlen_q, seqlen_k, 192, 128, True)
    assert fwd.flops == 2 * 2 * 6 * brute * (192 + 128)
    bwd = cases.BroadCase("bwd", 2, 6, 2, seqlen_q, seqlen_k, 64, 64, True)
    assert bwd.flops == 2.5 * 4 * 2 * 6 * brute * 64


def test_equal_lengths_keep_the_standard_convention(cases: ModuleType) -> None:
    # 4*b*h*s*s*d, halved when causal (bench_fwd.py's Case.flops), whatever the diagonal.
    full = cases.BroadCase("fwd", 2, 8, 8, 1000, 1000, 128, 128, False)
    assert full.flops == 4 * 2 * 8 * 1000 * 1000 * 128
    assert cases.BroadCase("fwd", 2, 8, 8, 1000, 1000, 128, 128, True).flops == full.flops / 2


def test_decode_bytes(cases: ModuleType) -> None:
    # bench_decode.py's count: q and o rows, k and v rows, 2 bytes an element.
    case = cases.BroadCase("decode", 4, 32, 8, 1, 4096, 128, 128, False)
    assert case.bytes_moved == 2 * 128 * (2 * 4 * 32 * 1 + 2 * 4 * 8 * 4096)


def test_quick_subset(cases: ModuleType) -> None:
    quick = cases.quick_cases()
    assert len(quick) == sum(cases.QUICK_COUNTS.values()) == 15
    assert Counter(c.kind for c in quick) == Counter(cases.QUICK_COUNTS)
    own = set(cases.broad_cases())
    assert all(c in own for c in quick) and len(set(quick)) == len(quick)
    assert {c.hdim_label for c in quick if c.kind == "fwd"} == {
        "d64", "d96", "d128", "d192x128", "d256"}


def test_standard_cases_are_included(bench_broad: ModuleType) -> None:
    import bench_bwd
    import bench_fwd

    suite = bench_broad.build_cases("bf16", quick=False, kinds=["fwd", "bwd", "decode"])
    assert len({c.key for c in suite}) == len(suite)
    hdims, seqlens = list(bench_fwd.STANDARD_HDIMS), list(bench_fwd.STANDARD_SEQLENS)
    for kind, module in (("fwd", bench_fwd), ("bwd", bench_bwd)):
        standard = [c for c in suite if c.kind == kind and c.standard]
        expected = module.standard_suite(hdims, seqlens)
        assert len(standard) == len(expected) == 18
        assert [(c.batch, c.nhead_q, c.seqlen_q, c.hdim, c.causal) for c in standard] == [
            (c.batch, c.heads, c.seqlen, c.hdim, c.causal) for c in expected
        ]
        # The same TFLOP/s as the standard suites report.
        assert [c.flops for c in standard] == [c.flops for c in expected]


def test_suite_fits_its_run_time(bench_broad: ModuleType, cases: ModuleType) -> None:
    # About five minutes on an H100 by broad_cases' estimate at the default settings.
    suite = bench_broad.build_cases("bf16", quick=False, kinds=["fwd", "bwd", "decode"])
    calls = bench_broad.calls_per_impl(bench_broad.WARMUP, bench_broad.ITERS, bench_broad.REPEATS)
    seconds = cases.estimated_run_seconds(suite, calls)
    assert 150 < seconds < 360, seconds


def test_list_runs_without_a_gpu() -> None:
    pytest.importorskip("torch")
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_broad.py"), "--list", "--quick"],
        capture_output=True, text=True, env=child_env(), timeout=120, check=True,
    )  # fmt: skip
    assert "15 cases (6 fwd, 5 bwd, 4 decode)" in result.stdout


def test_readme_counts_the_cases(bench_broad: ModuleType) -> None:
    suite = bench_broad.build_cases("bf16", quick=False, kinds=["fwd", "bwd", "decode"])
    counts = Counter(c.kind for c in suite)
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    claim = f"{counts['fwd']} forward, {counts['bwd']} backward and {counts['decode']} decode cases"
    assert claim in readme


@pytest.fixture(scope="module")
def broad_plot(benchmarks_importable: None) -> ModuleType:
    return importlib.import_module("broad_plot")


def _committed_runs() -> list[dict]:
    runs = sorted((BENCHMARKS / "results" / "broad").glob("*.json"))
    return [json.loads(path.read_text()) for path in runs]


def test_committed_runs_hold_what_the_plot_reads(broad_plot: ModuleType) -> None:
    runs = _committed_runs()
    assert runs, "the broad suite's latest runs are committed under benchmarks/results/broad"
    for run in runs:
        for row in run["rows"]:
            assert row["kind"] in broad_plot.KINDS
            assert broad_plot.hdim_label(row) in broad_plot.HDIM_COLOURS, row["label"]
            assert row["group"] == row["nhead_q"] // row["nhead_k"]
            assert row["seqlen_k"] > 0 and isinstance(row["causal"], bool)
        assert any(row.get("ratio_vs_torch_cudnn") for row in run["rows"])


def test_plot_draws_each_committed_run(broad_plot: ModuleType, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    run = _committed_runs()[0]
    # Without matplotlib the plot is skipped, not an error.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert broad_plot.plot_ratio_records(run["rows"], tmp_path / "none.png") is False
    monkeypatch.delitem(sys.modules, "matplotlib")
    pytest.importorskip("matplotlib")
    for i, run in enumerate(_committed_runs()):
        path = tmp_path / f"run{i}.png"
        assert broad_plot.plot_ratio_records(run["rows"], path, "title") is True
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
