"""Performance benchmarks: how fast snip's kernels, steps, gathers, optimizer and planner run.

Run from the repository root as modules, e.g. `python -m bench.bench_gemm --quick` (or `snip bench NAME`):

    bench_gemm, bench_quant, gpu_bench      the GPU kernels (a CUDA GPU; --smoke runs their code on the CPU)
    bench_cpu_step                          one training step on the CPU, FP4 against bf16
    bench_linear                            SnipLinear forward+backward against BF16 and torchao float8
    bench_step                              one training step: tokens/s and peak memory, eager and compiled
    bench_fsdp_all_gather                   FSDP2 all-gather bytes with quantized weights
    bench_optim                             the BF16 + stochastic-rounding AdamW
    bench_planner_cost                      a re-plan's measurement against a training step, and the ILP's time
    bench_stability                         the bit-reduction stability sweep (`snip sweep`), recorded
    run_record                              the provenance every recorded result carries

Results go to bench/results/. How well the planner plans (quality grids, metric validity, ...) is measured by
the studies of experiments/, not here.
"""
