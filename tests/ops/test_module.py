"""SnipLinear and convert: module swap, plans, state dicts, errors."""

import pytest
import torch
from torch import nn

from snip_ops import LinearPrecision, SnipLinear, convert
from snip_ops.module import plan_for


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(16, 32)
        self.layers = nn.ModuleList(
            nn.ModuleDict({"q_proj": nn.Linear(32, 32, bias=False), "down_proj": nn.Linear(32, 32)}) for _ in range(2)
        )
        self.lm_head = nn.Linear(32, 16, bias=False)

    def forward(self, tokens):
        h = self.embed_tokens(tokens)
        for layer in self.layers:
            h = h + layer["down_proj"](torch.relu(layer["q_proj"](h)))
        return self.lm_head(h)


def test_convert_swaps_all_but_embedding_and_head():
    model = Block()
    convert(model, "fp8")
    kinds = {n: type(m) for n, m in model.named_modules()}
    assert kinds["layers.0.q_proj"] is SnipLinear and kinds["layers.1.down_proj"] is SnipLinear
    assert kinds["lm_head"] is nn.Linear and kinds["embed_tokens"] is nn.Embedding
    assert str(model.layers[0]["q_proj"].precision) == "fp8"


def test_state_dict_identical_to_nn_linear():
    torch.manual_seed(0)
    plain = Block()
    sd = {k: v.clone() for k, v in plain.state_dict().items()}
    converted = convert(Block(), "fp4")
    converted.load_state_dict(sd)
    assert converted.state_dict().keys() == sd.keys()
    for k in sd:
        assert torch.equal(converted.state_dict()[k], sd[k])
    fresh = Block()
    fresh.load_state_dict(converted.state_dict())  # loadable into an unconverted model


def test_convert_shares_parameters():
    model = Block()
    params = list(model.parameters())
    convert(model, "fp8")
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]


def test_plan_patterns_and_reconversion():
    model = Block()
    convert(model, {"layers.0.q_proj": "fp4", "*.down_proj": {"fprop": "fp8", "dgrad": "fp4", "wgrad": "fp8"}, "*": "fp8"})
    assert str(model.layers[0]["q_proj"].precision) == "fp4"
    assert str(model.layers[1]["q_proj"].precision) == "fp8"
    assert str(model.layers[0]["down_proj"].precision) == "fp8/fp4/fp8"
    convert(model, "bf16")  # already converted modules take the new plan
    assert model.layers[0]["q_proj"].precision.is_bf16
    with pytest.raises(ValueError, match="matches no linear layer"):
        convert(model, {"layers.9.q_proj": "fp8"})


def test_filter_fn_and_plain_linear_model():
    model = Block()
    convert(model, "fp8", filter_fn=lambda m, name: name.endswith("q_proj"))
    assert type(model.layers[0]["down_proj"]) is nn.Linear
    lin = convert(nn.Linear(8, 4), "fp8")
    assert isinstance(lin, SnipLinear)
    with pytest.raises(TypeError, match="nn.Module"):
        convert("model", "fp8")


def test_converted_model_trains_and_sr_step_advances():
    torch.manual_seed(0)
    model = convert(Block(), "fp4")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(0, 16, (4, 8))
    losses = []
    for _ in range(20):
        loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0  # a drop of 2.5 +- 0.2 (mean +- sd over seeds 0-9)
    assert int(model.layers[0]["q_proj"].sr_step) == 20


def test_plan_for():
    assert plan_for("a.b", None).is_bf16
    assert str(plan_for("a.b", {"a.*": "fp8"})) == "fp8"
    assert plan_for("c", {"a.*": "fp8"}).is_bf16
    assert plan_for("x", LinearPrecision("fp4")) == LinearPrecision("fp4")


def test_snip_linear_constructor_and_repr():
    m = SnipLinear(8, 4, precision="mxfp8")
    assert "precision=mxfp8" in repr(m)
    m.set_precision("bf16")
    assert m(torch.randn(2, 8)).shape == (2, 4)


def test_emulate_flag_reaches_every_converted_layer():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    convert(model, "fp8", emulate=True)
    assert all(m.emulate for m in model) and "emulate=True" in repr(model[0])
    convert(model, "fp4")  # a new plan keeps the flag ...
    assert all(m.emulate for m in model)
    convert(model, "fp4", emulate=False)  # ... unless told otherwise
    assert not any(m.emulate for m in model)
    # On the CPU both settings run the emulated GEMMs: identical results.
    x = torch.randn(5, 8)
    y0 = model(x)
    convert(model, "fp4", emulate=True)
    torch.testing.assert_close(model(x), y0, rtol=0, atol=0)
