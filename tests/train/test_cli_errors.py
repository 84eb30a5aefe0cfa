"""User errors on the command line: one `snip: error: ...` line saying what was wrong and what is
accepted, exit status 2, no traceback (unless --debug); a bug keeps its traceback. Every case is
caught before any data is loaded or any training starts."""

import importlib
import json

import pytest
import torch

from snip_train import cli
from snip_train.errors import UsageError

TRAIN_MODULE = importlib.import_module("snip_train.train")  # `snip_train.train` is also the function
SWEEP_MODULE = importlib.import_module("snip_train.stability.command")

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = ["train", "--preset", "tiny", "--steps", "2", "--no-progress"]


@pytest.fixture(autouse=True)
def no_training(monkeypatch):
    """A user error must stop the command before a run starts: starting one fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(TRAIN_MODULE, "_train", refuse)
    monkeypatch.setattr(SWEEP_MODULE, "run_sweep_command", refuse)


def _error(capsys, *argv: str) -> str:
    """Run `snip argv`; assert it failed as a user error; return the message."""
    assert cli.main(list(argv)) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("snip: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err + captured.out
    return err[len("snip: error: "):]


def _plan_file(tmp_path, text: str) -> str:
    path = tmp_path / "plan.json"
    path.write_text(text)
    return str(path)


# ---- precisions and plans -------------------------------------------------------------------------------

def test_unknown_precision(capsys):
    msg = _error(capsys, *TRAIN, "--precision", "fp5")
    assert "unknown precision 'fp5'" in msg and "known: bf16, fp8" in msg and "fp4_mlp" in msg and ".json" in msg


def test_unknown_model_preset(capsys):
    msg = _error(capsys, *TRAIN, "--preset", "huge")
    assert "--preset" in msg and "'huge'" in msg and "'tiny'" in msg


def test_unreadable_plan_file(capsys, tmp_path):
    msg = _error(capsys, *TRAIN, "--precision", str(tmp_path / "missing.json"))
    assert "cannot read plan file" in msg and "No such file" in msg


def test_plan_file_with_a_syntax_error(capsys, tmp_path):
    msg = _error(capsys, *TRAIN, "--precision", _plan_file(tmp_path, '{"*.mlp.*": "fp4",\n "*": fp8}'))
    assert "is not valid JSON" in msg and "line 2" in msg


def test_plan_file_that_is_not_an_object(capsys, tmp_path):
    msg = _error(capsys, *TRAIN, "--precision", _plan_file(tmp_path, '["fp4"]'))
    assert "expected a JSON object" in msg and "list" in msg


def test_plan_entry_that_matches_no_layer(capsys, tmp_path):
    msg = _error(capsys, *TRAIN, "--precision", _plan_file(tmp_path, json.dumps({"*.feed_forward.*": "fp4"})))
    assert "'*.feed_forward.*' matches no linear layer" in msg
    assert "model.layers.N.mlp.down_proj" in msg  # what the model's layers are called


def test_plan_entry_with_an_unknown_precision(capsys, tmp_path):
    msg = _error(capsys, *TRAIN, "--precision", _plan_file(tmp_path, json.dumps({"plan": {"*": "fp5"}})))
    assert "unknown precision 'fp5'" in msg


# ---- planner flags ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags,expected", [
    (["--planner-budget", "75%"], "--planner-budget: cannot parse budget '75%'; write 'fp4=0.75'"),
    (["--fp4-fraction", "1.5"], "--fp4-fraction: an FP4 FLOP fraction must be in [0, 1]"),
    (["--planner-pin", "*.layers.0.*"], "--planner-pin expects PATTERN=PRECISION"),
    (["--planner-pin", "*.layers.0.*=fp5"], "unknown precision 'fp5'"),
    (["--planner-candidates", "fp8,fp5"], "--planner-candidates: unknown precision 'fp5'"),
    (["--planner-cost-table", "missing.json"], "--planner-cost-table: missing.json: No such file"),
])
def test_bad_planner_flags(capsys, flags, expected):
    assert expected in _error(capsys, *TRAIN, "--precision", "snip", *flags)
    assert expected in _error(capsys, *TRAIN, "--planner", *flags)


# ---- data, sizes, counts, device ---------------------------------------------------------------------------

def test_missing_corpus(capsys, tmp_path):
    msg = _error(capsys, *TRAIN, "--corpus", str(tmp_path / "nothing.txt"))
    assert "corpus not found" in msg and ".npy" in msg


def test_bad_size_and_counts(capsys):
    assert "not a size: '8X'" in _error(capsys, *TRAIN, "--max-bytes", "8X")
    assert "--steps: must be >= 1, got 0" in _error(capsys, *TRAIN, "--steps", "0")
    assert "--batch-size: not an integer: 'two'" in _error(capsys, *TRAIN, "--batch-size", "two")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_device_without_a_gpu(capsys):
    assert "CUDA is not available" in _error(capsys, *TRAIN, "--device", "cuda")


def test_not_a_device(capsys):
    assert "not a device: 'tpu'" in _error(capsys, *TRAIN, "--device", "tpu")


# ---- incompatible flags -----------------------------------------------------------------------------------

def test_incompatible_flags(capsys, tmp_path):
    assert "--branch-at, --workers: only for the --planner comparison" in _error(
        capsys, *TRAIN, "--branch-at", "1", "--workers", "1")
    assert "takes no --precision (got 'fp8')" in _error(capsys, *TRAIN, "--planner", "--precision", "fp8")
    assert "not for the --planner comparison" in _error(capsys, *TRAIN, "--planner", "--checkpoint-interval", "1")
    assert "not for the --planner comparison" in _error(capsys, *TRAIN, "--planner", "--resume", str(tmp_path))
    assert "--branch-at must be in 0..1" in _error(capsys, *TRAIN, "--planner", "--branch-at", "2")
    assert "leave out --out" in _error(capsys, *TRAIN, "--resume", str(tmp_path), "--out", str(tmp_path / "x"))
    assert "no checkpoint at" in _error(capsys, *TRAIN, "--resume", str(tmp_path))


# ---- the other commands -----------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
@pytest.mark.parametrize("bench", [["gemm"], ["quant"], ["optim", "gpu"]])
def test_gpu_benchmark_without_a_gpu(capsys, bench):
    msg = _error(capsys, "bench", *bench)
    assert f"snip bench {' '.join(bench)} times CUDA kernels and needs a GPU" in msg and "planner" in msg


def test_unknown_benchmark(capsys):
    assert "invalid choice: 'gemv'" in _error(capsys, "bench", "gemv")
    assert "invalid choice: 'planner'" in _error(capsys, "bench", "planner")  # the quality studies are experiments'


def test_benchmark_outside_the_source_tree(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "BENCH_DIR", tmp_path / "bench")  # an installed copy without bench/
    assert "bench_planner_cost.py not found (the benchmarks live in the source tree" in _error(
        capsys, "bench", "planner-cost")


def test_sweep_errors(capsys, tmp_path):
    assert "unknown precision 'fp5'" in _error(capsys, "sweep", "--precisions", "fp32,fp5", "--out", str(tmp_path))
    assert "'e9m99'" in _error(capsys, "sweep", "--precisions", "fp32,e9m99", "--out", str(tmp_path))
    assert "--lrs" in _error(capsys, "sweep", "--lrs", "fast", "--out", str(tmp_path))
    assert "corpus not found" in _error(capsys, "sweep", "--corpus", str(tmp_path / "none"), "--out", str(tmp_path))
    assert "unknown model preset 'huge'" in _error(capsys, "sweep", "--model", "huge", "--out", str(tmp_path))


def test_doctor_results_must_be_a_directory(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    assert "not a directory" in _error(capsys, "doctor", "--results", str(tmp_path / "file"))


@pytest.mark.skipif("plan" not in cli.COMMANDS, reason="no `snip plan` command")
def test_plan_without_a_model(capsys):
    assert "the following arguments are required" in _error(capsys, "plan")


def test_unknown_command(capsys):
    assert "invalid choice: 'fit'" in _error(capsys, "fit")


# ---- --debug, and bugs ------------------------------------------------------------------------------------

def test_debug_shows_the_traceback(capsys):
    for argv in (["--debug", *TRAIN, "--precision", "fp5"], [*TRAIN, "--precision", "fp5", "--debug"]):
        with pytest.raises(UsageError, match="unknown precision 'fp5'"):
            cli.main(argv)
    with pytest.raises(UsageError, match="invalid choice: 'huge'"):
        cli.main(["--debug", *TRAIN, "--preset", "huge"])


def test_a_bug_keeps_its_traceback(monkeypatch):
    """An exception that is not a user error (here a ValueError from inside a run) is not turned into one."""
    def broken(*args, **kwargs):
        raise ValueError("an internal invariant failed")

    monkeypatch.setattr(TRAIN_MODULE, "_train", broken)
    with pytest.raises(ValueError, match="internal invariant") as raised:
        cli.main(TRAIN)
    assert not isinstance(raised.value, UsageError)
