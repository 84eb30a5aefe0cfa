"""snip_train.train and the CLI. The fp8 / fp4_mlp tests exercise snip_ops.convert (the lead's module)."""

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

from snip_train import cli
from snip_train.errors import UsageError
from snip_train.model import Llama
from snip_train.train import (PLAN_PRESETS, TrainConfig, apply_precision, learning_rates, linear_precisions, lr_at,
                              resolve_plan, train)

FAST = dict(preset="tiny", batch_size=8, seq_len=64, max_bytes=1 << 20, eval_batches=2, progress=False)
# Over seeds 0-11 (mean +- sd): the untrained val loss is ln 256 + 0.05 +- 0.06 on text (the targets
# repeat, so one init's logits do not average out; test_model checks the init loss itself); over seeds
# 0-7: ln 300 + 0.02 +- 0.01 on uniform tokens, and 30 steps cut the train loss by 2.65 +- 0.11 and the
# val loss by 3.0 +- 0.1 (bf16, bf16_sr, bf16_nearest, fp8 alike). Every limit below is >= 6 sd away.


def test_train_bf16_loss_falls_and_writes_outputs(tmp_path):
    s = train(TrainConfig(steps=30, lr=3e-3, eval_interval=15, out_dir=str(tmp_path), **FAST))
    assert s["steps"] == 30 and not s["diverged"]
    assert abs(s["initial_val_loss"] - math.log(256)) < 0.45
    assert s["final_train_loss"] < s["initial_val_loss"] - 1.0
    assert s["final_val_loss"] < s["initial_val_loss"] - 1.0
    assert s["history"]["val"]["step"] == [0, 15, 30]
    assert s["plan"] is None and set(s["linear_precisions"].values()) == {"bf16"}
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["final_val_loss"] == s["final_val_loss"]  # JSON round-trips floats exactly
    assert on_disk["config"]["steps"] == 30 and on_disk["tokens_per_s"] > 0
    png = (tmp_path / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("weights", ["bf16_sr", "bf16_nearest"])
def test_train_bf16_weights_without_master_copy(weights):
    s = train(TrainConfig(steps=30, lr=3e-3, eval_interval=0, weights=weights, **FAST))
    assert not s["diverged"] and s["final_val_loss"] < s["initial_val_loss"] - 1.0
    assert s["compute_dtype"] == "bfloat16 (autocast)"
    with pytest.raises(ValueError, match="weights must be one of"):
        train(TrainConfig(steps=1, weights="fp16", **FAST))


def test_seed_determinism():
    cfg = dict(steps=4, eval_interval=0, **FAST)
    a = train(TrainConfig(seed=1, **cfg))["history"]["train"]["loss"]
    b = train(TrainConfig(seed=1, **cfg))["history"]["train"]["loss"]
    c = train(TrainConfig(seed=2, **cfg))["history"]["train"]["loss"]
    assert a == b and a != c


def test_token_file_with_larger_vocab(tmp_path):
    import numpy as np

    toks = np.random.default_rng(0).integers(0, 300, size=40_000).astype(np.uint16)
    np.save(tmp_path / "toks.npy", toks)
    s = train(TrainConfig(steps=2, eval_interval=0, corpus=str(tmp_path / "toks.npy"),
                          **{**FAST, "max_bytes": None}))
    assert s["model_config"]["vocab_size"] == 300 and s["data"]["vocab_size"] == 300
    assert abs(s["initial_val_loss"] - math.log(300)) < 0.1


def test_lr_schedule():
    cfg = TrainConfig(steps=100, lr=1.0, min_lr_ratio=0.1)
    lrs = [lr_at(i, cfg, 10) for i in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1)
    assert all(x >= y for x, y in zip(lrs[10:], lrs[11:]))


def test_learning_rates_are_the_loops_and_zero_after_the_run():
    """`learning_rates(cfg)` is what the loop sets at every step (the planner's horizon looks ahead along it),
    and 0 from cfg.steps on: the run takes no more steps."""
    cfg = TrainConfig(steps=6, eval_interval=0, lr=1e-2, warmup_steps=2, min_lr_ratio=0.1, **FAST)
    seen = []
    box = {}
    train(dataclasses.replace(cfg, on_setup=lambda model, opt: box.update(opt=opt),
                              on_step=lambda step, model, batch: seen.append(box["opt"].param_groups[0]["lr"])))
    schedule = learning_rates(cfg)
    assert seen == [schedule(step) for step in range(6)] == [lr_at(step, cfg, 2) for step in range(6)]
    assert schedule(6) == schedule(100) == 0.0


def test_hooks_are_called():
    calls = {"prepare": 0, "setup": 0, "steps": []}

    def prepare(model):
        calls["prepare"] += 1
        assert isinstance(model, Llama)
        return model

    def setup(model, opt):
        calls["setup"] += 1
        assert isinstance(opt, torch.optim.AdamW)

    def on_step(step, model, batch):
        calls["steps"].append(step)
        assert batch.shape == (FAST["batch_size"], FAST["seq_len"] + 1) and batch.dtype == torch.int64

    losses = []
    summary = train(TrainConfig(steps=3, eval_interval=0, prepare_model=prepare, on_setup=setup, on_step=on_step,
                                on_loss=lambda step, loss: losses.append((step, loss)), **FAST))
    assert calls == {"prepare": 1, "setup": 1, "steps": [0, 1, 2]}
    assert losses == list(enumerate(summary["history"]["train"]["loss"]))


def test_summary_reports_precisions_changed_during_training():
    def on_step(step, model, batch):
        if step == 1:
            for m in model.modules():
                if hasattr(m, "set_precision"):
                    m.set_precision("fp4")

    s = train(TrainConfig(steps=2, eval_interval=0, precision="fp8", on_step=on_step, **FAST))
    converted = lambda precs: {v for k, v in precs.items() if k != "lm_head"}  # noqa: E731 (lm_head stays bf16)
    assert converted(s["linear_precisions"]) == {"fp8"}
    assert converted(s["final_linear_precisions"]) == {"fp4"}


def test_resolve_plan(tmp_path):
    assert resolve_plan("bf16") is None and resolve_plan(None) is None
    assert resolve_plan("fp8") == "fp8"
    assert resolve_plan("fp4_mlp") == {"*.mlp.*": "fp4", "*": "fp8"}
    assert resolve_plan("fp4_mlp") is not PLAN_PRESETS["fp4_mlp"]  # a copy
    assert resolve_plan("nvfp4") == "nvfp4"
    plan = {"model.layers.0.mlp.down_proj": "fp4", "*": "fp8"}
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"plan": plan, "stats": {}}))
    assert resolve_plan(str(p)) == plan
    m = Llama("tiny")
    assert apply_precision(m, "bf16") is m and all(type(x) is nn.Linear for x in m.modules()
                                                   if isinstance(x, nn.Linear))


