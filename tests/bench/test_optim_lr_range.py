"""The lr-range benchmark's parts (bench.bench_optim): the stability edge of a learning-rate grid, the
ratio of two edges with the bound it is, the per-strategy summary of judged runs, and the hook that
gives the trainer's optimizer BF16 moments."""

import pytest
import torch

from bench.bench_optim import (
    StabilityEdge, edge_ratio, keep_moments_in, stability_edge, summarize_lr_range)

GRID = [0.125, 0.25, 0.5, 1.0, 2.0]


def _grid(*stable: bool) -> dict[float, bool]:
    return dict(zip(GRID, stable))


def test_edge_of_a_monotone_grid():
    assert stability_edge(_grid(True, True, True, False, False)) == StabilityEdge(0.5, 1.0, ())


def test_edge_ignores_the_order_of_the_mapping():
    grid = _grid(True, True, False, False, False)
    assert stability_edge(dict(reversed(list(grid.items())))) == StabilityEdge(0.25, 0.5, ())


def test_edge_when_all_diverge():
    assert stability_edge(_grid(False, False, False, False, False)) == StabilityEdge(None, 0.125, ())


def test_edge_when_none_diverge_is_the_top_of_the_grid_and_open():
    assert stability_edge(_grid(True, True, True, True, True)) == StabilityEdge(2.0, None, ())


def test_edge_of_a_non_monotone_grid_stops_at_the_first_unstable_lr():
    edge = stability_edge(_grid(True, False, True, True, False))
    assert edge == StabilityEdge(0.125, 0.25, (0.5, 1.0))


def test_edge_of_a_grid_unstable_only_at_the_bottom():
    assert stability_edge(_grid(False, True, True, True, True)) == StabilityEdge(None, 0.125, (0.25, 0.5, 1.0, 2.0))


def test_edge_of_an_empty_grid_is_an_error():
    with pytest.raises(ValueError):
        stability_edge({})


@pytest.mark.parametrize("edge, reference, expected", [
    (StabilityEdge(1.0, 2.0), StabilityEdge(0.25, 0.5), (4.0, "=")),
    (StabilityEdge(0.25, 0.5), StabilityEdge(0.25, 0.5), (1.0, "=")),
    (StabilityEdge(0.125, 0.25), StabilityEdge(0.5, 1.0), (0.25, "=")),
    # edge stable over the whole grid: its grid edge is a lower bound, so is the ratio
    (StabilityEdge(2.0, None), StabilityEdge(0.5, 1.0), (4.0, ">=")),
    # reference stable over the whole grid: an upper bound
    (StabilityEdge(0.5, 1.0), StabilityEdge(2.0, None), (0.25, "<=")),
    # edge unstable everywhere: its true edge is below the grid's smallest lr
    (StabilityEdge(None, 0.125), StabilityEdge(0.5, 1.0), (0.25, "<")),
    # reference unstable everywhere
    (StabilityEdge(0.5, 1.0), StabilityEdge(None, 0.125), (4.0, ">")),
    # nothing to compare
    (StabilityEdge(None, 0.125), StabilityEdge(None, 0.125), (None, "?")),
    (StabilityEdge(2.0, None), StabilityEdge(2.0, None), (None, "?")),
])
def test_edge_ratio(edge, reference, expected):
    assert edge_ratio(edge, reference) == expected  # powers of two: the quotients are exact


def _verdicts(diverged: dict[tuple[str, int], list[bool]], losses: dict[str, list[float]]) -> list[dict]:
    """judge()-shaped verdicts over GRID: diverged[(strategy, seed)][i] at GRID[i]; the final loss of
    every run is losses[strategy][i] plus 0.01 x seed."""
    return [{"precision": st, "lr": lr, "seed": seed, "diverged": div[i], "final_loss": losses[st][i] + 0.01 * seed}
            for (st, seed), div in diverged.items() for i, lr in enumerate(GRID)]


