"""README.md stays a user's guide: findings and long numbers go to docs/ and bench/results/."""

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
MAX_LINES = 300


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines (at most {MAX_LINES}): move depth to docs/"


def test_readme_links_resolve():
    import re

    for target in re.findall(r"\]\(([^)#\s]+)", README.read_text()):
        if not target.startswith(("http://", "https://")):
            assert (README.parent / target).exists(), f"README.md links {target}, which does not exist"
