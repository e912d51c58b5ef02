"""The smallest pipeline workload: an ``nn.Sequential`` of Linear+Tanh blocks.

It shows that any ``nn.Sequential`` runs as is (each child is one block the partition can
cut after), and its ``Tanh`` at every stage boundary makes the stage output a *saved*
tensor, which exercises the runtime's handling of saved tensors that are also sent.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def mlp_model(depth: int = 4, width: int = 16, in_features: int = 8,
              out_features: int = 4, seed: int = 0) -> nn.Sequential:
    """``depth`` blocks of Linear+Tanh, then a Linear head (inside the last block)."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        blocks: list[nn.Module] = []
        for i in range(depth):
            fan_in = in_features if i == 0 else width
            if i == depth - 1:
                blocks.append(nn.Sequential(nn.Linear(fan_in, width), nn.Tanh(),
                                            nn.Linear(width, out_features)))
            else:
                blocks.append(nn.Sequential(nn.Linear(fan_in, width), nn.Tanh()))
        return nn.Sequential(*blocks)
    finally:
        torch.random.set_rng_state(generator_state)


def mse_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error (a mean, so microbatch losses average to the batch's)."""
    return F.mse_loss(output, target)


def mlp_batch(batch: int, in_features: int = 8, out_features: int = 4,
              seed: int = 0, dtype: torch.dtype = torch.float32
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs and targets, reproducible from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, in_features, generator=generator, dtype=dtype)
    y = torch.randn(batch, out_features, generator=generator, dtype=dtype)
    return x, y
