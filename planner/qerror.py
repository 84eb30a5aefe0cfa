"""Quantization error per layer, per GEMM, per candidate precision (docs/design.md §4.2).

On the recorded operands (x and dy row samples, the full weight) each GEMM is run once exactly
(float32, never TF32) and once as `snip_ops.gemm` runs it under the candidate recipe; the error is relative and
squared:

    e_fwd   = ||Q(x) Q(w)^T  - x w^T ||^2 / ||x w^T ||^2
    e_dgrad = ||Q(dy) Q(w)   - dy w  ||^2 / ||dy w  ||^2
    e_wgrad = (M / m) ||Q(dy)^T Q(x) - dy^T x||^2 / ||dW||^2

fprop and dgrad are row-wise: a row's error does not depend on the other rows, so the sample's relative
error is the batch's. wgrad sums over the rows: on m sampled rows of M, the quantization errors of the
rows add up independently (their sum's energy grows as the rows' count) while the exact products add up
coherently as far as the tokens' gradients agree (up to (M / m)^2 for identical rows). The sample's own
ratio would therefore overstate the error of the step's weight gradient by up to M / m, most early in
training when the tokens agree most. So e_wgrad is the error energy scaled to all M rows over the
full-batch gradient dW the statistics pass recorded: the relative error of the wgrad that training
computes. Measured against the whole batch's wgrad error, the sample's own ratio overstates it most early in
training, and the scaled estimate matches it closely (bench/results/cpu-planner-wgrad-error.md).

bf16 is the planner's reference (the high-precision GEMM), so its errors are 0 by definition.
Stochastic rounding (FP4 gradients) draws its bits from a fixed (seed, offset): errors are
deterministic for a given seed. The quantized operands come from the native quantizer where it exists
for the device (on the CPU its host implementation), else from the reference: the same values.
"""

from __future__ import annotations

from typing import Iterable

import torch

from snip_ops import gemm
from snip_ops.formats import GEMMS, recipe
from snip_ops.quantize import fake_quantize

from .stats import LayerRecording

__all__ = ["relative_error", "gemm_outputs", "relative_errors", "gemm_errors"]


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """||approx - exact||^2 / ||exact||^2 (0 when both are zero; inf when only exact is), summed in float64."""
    num = float((approx - exact).double().pow(2).sum())
    den = float(exact.double().pow(2).sum())
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def _emulated_gemms(x: torch.Tensor, dy: torch.Tensor, w: torch.Tensor, r, seed: int) -> dict[str, torch.Tensor]:
    """The emulated fprop / dgrad / wgrad of `snip_ops.gemm` (same specs, Philox streams, transposes and
    Hadamard transforms), except that Q(w^T) is taken as Q(w)^T where that is exact
    (`gemm.transpose_shares_quantization`: square weight blocks), which saves one weight quantization, and
    that every operand comes from the native quantizer where there is one (the emulated GEMMs take the
    reference's: the same values; on the CPU the wgrad operands' stochastic rounding took most of the time)."""
    def q(t, spec, operand, transpose=False):
        if spec is None:
            return gemm.emulated_operand(t, spec, seed, 0, operand, transpose)
        return fake_quantize(t, spec, seed=seed, offset=gemm.operand_offset(0, operand), transpose=transpose)

    wq = q(w, r.weight, "w")
    wtq = wq.t() if gemm.transpose_shares_quantization(r.weight) else q(w, r.weight, "wt", transpose=True)
    mm = gemm.fp32_mm
    return {
        "fprop": mm(q(x, r.act, "x"), wq.t()),
        "dgrad": mm(q(dy, r.grad, "dy"), wtq.t()),
        "wgrad": mm(q(gemm.wgrad_operand(dy, r, seed, 0), r.grad, "dyt", transpose=True),
                    q(gemm.wgrad_operand(x, r, seed, 0), r.act, "xt", transpose=True).t()),
    }


def gemm_outputs(rec: LayerRecording, candidates: Iterable[str], seed: int = 0
                 ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """(the exact GEMMs {gemm: output}, {precision: {gemm: output}} as `snip_ops.gemm` computes them) on the
    recorded operands: from the GEMM kernels where `snip_ops.gemm` would run them on a GPU, else from the emulated
    GEMMs (on the CPU `snip_ops.gemm` multiplies in FP32 as they do, and they save one weight quantization).
    bf16 has no entry: it is the reference."""
    x, dy, w = rec.x, rec.dy, rec.weight.float()
    mm = gemm.fp32_mm
    exact = {"fprop": mm(x, w.t()), "dgrad": mm(dy, w), "wgrad": mm(dy.t(), x)}
    approx = {}
    for name in candidates:
        r = recipe(name)
        if r.is_bf16:
            continue
        if x.is_cuda and gemm.uses_kernels(x, r):
            approx[name] = {"fprop": gemm.fprop(x, w, r, seed=seed), "dgrad": gemm.dgrad(dy, w, r, seed=seed),
                            "wgrad": gemm.wgrad(dy, x, r, seed=seed)}
        else:
            approx[name] = _emulated_gemms(x, dy, w, r, seed)
    return exact, approx


def relative_errors(rec: LayerRecording, candidates: Iterable[str], exact: dict[str, torch.Tensor],
                    approx: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, float]]:
    """{precision: {"fprop": e_fwd, "dgrad": e_dgrad, "wgrad": e_wgrad}} from `gemm_outputs`' GEMMs (bf16: 0)."""
    out = {}
    for name in candidates:
        if name not in approx:
            out[name] = {g: 0.0 for g in GEMMS}
            continue
        out[name] = {g: relative_error(approx[name][g], exact[g]) for g in ("fprop", "dgrad")}
        out[name]["wgrad"] = _batch_wgrad_error(approx[name]["wgrad"], exact["wgrad"], rec)
    return out


def gemm_errors(rec: LayerRecording, candidates: Iterable[str], seed: int = 0) -> dict[str, dict[str, float]]:
    """{precision: {"fprop": e_fwd, "dgrad": e_dgrad, "wgrad": e_wgrad}} for one recorded layer."""
    candidates = tuple(candidates)
    return relative_errors(rec, candidates, *gemm_outputs(rec, candidates, seed))


def _batch_wgrad_error(approx: torch.Tensor, exact: torch.Tensor, rec: LayerRecording) -> float:
    """e_wgrad of the whole batch's weight gradient from the sampled rows' (module docstring)."""
    num = float((approx - exact).double().pow(2).sum()) * (rec.shape.tokens / rec.rows.numel())
    den = float(rec.weight_grad.double().pow(2).sum())
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den