def test_summary_edges_paired_ratios_and_best_lr():
    ok, bad = False, True
    verdicts = _verdicts(
        {("master", 0): [ok, ok, bad, bad, bad], ("master", 1): [ok, ok, ok, bad, bad],
         ("sr", 0): [ok, ok, ok, ok, bad], ("sr", 1): [ok, bad, ok, ok, ok]},
        {"master": [3.0, 2.9, 3.1, 3.5, 4.0], "sr": [3.0, 3.2, 2.8, 2.7, 3.6]})
    summary = summarize_lr_range(verdicts, ["master", "sr"], GRID, [0, 1], "master", near_best_nats=0.15)
    master, sr = summary["master"], summary["sr"]
    # all seeds: a grid lr is stable only when every seed's run is
    assert master["edge"] == {"largest_stable_lr": 0.25, "first_unstable_lr": 0.5, "stable_above_edge": ()}
    assert sr["edge"] == {"largest_stable_lr": 0.125, "first_unstable_lr": 0.25, "stable_above_edge": (0.5, 1.0)}
    assert sr["ratio_to_baseline"] == (0.5, "=")
    # per seed, paired with the same seed's master run
    assert [sr["seed_edges"][s]["largest_stable_lr"] for s in (0, 1)] == [1.0, 0.125]
    assert sr["seed_ratios_to_baseline"] == [(4.0, "="), (0.25, "=")]
    assert master["seed_ratios_to_baseline"] == [(1.0, "="), (1.0, "=")]
    # lowest mean final loss among the lrs up to the all-seeds edge (sr's 2.7 at lr 1 lies above it)
    assert (master["best_lr"], master["best_mean_final_loss"]) == (0.25, pytest.approx(2.905))
    assert (sr["best_lr"], sr["best_mean_final_loss"]) == (0.125, pytest.approx(3.005))
    # quality: stable and within 0.15 of master's 2.905, scanning up from each strategy's best lr
    assert master["quality_edge"] == {"largest_stable_lr": 0.25, "first_unstable_lr": 0.5, "stable_above_edge": ()}
    assert sr["quality_edge"] == {"largest_stable_lr": 0.125, "first_unstable_lr": 0.25,
                                  "stable_above_edge": (0.5, 1.0)}
    assert sr["quality_ratio_to_baseline"] == (0.5, "=")


def test_quality_edge_scans_up_from_the_best_lr_and_needs_a_loss_near_the_baselines_best():
    never_diverged = [False] * 5
    verdicts = _verdicts({("master", 0): never_diverged, ("sr", 0): never_diverged},
                         {"master": [3.5, 2.5, 2.6, 2.9, 3.0], "sr": [3.5, 3.0, 2.7, 2.75, 2.85]})
    summary = summarize_lr_range(verdicts, ["master", "sr"], GRID, [0], "master", near_best_nats=0.3)
    # master: best 2.5 at 0.25; 0.125 (3.5) trains too slowly but lies below the best lr and does not count
    assert summary["master"]["best_lr"] == 0.25
    assert summary["master"]["quality_edge"]["largest_stable_lr"] == 0.5
    assert summary["master"]["quality_edge"]["first_unstable_lr"] == 1.0
    # sr: best 2.7 at 0.5; 2.75 at 1 and 2.85 at 2 are within 2.5 + 0.3 up to lr 1
    assert summary["sr"]["quality_edge"]["largest_stable_lr"] == 1.0
    assert summary["sr"]["quality_ratio_to_baseline"] == (2.0, "=")
    # every lr is stable: the stability edges are open and their ratio undetermined
    assert summary["sr"]["ratio_to_baseline"] == (None, "?")


def test_summary_when_a_strategy_diverges_everywhere():
    verdicts = _verdicts({("master", 0): [False] * 5, ("sr", 0): [True] * 5},
                         {"master": [3.0] * 5, "sr": [9.0] * 5})
    summary = summarize_lr_range(verdicts, ["master", "sr"], GRID, [0], "master", near_best_nats=0.3)
    assert summary["sr"]["edge"]["largest_stable_lr"] is None
    assert summary["sr"]["quality_edge"]["largest_stable_lr"] is None
    assert summary["sr"]["best_lr"] is None and summary["sr"]["best_mean_final_loss"] is None
    # sr's true edge is below 0.125, master's at least 2: the ratio is below 0.125 / 2
    assert summary["sr"]["ratio_to_baseline"] == (0.0625, "<")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_keep_moments_in_sets_the_dtype_of_the_trainers_optimizer_state(dtype):
    from snip_train.train import TrainConfig, train

    optimizers = []

    def setup(model, optimizer):
        keep_moments_in(dtype, model, optimizer)
        optimizers.append(optimizer)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(TrainConfig(preset="tiny", steps=1, batch_size=2, seq_len=16, weights="bf16_sr", eval_batches=1,
                          progress=False, on_setup=setup))
    finally:
        torch.set_num_threads(threads)
    state = list(optimizers[0].state.values())
    assert state and all(st["exp_avg"].dtype == dtype and st["exp_avg_sq"].dtype == dtype for st in state)
