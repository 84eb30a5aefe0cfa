"""A user's own model for the library's tests: Hugging Face transformers' Llama, built from a config
(random weights, no download), with the two methods the planner's default loss and the sharpness
metric call: `forward(tokens) -> logits` and `loss(window)` (mean next-token cross-entropy of
`window[:, 1:]` given `window[:, :-1]`). The demo trainer's own model (snip_train) is left to the
application's tests."""

import torch
import transformers
from torch.nn import functional as F

from snip_ops import SnipLinear, convert


class CausalLM(transformers.LlamaForCausalLM):
    @classmethod
    def build(cls, dim: int, n_layers: int, n_heads: int, n_kv_heads: int, ffn_hidden: int, max_seq_len: int,
              vocab_size: int = 256) -> "CausalLM":
        return cls(transformers.LlamaConfig(
            vocab_size=vocab_size, hidden_size=dim, intermediate_size=ffn_hidden, num_hidden_layers=n_layers,
            num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, max_position_embeddings=max_seq_len,
            attn_implementation="eager"))

    def forward(self, tokens):
        return super().forward(input_ids=tokens, use_cache=False).logits

    def loss(self, window):
        logits = self(window[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))


def trained_causal_lm(config: dict, vocab_size: int, sequences: int = 5, steps: int = 3):
    """A converted CausalLM of `config` after `steps` AdamW steps (so the optimizer has Adam state), its SnipLinear
    layers, the optimizer and a batch of `sequences` windows of 13 tokens."""
    torch.manual_seed(0)
    model = convert(CausalLM.build(**config, vocab_size=vocab_size))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(2)
    for _ in range(steps):
        model.loss(torch.randint(0, vocab_size, (4, 13), generator=gen)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}
    return model, layers, opt, torch.randint(0, vocab_size, (sequences, 13), generator=gen)


# A model small enough for the sharpness metrics' tests, and its held-out batches.
MICRO = dict(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=64, max_seq_len=16)


def micro_model_and_batches() -> tuple[CausalLM, list]:
    torch.manual_seed(0)
    model = CausalLM.build(**MICRO)
    gen = torch.Generator().manual_seed(1)
    return model, [torch.randint(0, 256, (4, 17), generator=gen) for _ in range(2)]
