"""bench.bench_fsdp_all_gather runs end to end in a seconds-long setting (2 gloo ranks, 1 step),
writing into a temporary directory, and its table shows the expected savings over BF16 gathers."""

import re
import sys
from pathlib import Path
import warm_python

ROOT = Path(__file__).resolve().parents[2]


def test_fsdp_all_gather_bench(tmp_path):
    warm_python.run([sys.executable, "-m", "bench.bench_fsdp_all_gather", "--layers", "1", "--width", "256", "--steps", "1",
                    "--results", str(tmp_path)], cwd=ROOT, check=True, capture_output=True, text=True,
                   timeout=300)
    md = (tmp_path / "cpu-fsdp-all-gather.md").read_text()
    rows = [re.split(r"\s*\|\s*", line.strip("| ")) for line in md.splitlines() if line.endswith("x |")]
    savings = {row[0]: float(row[-1].rstrip("x")) for row in rows}
    assert savings["bf16 params, full-precision gather"] == 1.0
    assert 1.99 < savings["fp8 (E4M3, 128x128 FP32 scales)"] <= 2.0
    assert 3.95 < savings["fp4 (E2M1, 128x128 FP32 scales)"] <= 4.0
