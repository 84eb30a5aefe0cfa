"""The theoretical cost model on a given GPU prices the GEMM path each recipe's GEMMs actually take
there (snip_ops.gemm_kernels.gemm_path, qgemm's own rules), not the recipe's nominal speed-up; the
default model (no arch) is unchanged. CPU only."""

import json
from pathlib import Path

import pytest

from planner.cost import PATH_SPEEDUP, Budget, LayerShape, MeasuredCost, TheoreticalCost, gemm_flops, plan_metrics
from snip_ops import gemm_kernels as gk
from snip_ops.formats import GEMMS, RECIPES, GemmRecipe, QuantSpec, E4M3

LAYER = LayerShape("l", in_features=4096, out_features=11008, tokens=8192)


def test_every_path_has_a_speed():
    assert set(PATH_SPEEDUP) == set(gk.PATHS)
    assert all(PATH_SPEEDUP[p] <= 1 for p in ("bf16_exact", "blockwise_bf16", "fp32"))


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_default_model_is_the_nominal_speedup(name):
    for g in GEMMS:
        assert TheoreticalCost().gemm_cost(LAYER, g, name) == gemm_flops(LAYER, g) / RECIPES[name].speedup


@pytest.mark.parametrize(
    "arch, speedups",
    [
        # sm_90: FP4 rides the FP8 kernel (FP8 speed), MX/NV formats run on BF16 tensor cores
        ((9, 0), {"bf16": 1, "fp8": 2, "fp8_e5m2grad": 2, "fp4": 2, "mxfp8": 1, "nvfp4": 1, "mxfp4": 1}),
        # sm_100: native block-scaled FP4/FP8; the FP32-scaled fp4 recipe on the FP8 blockwise kernel
        ((10, 0), {"bf16": 1, "fp8": 2, "fp8_e5m2grad": 2, "fp4": 2, "mxfp8": 2, "nvfp4": 4, "mxfp4": 4}),
        # no kernels: BF16 tensor cores, exact BF16 values at BF16 speed, FP32 scales blockwise below it
        ((8, 9), {"bf16": 1, "fp8": 1 / 8, "fp8_e5m2grad": 1 / 8, "fp4": 1 / 8, "mxfp8": 1, "nvfp4": 1, "mxfp4": 1}),
    ],
)
def test_arch_model_prices_the_path_taken(arch, speedups):
    cost = TheoreticalCost(arch=arch)
    assert cost.name == f"theoretical_sm{arch[0]}{arch[1]}"
    for name, speedup in speedups.items():
        for g in GEMMS:
            assert cost.gemm_cost(LAYER, g, name) == pytest.approx(gemm_flops(LAYER, g) / speedup), (name, g)


def test_arch_model_follows_gemm_path(monkeypatch):
    # One table: the model asks gemm_path and nothing else.
    seen = []

    def fake_path(r, gemm, arch, available=None, mnk=(128, 128, 128)):
        seen.append((r.name, gemm, arch, mnk))
        return gk.PathChoice("sm100_nvfp4", {})

    monkeypatch.setattr(gk, "gemm_path", fake_path)
    cost = TheoreticalCost(arch=(9, 0))
    assert cost.gemm_cost(LAYER, "wgrad", "fp8") == gemm_flops(LAYER, "wgrad") / 4
    assert seen == [("fp8", "wgrad", (9, 0), (11008, 4096, 8192))]


def test_partly_quantized_recipe_is_emulated():
    half = GemmRecipe("half", act=QuantSpec(E4M3), weight=QuantSpec(E4M3, (128, 128)), speedup=2.0)
    assert TheoreticalCost(arch=(9, 0)).speedup(LAYER, "fprop", half) == PATH_SPEEDUP["fp32"]
    assert TheoreticalCost().speedup(LAYER, "fprop", half) == 2.0


def test_budget_under_the_arch_model():
    assign = {("l", g): "fp4" for g in GEMMS}
    shapes = {"l": LAYER}
    assert plan_metrics(assign, shapes, TheoreticalCost()).relative_cost == pytest.approx(0.25)
    assert plan_metrics(assign, shapes, TheoreticalCost(arch=(9, 0))).relative_cost == pytest.approx(0.5)
    assert plan_metrics(assign, shapes, TheoreticalCost(arch=(10, 0))).relative_cost == pytest.approx(0.5)
    nv = {("l", g): "nvfp4" for g in GEMMS}
    assert plan_metrics(nv, shapes, TheoreticalCost(arch=(10, 0))).relative_cost == pytest.approx(0.25)
    budget = Budget.relative_cost(0.3, TheoreticalCost(arch=(9, 0)))
    assert "theoretical_sm90" in budget.describe() and budget.to_json()["cost_model"] == "theoretical_sm90"


def test_arch_must_be_a_capability():
    with pytest.raises(ValueError, match="compute capability"):
        TheoreticalCost(arch=(9,))


@pytest.mark.parametrize("device,table", [("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3-gemm.json"),
                                          ("NVIDIA H200", "nvidia-h200-gemm.json")])
def test_a_committed_gemm_benchmark_prices_a_plan(device, table):
    # bench_gemm's output is the planner's measured cost table (--planner-cost-table): each committed
    # GPU run reads as one, and prices what that GPU did: a layer of a measured shape at the time the file
    # gives its GEMM, FP8 below BF16 in fprop.
    path = Path(__file__).resolve().parents[2] / "bench" / "results" / table
    cost = MeasuredCost.from_json(path)
    assert cost.device == device
    layer = LayerShape("l", in_features=4096, out_features=4096, tokens=8192)
    rows = json.loads(path.read_text())["entries"]
    for p in ("bf16", "fp8", "fp4"):
        [seconds] = [r["time"] for r in rows if (r["gemm"], r["m"], r["n"], r["k"], r["format"])
                     == ("fprop", 8192, 4096, 4096, p)]
        assert cost.gemm_cost(layer, "fprop", p) == pytest.approx(seconds)
    assert cost.gemm_cost(layer, "fprop", "fp8") < cost.gemm_cost(layer, "fprop", "bf16")
