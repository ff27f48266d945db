"""The test suite's layout: tests sit in a domain folder, tests/<domain>/test_*.py, and the
modules they share sit in tests/support/ (imported as `support.<module>`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from support.paths import REPO_ROOT

TESTS = REPO_ROOT / "tests"
SUPPORT = TESTS / "support"
# Modules pytest itself looks for, allowed anywhere.
PYTEST_FILES = {"conftest.py", "__init__.py"}


def _python_files() -> list[Path]:
    found = []
    for path in TESTS.rglob("*.py"):
        parts = path.relative_to(TESTS).parts
        if "__pycache__" not in parts and not any(part.startswith(".") for part in parts):
            found.append(path)
    return sorted(found)


def _is_test(path: Path) -> bool:
    return path.name.startswith("test_")


def test_no_test_file_sits_directly_in_tests() -> None:
    loose = [p.name for p in _python_files() if _is_test(p) and p.parent == TESTS]
    assert not loose, f"move these into a domain folder, tests/<domain>/: {loose}"


def test_helper_modules_live_in_support() -> None:
    helpers = [
        str(p.relative_to(TESTS))
        for p in _python_files()
        if not _is_test(p) and p.name not in PYTEST_FILES and SUPPORT not in p.parents
    ]
    assert not helpers, f"move these helpers into tests/support/: {helpers}"


def test_every_domain_is_listed_in_the_readme() -> None:
    # The README's "Tests" section is the list of domains: a new folder of tests joins it.
    readme = (REPO_ROOT / "README.md").read_text()
    tests_section = readme.split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    domains = sorted({p.parent.relative_to(TESTS).parts[0] for p in _python_files()
                      if _is_test(p) and p.parent != TESTS})  # fmt: skip
    missing = [d for d in domains if f"`tests/{d}/`" not in tests_section]
    assert not missing, f"list these domains in the README's Tests section: {missing}"


def test_test_basenames_are_unique() -> None:
    # pytest's default (prepend) import mode imports each test file under its basename.
    counts = Counter(p.name for p in _python_files() if _is_test(p))
    assert not [name for name, n in counts.items() if n > 1], counts.most_common(3)
