"""Which tests CI runs once only: their outcome cannot depend on the intra-op thread count
(tests/conftest.py marks every other test `threads`)."""

# Tests whose outcome cannot depend on the intra-op thread count, by module or test-id prefix, and why.
# Every other test is marked `threads` (CI runs those again at another thread count), unless it pins one
# thread (the `one_thread` fixture) or is a GPU test. A new module is therefore `threads` until it is
# listed here; tests/test_thread_count.py proves the bit-exact library code these lean on thread-free.
THREAD_FREE = {
    "tests/ops/test_build.py": "build information",
    "tests/ops/test_install.py": "pip installs and warnings",
    "tests/ops/test_cpu_only_build.py": "a build, then bit-exact quantization",
    "tests/ops/test_cuda_host_shim.py": "the host shim: own C++ threads, bit-exact",
    "tests/ops/test_cast.py": "bit-exact casts",
    "tests/ops/test_philox.py": "integer random bits",
    "tests/ops/test_quant_dispatch.py": "schemas, shapes and bit-exact dispatch",
    "tests/ops/test_quant_math_host.py": "the host twin against bit-exact casts",
    "tests/ops/test_quantize.py": "bit-exact reference quantization",
    "tests/ops/test_quantize_cpu_op.py": "bit-exact quantization, its thread counts set by the test",
    "tests/ops/test_optim_native.py": "the AdamW op against its reference, bit for bit",
    "tests/ops/test_scale_layout.py": "index arithmetic",
    "tests/ops/test_autotune.py": "config choices under a stand-in timer, traced calls",
    "tests/ops/test_scale_rules.py": "bit-exact scale rules",
    "tests/ops/test_gemm_dispatch.py::test_sm90_sass": "instructions in the binary",
    "tests/ops/test_gemm_dispatch.py::test_sm100_sass": "instructions in the binary",
    "tests/planner/test_cost_paths.py": "cost arithmetic in Python",
    "tests/planner/test_stability_exmy.py": "bit-exact casts against oracles",
    "tests/planner/test_stability_paper_exmy.py": "bit-exact casts against a NumPy oracle",
    "tests/train/test_data.py": "integer tokens",
    "tests/bench/test_gpu_bench_smoke.py": "timing benchmarks' outputs are timings",
    "tests/bench/test_linear_step_smoke.py": "timing benchmarks' outputs are timings; the plan is FLOP arithmetic",
    "tests/bench/test_gpu_perf_dry_run.py": "a script's steps and the files they write",
    "tests/bench/test_stability_paper_smoke.py": "the sweep runs with --threads 1",
    "tests/experiments/test_cache_numerics.py": "cache records, the digest monkeypatched",
    "tests/experiments/test_quality_table.py": "tables of given numbers",
    "tests/experiments/test_results_layout.py": "results files",
    "tests/experiments/test_retabulate.py": "committed results re-tabulated",
    "tests/experiments/test_quality_grid_smoke.py": "the grid trains at one thread (its workers, --threads 1)",
    "tests/experiments/test_studies_smoke.py": "the studies train at one thread (--threads 1)",
    "tests/experiments/test_plan_replay.py": "the replays train at one thread",
    "tests/test_gpu_only_code_checked.py": "static analysis",
    "tests/test_layering.py": "static analysis",
    "tests/test_thread_count.py": "sets its own thread counts",
    "tests/test_ci_stages.py": "a shell script's timing",
    "tests/test_committed_results.py": "file sizes and JSON keys",
    "tests/test_design_references.py": "text of the docs and sources",
    "tests/test_readme.py": "text of the README",
    "tests/test_warm_python.py": "a process runner's plumbing",
}


def thread_free(nodeid: str) -> bool:
    return any(nodeid == key or nodeid.startswith(key + ("" if "::" in key else "::")) for key in THREAD_FREE)
