"""Where the studies' results and raw runs live, and how they are written and read.

A study writes bench/results/cpu-planner-<name>.json (its summary: date, command, commit, machine, then what it
measured) and .md (the summary's tables). A summary never holds raw runs: a study's "runs" (every trained branch's
losses and plans, most of a quality grid's bytes) go to the sibling cpu-planner-<name>.runs.json.xz, an
lzma-compressed JSON object {"runs": {key: run}}; `read_runs` reads them back from the summary's path.

The studies' caches of trained runs (under experiments.common.CACHE) are plain JSON objects {key: run}: `save_run`
merges one run into a cache under a lock, so that studies running at the same time keep each other's runs.
"""

from __future__ import annotations

import fcntl
import json
import lzma
from pathlib import Path

from bench.run_record import run_provenance

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
RUNS_SUFFIX = ".runs.json.xz"


def runs_path(summary: Path) -> Path:
    """The raw runs' file beside a results summary: cpu-planner-x.json -> cpu-planner-x.runs.json.xz."""
    return summary.with_name(summary.name.removesuffix(".json") + RUNS_SUFFIX)


def write_runs(summary: Path, runs: dict) -> None:
    data = json.dumps({"runs": runs}, separators=(",", ":")).encode()
    runs_path(summary).write_bytes(lzma.compress(data, preset=9))


def read_runs(summary: Path) -> dict:
    """The raw runs {key: run} of the results summary at `summary` (a cpu-planner-*.json), from its sibling file."""
    path = runs_path(summary)
    if not path.exists():
        raise SystemExit(f"{summary}: its runs are not there ({path.name} is missing)")
    with lzma.open(path) as f:
        return json.load(f)["runs"]


def save(results: Path, stem: str, payload: dict, markdown: str) -> Path:
    """`payload` as `results`/<stem>.json, its "runs" (if any) as the sibling .runs.json.xz, `markdown` as <stem>.md;
    the markdown is printed. Returns the summary's path."""
    results.mkdir(parents=True, exist_ok=True)
    payload = dict(payload)
    runs = payload.pop("runs", None)
    summary = results / f"{stem}.json"
    summary.write_text(json.dumps(payload, indent=1) + "\n")
    if runs is not None:
        write_runs(summary, runs)
    (results / f"{stem}.md").write_text(markdown)
    print(markdown)
    return summary


def write(results: Path, name: str, payload: dict, markdown: str) -> Path:
    """A study's result: `payload` and the provenance as `results`/cpu-planner-<name>.json (its "runs" beside it),
    `markdown` under a heading that says how it was made as the .md."""
    payload = {**run_provenance(), **payload}
    heading = f"{payload['date']} | `{payload['command']}` | commit {payload['commit']} | {payload['machine']}"
    return save(results, f"cpu-planner-{name}", payload, f"# planner study: {name}\n\n{heading}\n\n{markdown}\n")


def scale_block_rows(results: Path = RESULTS) -> list[dict]:
    """The committed rows of the scale study's per-block run (the tiny preset's per-block truths), [] without it."""
    path = results / "cpu-planner-scale-blocks.json"
    return json.loads(path.read_text())["rows"] if path.exists() else []


# ---------------------------------------------------------------------------------------------
# the caches of trained runs
# ---------------------------------------------------------------------------------------------
def read_cache(path: Path) -> dict:
    """A study's cache of runs {key: result}, {} before the first run."""
    return json.loads(path.read_text()) if path.exists() else {}


def write_cache(path: Path, done: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(done))
    partial.replace(path)


def save_run(cache: Path, key: str, result: dict) -> None:
    """Add one trained run to the cache file, merged under a lock with what is there: processes running at the same
    time (another preset, another cell) share the cache, and none may drop the others' runs."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = read_cache(cache)
        runs[key] = result
        write_cache(cache, runs)


def with_runs_from(done: dict, summaries: list[Path]) -> dict:
    """The cached runs `done` and those of committed results (`read_runs` of each summary), for tabulating seeds
    trained elsewhere beside this cache's: a run in two places must be the same run (the tables pair a seed's runs
    only under one numerics, experiments.common.check_paired)."""
    out = dict(done)
    for path in summaries:
        for key, result in read_runs(path).items():
            if key in out and out[key] != result:
                raise SystemExit(f"{path}: run {key} differs from the one already read (another machine's or "
                                 "checkpoint's): tabulate them apart")
            out[key] = result
    return out
