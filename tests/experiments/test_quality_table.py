"""The quality grid's tabulation: run keys of every layout read back, gaps paired per seed and only under one numerics,
the verdict's margins and the seeds that would resolve them, the GEMMs a method's plans keep above FP4; and its cache:
each trained run is merged into the file as it is then, so processes that share it keep each other's runs."""

import json

import pytest

from experiments.common import check_paired
from experiments.quality_table import (QualityRun, grid, kept_above_fp4, quality_table, quality_verdicts,
                                       seeds_to_resolve)
from experiments.results import save_run, with_runs_from, write_runs


def test_run_keys_of_every_layout_read_back():
    run = QualityRun.of("tiny", 100, 0.8, "snip_signal_gemm", 3, 100, 50, 64)
    assert run.key == "tiny/100/0.8/snip_signal_gemm/3/100/50/e64/lr0.003" and QualityRun.from_key(run.key) == run
    for key in ("tiny/400/-/bf16/0/100/50", "tiny/400/0.75/snip/0/100/50/e64", "mini/100/-/uniform_fp4/2/100/50/e64/lr0.001"):
        assert QualityRun.from_key(key).key == key
    assert QualityRun.from_key("tiny/400/-/bf16/0/100/50").budget is None
    with pytest.raises(ValueError, match="not a quality run's key"):
        QualityRun.from_key("tiny/400/0.750/snip/0/100/50")


def test_the_grid_trains_the_ablation_at_the_middle_budget_and_budget_free_runs_once():
    runs = grid("tiny", [100], [0.5, 0.75, 0.8], [0], ["bf16", "snip_ld", "layer_type"], 100, 50, 64, ("snip_ld",))
    assert [(r.method, r.budget if r.method != "bf16" else "-") for r in runs] == [
        ("bf16", "-"), ("layer_type", 0.5), ("snip_ld", 0.75), ("layer_type", 0.75), ("layer_type", 0.8)]


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
    check_paired({"a": {}, "b": {}}, "cell")  # runs from before the digest: one kind, as they were
    for other in ({"numerics": "y"}, {}):
        with pytest.raises(SystemExit, match=r"cell: runs trained under different numerics .*SNIP_BENCH_CACHE"):
            check_paired({"a": {"numerics": "x"}, "b": other}, "cell")


def test_quality_table_refuses_a_seed_whose_branches_came_from_two_machines():
    runs = [QualityRun.of("tiny", 100, 0.8, m, s, 100, 50, 64) for m in ("bf16", "snip_gemm") for s in (0, 1)]
    done = {r.key: {"final_val_loss": 2.0 + 0.001 * (r.method != "bf16"), "fp4_fraction": 0.8, "plans": [],
                    "numerics": "x"} for r in runs}
    cell = quality_table(runs, done, [0.8], [100], [0, 1])["100/0.8"]
    assert cell["snip_gemm"]["gap_per_seed"] == pytest.approx([0.001, 0.001])
    done[runs[3].key]["numerics"] = "y"  # seed 1's SNIP branch trained elsewhere
    with pytest.raises(SystemExit, match="cell 100/0.8, seed 1: runs trained under different numerics"):
        quality_table(runs, done, [0.8], [100], [0, 1])


def test_runs_from_committed_results_join_the_cache_unless_they_differ(tmp_path):
    committed = tmp_path / "cpu-planner-quality-x.json"
    committed.write_text("{}")
    write_runs(committed, {"tiny/b": {"final_val_loss": 2.0}, "tiny/c": {"final_val_loss": 2.5}})
    done = {"tiny/a": {"final_val_loss": 1.0}, "tiny/b": {"final_val_loss": 2.0}}
    assert with_runs_from(done, [committed]) == {**done, "tiny/c": {"final_val_loss": 2.5}}
    assert with_runs_from(done, []) == done and len(done) == 2  # the cache's dict untouched
    with pytest.raises(SystemExit, match="run tiny/b differs from the one already read"):
        with_runs_from({"tiny/b": {"final_val_loss": 2.1}}, [committed])


def test_kept_above_fp4_counts_every_plans_gemms_by_kind():
    plan = {"precisions": {"a": "fp8", "b": {"fprop": "fp8", "dgrad": "fp4", "wgrad": "fp4"}, "c": "fp4"}}
    other = {"precisions": {"a": {"fprop": "fp4", "dgrad": "fp4", "wgrad": "fp8"}, "b": "fp4", "c": "fp4"}}
    kept = kept_above_fp4([{"plans": [plan]}, {"plans": [other]}])
    assert kept == {"fprop": 0.4, "dgrad": 0.2, "wgrad": 0.4}
    assert kept_above_fp4([{"plans": []}]) is None and kept_above_fp4([{"plans": [{"precisions": {"a": "fp4"}}]}]) is None
    assert kept_above_fp4([{"plans": [plan, {"step": 50}]}]) is None  # recorded before the plans' precisions were


def test_quality_verdicts_call_a_margin_resolved_beyond_two_standard_errors_of_every_paired_difference():
    def cell(**gaps):
        return {m: {"gap_per_seed": g, "mean_gap": sum(g) / len(g)} for m, g in gaps.items()}
    # below both heuristics on average, but random's paired difference (0.002, -0.001, 0.002) is within 2 SE
    table = {"100/0.8": cell(snip_gemm=[0.001, 0.003, 0.002], random_gemm=[0.003, 0.002, 0.004],
                             first_last_gemm=[0.011, 0.013, 0.012], snip_ld_gemm=[0.0, 0.0, 0.0])}
    v = quality_verdicts(table, "snip_gemm")["100/0.8"]
    assert v["below_every_heuristic"] and not v["resolved_below_every_heuristic"]
    assert set(v["margins"]) == {"random_gemm", "first_last_gemm"}  # the ablation is no rival
    assert v["best_heuristic"] == "random_gemm" and v["margin_standard_error"] == pytest.approx(0.001)
    assert v["margins"]["first_last_gemm"] == pytest.approx((0.01, 0.0))
    assert 12 <= v["seeds_to_resolve"] <= 13  # random's 0.001 +- 0.001 at 3 seeds: 2 SE fall below it beyond 12
    table["100/0.8"]["random_gemm"] = cell(x=[0.003, 0.0045, 0.0035])["x"]  # 0.0017 +- 0.0002 now
    v = quality_verdicts(table, "snip_gemm")["100/0.8"]
    assert v["resolved_below_every_heuristic"] and v["seeds_to_resolve"] == 3
    table["100/0.8"]["random_gemm"] = cell(x=[0.001, 0.003, 0.002])["x"]  # a tie: no number of seeds resolves it
    assert quality_verdicts(table, "snip_gemm")["100/0.8"]["seeds_to_resolve"] is None


def test_seeds_to_resolve_scale_the_standard_error_as_one_over_the_root_of_the_seeds():
    assert seeds_to_resolve({"a": (0.003, 0.003)}, 3) == 13  # 2 SE = 2 margins at 3 seeds: 4x the seeds, and one more
    assert seeds_to_resolve({"a": (0.003, 0.003), "b": (0.004, 0.001)}, 3) == 13  # the worst margin decides
    assert seeds_to_resolve({"a": (0.004, 0.001)}, 10) == 10  # resolved already
    assert seeds_to_resolve({"a": (0.004, 0.001), "b": (-0.0001, 0.001)}, 10) is None
    assert seeds_to_resolve({"a": (0.0, 0.001)}, 10) is None
