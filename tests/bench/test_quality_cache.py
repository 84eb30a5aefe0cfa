"""bench_planner.py's quality cache: each trained run is merged into the file as it is then, so bench processes that
share the cache (another preset or cell at the same time) keep each other's runs."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_planner import save_run  # noqa: E402


def test_save_run_merges_with_what_another_process_wrote(tmp_path):
    cache = tmp_path / "quality-runs.json"
    save_run(cache, "tiny/run-a", {"final_val_loss": 2.0})
    cache.write_text(json.dumps({**json.loads(cache.read_text()), "mini/run-b": {"final_val_loss": 1.5}}))  # another process
    save_run(cache, "tiny/run-c", {"final_val_loss": 2.5})
    assert json.loads(cache.read_text()) == {"tiny/run-a": {"final_val_loss": 2.0}, "mini/run-b": {"final_val_loss": 1.5},
                                             "tiny/run-c": {"final_val_loss": 2.5}}
    save_run(cache, "tiny/run-a", {"final_val_loss": 2.25})  # a retrained run replaces its entry
    assert json.loads(cache.read_text())["tiny/run-a"] == {"final_val_loss": 2.25}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quality-runs.json", "quality-runs.lock"]
