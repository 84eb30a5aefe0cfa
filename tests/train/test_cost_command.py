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
    shapes = {(r["m"], r["n"], r["k"], r["gemm"]) for r in table["entries"]}
    assert {r["format"] for r in table["entries"]} == {"bf16", "fp8"} and len(table["entries"]) == 2 * len(shapes)
    assert all(r["m"] == 64 for r in table["entries"] if r["gemm"] != "wgrad")
    assert "GEMM times" in capsys.readouterr().out
    MeasuredCost.from_json(out)
    assert main(["cost", "--preset", "nope", "--out", str(out)]) == 2
    assert main(["cost", "--precisions", "fp9", "--out", str(out)]) == 2
    assert main(["cost", "--tokens", "0", "--out", str(out)]) == 2
