"""A study's results: the summary names how it was made and holds no raw runs; the runs live beside it,
lzma-compressed, and read back as written, floats bit for bit."""

import json
import lzma
import sys

import pytest

from experiments import results

RUN = {"final_val_loss": 1.9230808410793543, "val": [[0, 2.2231], [100, 1.923]], "plans": [{"step": 0, "precisions": {
    "q_proj": {"fprop": "fp8", "dgrad": "fp4", "wgrad": "fp4"}}}]}


@pytest.mark.parametrize("runs", [{}, {"tiny/a": RUN}, {"tiny/a": RUN, "mini/b": {"x": 5e-324}}])
def test_runs_live_beside_the_summary_and_read_back_as_written(tmp_path, monkeypatch, runs):
    monkeypatch.setattr(sys, "argv", ["quality.py", "--seeds", "0,1", "--results", str(tmp_path)])
    summary = results.write(tmp_path, "quality-x", {"table": {"100/0.8": {}}, "runs": runs}, "| a table |")
    assert summary == tmp_path / "cpu-planner-quality-x.json"
    stored = json.loads(summary.read_text())
    assert "runs" not in stored and stored["table"] == {"100/0.8": {}}
    assert {"date", "command", "commit", "machine"} <= set(stored) and "--results" not in stored["command"]
    assert stored["command"].endswith("--seeds 0,1")
    raw = tmp_path / "cpu-planner-quality-x.runs.json.xz"
    assert json.loads(lzma.decompress(raw.read_bytes())) == {"runs": runs} and results.read_runs(summary) == runs
    assert "| a table |" in (tmp_path / "cpu-planner-quality-x.md").read_text()


def test_a_result_without_runs_has_no_runs_file(tmp_path):
    results.write(tmp_path, "horizon", {"rows": []}, "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu-planner-horizon.json", "cpu-planner-horizon.md"]
    with pytest.raises(SystemExit, match="cpu-planner-horizon.runs.json.xz is missing"):
        results.read_runs(tmp_path / "cpu-planner-horizon.json")
