"""Hugging Face transformers' Llama (random weights from a config, no download): convert() swaps its
projections; loss and gradients stay close to bf16; checkpoints stay loadable unconverted."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from snip_ops import SnipLinear, convert  # noqa: E402


def _model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_convert_swaps_projections_only():
    model = convert(_model(), "fp8")
    swapped = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, SnipLinear)}
    assert swapped == PROJECTIONS
    assert type(model.lm_head) is torch.nn.Linear
    assert sum(isinstance(m, SnipLinear) for m in model.modules()) == 14


# Over 16 draws (model seeds and token batches) the relative loss change is 0 +- 0.00016 (fp8) and
# 0 +- 0.0006 (mxfp4) (mean +- sd), the worst parameter's gradient SQNR 21.1 +- 0.5 and 6.9 +- 0.5 dB:
# each limit is >= 6 sd away.
@pytest.mark.parametrize("precision,loss_tol,grad_sqnr", [("fp8", 0.001, 18.0), ("mxfp4", 0.004, 3.5)])
def test_loss_and_grads_close_to_high_precision(precision, loss_tol, grad_sqnr):
    tokens = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(1))
    ref = _model()
    loss_ref = ref(tokens, labels=tokens).loss
    loss_ref.backward()
    model = convert(_model(), precision)
    loss = model(tokens, labels=tokens).loss
    loss.backward()
    assert abs(loss.item() - loss_ref.item()) / loss_ref.item() < loss_tol
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
        err = (p.grad - p_ref.grad).pow(2).sum() / p_ref.grad.pow(2).sum()
        assert -10 * torch.log10(err) > grad_sqnr, name


def test_save_pretrained_loads_into_unconverted_model(tmp_path):
    model = convert(_model(), "fp4")
    model.save_pretrained(tmp_path)
    plain = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    assert not any(isinstance(m, SnipLinear) for m in plain.modules())
    for (k, v), (k2, v2) in zip(model.state_dict().items(), plain.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
