"""`snip cost`: a preset's linear-layer GEMMs timed on this device (the CPU here: a smoke run)."""

import json

from planner.cost import MeasuredCost
from snip_train.cli import main


def test_snip_cost_writes_a_table_the_planner_reads(tmp_path, capsys):
    out = tmp_path / "cost.json"
    assert main(["cost", "--preset", "tiny", "--tokens", "64", "--precisions", "bf16,fp8", "--device", "cpu",
                 "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["preset"] == "tiny" and table["tokens"] == 64 and table["tuning"] == "tune"
    # provenance, as every committed result carries (tests/test_committed_results.py)
    assert table["command"] == "snip cost --preset tiny --tokens 64 --precisions bf16,fp8 --device cpu --out cost.json"
    assert "commit" in table and table["date"]
    shapes = {(r["m"], r["n"], r["k"], r["gemm"]) for r in table["entries"]}
    assert {r["format"] for r in table["entries"]} == {"bf16", "fp8"} and len(table["entries"]) == 2 * len(shapes)
    assert all(r["m"] == 64 for r in table["entries"] if r["gemm"] != "wgrad")
    assert "GEMM times" in capsys.readouterr().out
    MeasuredCost.from_json(out)
    assert main(["cost", "--preset", "nope", "--out", str(out)]) == 2
    assert main(["cost", "--precisions", "fp9", "--out", str(out)]) == 2
    assert main(["cost", "--tokens", "0", "--out", str(out)]) == 2


def test_a_budget_the_measured_costs_cannot_meet_is_a_user_error(tmp_path, capsys):
    # A table where every low precision costs ten times bf16 (an emulating CPU looks like this): no plan
    # meets cost=0.5, and the live planner's first plan says so in one line.
    table = {"device": "test", "entries": [{"m": 256, "n": 256, "k": 256, "format": f, "time": t}
                                           for f, t in (("bf16", 1.0), ("fp8", 10.0), ("fp4", 10.0))]}
    (tmp_path / "cost.json").write_text(json.dumps(table))
    assert main(["train", "--preset", "tiny", "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--threads", "1",
                 "--precision", "snip", "--planner-budget", "cost=0.5", "--planner-cost-table",
                 str(tmp_path / "cost.json"), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("snip: error: --planner-budget cost=0.5: budget") and "infeasible" in err
    assert "Traceback" not in err
