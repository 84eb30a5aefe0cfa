"""A user's own model for the library's tests: Hugging Face transformers' Llama, built from a config
(random weights, no download), with the two methods the planner's default loss and the sharpness
metric call: `forward(tokens) -> logits` and `loss(window)` (mean next-token cross-entropy of
`window[:, 1:]` given `window[:, :-1]`). The demo trainer's own model (snip_train) is left to the
application's tests."""

import torch
import transformers
from torch.nn import functional as F


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


# A model small enough for the sharpness metrics' tests, and its held-out batches.
MICRO = dict(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=64, max_seq_len=16)


def micro_model_and_batches() -> tuple[CausalLM, list]:
    torch.manual_seed(0)
    model = CausalLM.build(**MICRO)
    gen = torch.Generator().manual_seed(1)
    return model, [torch.randint(0, 256, (4, 17), generator=gen) for _ in range(2)]
