"""benchmarks/NOTES.md indexes the numbered entries of benchmarks/notes/*.md; citations resolve.

Code comments, the README and the notes themselves cite entries by number ("NOTES 41",
"NOTES entry 39", "`benchmarks/NOTES.md` entries 21, 37 and 41", "(entry 68)"). These tests
keep every such number pointing at exactly one entry, and the index row of each entry
pointing at the file and anchor that hold it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.paths import REPO_ROOT

INDEX = REPO_ROOT / "benchmarks" / "NOTES.md"
NOTES_DIR = REPO_ROOT / "benchmarks" / "notes"

ENTRY = re.compile(r"^(\d+)\. \*\*(.+?)\*\*", re.MULTILINE | re.DOTALL)
ANCHOR = re.compile(r'^<a id="entry-(\d+)"></a>$', re.MULTILINE)
INDEX_ROW = re.compile(
    r"^\| (\d+) \| \[([\w.]+)\]\(notes/([\w.]+)#entry-(\d+)\) \| (.+) \|$", re.MULTILINE
)
INDEX_TOPIC = re.compile(r"^- \[([\w.]+)\]\(notes/([\w.]+)\)", re.MULTILINE)

# A list of entry numbers and ranges: "22-27, 34, 50-52, 55-62, 74 and 75".
NUMBERS = r"\d+(?:-\d+)?(?:(?:,\s*|,?\s+and\s+)\d+(?:-\d+)?)*"
# "NOTES 33", "NOTES entry 67", "benchmarks/NOTES.md, entry 2", "`benchmarks/NOTES.md` entries 21".
NOTES_CITATION = re.compile(
    rf"NOTES(?:\.md)?`?,?\s+(?:entry\s+(\d+)\b|entries\s+({NUMBERS})|(\d+)\b)"
)
# Prose in the README and the notes continues with bare "entry 68" / "entries 31-33".
BARE_CITATION = re.compile(rf"\b[Ee](?:ntry\s+(\d+)\b|ntries\s+({NUMBERS}))")
# The notes were one file with sections; a section is now a file of benchmarks/notes/.
SECTION_CITATION = re.compile(r'NOTES\.md`?,\s*"')
NOTES_PATH = re.compile(r"benchmarks/notes/([\w.]+\.md)")

CODE_DIRS = ("cpp", "generator", "ckfmha", "tests", "examples")
CODE_SUFFIXES = {".py", ".pyx", ".pxd", ".pyi", ".c", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".md"}


@dataclass(frozen=True)
class Entry:
    number: int
    file: str
    title: str


def _entries() -> list[Entry]:
    found = []
    for path in sorted(NOTES_DIR.glob("*.md")):
        for m in ENTRY.finditer(path.read_text()):
            title = re.sub(r"\s+", " ", m.group(2)).rstrip(".")
            found.append(Entry(int(m.group(1)), path.name, title))
    return found


def _by_number() -> dict[int, Entry]:
    return {e.number: e for e in _entries()}


def _numbers(spec: str) -> list[int]:
    out = []
    for part in re.split(r",\s*|,?\s+and\s+", spec):
        first, _, last = part.partition("-")
        lo, hi = int(first), int(last or first)
        assert lo <= hi, f"backwards range {part!r}"
        out += range(lo, hi + 1)
    return out


def _joined(text: str) -> str:
    """Lines joined, comment leaders dropped, so that a citation may wrap."""
    return re.sub(r"\n[ \t]*(?://+|#+|\*)?[ \t]*", " ", text)


def _cited(text: str, bare: bool) -> list[int]:
    text = _joined(text)
    cited = []
    for m in NOTES_CITATION.finditer(text):
        one, many, plain = m.groups()
        cited += _numbers(many) if many else [int(one or plain)]
    if bare:
        for m in BARE_CITATION.finditer(text):
            one, many = m.groups()
            cited += _numbers(many) if many else [int(one)]
    return cited


def _citing_files() -> list[Path]:
    files = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "benchmarks").glob("*.py"))]
    files += sorted((REPO_ROOT / "benchmarks").glob("*.sh"))
    for top in CODE_DIRS:
        files += sorted(
            p
            for p in (REPO_ROOT / top).rglob("*")
            if p.is_file() and p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts
        )
    return files


def test_every_entry_number_appears_once_with_its_anchor() -> None:
    entries = _entries()
    assert entries, f"no entries found in {NOTES_DIR}"
    numbers = [e.number for e in entries]
    duplicates = sorted({n for n in numbers if numbers.count(n) > 1})
    assert not duplicates, f"entry numbers used twice: {duplicates}"
    missing = sorted(set(range(1, max(numbers) + 1)) - set(numbers))
    assert not missing, f"entry numbers missing: {missing}"
    for path in sorted(NOTES_DIR.glob("*.md")):
        text = path.read_text()
        anchors = [int(a) for a in ANCHOR.findall(text)]
        in_file = [int(m.group(1)) for m in ENTRY.finditer(text)]
        assert anchors == in_file, f"{path.name}: anchors {anchors} against entries {in_file}"
        for n in in_file:
            assert f'<a id="entry-{n}"></a>\n\n{n}. **' in text, f"{path.name}: entry {n}'s anchor"


def test_index_lists_each_entry_with_its_file_and_anchor() -> None:
    entries = _by_number()
    text = INDEX.read_text()
    rows = INDEX_ROW.findall(text)
    listed = [int(number) for number, *_ in rows]
    assert listed == sorted(entries), "the index must list every entry once, in number order"
    for number, shown, file, anchor, title in rows:
        entry = entries[int(number)]
        row = f"| {number} | [{shown}](notes/{file}#entry-{anchor}) | {title} |"
        assert shown == file == entry.file, f"{row}: entry {number} is in {entry.file}"
        assert anchor == number, f"{row}: anchor"
        assert entry.title.startswith(title.removesuffix(" …")), f"{row}: title of {entry.title!r}"
    topics = INDEX_TOPIC.findall(text)
    assert all(shown == file for shown, file in topics)
    assert sorted(file for file, _ in topics) == sorted(p.name for p in NOTES_DIR.glob("*.md"))


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("(NOTES 33); a", [33]),
        ("(NOTES\nentry 73)", [73]),
        ("see\n// benchmarks/NOTES.md, entry 2).", [2]),
        ("  // nor meet at a barrier (NOTES\n  // 74).", [74]),
        ("`benchmarks/NOTES.md` entries 21, 37 and 41 have", [21, 37, 41]),
        (
            "`benchmarks/NOTES.md` entries 22-24, 34,\n50-51, 74\nand 75.",
            [22, 23, 24, 34, 50, 51, 74, 75],
        ),
        ("`benchmarks/NOTES.md`\nentry 76); the", [76]),
        ("recorded in benchmarks/NOTES.md. 12 tiles", []),
    ],
)
def test_citation_forms_are_read(text: str, numbers: list[int]) -> None:
    assert _cited(text, bare=False) == numbers


def test_bare_entry_citations_take_a_list_only_after_entries() -> None:
    text = "built in entry 70 and 4-8% slower; entries 63, 64 and 66"
    assert _cited(text, bare=True) == [70, 63, 64, 66]


def test_citations_in_code_and_docs_resolve() -> None:
    entries = _by_number()
    unresolved = []
    total = 0
    for path in _citing_files():
        text = path.read_text(errors="replace")
        rel = path.relative_to(REPO_ROOT)
        cited = _cited(text, bare=path.suffix == ".md")
        total += len(cited)
        unresolved += [f"{rel}: entry {n}" for n in cited if n not in entries]
        if SECTION_CITATION.search(text):
            unresolved.append(f"{rel}: cites a NOTES.md section; cite benchmarks/notes/<file>.md")
        unresolved += [
            f"{rel}: no benchmarks/notes/{name}"
            for name in NOTES_PATH.findall(text)
            if not (NOTES_DIR / name).is_file()
        ]
    assert total > 0, "no citations found: the citation patterns no longer match the tree"
    assert not unresolved, "\n".join(unresolved)


def test_cross_references_between_entries_resolve() -> None:
    entries = _by_number()
    for path in sorted(NOTES_DIR.glob("*.md")):
        cited = _cited(path.read_text(), bare=True)
        unresolved = sorted({n for n in cited if n not in entries})
        assert not unresolved, f"{path.name} cites missing entries {unresolved}"