def test_cli_train(tmp_path, capsys):
    out = tmp_path / "run"
    rc = cli.main(["train", "--preset", "tiny", "--steps", "5", "--batch-size", "4", "--seq-len", "32",
                   "--max-bytes", "1M", "--eval-interval", "0", "--eval-batches", "1", "--seed", "3",
                   "--out", str(out), "--no-progress"])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 5 and s["config"]["seed"] == 3 and s["config"]["batch_size"] == 4
    assert (out / "loss.png").exists()
    text = capsys.readouterr().out
    assert "params" in text and "device" in text and "precision" in text
    assert text.strip().splitlines()[-1].startswith("done: 5 steps")


def test_cli_bench_runs_a_benchmark_module(capfd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # from anywhere: the benchmark runs in a process of its own, the source tree importable
    assert cli.main(["bench", "gemm", "--help"]) == 0  # the module's own help, GPU or not
    assert "--quick" in capfd.readouterr().out
    assert cli.main(["bench", "planner-cost", "--help"]) == 0
    assert "--ilp-only" in capfd.readouterr().out


def test_cli_doctor_without_a_gpu_says_so(capsys, tmp_path):
    assert cli.main(["doctor", "--results", str(tmp_path)]) == 0
    assert "no CUDA GPU here" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


def test_doctor_reports_a_failing_kernel(monkeypatch):
    """A kernel whose check fails is reported in its row (the error and where), not raised."""
    from snip_ops import self_check
    from snip_train.doctor import _check

    def failing(device):
        raise AssertionError("codes of e4m3/1x128/fp32/rne: differs from the reference")

    monkeypatch.setitem(self_check.CHECKS, "adamw", failing)
    row = _check("adamw", torch.device("cpu"))
    assert row["self_check"] == "FAIL" and "differs from the reference" in row["error"]


@pytest.mark.parametrize("kernel", ["fp8_gemm_nt_blockwise", "fp8_gemm_nt_blockwise_e5m2", "nvfp4_gemm_nt"])
def test_doctor_times_the_gemm_that_runs_the_kernel(monkeypatch, kernel):
    """The large-shape timing of a GEMM kernel quantizes the operands of the GEMM that kernel runs
    (E5M2 gradients for the E5M2 kernels), on the CPU with the path and timer stubbed."""
    from snip_ops import gemm_kernels, self_check
    from snip_ops.formats import E5M2
    from snip_train import doctor

    seen = {}

    def qgemm(a, b, path):
        seen.update(a=a.spec, b=b.spec, path=path)

    monkeypatch.setattr(doctor, "_LARGE", 256)
    monkeypatch.setattr(doctor, "_time", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(self_check, "gemm_case", lambda *args: None)
    monkeypatch.setattr(gemm_kernels, "qgemm", qgemm)
    row = doctor._large_gemm(kernel, torch.device("cpu"))
    path, name = self_check.GEMM_KERNELS[kernel]
    assert seen["path"] == path and row["gemm"].startswith(name)
    assert (seen["a"].element == E5M2) == ("e5m2" in kernel)


@pytest.mark.parametrize("model, group", [("aligned", 32), ("truncated_sum", 8)])
def test_doctor_accumulator_probe_names_the_model_the_kernel_follows(monkeypatch, model, group):
    """The probe's plumbing, on the CPU: with the kernel stubbed by one model of the accumulation,
    the probe names that model (so on a GPU its answer is the hardware's)."""
    from snip_ops import gemm_kernels
    from snip_ops.tensor_core_model import BLOCK_K, StepModel, blockwise_gemm, kernel_operands
    from snip_train import doctor

    results = []

    def qgemm(a, b, out_dtype, path):
        assert path == "sm90_fp8" and out_dtype == torch.float32 and b.spec.block == (BLOCK_K, BLOCK_K)
        results.append(blockwise_gemm(*kernel_operands(a, b), model=StepModel(model), group=group))
        return results[-1]

    monkeypatch.setattr(gemm_kernels, "qgemm", qgemm)
    probe = json.loads(json.dumps(doctor._accumulator_probe(torch.device("cpu"))))  # as the doctor's JSON holds it
    assert f"{model}/g{group}/p13" in probe["best_models"] and probe["best_match"] == 1.0
    assert 0 < probe["max_error_over_abs_product"] < 2.0**-8
    # The recorded outputs and the regenerated operands are the kernel's result and inputs, bit for bit:
    # a model can be fitted to a GPU's probe later, on the CPU.
    outputs = doctor.probe_outputs(probe)
    assert outputs.dtype == torch.float32 and torch.equal(outputs.view(torch.int32), results[0].view(torch.int32))
    a, b = doctor.accumulator_probe_operands(torch.device("cpu"))
    assert torch.equal(blockwise_gemm(*kernel_operands(a, b), model=StepModel(model), group=group), outputs)


def test_cli_parser():
    p = cli.build_parser()
    a = p.parse_args(["train", "--precision", "fp4_mlp", "--device", "cpu", "--max-bytes", "all"])
    assert a.precision == "fp4_mlp" and a.max_bytes is None and a.steps == 300
    assert cli.main([]) == 2
    with pytest.raises(UsageError, match="invalid choice: 'huge'"):
        p.parse_args(["train", "--preset", "huge"])


# ---- these use snip_ops.convert (the lead's module) -------------------------------------------

def test_fp4_mlp_plan_converts_the_right_layers():
    import snip_ops

    m = apply_precision(Llama("tiny"), "fp4_mlp")
    assert isinstance(m.model.layers[0].mlp.gate_proj, snip_ops.SnipLinear)
    assert isinstance(m.model.layers[0].self_attn.q_proj, snip_ops.SnipLinear)
    assert not isinstance(m.lm_head, snip_ops.SnipLinear)
    precs = linear_precisions(m)
    assert "fp4" in json.dumps(precs["model.layers.1.mlp.down_proj"])
    assert "fp8" in json.dumps(precs["model.layers.1.self_attn.o_proj"])
    assert precs["lm_head"] == "bf16"


def test_train_fp8_loss_falls(tmp_path):
    s = train(TrainConfig(steps=30, lr=3e-3, precision="fp8", eval_interval=0, out_dir=str(tmp_path), **FAST))
    assert not s["diverged"]
    assert s["plan"] == "fp8"
    assert s["precision_counts"].get("fp8") == 28
    assert s["final_train_loss"] < s["initial_val_loss"] - 1.0
    assert (tmp_path / "summary.json").exists()
