"""bench_planner.py's quality cache: each trained run is merged into the file as it is then, so bench processes that
share the cache (another preset or cell at the same time) keep each other's runs; runs trained under other numerics
(another machine or checkpoint) are never paired."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import pytest  # noqa: E402

from bench_planner import QualityRun, check_paired, quality_table, save_run, with_runs_from  # noqa: E402


def test_save_run_merges_with_what_another_process_wrote(tmp_path):
    cache = tmp_path / "quality-runs.json"
    save_run(cache, "tiny/run-a", {"final_val_loss": 2.0})
    cache.write_text(json.dumps({**json.loads(cache.read_text()), "mini/run-b": {"final_val_loss": 1.5}}))  # another process
    save_run(cache, "tiny/run-c", {"final_val_loss": 2.5})
    assert json.loads(cache.read_text()) == {"tiny/run-a": {"final_val_loss": 2.0}, "mini/run-b": {"final_val_loss": 1.5},
                                             "tiny/run-c": {"final_val_loss": 2.5}}
    save_run(cache, "tiny/run-a", {"final_val_loss": 2.25})  # a retrained run replaces its entry
    assert json.loads(cache.read_text())["tiny/run-a"] == {"final_val_loss": 2.25}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quality-runs.json", "quality-runs.lock"]


def test_runs_are_paired_only_under_one_numerics():
    check_paired({"a": {"numerics": "x"}, "b": {"numerics": "x"}}, "cell")
    check_paired({"a": {}, "b": {}}, "cell")  # a cache from before the digest: one kind, as it was
    for other in ({"numerics": "y"}, {}):
        with pytest.raises(SystemExit, match=r"cell: runs trained under different numerics .*SNIP_BENCH_CACHE"):
            check_paired({"a": {"numerics": "x"}, "b": other}, "cell")


def test_quality_table_refuses_a_seed_whose_branches_came_from_two_machines():
    runs = [QualityRun("tiny", 100, 0.8, m, s, 100, 50, 64) for m in ("bf16", "snip_gemm") for s in (0, 1)]
    done = {r.key: {"final_val_loss": 2.0 + 0.001 * (r.method != "bf16"), "fp4_fraction": 0.8, "plans": [],
                    "numerics": "x"} for r in runs}
    cell = quality_table(runs, done, [0.8], [100], [0, 1])["100/0.8"]
    assert cell["snip_gemm"]["gap_per_seed"] == pytest.approx([0.001, 0.001])
    done[runs[3].key]["numerics"] = "y"  # seed 1's SNIP branch trained elsewhere
    with pytest.raises(SystemExit, match="cell 100/0.8, seed 1: runs trained under different numerics"):
        quality_table(runs, done, [0.8], [100], [0, 1])


def test_runs_from_committed_results_join_the_cache_unless_they_differ(tmp_path):
    committed = tmp_path / "committed.json"
    committed.write_text(json.dumps({"runs": {"tiny/b": {"final_val_loss": 2.0}, "tiny/c": {"final_val_loss": 2.5}}}))
    done = {"tiny/a": {"final_val_loss": 1.0}, "tiny/b": {"final_val_loss": 2.0}}
    assert with_runs_from(done, [committed]) == {**done, "tiny/c": {"final_val_loss": 2.5}}
    assert with_runs_from(done, []) == done and len(done) == 2  # the cache's dict untouched
    with pytest.raises(SystemExit, match="run tiny/b differs from the one already read"):
        with_runs_from({"tiny/b": {"final_val_loss": 2.1}}, [committed])
