"""tests/warm_python.py runs `python -m module` as a fresh interpreter would: arguments, working directory,
environment, output and exit status, a timeout that kills, and no state left from one run to the next."""

import subprocess
import sys

import pytest

import warm_python

PROBE = '''
import os, sys
import snip_ops
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("PROBE_VALUE"))
print("main", __name__, "seen", getattr(snip_ops, "_probe_mark", None))
snip_ops._probe_mark = "set by an earlier run"
print("to stderr", file=sys.stderr)
if len(sys.argv) > 1 and sys.argv[1] == "fail":
    sys.exit("a message")
if len(sys.argv) > 1 and sys.argv[1] == "raise":
    raise ValueError("boom")
if len(sys.argv) > 1 and sys.argv[1] == "sleep":
    import time
    time.sleep(60)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
'''


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "warm_probe.py").write_text(PROBE)
    return tmp_path


def _run(cwd, *args, **kw):
    return warm_python.run([sys.executable, "-m", "warm_probe", *args], cwd=cwd, capture_output=True, text=True, **kw)


def test_a_run_sees_its_arguments_directory_and_environment(probe, monkeypatch):
    monkeypatch.setenv("PROBE_VALUE", "from the test")
    out = _run(probe, "3")
    assert out.returncode == 3 and out.stderr == "to stderr\n"
    assert out.stdout.splitlines() == [f"argv ['3'] cwd {probe} env from the test", "main __main__ seen None"]
    out = _run(probe, env={"PROBE_VALUE": "given"})
    assert out.returncode == 0 and "env given" in out.stdout


def test_no_state_passes_from_one_run_to_the_next(probe):
    for _ in range(2):  # each run sets a mark on the preloaded snip_ops; the next one starts without it
        assert "seen None" in _run(probe).stdout


def test_exit_messages_exceptions_and_check_are_those_of_an_interpreter(probe):
    out = _run(probe, "fail")
    assert out.returncode == 1 and out.stderr.endswith("a message\n")
    out = _run(probe, "raise")
    assert out.returncode == 1 and "ValueError: boom" in out.stderr
    with pytest.raises(subprocess.CalledProcessError):
        _run(probe, "2", check=True)


def test_a_run_past_its_timeout_is_killed(probe):
    with pytest.raises(subprocess.TimeoutExpired):
        _run(probe, "sleep", timeout=3)
    assert _run(probe, "0").returncode == 0  # the server goes on


def test_other_commands_go_to_subprocess(tmp_path):
    out = warm_python.run([sys.executable, "-c", "print(40 + 2)"], capture_output=True, text=True)
    assert out.stdout == "42\n"
