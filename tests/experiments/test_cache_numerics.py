"""The studies' paired caches (scale, schedule, swap, forward_train's routes): each records the numerics its runs were
trained under per checkpoint, and nothing is trained beside runs of another or of none recorded."""

import json

import pytest

from experiments import common
from experiments.results import read_cache


@pytest.fixture
def digest(monkeypatch):
    """common.numerics as a digest this test sets per checkpoint, without training one."""
    digests = {}
    monkeypatch.setattr(common, "numerics", lambda phase, preset="tiny", threads=1: digests.get((preset, phase), "here"))
    return digests


def test_the_first_run_records_the_numerics_of_its_checkpoint(digest, tmp_path):
    done = read_cache(tmp_path / "scale-2.json")
    assert done == {}
    common.check_cache_numerics(done, tmp_path / "scale-2.json", 100)
    digest["tiny", 400] = "there"
    common.check_cache_numerics(done, tmp_path / "scale-2.json", 400)
    common.check_cache_numerics(done, tmp_path / "scale-2.json", 100)  # again: the same numerics
    assert done == {"numerics": {"tiny/100": "here", "tiny/400": "there"}}


def test_no_run_is_trained_beside_runs_of_other_numerics(digest, tmp_path):
    path = tmp_path / "swap.json"
    path.write_text(json.dumps({"bf16/0/null": 2.0, "numerics": {"tiny/400": "another machine"}}))
    done = read_cache(path)
    with pytest.raises(SystemExit, match=r"swap.json: its runs from tiny's 400-step checkpoint were trained under "
                                         r"numerics another machine, this process trains under here .*SNIP_BENCH_CACHE"):
        common.check_cache_numerics(done, path, 400)
    common.check_cache_numerics(done, path, 100)  # another checkpoint's runs have a record of their own
    assert done["numerics"] == {"tiny/400": "another machine", "tiny/100": "here"}


def test_a_cache_from_before_the_record_trains_nothing_beside_its_runs(digest, tmp_path):
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps({"bf16/0": {"final_val_loss": 2.0}}))
    with pytest.raises(SystemExit, match="schedule.json: its runs carry no record of the numerics"):
        common.check_cache_numerics(read_cache(path), path, 400)
