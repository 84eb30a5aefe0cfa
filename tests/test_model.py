"""snip_train.model: shapes, names, causality, GQA, RoPE, init."""

import math

import pytest
import torch
from torch import nn

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
    torch.testing.assert_close(a[:, :t], b[:, :t], atol=1e-5, rtol=0)
    assert (a[:, t:] - b[:, t:]).abs().amax() > 1e-3


def test_gqa_equals_mha_with_repeated_kv_heads():
    torch.manual_seed(0)
    gqa = Attention(SMALL)
    mha_cfg = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=4, ffn_hidden=96, max_seq_len=32)
    mha = Attention(mha_cfg)
    hd = SMALL.head_dim
    rep = SMALL.n_heads // SMALL.n_kv_heads
    with torch.no_grad():
        mha.q_proj.weight.copy_(gqa.q_proj.weight)
        mha.o_proj.weight.copy_(gqa.o_proj.weight)
        for src, dst in ((gqa.k_proj, mha.k_proj), (gqa.v_proj, mha.v_proj)):
            w = src.weight.view(SMALL.n_kv_heads, hd, SMALL.dim).repeat_interleave(rep, dim=0)
            dst.weight.copy_(w.reshape(-1, SMALL.dim))
    x = torch.randn(2, 10, 64)
    cos, sin = rope_cos_sin(10, hd, SMALL.rope_theta)
    torch.testing.assert_close(gqa(x, cos, sin), mha(x, cos, sin), atol=1e-5, rtol=1e-5)


def test_rope_relative_position_invariance():
    torch.manual_seed(0)
    hd = 32
    q, k = torch.randn(hd), torch.randn(hd)

    def rot(v, pos):
        cos, sin = rope_cos_sin(1, hd, 10000.0, offset=pos)
        return apply_rope(v.view(1, hd), cos, sin).view(hd)

    ref = rot(q, 7) @ rot(k, 3)
    for shift in (0, 1, 10, 100):
        torch.testing.assert_close(rot(q, 7 + shift) @ rot(k, 3 + shift), ref, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(rot(q, 9) @ rot(k, 3), ref, atol=1e-3)  # depends on the distance
    torch.testing.assert_close(rot(q, 0), q)  # position 0 is the identity
    torch.testing.assert_close(rot(q, 55).norm(), q.norm())  # a rotation


def test_init_loss_and_std():
    m = _model(LlamaConfig.preset("tiny"))
    x = torch.randint(0, 256, (4, 65))
    with torch.no_grad():
        loss = m.loss(x)
    assert abs(loss.item() - math.log(256)) < 0.1
    # loss(x, y) form agrees with the window form
    with torch.no_grad():
        torch.testing.assert_close(m.loss(x[:, :-1], x[:, 1:]), loss)
    L = m.config.n_layers
    assert abs(m.model.layers[0].mlp.gate_proj.weight.std().item() - 0.02) < 0.002
    assert abs(m.model.layers[0].mlp.down_proj.weight.std().item() - 0.02 / math.sqrt(2 * L)) < 0.001


def test_backward_and_tied_embeddings():
    m = _model(LlamaConfig(dim=64, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=64, max_seq_len=16,
                           tie_embeddings=True)).train()
    assert m.lm_head.weight is m.model.embed_tokens.weight
    m.loss(torch.randint(0, 256, (2, 9))).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
