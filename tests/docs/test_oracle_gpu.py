"""The selection oracle (benchmarks/oracle.py) on a GPU: it times the dispatcher's call and each
candidate its explain output lists, for a forward, a decode and a backward problem."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest
from support.paths import REPO_ROOT

pytestmark = pytest.mark.gpu
BENCHMARKS = REPO_ROOT / "benchmarks"


@pytest.fixture(scope="module")
def modules() -> Iterator[tuple[ModuleType, ModuleType]]:
    pytest.importorskip("torch")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        yield importlib.import_module("oracle_shapes"), importlib.import_module("oracle")


def test_oracle_times_every_candidate_and_the_dispatcher(
        modules: tuple[ModuleType, ModuleType]) -> None:  # fmt: skip
    shapes, oracle = modules
    args = argparse.Namespace(commit="test", warmup=1, iters=2, repeats=2)
    for problem in (shapes.BroadCase("fwd", 2, 8, 2, 300, 300, 128, 128, True),
                    shapes.BroadCase("decode", 4, 32, 4, 1, 4000, 128, 128, False),
                    shapes.BroadCase("bwd", 2, 8, 2, 300, 300, 128, 128, True)):
        rows = oracle.time_problem(problem, 0, args, "device")
        assert rows and set(rows[0]) == set(oracle.CSV_FIELDS)
        timed = [r for r in rows if r["ms"] is not None]
        assert timed and all(r["ms"] > 0 for r in timed), rows
        # Every candidate row names its kernel's algorithm; the fastest is timed in full, and
        # the hand rules' plan is one of the candidates.
        assert all(r["pipeline"] and r["tile_m"] > 0 for r in rows), rows
        assert min(timed, key=lambda r: r["ms"])["repeats"] == args.repeats
        assert sum(oracle.is_choice(r) for r in rows) == 1, rows
        summary = oracle.efficiency_summary(rows)[problem.kind]["all"]
        assert 0 < summary["worst"] <= 1.0
