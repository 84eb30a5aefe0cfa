"""The committed measurements stay small enough to travel with the tree and say how they were made.

bench/results holds every number the docs cite. The raw runs of the planner-quality grids are most of
its bytes, so they live compressed beside their summaries (`<stem>.runs.json.xz`); the summaries are
re-tabulated from them in tests/experiments/test_retabulate.py."""

import json
import lzma
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
LIMIT_BYTES = 10 * 1000 * 1000
JSON_FILES = sorted(p for p in RESULTS.glob("*.json"))


def test_results_fit_the_budget():
    total = sum(p.stat().st_size for p in RESULTS.rglob("*") if p.is_file())
    assert total <= LIMIT_BYTES, f"bench/results holds {total} bytes, more than {LIMIT_BYTES}: compress or prune raw runs"


def _commands(record) -> list[str]:
    """The commands a results record names: its own, its context's, or those of its sub-records (a GPU
    session's record lists its runs, each with the command it ran or the file that command wrote)."""
    if isinstance(record, list):
        return [c for r in record for c in _commands(r)]
    if not isinstance(record, dict):
        return []
    if isinstance(record.get("command"), str):
        return [record["command"]]
    context = record.get("context")
    if isinstance(context, dict) and isinstance(context.get("command"), str):
        return [context["command"]]
    subs = [r for key in ("records", "runs") if isinstance(record.get(key), list) for r in record[key]]
    found = [_commands(r) for r in subs]
    return [c for cs in found for c in cs]


@pytest.mark.parametrize("path", JSON_FILES, ids=[p.name for p in JSON_FILES])
def test_each_result_names_its_command_and_commit(path):
    record = json.loads(path.read_text())
    if isinstance(record, list):  # a sweep's per-cell rows: the sibling summary without "-cells" names them
        summary = path.with_name(path.name.replace("-cells.json", ".json"))
        assert summary != path and summary.exists(), f"{path.name}: rows without a summary file"
        return
    assert _commands(record), f"{path.name} does not say which command made it"
    has_commit = "commit" in record or "recorded_in" in record or \
        all("commit" in r for r in record.get("records", [])) and record.get("records")
    assert has_commit, f"{path.name} does not say which commit made it ('commit', or 'recorded_in' where the " \
                       "run's own commit was not recorded)"


def test_raw_runs_live_compressed_beside_their_summary():
    summaries = [p for p in JSON_FILES if p.name.startswith("cpu-planner-quality")]
    assert summaries
    for path in summaries:
        assert "runs" not in json.loads(path.read_text()), f"{path.name} holds raw runs: move them to .runs.json.xz"
        runs = path.with_name(path.stem + ".runs.json.xz")
        assert runs.exists(), f"{path.name} has no {runs.name}"
    for runs in RESULTS.glob("*.runs.json.xz"):
        assert runs.with_name(runs.name.replace(".runs.json.xz", ".json")).exists(), f"{runs.name} has no summary"
        assert isinstance(json.loads(lzma.decompress(runs.read_bytes()))["runs"], dict)
