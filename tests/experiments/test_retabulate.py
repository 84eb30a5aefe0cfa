"""Every committed quality grid's summary (bench/results/cpu-planner-quality*.json) re-tabulates from its raw runs
(the sibling .runs.json.xz) as `python -m experiments.quality --report-only` tabulates them: the same cells, the same
methods in each, the same numbers. No planner runs: methods that are no longer trained re-tabulate too.

A summary written by an earlier version of the tabulation holds fewer fields than today's (its cells' GEMMs kept above
FP4, its verdicts' per-rival margins and seeds to resolve came later, and its random ranks where none were drawn):
every field it holds must equal today's, under its name then."""

import json
from pathlib import Path

import pytest

from experiments.quality_table import retabulate
from experiments.results import read_runs

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
SUMMARIES = sorted(RESULTS.glob("cpu-planner-quality*.json"))
# a verdict's fields by their earlier names (before the judged method was a choice, it was always snip)
EARLIER_NAMES = {"snip_below_every_heuristic": "below_every_heuristic"}


def _as_stored(fresh: dict, stored: dict) -> dict:
    """`fresh`'s fields that `stored` holds, under the names `stored` gives them."""
    return {k: fresh.get(EARLIER_NAMES.get(k, k), "(not tabulated today)") for k in stored}


def test_there_are_summaries():
    assert len(SUMMARIES) >= 10


@pytest.mark.parametrize("path", SUMMARIES, ids=[p.name for p in SUMMARIES])
def test_the_summary_retabulates_from_its_raw_runs(path):
    stored = json.loads(path.read_text())
    fresh = json.loads(json.dumps(retabulate(stored, read_runs(path))))  # tuples as the summary's lists
    for part in ("table", "verdicts", "random_ranks"):
        assert set(fresh[part]) == set(stored.get(part, {})), f"{part}: other cells"
    for cell, methods in stored["table"].items():
        assert set(fresh["table"][cell]) == set(methods), f"table {cell}: other methods"
        for method, row in methods.items():
            assert _as_stored(fresh["table"][cell][method], row) == row, f"table {cell} {method}"
    for part in ("verdicts", "random_ranks"):
        for cell, entry in stored.get(part, {}).items():
            assert _as_stored(fresh[part][cell], entry) == entry, f"{part} {cell}"
