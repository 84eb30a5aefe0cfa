"""Statistics as one flat vector (what data-parallel ranks all-reduce) and the mean of several
measurements (what `snip plan` averages over calibration batches)."""

import pytest

from planner import LayerShape, LayerStats, PlannerStats
from planner import mean_stats
from snip_ops.formats import GEMMS


def _stats(scale: float, loss: float, name: str = "a") -> PlannerStats:
    layers = tuple(
        LayerStats(shape=LayerShape(f"{name}{i}", 4, 8, 16), out_rms=1.0 * scale, grad_out_rms=2.0 * scale,
                   grad_in_rms=3.0 * scale, weight_grad_rms=4.0 * scale, curvature=5.0 * scale + i,
                   s_dgrad=6.0 * scale, s_wgrad=7.0 * scale,
                   errors={"fp8": {g: 0.25 * scale for g in GEMMS}, "fp4": {g: 0.5 * scale + i for g in GEMMS}},
                   fprop_alignment={"fp8": 1.5 * scale, "fp4": 2.0 * scale + i})
        for i in range(2))
    return PlannerStats(layers, loss, None, "gradient second moment", {"time_record_s": scale}, "loss")


def test_vector_round_trip():
    stats = _stats(1.5, 2.0)
    vector = stats.to_vector()
    assert len(vector) == 1 + 2 * (7 + 2 * len(GEMMS) + 2)  # the loss; per layer 7 numbers, 2 x 3 errors, 2 alignments
    assert stats.with_vector(vector).to_json() == stats.to_json()
    doubled = stats.with_vector([2 * v for v in vector])
    assert doubled.to_vector() == [2 * v for v in vector]
    assert [s.name for s in doubled.layers] == ["a0", "a1"] and doubled.diagnostics == stats.diagnostics
    with pytest.raises(ValueError, match="expected 31 numbers"):
        stats.with_vector(vector[:-1])


def test_mean_is_the_mean_of_every_number():
    mean = mean_stats([_stats(1.0, 2.0), _stats(3.0, 4.0)])
    assert mean.to_json() == _stats(2.0, 3.0).to_json()  # exact: every mean is a dyadic rational
    one = _stats(1.0, 2.0)
    assert mean_stats([one]).to_json() == one.to_json()
    with pytest.raises(ValueError, match="different layers"):
        mean_stats([_stats(1.0, 2.0), _stats(1.0, 2.0, name="b")])
    with pytest.raises(ValueError, match="no statistics"):
        mean_stats([])


def test_statistics_written_before_the_alignment_read_as_isotropic():
    stats = _stats(1.0, 2.0)
    obj = stats.to_json()
    for layer in obj["layers"]:
        del layer["fprop_alignment"]
    old = PlannerStats.from_json(obj)
    assert all(s.fprop_alignment == {} for s in old.layers)
    for new, was in zip(stats.layers, old.layers):
        assert was.ld("fp4") == new.curvature * new.errors["fp4"]["fprop"]
        assert new.ld("fp4") == was.ld("fp4") * new.fprop_alignment["fp4"]
    assert PlannerStats.from_json(stats.to_json()).to_json() == stats.to_json()
