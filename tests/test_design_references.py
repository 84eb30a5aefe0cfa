"""Every "docs/design.md §N" that the code and the docs cite names a section that docs/design.md has."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("snip_ops", "planner", "snip_train", "csrc", "bench", "experiments", "tests", "docs", "scripts")
SUFFIXES = {".py", ".md", ".cu", ".cuh", ".h", ".cpp", ".sh"}
CITATION = re.compile(r"design\.md §(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?")


def _sections() -> set[str]:
    heads = re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", (ROOT / "docs" / "design.md").read_text(), flags=re.M)
    return set(heads)


def _files():
    yield ROOT / "README.md"
    for top in SOURCES:
        yield from (p for p in (ROOT / top).rglob("*") if p.suffix in SUFFIXES and p.is_file())


def test_every_design_citation_resolves():
    sections = _sections()
    assert {"1", "2", "3", "4", "4.1", "4.6", "5", "6", "7"} <= sections, sorted(sections)
    cited = 0
    for path in _files():
        for match in CITATION.finditer(path.read_text(errors="replace")):
            cited += 1
            for number in filter(None, match.groups()):
                assert number in sections, f"{path.relative_to(ROOT)} cites docs/design.md §{number}, which does not exist"
    assert cited >= 20


def test_no_citation_of_a_design_file_outside_the_tree():
    for path in _files():
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(errors="replace")
        assert not re.search(r"(?<![/\w])DESIGN\.md", text), f"{path.relative_to(ROOT)} cites DESIGN.md: cite docs/design.md"
