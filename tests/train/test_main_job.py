"""The main job (scripts/main.sh): its `snip train --planner` command line, as the script has it, run in a
seconds-long setting by appending overrides (the script passes extra arguments on, and later flags win).
The install step of the script is not run here (scripts/test.sh runs the same one)."""

import json
import shlex
from pathlib import Path

import pytest

from snip_train import cli
from snip_train.planning import DEFAULT_BASELINES, comparison_from_args

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["--steps", "4", "--branch-at", "2", "--batch-size", "2", "--seq-len", "16", "--max-bytes", "1M",
         "--eval-batches", "1", "--eval-interval", "1", "--branch-seeds", "0", "--baselines", "layer_type",
         "--workers", "1", "--planner-interval", "1", "--no-progress"]

pytestmark = pytest.mark.usefixtures("one_thread")


def main_job_args() -> list[str]:
    """The arguments main.sh gives `python -m snip_train` (without its trailing "$@")."""
    line = next(line for line in (ROOT / "scripts" / "main.sh").read_text().splitlines()
                if line.startswith('exec "$PY" -m snip_train '))
    words = shlex.split(line.removesuffix('"$@"'))
    return words[words.index("snip_train") + 1:]


def test_the_main_job_is_the_paired_comparison():
    args = cli.build_parser().parse_args(main_job_args())
    comparison = comparison_from_args(args, args.steps)
    assert args.command == "train" and args.planner and args.steps - comparison.branch_at > 0
    assert comparison.baselines == DEFAULT_BASELINES and len(comparison.seeds) >= 2 and comparison.threads == 1
    assert comparison.planner.budget.describe() == "at least 75% of linear FLOPs in FP4"


def test_main_job_smoke(tmp_path, capsys):
    out = tmp_path / "main"
    assert cli.main(main_job_args() + SMOKE + ["--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fprop" in text and "gap to bf16" in text and "Why the ranking means something" in text
    for name in ("snip/plan.json", "snip/plan.png", "branch_gaps.png", "comparison.json"):
        assert (out / name).stat().st_size > 0, name
    result = json.loads((out / "comparison.json").read_text())
    assert set(result["table"]) == {"bf16", "SNIP", "layer_type"} and result["branch_steps"] == 2
