"""A small Llama-style decoder-only language model.

The module tree mirrors Hugging Face ``LlamaForCausalLM`` so that code written
against HF names (plans, hooks, state-dict conversion) works unchanged::

    Llama
    ├── model                                   (LlamaModel)
    │   ├── embed_tokens                        nn.Embedding
    │   ├── layers[i]                           (DecoderLayer)
    │   │   ├── input_layernorm                 RMSNorm
    │   │   ├── self_attn.{q,k,v,o}_proj        nn.Linear(bias=False)
    │   │   ├── post_attention_layernorm        RMSNorm
    │   │   └── mlp.{gate,up,down}_proj         nn.Linear(bias=False)
    │   └── norm                                RMSNorm
    └── lm_head                                 nn.Linear(bias=False)

so e.g. the fully-qualified name of the first gate projection is
``model.layers.0.mlp.gate_proj``. Every projection is a plain ``nn.Linear`` so
``snip_ops.convert(model, ...)`` can swap it for a low-precision ``SnipLinear``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LlamaConfig", "PRESETS", "Llama", "RMSNorm", "rope_cos_sin", "apply_rope"]


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 256  # byte-level
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2  # grouped-query attention; must divide n_heads
    ffn_hidden: int = 384
    max_seq_len: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02

    def __post_init__(self):
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} not divisible by n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @classmethod
    def preset(cls, name: str, **overrides) -> "LlamaConfig":
        """A named preset (see ``PRESETS``), optionally with some fields overridden."""
        try:
            base = PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown model preset {name!r}; choose from {sorted(PRESETS)}") from None
        return dataclasses.replace(base, **overrides) if overrides else base

    def num_params(self) -> int:
        """Parameter count implied by the config (matches ``Llama(cfg).num_params()``)."""
        d, hd = self.dim, self.head_dim
        attn = d * self.n_heads * hd * 2 + d * self.n_kv_heads * hd * 2
        mlp = 3 * d * self.ffn_hidden
        per_layer = attn + mlp + 2 * d
        emb = self.vocab_size * d
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return emb + self.n_layers * per_layer + d + head


PRESETS: dict[str, LlamaConfig] = {
    # ~0.85M params; 300 steps of batch 8 x 128 take ~15 s (bf16) on 2 CPU cores.
    # Widths are multiples of 128 so the 1x128 / 128x128 FP8/FP4 blocks need no padding.
    "tiny": LlamaConfig(dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=384, max_seq_len=128),
    # ~10.8M params (12.7x tiny), the same 128-token context: the planner benchmark's larger model on a CPU.
    "mini": LlamaConfig(dim=384, n_layers=6, n_heads=6, n_kv_heads=6, ffn_hidden=1024, max_seq_len=128),
    # ~25M params.
    "small": LlamaConfig(dim=512, n_layers=8, n_heads=8, n_kv_heads=4, ffn_hidden=1536, max_seq_len=512),
    # ~1.0B params, Llama-3.2-1B shape with a byte vocabulary; for GPUs.
    "1b": LlamaConfig(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_hidden=8192, max_seq_len=2048,
        rope_theta=500000.0,
    ),
}


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 (as HF ``LlamaRMSNorm``), output in the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, device=None, offset: int = 0):
    """cos/sin tables of shape [seq_len, head_dim] in float32 (HF "rotate_half" layout).

    Computed on the fly (it is tiny) rather than stored as a buffer, so that casting the
    model to bf16 never degrades the rotation angles.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    pos = torch.arange(offset, offset + seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)  # [T, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [..., T, head_dim] by position; computed in float32, returned in x.dtype."""
    xf = x.float()
    return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        if self.n_kv_heads != self.n_heads:
            # query head h attends with kv head h // (n_heads / n_kv_heads)
            rep = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.o_proj(y)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class LlamaModel(nn.Module):
    """The transformer trunk: embeddings -> decoder layers -> final norm (hidden states)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len={self.config.max_seq_len}")
        cos, sin = rope_cos_sin(T, self.config.head_dim, self.config.rope_theta, device=tokens.device)
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class Llama(nn.Module):
    """Decoder-only LM. ``forward(tokens [B, T]) -> logits [B, T, vocab]``."""

    def __init__(self, config: LlamaConfig | str = "tiny"):
        super().__init__()
        if isinstance(config, str):
            config = LlamaConfig.preset(config)
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.reset_parameters()
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, init_std) for all matrices; residual-branch outputs (o_proj, down_proj)
        scaled by 1/sqrt(2 * n_layers) (GPT-2); norms to one."""
        std = self.config.init_std
        resid_std = std / math.sqrt(2 * self.config.n_layers)
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                s = resid_std if name.endswith(("o_proj", "down_proj")) else std
                nn.init.normal_(m.weight, mean=0.0, std=s)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=std)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(tokens))

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Mean next-token cross-entropy (nats), computed in float32.

        ``loss(window)`` with ``window`` [B, T+1] predicts ``window[:, 1:]`` from
        ``window[:, :-1]``; ``loss(x, y)`` with both [B, T] uses ``y`` as the targets.
        """
        if targets is None:
            tokens, targets = tokens[:, :-1], tokens[:, 1:]
        logits = self(tokens)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # shared (tied) params counted once
