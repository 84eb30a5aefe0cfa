"""snip_train.model: shapes, names, causality, GQA, RoPE, init."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bounds import gamma, unit_roundoff
from snip_train.model import PRESETS, Attention, Llama, LlamaConfig, apply_rope, rope_cos_sin

SMALL = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=96, max_seq_len=32)


def _model(cfg=SMALL, seed=0):
    torch.manual_seed(seed)
    return Llama(cfg).eval()


def test_presets():
    tiny = Llama("tiny")
    assert tiny.num_params() == PRESETS["tiny"].num_params()
    assert tiny.num_params() < 2e6
    assert 20e6 <= PRESETS["small"].num_params() <= 30e6
    assert PRESETS["mini"].num_params() >= 10 * PRESETS["tiny"].num_params()  # the planner bench's larger model
    assert 0.8e9 <= PRESETS["1b"].num_params() <= 1.3e9
    assert LlamaConfig.preset("tiny", n_layers=2).n_layers == 2
    with pytest.raises(ValueError):
        LlamaConfig.preset("nope")
    with pytest.raises(ValueError):
        LlamaConfig(dim=64, n_heads=4, n_kv_heads=3)
    with pytest.raises(Exception):  # frozen
        PRESETS["tiny"].dim = 3


def test_hf_module_names_and_plain_linears():
    m = _model()
    names = dict(m.named_modules())
    assert isinstance(names["model.embed_tokens"], nn.Embedding)
    assert isinstance(names["lm_head"], nn.Linear)
    assert "model.norm" in names
    for i in range(SMALL.n_layers):
        for sub in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            lin = names[f"model.layers.{i}.{sub}"]
            assert type(lin) is nn.Linear and lin.bias is None
        assert f"model.layers.{i}.input_layernorm" in names
        assert f"model.layers.{i}.post_attention_layernorm" in names
    n_linear = sum(type(x) is nn.Linear for x in m.modules())
    assert n_linear == 7 * SMALL.n_layers + 1


def test_forward_shapes_and_gqa_shapes():
    m = _model()
    x = torch.randint(0, 256, (3, 17))
    assert m(x).shape == (3, 17, 256)
    attn = m.model.layers[0].self_attn
    hd = SMALL.dim // SMALL.n_heads
    assert attn.q_proj.weight.shape == (SMALL.n_heads * hd, SMALL.dim)
    assert attn.k_proj.weight.shape == (SMALL.n_kv_heads * hd, SMALL.dim)
    assert attn.v_proj.weight.shape == (SMALL.n_kv_heads * hd, SMALL.dim)
    assert attn.o_proj.weight.shape == (SMALL.dim, SMALL.n_heads * hd)
    with pytest.raises(ValueError):
        m(torch.randint(0, 256, (1, SMALL.max_seq_len + 1)))


def test_causal_masking():
    m = _model()
    x = torch.randint(0, 256, (2, 24))
    t = 13
    x2 = x.clone()
    x2[:, t] = (x2[:, t] + 7) % 256
    with torch.no_grad():
        a, b = m(x), m(x2)
    # Exact: a GEMM's row never depends on other rows' values, and masked keys weigh exactly 0.
    assert torch.equal(a[:, :t], b[:, :t])
    assert (a[:, t:] - b[:, t:]).abs().amax() > 1e-3  # ~0.66: a different token, not rounding


def test_gqa_equals_mha_with_repeated_kv_heads(monkeypatch):
    torch.manual_seed(0)
    gqa = Attention(SMALL)
    mha_cfg = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=4, ffn_hidden=96, max_seq_len=32)
    mha = Attention(mha_cfg)
    hd = SMALL.head_dim
    rep = SMALL.n_heads // SMALL.n_kv_heads
    with torch.no_grad():
        # Dyadic weights and inputs (multiples of 2^-6 and 2^-2): every projection sum is exact in
        # float32 in any order, so both see the same q, k, v bits, and the same ops follow.
        for p in gqa.parameters():
            p.copy_(torch.randint(-8, 9, p.shape) / 64)
        mha.q_proj.weight.copy_(gqa.q_proj.weight)
        mha.o_proj.weight.copy_(gqa.o_proj.weight)
        for src, dst in ((gqa.k_proj, mha.k_proj), (gqa.v_proj, mha.v_proj)):
            w = src.weight.view(SMALL.n_kv_heads, hd, SMALL.dim).repeat_interleave(rep, dim=0)
            dst.weight.copy_(w.reshape(-1, SMALL.dim))
    x = torch.randint(-4, 5, (2, 10, 64)) / 4
    cos, sin = rope_cos_sin(10, hd, SMALL.rope_theta)
    sdpa = F.scaled_dot_product_attention  # one memory layout for both (repeat_interleave copies)
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: sdpa(q.contiguous(), k.contiguous(), v.contiguous(), **kw))
    assert torch.equal(gqa(x, cos, sin), mha(x, cos, sin))


def test_rope_relative_position_invariance():
    torch.manual_seed(0)
    hd = 32
    q, k = torch.randn(hd), torch.randn(hd)

    def rot(v, pos):
        cos, sin = rope_cos_sin(1, hd, 10000.0, offset=pos)
        return apply_rope(v.view(1, hd), cos, sin).view(hd)

    u = unit_roundoff(torch.float32)
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    q_pair, k_pair = (v.abs().double().view(2, -1).sum(0) for v in (q, k))  # |x_i| + |x_i+hd/2| per angle

    def dot_bound(pos_q, pos_k):
        """|fl(rot(q, pos_q) . rot(k, pos_k)) - exact|. The angle pos * inv_freq is off by <= 5u of
        itself (pow, division, product), cos and sin by 2u more (1 ulp), the rotation's products and
        sum by 2u: a rotated component is within (|x_i| + |x_i+hd/2|) (5u angle + 4u) of the exact
        one; the dot product adds gamma_hd (second-order terms are covered by rounding 4u up to 5u)."""
        per_pair = 5 * u * (pos_q + pos_k) * inv_freq + 8 * u + gamma(hd)
        return float((2 * q_pair * k_pair * per_pair).sum())

    ref = rot(q, 7) @ rot(k, 3)
    for shift in (0, 1, 10, 100):
        assert abs(rot(q, 7 + shift) @ rot(k, 3 + shift) - ref) <= dot_bound(7 + shift, 3 + shift) + dot_bound(7, 3)
    assert abs(rot(q, 9) @ rot(k, 3) - ref) > 100 * (dot_bound(9, 3) + dot_bound(7, 3))  # depends on the distance
    assert torch.equal(rot(q, 0), q)  # position 0 is the identity: cos 0 = 1, sin 0 = 0 exactly
    # a rotation: rotating by the rounded angle keeps the norm; cos, sin and the rotation's rounding
    # move each component by <= 4u (|x_i| + |x_i+hd/2|); each norm is computed to gamma_hd / 2 + u
    rotated = rot(q, 55)
    moved = 4 * u * float((2 * q_pair.pow(2).sum()).sqrt())
    norms_rounding = (gamma(hd) / 2 + u) * float(rotated.norm() + q.norm())
    assert abs(rotated.norm() - q.norm()) <= moved + norms_rounding


def test_init_loss_and_std():
    m = _model(LlamaConfig.preset("tiny"))
    x = torch.randint(0, 256, (4, 65))
    with torch.no_grad():
        loss = m.loss(x)
        logits = m(x[:, :-1]).float().reshape(-1, 256)
    # Random targets are independent of the logits z that predict them: given z the expected loss is
    # mean(logsumexp(z) - mean(z)), which is ln 256 plus a Jensen gap ~ var(z) / 2 (~0.025 for the
    # 0.02 init); the targets add noise of standard error sd(per-token loss - its expectation) / sqrt(n).
    per_token = F.cross_entropy(logits, x[:, 1:].reshape(-1), reduction="none")
    expected = logits.logsumexp(-1) - logits.mean(-1)
    standard_error = float((per_token - expected).std()) / per_token.numel() ** 0.5
    assert abs(loss.item() - expected.mean().item()) < 6 * standard_error
    assert 0 <= expected.mean().item() - math.log(256) < 0.1
    # loss(x, y) form agrees with the window form: the same call
    with torch.no_grad():
        assert torch.equal(m.loss(x[:, :-1], x[:, 1:]), loss)
    # sample standard deviations of N(0, s^2) weights: standard error s / sqrt(2 n)
    L = m.config.n_layers
    for w, s in ((m.model.layers[0].mlp.gate_proj.weight, 0.02), (m.model.layers[0].mlp.down_proj.weight,
                                                                  0.02 / math.sqrt(2 * L))):
        assert abs(w.std().item() - s) < 6 * s / math.sqrt(2 * w.numel())


def test_backward_and_tied_embeddings():
    m = _model(LlamaConfig(dim=64, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=64, max_seq_len=16,
                           tie_embeddings=True)).train()
    assert m.lm_head.weight is m.model.embed_tokens.weight
    m.loss(torch.randint(0, 256, (2, 9))).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
