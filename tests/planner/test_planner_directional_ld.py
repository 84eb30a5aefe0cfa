"""The directional LD (planner/divergence.py, "Directional LD"): the Fisher draws' cotangents dotted with each
precision's actual forward error on the sampled rows estimate, without bias, the Gauss-Newton form of the loss
along that error, position by position, computed exactly from the logits' change; it changes LD only; the
isotropic form (the default) and the estimators without logits leave the alignment out."""

import dataclasses

import pytest
import torch

from causal_lm import CausalLM
from gauss_newton import gauss_newton_along
from planner.divergence import DivergenceConfig, lm_logits, measure
from planner.stats import StatsConfig
from snip_ops import LinearPrecision, SnipLinear, convert

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 24
CONFIG = dict(dim=64, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=96, max_seq_len=8, vocab_size=VOCAB)


def _model_and_batch(sequences: int = 2, positions: int = 4):
    torch.manual_seed(0)
    model = convert(CausalLM.build(**CONFIG))
    layers = {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}
    batch = torch.randint(0, VOCAB, (sequences, positions + 1), generator=torch.Generator().manual_seed(3))
    return model, layers, batch


def _measure(model, layers, batch, **config):
    return measure(model, layers, None, batch, lambda m, b: m.loss(b), ("bf16", "fp8", "fp4"),
                   StatsConfig(max_rows=128), DivergenceConfig(**{"ld_form": "directional", **config}),
                   logits_fn=lm_logits)


def _forward_error(model, layer, batch, precision: str) -> torch.Tensor:
    """The layer's output under `precision`'s forward GEMM minus its bf16 output, on its own input in the batch."""
    box = {}
    handle = layer.register_forward_hook(lambda mod, args, y: box.update(x=args[0].detach(), y=y.detach()))
    try:
        with torch.no_grad():
            model(batch[:, :-1])
    finally:
        handle.remove()
    saved = layer.precision
    layer.set_precision(LinearPrecision(fprop=precision, dgrad="bf16", wgrad="bf16"))
    try:
        with torch.no_grad():
            return layer(box["x"]).float() - box["y"].float()
    finally:
        layer.set_precision(saved)


def _per_position_gauss_newton(model, layer, error, batch) -> float:
    """sum_t 1/2 e_t^T G e_t, e_t the error at position t alone (the rest zero)."""
    flat = error.reshape(-1, error.shape[-1])
    total = 0.0
    for t in range(flat.shape[0]):
        only_t = torch.zeros_like(flat)
        only_t[t] = flat[t]
        total += gauss_newton_along(model, layer, only_t.reshape(error.shape), batch)
    return total


def test_directional_ld_is_unbiased_for_the_gauss_newton_form_along_the_actual_error():
    model, layers, batch = _model_and_batch()
    draws = 400
    stats = _measure(model, layers, batch, draws=draws).by_name()
    for name in ("model.layers.0.self_attn.v_proj", "model.layers.0.mlp.down_proj"):
        for precision in ("fp8", "fp4"):
            error = _forward_error(model, layers[name], batch, precision)
            want = _per_position_gauss_newton(model, layers[name], error, batch)
            assert want > 0
            # one draw sums 8 positions' squares of roughly Gaussian terms: relative SD about sqrt(2 / 8) = 0.5, so
            # 0.025 over 400 draws; 0.15 is 6 standard errors
            assert stats[name].ld(precision) == pytest.approx(want, rel=0.15), (name, precision)


def test_a_row_sample_scales_to_the_whole_batch():
    """On m of the M rows the estimate is scaled by M / m: over row samples (the statistics seed; the same label
    draws) its mean is the estimate on every row, within 5 standard errors of the samples' spread."""
    model, layers, batch = _model_and_batch(sequences=4, positions=8)
    config = DivergenceConfig(draws=2, ld_form="directional")

    def ld(rows: int, seed: int) -> torch.Tensor:
        stats = measure(model, layers, None, batch, lambda m, b: m.loss(b), ("fp4",), StatsConfig(max_rows=rows,
                        seed=seed), config, logits_fn=lm_logits)
        return torch.tensor([s.ld("fp4") for s in stats.layers], dtype=torch.float64)
    whole = ld(128, 0)
    samples = torch.stack([ld(16, seed) for seed in range(48)])  # 16 of the 32 rows
    standard_error = samples.std(0) / len(samples) ** 0.5
    assert (standard_error > 0).all()
    assert ((samples.mean(0) - whole).abs() < 5 * standard_error).all(), (samples.mean(0) / whole)


def test_directional_ld_changes_only_ld():
    model, layers, batch = _model_and_batch()
    directional = _measure(model, layers, batch, draws=2)
    isotropic = _measure(model, layers, batch, draws=2, ld_form="isotropic")
    assert directional.diagnostics["ld_directional"] == 1.0 and isotropic.diagnostics["ld_directional"] == 0.0
    for d, i in zip(directional.layers, isotropic.layers):
        assert i.fprop_alignment == {} and set(d.fprop_alignment) == {"fp8", "fp4"}  # bf16 has no error to align
        assert dataclasses.replace(d, fprop_alignment={}) == i
        assert d.ld("bf16") == 0.0
        for p in ("fp8", "fp4"):
            assert i.ld(p) == d.curvature * d.errors[p]["fprop"]
            assert d.ld(p) == pytest.approx(i.ld(p) * d.fprop_alignment[p], rel=1e-12)
            assert d.fprop_alignment[p] > 0


def test_the_estimators_without_logits_have_no_alignment():
    model, layers, batch = _model_and_batch()
    stats = measure(model, layers, None, batch, lambda m, b: m.loss(b), ("fp4",), StatsConfig(max_rows=128),
                    DivergenceConfig(draws=1, method="batched", ld_form="directional"))
    assert stats.diagnostics["ld_directional"] == 0.0 and all(s.fprop_alignment == {} for s in stats.layers)


def test_ld_is_isotropic_by_default():
    model, layers, batch = _model_and_batch()
    stats = measure(model, layers, None, batch, lambda m, b: m.loss(b), ("fp4",), StatsConfig(max_rows=128),
                    DivergenceConfig(draws=1), logits_fn=lm_logits)
    assert stats.diagnostics["ld_directional"] == 0.0 and all(s.fprop_alignment == {} for s in stats.layers)


def test_ld_form_is_validated():
    with pytest.raises(ValueError, match="ld_form must be one of"):
        DivergenceConfig(ld_form="structured")
