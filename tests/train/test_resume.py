"""Exact resume (snip_train.checkpoint, `snip train --checkpoint-interval N` / `--resume DIR`): a run killed
with SIGKILL -- between steps, or in the middle of writing a checkpoint -- and resumed ends bit for bit
where the uninterrupted run ends (loss history, evaluations, final weights, plan), with and without a
live planner; a damaged checkpoint, or one of another run, is refused with a clear error."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from snip_train import cli
from snip_train.checkpoint import CHECKPOINT_FILE, KILL_ENV, load_checkpoint
from snip_train.errors import UsageError
from snip_train.model import LlamaConfig
from snip_train.train import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[2]
STEPS = 24
# The smallest preset on 2 x 16-token batches, a checkpoint every 2 steps, evaluations at 0, 5, 10, ... and
# the end; --save writes the final weights (model.pt).
RUN = ["train", "--preset", "tiny", "--steps", str(STEPS), "--batch-size", "2", "--seq-len", "16", "--max-bytes",
       "256k", "--eval-interval", "5", "--eval-batches", "1", "--threads", "1", "--no-progress", "--save",
       "--checkpoint-interval", "2", "--name", "run"]
PLANNER = ["--precision", "snip", "--planner-interval", "4", "--planner-calib-batch", "1"]
# Measured, not computed: a resumed run's timings are its own.
TIMINGS = ("tokens_per_s", "step_time_s", "train_time_s", "eval_time_s", "checkpoint_time_s", "setup_time_s",
           "time_s", "torch_threads")


def _argv(planner: bool, out: Path, *more: str) -> list[str]:
    return [*RUN, *(PLANNER if planner else []), "--out", str(out), *more]


def _start(argv: list[str], **env: str) -> subprocess.Popen:
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen([sys.executable, "-m", "snip_train", *argv], cwd=REPO, env=environ,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _kill_after_first_checkpoint(argv: list[str], out: Path) -> None:
    proc = _start(argv)
    checkpoint = out / CHECKPOINT_FILE
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    err = proc.communicate()[1].decode()
    assert proc.returncode == -signal.SIGKILL, f"the run ended on its own before the kill: {err[-2000:]}"
    assert not (out / "summary.json").exists()  # killed mid-way, not after the last step


def _outcome(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").exists() else None
    if plan is not None:  # the measured numbers of a plan: the solver's and the measurement's wall times
        plan["metrics"].pop("solve_time_s")
        diagnostics = plan["stats"]["diagnostics"]
        for key in [k for k in diagnostics if k.startswith("time_")]:
            diagnostics.pop(key)
    summary["config"].pop("out_dir")  # the one difference between the two runs' commands
    return {"summary": {k: v for k, v in summary.items() if k not in TIMINGS + ("resumed_at", "out_dir")},
            "plan": plan,
            "weights": torch.load(out / "model.pt", weights_only=True)["model"], "resumed_at": summary["resumed_at"]}


def _assert_same_run(resumed: dict, whole: dict) -> None:
    assert resumed["summary"]["history"] == whole["summary"]["history"]  # every loss, lr, norm, evaluation
    assert resumed["summary"] == whole["summary"]
    assert resumed["plan"] == whole["plan"]
    a, b = resumed["weights"], whole["weights"]
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert whole["resumed_at"] == [] and len(resumed["resumed_at"]) == 1


@pytest.fixture(scope="module", params=[False, True], ids=["bf16", "planner"])
def uninterrupted(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    assert cli.main(_argv(request.param, out)) == 0
    return request.param, out


def test_the_summary_names_the_precision_that_ran(uninterrupted):
    planner, whole = uninterrupted
    summary = json.loads((whole / "summary.json").read_text())
    assert (summary["precision"], summary["initial_precision"]) == (("snip", "bf16") if planner else ("bf16", "bf16"))


def test_a_run_killed_between_steps_resumes_bit_for_bit(uninterrupted, tmp_path):
    planner, whole = uninterrupted
    out = tmp_path / "run"
    _kill_after_first_checkpoint(_argv(planner, out), out)
    assert cli.main(["train", "--resume", str(out)]) == 0  # the checkpoint holds the run's flags
    _assert_same_run(_outcome(out), _outcome(whole))


def test_a_resumed_run_may_take_more_steps(uninterrupted, tmp_path, capsys):
    """--steps beside --resume extends the run: the history so far and the warmup are the run's, the
    cosine decay spans the new length; fewer steps than the checkpoint's is refused."""
    planner, whole = uninterrupted
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    at = load_checkpoint(out).state.step
    assert cli.main(["train", "--resume", str(out), "--steps", str(at)]) == 2
    assert f"the checkpoint is at step {at}" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(out), "--steps", str(STEPS + 6)]) == 0
    longer = json.loads((out / "summary.json").read_text())
    before = json.loads((whole / "summary.json").read_text())["history"]["train"]
    train_history = longer["history"]["train"]
    assert train_history["step"] == list(range(1, STEPS + 7)) and longer["config"]["steps"] == STEPS + 6
    for key in ("loss", "lr", "grad_norm"):
        assert train_history[key][:at] == before[key][:at], key
    warmup = max(1, min(100, STEPS // 10))  # the run's default warmup, not the longer run's
    assert train_history["lr"].index(max(train_history["lr"])) == warmup - 1
    assert train_history["lr"][at] > before["lr"][at]  # the decay spans more steps


def test_a_kill_inside_a_checkpoint_write_keeps_the_previous_checkpoint(uninterrupted, tmp_path):
    planner, whole = uninterrupted
    out = tmp_path / "run"
    proc = _start(_argv(planner, out), **{KILL_ENV: "2"})  # dies half-way through writing the step-4 checkpoint
    err = proc.communicate()[1].decode()
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    partial = out / (CHECKPOINT_FILE + ".tmp")
    assert partial.exists() and 0 < partial.stat().st_size < (out / CHECKPOINT_FILE).stat().st_size
    assert load_checkpoint(out).state.step == 2  # the previous one, whole
    assert cli.main(_argv(planner, out, "--resume", str(out))) == 0
    _assert_same_run(_outcome(out), _outcome(whole))


def test_a_checkpoint_of_another_run_is_refused(uninterrupted, capsys):
    planner, whole = uninterrupted
    base = _argv(planner, whole, "--resume", str(whole))
    mismatches = [(["--batch-size", "4"], "batch_size: checkpoint 2, this run 4"),
                  (["--preset", "mini"], "preset: checkpoint 'tiny', this run 'mini'")]
    if planner:
        mismatches += [(["--planner-candidates", "fp8,nvfp4"], "candidates: checkpoint ['fp8', 'fp4']"),
                       (["--fp4-fraction", "0.5"], "budget")]
    else:
        mismatches += [(["--precision", "snip"], "written by a run without training-loop hooks")]
    for flags, message in mismatches:
        assert cli.main([*base, *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith("snip: error: ") and message in err and err.count("\n") == 1, err
        assert cli.main(["train", "--resume", str(whole), *flags]) == 2  # typed beside --resume alone
        assert message in capsys.readouterr().err
    if planner:  # the same run without its planner
        assert cli.main(_argv(False, whole, "--resume", str(whole), "--precision", "bf16")) == 2
        assert "written by a run with training-loop hooks" in capsys.readouterr().err


# ---- the checkpoint file ---------------------------------------------------------------------------------

MODEL = LlamaConfig(dim=64, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=128, max_seq_len=16)
SMALL = dict(model=MODEL, steps=6, batch_size=2, seq_len=16, max_bytes=1 << 18, eval_batches=1, eval_interval=4,
             progress=False, checkpoint_interval=2)


@pytest.mark.parametrize("weights,precision", [("fp32", "bf16"), ("bf16_sr", "fp4")])
def test_library_resume_from_a_checkpoint_file(tmp_path, weights, precision):
    """train(cfg, resume=load_checkpoint(dir)) from each checkpoint continues the run exactly, BF16+SR
    optimizer and SR counters included."""
    cfg = TrainConfig(out_dir=str(tmp_path), weights=weights, precision=precision, **SMALL)
    whole = train(cfg, stop_at=cfg.steps)
    for step in (2, 4):
        head = train(cfg, stop_at=step + 1)  # its last checkpoint is the one of `step`
        ckpt = load_checkpoint(tmp_path)
        assert ckpt.state.step == step and ckpt.history["train"]["step"] == list(range(1, step + 1))
        assert ckpt.history["train"]["loss"] == head["history"]["train"]["loss"][:step]
        rest = train(cfg, resume=ckpt, stop_at=cfg.steps)
        assert rest["history"] == whole["history"] and rest["resumed_at"] == [step]
        assert rest["state"].sr_counters == whole["state"].sr_counters
        assert all(torch.equal(rest["state"].model[k], whole["state"].model[k]) for k in whole["state"].model)
        moments = rest["state"].optimizer["state"], whole["state"].optimizer["state"]
        assert all(torch.equal(a, moments[1][i][k]) for i, st in moments[0].items() for k, a in st.items())


def test_damaged_or_missing_checkpoints_are_refused(tmp_path):
    cfg = TrainConfig(out_dir=str(tmp_path), **SMALL)
    train(cfg)
    path = tmp_path / CHECKPOINT_FILE
    data = path.read_bytes()
    with pytest.raises(UsageError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "elsewhere")
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError, match="damaged"):
        load_checkpoint(tmp_path)
    flipped = bytearray(data)
    flipped[-100] ^= 0x01  # one bit
    path.write_bytes(bytes(flipped))
    with pytest.raises(UsageError, match="damaged"):
        load_checkpoint(tmp_path)
    path.write_bytes(b"PK\x03\x04 a zip, not ours")
    with pytest.raises(UsageError, match="not a snip checkpoint"):
        load_checkpoint(path)
    path.write_bytes(data)
    assert load_checkpoint(path).state.step == 4
    with pytest.raises(UsageError, match="another run: lr: checkpoint 0.003, this run 0.001"):
        train(TrainConfig(out_dir=str(tmp_path), lr=1e-3, **SMALL), resume=load_checkpoint(tmp_path))
