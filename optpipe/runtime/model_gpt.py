"""A small, readable GPT (nanoGPT-style) that follows the runtime's pipeline protocol.

The model is the reference workload of the runtime: tests train it in float64 and
compare pipelined gradients against a plain ``loss.backward()``; ``optpipe profile`` and
``optpipe run`` build it from a model preset (``models/tiny-gpt.toml``). It is laid out
the way :mod:`optpipe.runtime.partition` wants a model: ``pre`` (token and position
embeddings), ``blocks`` (the transformer blocks, cut between stages) and ``post`` (final
norm and the language-model head). With tied embeddings the head reuses ``pre.wte``'s
weight; the runner keeps the two copies in step when they land on different ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from optpipe.errors import OptPipeError


@dataclass(frozen=True)
class GPTConfig:
    """The architecture of :class:`GPT`; field names follow the model presets."""

    layers: int = 4
    hidden: int = 64
    heads: int = 4
    ffn_hidden: int = 256
    vocab: int = 256
    seq_len: int = 32
    activation: str = "gelu"
    gated_mlp: bool = False
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    position: str = "learned"
    tied_embeddings: bool = True
    bias: bool = True
    dropout: float = 0.0

    @classmethod
    def from_preset(cls, preset: Any = "tiny-gpt", **overrides: Any) -> "GPTConfig":
        """A config from a preset name, a :class:`~optpipe.presets.ModelPreset` or a dict.

        Keys the GPT does not use (``kv_heads``, ``source``...) are ignored, so any model
        preset file can be read; ``overrides`` replace single fields (``layers=8``).
        """
        if isinstance(preset, str):
            from optpipe.presets import load_model_preset

            preset = load_model_preset(preset)
        if isinstance(preset, GPTConfig):
            data: dict[str, Any] = {f.name: getattr(preset, f.name) for f in fields(cls)}
        elif isinstance(preset, Mapping):
            data = dict(preset)
        else:
            data = {f.name: getattr(preset, f.name) for f in fields(cls)
                    if hasattr(preset, f.name)}
        known = {f.name for f in fields(cls)}
        kv_heads = data.get("kv_heads", getattr(preset, "kv_heads", None))
        if kv_heads is not None and kv_heads != data.get("heads", cls.heads):
            raise OptPipeError("the reference GPT has no grouped-query attention; use a "
                               "preset with kv_heads == heads")
        config = cls(**{k: v for k, v in data.items() if k in known})
        config = replace(config, **overrides)
        config.check()
        return config

    def check(self) -> None:
        """Reject what the reference GPT cannot build, naming the field."""
        if self.hidden % self.heads:
            raise OptPipeError(f"hidden ({self.hidden}) must be a multiple of heads "
                               f"({self.heads})")
        if self.activation not in _ACTIVATIONS:
            raise OptPipeError(f"activation {self.activation!r} is not one of "
                               f"{sorted(_ACTIVATIONS)}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise OptPipeError(f"norm {self.norm!r} is not 'layernorm' or 'rmsnorm'")
        if self.position != "learned":
            raise OptPipeError("the reference GPT only has learned positions "
                               f"(position = \"learned\"), not {self.position!r}")


_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "silu": F.silu}


def _norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.hidden, eps=config.norm_eps)
    return nn.LayerNorm(config.hidden, eps=config.norm_eps, bias=config.bias)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused QKV projection."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden, bias=config.bias)
        self.proj = nn.Linear(config.hidden, config.hidden, bias=config.bias)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        shape = (batch, seq, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(batch, seq, width)
        return F.dropout(self.proj(y), self.dropout, self.training)


class MLP(nn.Module):
    """The feed-forward part of a block (GELU by default; gated as in SwiGLU if asked)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.gated = config.gated_mlp
        width = config.ffn_hidden * (2 if self.gated else 1)
        self.fc = nn.Linear(config.hidden, width, bias=config.bias)
        self.proj = nn.Linear(config.ffn_hidden, config.hidden, bias=config.bias)
        self.act = _ACTIVATIONS[config.activation]
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = self.act(gate) * up
        else:
            h = self.act(h)
        return F.dropout(self.proj(h), self.dropout, self.training)


class Block(nn.Module):
    """One pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.norm1 = _norm(config)
        self.attn = CausalSelfAttention(config)
        self.norm2 = _norm(config)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Embedding(nn.Module):
    """Token plus learned position embeddings: the ``pre`` part of the pipeline."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab, config.hidden)
        self.wpe = nn.Embedding(config.seq_len, config.hidden)
        self.dropout = config.dropout

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return F.dropout(self.wte(idx) + self.wpe(positions), self.dropout, self.training)


class Head(nn.Module):
    """Final norm and the vocabulary projection: the ``post`` part of the pipeline."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.norm = _norm(config)
        self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))


class GPT(nn.Module):
    """nanoGPT-style decoder: ``post(blocks(pre(tokens)))`` -> logits (batch, seq, vocab)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.pre = Embedding(config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.post = Head(config)
        if config.tied_embeddings:
            self.post.lm_head.weight = self.pre.wte.weight
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2's scaled init of residual projections
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.pre(idx)
        for block in self.blocks:
            x = block(x)
        return self.post(x)


def gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; a mean, so microbatch losses average to the batch's."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def gpt_batch(config: GPTConfig, batch: int, seed: int = 0,
              seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and next-token targets, reproducible from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    length = seq_len or config.seq_len
    tokens = torch.randint(0, config.vocab, (batch, length + 1), generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
