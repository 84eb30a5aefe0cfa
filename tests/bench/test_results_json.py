"""bench_planner.py's results file: the raw runs one compact line each, everything else indented, and the
file reads back as the payload it was written from, floats bit for bit."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_planner import results_json  # noqa: E402

RUN = {"final_val_loss": 1.9230808410793543, "val": [[0, 2.2231], [100, 1.923]], "plans": [{"step": 0, "precisions": {
    "q_proj": {"fprop": "fp8", "dgrad": "fp4", "wgrad": "fp4"}}}]}


@pytest.mark.parametrize("payload", [{}, {"runs": {}}, {"runs": {"tiny/a": RUN}},
                                     {"date": "d", "runs": {"tiny/a": RUN, "mini/b": {"x": 5e-324}}, "complete": True}])
def test_reads_back_as_written(payload):
    assert json.loads(results_json(payload)) == payload


def test_each_run_is_one_line():
    text = results_json({"date": "d", "table": {"100": [1, 2]}, "runs": {"tiny/a": RUN, "tiny/b": RUN}})
    run_lines = [line for line in text.splitlines() if line.lstrip().startswith('"tiny/')]
    assert len(run_lines) == 2 and all(json.loads("{" + line.rstrip(",") + "}") for line in run_lines)
    assert '\n "table": {' in text  # the rest stays indented for reading
