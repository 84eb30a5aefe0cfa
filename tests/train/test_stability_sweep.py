"""The stability sweep (snip_train.stability: sweep / cell / analysis / command): divergence detection on
a deliberately unstable setting, resumability, parallel workers, offline baseline rule, outputs; the paper's
preset and its sharpness recorded next to ours."""

import argparse
import dataclasses
import hashlib
import json

from planner.stability import DivergenceRule, EpsilonSharpnessConfig, parse_scheme
from snip_ops.formats import Rounding
from snip_train import cli
from snip_train.model import LlamaConfig
from snip_train.stability import Cell, SweepSpec, TrainingSetup, run_sweep
from snip_train.stability.analysis import judge, summarize
from snip_train.stability.command import add_sweep_arguments, spec_from_args
from snip_train.stability.presets import preset

MICRO = LlamaConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=64, max_seq_len=16)
SETUP = TrainingSetup(
    model=MICRO, steps=16, batch_size=4, seq_len=16, warmup_steps=2, max_bytes=200_000, eval_batches=1,
    sharpness_every=8, divergence=DivergenceRule(blowup_patience=5),
)
STABLE_LR, UNSTABLE_LR = 3e-3, 1e3  # AdamW at lr 1000 moves every weight by ~1000 per step


def _spec(**kw):
    return SweepSpec(**{"precisions": ("fp32", "e8m3"), "learning_rates": (STABLE_LR, UNSTABLE_LR),
                        "seeds": (0,), "setup": SETUP, **kw})


def test_unstable_setting_diverges_and_sweep_resumes(tmp_path):
    spec = _spec()
    first = run_sweep(spec, tmp_path, workers=1, torch_threads=1, progress=False)
    assert len(first.ran) == 4 and not first.reused and not first.errors
    verdicts = {(v["precision"], v["lr"]): v for v in judge(first.records, "fp32", 0.3)}
    for p in spec.precisions:
        assert verdicts[(p, STABLE_LR)]["diverged"] is False
        assert verdicts[(p, UNSTABLE_LR)]["diverged"] is True
        assert verdicts[(p, UNSTABLE_LR)]["reason"] in ("non-finite", "blow-up")
        assert verdicts[(p, UNSTABLE_LR)]["steps"] < SETUP.steps          # stopped early
    stable = next(r for r in first.records if r["cell"]["lr"] == STABLE_LR)
    assert [s["step"] for s in stable["sharpness"]] == [8, 16] and stable["spikes"] == 0

    again = run_sweep(spec, tmp_path, workers=1, torch_threads=1, progress=False)         # nothing left to do
    assert not again.ran and sorted(again.reused) == sorted(first.ran)
    assert again.records == first.records

    # a lost and a half-written cell are rerun, the rest reused; a larger grid only adds its new cells
    cells = sorted((tmp_path / "cells").glob("*.json"))
    cells[0].unlink()
    cells[1].write_text('{"key": ')
    bigger = run_sweep(_spec(seeds=(0, 1)), tmp_path, workers=1, torch_threads=1, progress=False)
    assert len(bigger.ran) == 2 + 4 and len(bigger.reused) == 2


def test_parallel_workers_match_serial(tmp_path):
    spec = _spec(precisions=("fp32",), learning_rates=(STABLE_LR,), seeds=(0, 1))
    parallel = run_sweep(spec, tmp_path / "parallel", workers=2, torch_threads=1, progress=False)
    serial = run_sweep(spec, tmp_path / "serial", workers=1, torch_threads=1, progress=False)
    assert len(parallel.ran) == 2 and not parallel.errors
    assert [r["final_loss"] for r in parallel.records] == [r["final_loss"] for r in serial.records]


def _record(precision, lr, seed, final_loss, online=False, sharpness=1.0):
    return {"cell": {"precision": precision, "lr": lr, "seed": seed}, "status": "diverged" if online else "complete",
            "diverged_online": online, "divergence_reason": "blow-up" if online else None, "final_loss": final_loss,
            "spikes": 0, "steps": 10, "sharpness": [{"step": 5, "random": {"mean": sharpness}}]}


def test_offline_rule_compares_with_the_baseline_mean_at_the_same_lr():
    records = [
        _record("fp32", 0.1, 0, 3.0), _record("fp32", 0.1, 1, 3.2),          # baseline mean 3.1
        _record("e4m3", 0.1, 0, 3.35), _record("e4m3", 0.1, 1, 3.45, sharpness=3.0),  # 3.45 > 3.1 + 0.3
        _record("fp32", 1.0, 0, None, online=True, sharpness=2.0), _record("e4m3", 1.0, 0, 9.0),  # no baseline at lr 1
    ]
    got = {(v["precision"], v["lr"], v["seed"]): v["reason"] for v in judge(records, "fp32", 0.3)}
    assert got == {("fp32", 0.1, 0): None, ("fp32", 0.1, 1): None, ("e4m3", 0.1, 0): None,
                   ("e4m3", 0.1, 1): "above-baseline", ("fp32", 1.0, 0): "blow-up", ("e4m3", 1.0, 0): None}
    summary = summarize(records, "fp32", 0.3)
    assert summary["table"]["e4m3"]["by_lr"]["0.1"]["rate"] == 0.5
    assert summary["table"]["fp32"]["stable_lrs"] == [0.1]
    assert summary["early_sharpness_step"] == 5
    assert summary["sharpness_vs_divergence"]["random"]["all"]["auc"] == 1.0


