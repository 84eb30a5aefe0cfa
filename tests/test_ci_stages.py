"""CI's stages (scripts/stage.sh): a stage that fails or overruns its budget fails, naming itself."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _stage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "stage.sh"), *args], capture_output=True, text=True,
                          timeout=60)


def test_a_stage_within_its_budget_passes():
    run = _stage("quick", "30", "true")
    assert run.returncode == 0 and "CI: stage quick passed in" in run.stdout


def test_a_stage_over_its_budget_fails_naming_it():
    run = _stage("slow", "0", "sleep", "1.2")
    assert run.returncode == 1
    assert "CI: FAILED stage slow took" in run.stderr and "over its budget of 0s" in run.stderr


def test_a_failing_stage_fails_with_its_exit_status():
    run = _stage("broken", "30", "bash", "-c", "exit 3")
    assert run.returncode == 3 and "CI: FAILED stage broken (exit status 3" in run.stderr
