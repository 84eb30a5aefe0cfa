"""`run([sys.executable, "-m", module, *args], ...)`: `subprocess.run` of a Python module, in a process forked from
a server that has torch and the project's packages imported already.

A fresh interpreter spends seconds importing torch, snip_ops, the planner and the trainer before a smoke run's
first step; the end-to-end tests of the benchmarks and studies start dozens. Each call here is a new process
all the same, forked from a server process (one per test process, started at the first call) that imported
those packages and has run nothing else, so no state passes from one run, or from the test, to another. The
module then runs as `python -m` runs it (`runpy`, as `__main__`, in `cwd`, with `env` and these arguments);
stdout, stderr and the exit status come back as from `subprocess.run`. Modules that read the environment when
imported (the benchmarks' and studies' own) are not preloaded, so they import in the child, under its
environment. Commands of another form go to `subprocess.run` unchanged.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Imported once by the server; none reads the environment when imported.
PRELOAD = ("torch", "snip_ops", "planner", "snip_train.train")

# The server: imports PRELOAD, then for each request line forks a child that runs the module and reports
# "<pid>" when the child starts and "<pid> <wait status>" when it ends. Single-threaded, and it runs no torch
# op, so a fork of it is as sound as a fresh interpreter.
_SERVER = r"""
import importlib, json, os, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        import runpy, traceback
        for fd, path in ((1, req["out"]), (2, req["err"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(f, fd)
            os.close(f)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = [req["module"], *req["args"]]  # sys.path[0] is "" (-c): the directory just entered, as for -m
        code = 0
        try:
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(pid, status, flush=True)
"""

_server: subprocess.Popen | None = None


def _started() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen([sys.executable, "-c", _SERVER, json.dumps(PRELOAD)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    return _server


def _read_line(server: subprocess.Popen, deadline: float | None) -> str:
    """The server's next line; "" if the deadline passes first."""
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if select.select([server.stdout], [], [], wait)[0]:
            line = server.stdout.readline()
            if not line:
                raise RuntimeError("warm_python: the server process ended")
            return line
        if deadline is not None and time.monotonic() >= deadline:
            return ""


def run(cmd: list[str], *, cwd=None, env=None, check: bool = False, capture_output: bool = False,
        text: bool = False, timeout: float | None = None) -> subprocess.CompletedProcess:
    if len(cmd) < 3 or cmd[0] != sys.executable or cmd[1] != "-m":
        return subprocess.run(cmd, cwd=cwd, env=env, check=check, capture_output=capture_output, text=text,
                              timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    server = _started()
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        request = {"module": cmd[2], "args": [str(a) for a in cmd[3:]], "cwd": str(Path(cwd or os.getcwd()).resolve()),
                   "env": dict(os.environ if env is None else env), "out": str(out), "err": str(err)}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        pid = int(_read_line(server, None))
        line = _read_line(server, deadline)
        if not line:  # past the timeout: kill the run, collect its status line, report as subprocess.run does
            os.kill(pid, signal.SIGKILL)
            _read_line(server, None)
            raise subprocess.TimeoutExpired(cmd, timeout)
        status = int(line.split()[1])
        stdout, stderr = out.read_bytes(), err.read_bytes()
    code = os.waitstatus_to_exitcode(status)
    if not capture_output:  # let them through, as subprocess.run does
        sys.stdout.write(stdout.decode(errors="replace"))
        sys.stderr.write(stderr.decode(errors="replace"))
        stdout = stderr = None
    elif text:
        stdout, stderr = stdout.decode(), stderr.decode()
    result = subprocess.CompletedProcess(cmd, code, stdout, stderr)
    if check:
        result.check_returncode()
    return result