def test_cell_key_is_a_hash_of_the_whole_configuration():
    a = Cell("e8m3", 0.01, 0, SETUP)
    assert a.key() == Cell("e8m3", 0.01, 0, SETUP).key()
    assert len({a.key(), Cell("e8m3", 0.01, 1, SETUP).key(), Cell("e8m2", 0.01, 0, SETUP).key(),
                Cell("e8m3", 0.01, 0, TrainingSetup(model=MICRO, seq_len=16, steps=25)).key()}) == 4
    # the time limit only bounds a run: raising it keeps the finished cells
    assert Cell("e8m3", 0.01, 0, dataclasses.replace(SETUP, time_limit_s=1.0)).key() == a.key()


def test_cli_writes_report_heatmaps_and_resumes(tmp_path, capsys):
    args = ["sweep", "--preset", "cpu-quick", "--precisions", "fp32,e5m2", "--lrs", "0.01", "--seeds", "0",
            "--steps", "4", "--batch-size", "2", "--seq-len", "16", "--sharpness-every", "2",
            "--workers", "1", "--threads", "1", "--no-progress", "--out", str(tmp_path)]
    assert cli.main(args) == 0
    for name in ("summary.json", "report.md", "heatmap.png", "sharpness.png", "sweep.json"):
        assert (tmp_path / name).stat().st_size > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["precisions"] == ["fp32", "e5m2"] and summary["cells"] == 2
    assert "| e5m2 |" in (tmp_path / "report.md").read_text()
    assert cli.main(args + ["--report-only"]) == 0
    assert "0 trained now, 2 reused" in capsys.readouterr().out


def test_time_limited_cells_are_incomplete_and_retried_with_a_larger_limit(tmp_path):
    spec = _spec(precisions=("fp32",), learning_rates=(STABLE_LR,), setup=dataclasses.replace(SETUP, time_limit_s=0.0))
    first = run_sweep(spec, tmp_path, workers=1, torch_threads=1, progress=False)
    assert first.records[0]["status"] == "time_limit" and first.records[0]["steps"] == 1
    assert judge(first.records, "fp32", 0.3)[0]["diverged"] is None
    assert not run_sweep(spec, tmp_path, workers=1, torch_threads=1, progress=False).ran
    longer = dataclasses.replace(spec, setup=dataclasses.replace(SETUP, time_limit_s=600.0))
    assert run_sweep(longer, tmp_path, workers=1, torch_threads=1, progress=False).records[0]["status"] == "complete"


def test_paper_preset_is_the_papers_simulation_and_records_both_sharpness_metrics(tmp_path):
    spec = preset("cpu-paper")
    formats = [f"e8m{m}" for m in range(7, 0, -1)] + ["e7m2", "e6m2"]
    assert spec.precisions == ("fp32", *(f"{f}:trunc" for f in formats))
    for name in spec.precisions[1:]:
        scheme = parse_scheme(name)
        assert scheme.rounding == Rounding.TRUNC and scheme.scaling is None
        assert scheme == parse_scheme(name.replace("trunc", "paper"))
    assert spec.setup.epsilon_sharpness == EpsilonSharpnessConfig()
    # its setup is cpu-quick's but for the paper's sharpness: the same weights and batches per seed
    quick = preset("cpu-quick").setup
    assert dataclasses.replace(spec.setup, epsilon_sharpness=None) == quick

    setup = dataclasses.replace(SETUP, epsilon_sharpness=EpsilonSharpnessConfig(steps=2))
    outcome = run_sweep(_spec(precisions=("fp32", "e6m2:trunc"), learning_rates=(STABLE_LR,), setup=setup),
                        tmp_path, workers=1, torch_threads=1, progress=False)
    for record in outcome.records:
        assert [set(m) for m in record["sharpness"]] == [{"step", "random", "gradient", "epsilon"}] * 2
        assert record["sharpness"][0]["epsilon"]["mean"] >= 0 and record["epsilon_sharpness_time_s"] > 0
    summary = summarize(outcome.records, "fp32", 0.3)
    assert summary["table"]["e6m2:trunc"]["by_lr"][repr(STABLE_LR)]["median_early_sharpness"]["epsilon"] >= 0
    assert all(v["early_sharpness"]["epsilon"] is not None for v in summary["verdicts"])


def test_an_unmeasured_epsilon_sharpness_keeps_cell_keys_and_measuring_it_changes_them():
    plain = Cell("e8m3", 0.01, 0, SETUP)
    identity = plain.to_json()
    identity["setup"] = {k: v for k, v in identity["setup"].items() if k not in ("time_limit_s", "epsilon_sharpness")}
    assert plain.key() == hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
    measured = Cell("e8m3", 0.01, 0, dataclasses.replace(SETUP, epsilon_sharpness=EpsilonSharpnessConfig()))
    assert measured.key() != plain.key()


def test_cli_eps_option_turns_the_papers_sharpness_on_and_off():
    parser = argparse.ArgumentParser()
    add_sweep_arguments(parser)
    assert spec_from_args(parser.parse_args(["--preset", "cpu-quick"])).setup.epsilon_sharpness is None
    assert spec_from_args(parser.parse_args(["--preset", "cpu-quick", "--eps", "5e-4"])).setup.epsilon_sharpness.eps == 5e-4
    assert spec_from_args(parser.parse_args(["--preset", "cpu-paper", "--eps", "0"])).setup.epsilon_sharpness is None
    assert spec_from_args(parser.parse_args(["--preset", "cpu-paper"])).setup.epsilon_sharpness.eps == 1e-3
