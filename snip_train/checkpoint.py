"""Checkpoints of a training run: everything it needs to continue bit for bit after a crash.

    train(TrainConfig(..., out_dir="runs/x", checkpoint_interval=50))   # runs/x/checkpoint.pt every 50 steps
    ckpt = load_checkpoint("runs/x")                                      # after a crash
    train(TrainConfig(..., out_dir="runs/x"), resume=ckpt)                # the rest of the same run

A `Checkpoint` holds the run's `TrainState` (weights, optimizer state -- moments, step counts and the
BF16+SR optimizer's seed --, the generator of the batch order, which is the data position, the global
RNGs and the layers' stochastic-rounding counters), the `TrainConfig` it belongs to (as JSON, to
refuse resuming another run), the history so far (training losses, learning rates, gradient norms,
evaluations) and the state of the training-loop hooks (the planner's: its plan with statistics, its
history, the step it re-plans from, its schedule's state).

Writing never destroys the last good checkpoint: the new one is written to ``checkpoint.pt.tmp`` in
the same directory, flushed and fsync'ed, renamed over ``checkpoint.pt`` (`os.replace`, atomic) and
the directory is fsync'ed. A crash at any moment leaves the previous checkpoint or the new one, whole.
The file is a header line, the SHA-256 of the body and the body (`torch.save` of plain containers and
tensors, read back with ``weights_only=True``): a truncated or damaged file is refused with a clear
error, never loaded as a wrong state.

Test hook: with the environment variable ``SNIP_TEST_KILL_IN_CHECKPOINT=K`` a process kills itself
(SIGKILL) in the middle of its K-th checkpoint write, after half of the temporary file is on disk --
the one moment a crash could otherwise hurt, made reproducible for the tests.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from .errors import UsageError
from .state import TrainState

__all__ = ["Checkpoint", "CHECKPOINT_FILE", "CHECKPOINT_FORMAT", "save_checkpoint", "load_checkpoint",
           "differences"]

CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINT_FORMAT = "snip-checkpoint/1"
_HEADER = CHECKPOINT_FORMAT.encode() + b"\n"
_DIGEST_LEN = 64  # hex SHA-256 of the body, then b"\n"
KILL_ENV = "SNIP_TEST_KILL_IN_CHECKPOINT"
_writes = itertools.count(1)  # this process's checkpoint writes, for the test hook


@dataclass(frozen=True)
class Checkpoint:
    state: TrainState                 # the run before step `state.step`
    config: Mapping[str, Any]         # the run's TrainConfig as JSON (train.config_json)
    history: Mapping[str, Any]        # {"train": {"step", "loss", "lr", "grad_norm"}, "val": {"step", "loss"}}
    hooks: Any = None                 # the hooks' state, JSON-able (PlannerHooks.state_dict); None: no hooks
    start_step: int = 0               # the step the run began at (0, or the step of the state it branched from)
    resumed_at: tuple[int, ...] = ()  # the steps it was resumed at before this checkpoint


def _payload(ckpt: Checkpoint) -> dict[str, Any]:
    s = ckpt.state
    kind, keys, pos, has_gauss, gauss = s.numpy_rng
    state = {"step": s.step, "model": dict(s.model), "optimizer": s.optimizer, "sr_counters": dict(s.sr_counters),
             "data_rng": s.data_rng, "torch_rng": s.torch_rng,
             "numpy_rng": (kind, np.asarray(keys).tolist(), pos, has_gauss, gauss), "python_rng": s.python_rng}
    # the hooks' state as JSON text: whatever types it holds, it loads back (Python's JSON floats round-trip)
    hooks = None if ckpt.hooks is None else json.dumps(ckpt.hooks)
    return {"format": CHECKPOINT_FORMAT, "state": state, "config": dict(ckpt.config), "history": ckpt.history,
            "hooks": hooks, "start_step": ckpt.start_step, "resumed_at": list(ckpt.resumed_at)}


def _from_payload(p: Mapping[str, Any]) -> Checkpoint:
    s = p["state"]
    kind, keys, pos, has_gauss, gauss = s["numpy_rng"]
    state = TrainState(step=int(s["step"]), model=s["model"], optimizer=s["optimizer"], sr_counters=s["sr_counters"],
                       data_rng=s["data_rng"], torch_rng=s["torch_rng"],
                       numpy_rng=(kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss),
                       python_rng=s["python_rng"])
    hooks = None if p["hooks"] is None else json.loads(p["hooks"])
    return Checkpoint(state=state, config=p["config"], history=p["history"], hooks=hooks,
                      start_step=int(p["start_step"]), resumed_at=tuple(p["resumed_at"]))


def save_checkpoint(path: str | os.PathLike, ckpt: Checkpoint) -> None:
    """Write `ckpt` to `path` atomically (see the module docstring); the previous file stays until the
    new one is complete."""
    path = Path(path)
    buf = io.BytesIO()
    torch.save(_payload(ckpt), buf)
    body = buf.getvalue()
    data = _HEADER + hashlib.sha256(body).hexdigest().encode() + b"\n" + body
    tmp = path.with_name(path.name + ".tmp")
    kill = os.environ.get(KILL_ENV) == str(next(_writes))
    with open(tmp, "wb") as f:
        if kill:
            f.write(data[:len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    if os.name == "posix":  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """The checkpoint in `path` (a run directory or the file itself). A missing, truncated, damaged or
    foreign file raises `UsageError` saying so."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise UsageError(f"no checkpoint at {path} (a run writes one with --checkpoint-interval N)")
    data = path.read_bytes()
    if not data.startswith(_HEADER):
        raise UsageError(f"{path} is not a snip checkpoint ({CHECKPOINT_FORMAT})")
    head = len(_HEADER)
    digest, body = data[head:head + _DIGEST_LEN], data[head + _DIGEST_LEN + 1:]
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise UsageError(f"{path} is damaged (truncated or corrupt: its checksum does not match); no state was "
                         "loaded")
    try:
        return _from_payload(torch.load(io.BytesIO(body), map_location="cpu", weights_only=True))
    except Exception as e:  # a whole file with the right checksum whose contents this version cannot read
        raise UsageError(f"{path}: cannot read its contents ({type(e).__name__}: {e})") from e


def differences(saved: Mapping[str, Any], current: Mapping[str, Any], ignore: Iterable[str] = ()) -> list[str]:
    """``"key: checkpoint X, this run Y"`` for every key of either mapping, outside `ignore`, whose values
    differ."""
    skip = set(ignore)
    return [f"{k}: checkpoint {saved.get(k)!r}, this run {current.get(k)!r}"
            for k in sorted(set(saved) | set(current)) if k not in skip and saved.get(k) != current.get(k)]
