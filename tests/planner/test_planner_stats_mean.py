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
                   errors={"fp8": {g: 0.25 * scale for g in GEMMS}, "fp4": {g: 0.5 * scale + i for g in GEMMS}})
        for i in range(2))
    return PlannerStats(layers, loss, None, "gradient second moment", {"time_record_s": scale})


def test_vector_round_trip():
    stats = _stats(1.5, 2.0)
    vector = stats.to_vector()
    assert len(vector) == 1 + 2 * (7 + 2 * len(GEMMS))  # the loss; per layer 7 numbers and 2 x 3 errors
    assert stats.with_vector(vector).to_json() == stats.to_json()
    doubled = stats.with_vector([2 * v for v in vector])
    assert doubled.to_vector() == [2 * v for v in vector]
    assert [s.name for s in doubled.layers] == ["a0", "a1"] and doubled.diagnostics == stats.diagnostics
    with pytest.raises(ValueError, match="expected 27 numbers"):
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


def test_statistics_json_round_trip_in_loss_units():
    stats = _stats(1.0, 2.0)
    assert stats.to_json()["wd_units"] == "loss"
    assert PlannerStats.from_json(stats.to_json()).to_json() == stats.to_json()


@pytest.mark.parametrize("units", [None, "update"])
def test_statistics_without_loss_units_are_refused(units):
    """Statistics written before WD was an excess loss (no "wd_units") or in update units cannot be priced: loading
    them says why and what to do, instead of planning with WD in other units."""
    obj = _stats(1.0, 2.0).to_json()
    if units is None:
        del obj["wd_units"]
    else:
        obj["wd_units"] = units
    with pytest.raises(ValueError, match="re-collect the statistics") as err:
        PlannerStats.from_json(obj)
    assert ("no WD units" if units is None else "'update' units") in str(err.value)


def test_statistics_with_a_directional_ld_are_refused():
    """Statistics written while LD had a directional form load where it was off (an empty "fprop_alignment") and
    are refused where it was on."""
    stats = _stats(1.0, 2.0)
    obj = stats.to_json()
    for layer in obj["layers"]:
        layer["fprop_alignment"] = {}
    assert PlannerStats.from_json(obj).to_json() == stats.to_json()
    obj["layers"][1]["fprop_alignment"] = {"fp4": 1.5}
    with pytest.raises(ValueError, match="'a1' were measured with the directional LD .*re-collect the statistics"):
        PlannerStats.from_json(obj)
