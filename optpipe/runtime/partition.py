"""Cutting a model into pipeline stages: the model protocol and the balanced partition.

A model the runner can split is one of:

* an ``nn.Sequential`` — every child is one *block*;
* a model with a list of blocks in an attribute ``blocks`` or ``layers``
  (``nn.ModuleList`` or ``nn.Sequential``) and, optionally, a ``pre`` module run before
  the first block (embeddings) and a ``post`` module run after the last (final norm,
  head);
* any model with a method ``pipeline_parts()`` returning :class:`PipelineParts`.

The model's forward must be ``post(block_n(...block_1(pre(x))))`` with **one tensor**
between blocks: that tensor is what crosses a stage boundary. ``pre`` goes with stage 0
and ``post`` with the last stage. A partition is the number of blocks per stage; the
default balances a modelled compute cost (parameters of every module except
embeddings, which are table look-ups, not matrix products), so the head of a language
model counts and its embedding table does not.

Parameters shared by several stages (tied embeddings) are found here; the runner sums
their gradients across the ranks that hold them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from optpipe.errors import OptPipeError

PROTOCOL_HINT = ("give an nn.Sequential, a model with a 'blocks' or 'layers' ModuleList "
                 "(plus optional 'pre' and 'post' modules), or a model with "
                 "pipeline_parts(); see docs/runtime.md")


@dataclass
class PipelineParts:
    """The three parts of a pipelined model: optional ``pre``, the ``blocks``, optional ``post``."""

    pre: nn.Module | None
    blocks: list[nn.Module]
    post: nn.Module | None


def pipeline_parts(model: nn.Module) -> PipelineParts:
    """Find the blocks (and pre/post modules) of ``model`` by the protocol above."""
    custom = getattr(model, "pipeline_parts", None)
    if callable(custom):
        parts = custom()
        if not isinstance(parts, PipelineParts):
            raise OptPipeError(f"{type(model).__name__}.pipeline_parts() must return a "
                               f"PipelineParts, got {type(parts).__name__}")
        return parts
    if isinstance(model, nn.Sequential):
        return PipelineParts(None, list(model), None)
    for attribute in ("blocks", "layers"):
        blocks = getattr(model, attribute, None)
        if isinstance(blocks, (nn.ModuleList, nn.Sequential)):
            pre, post = getattr(model, "pre", None), getattr(model, "post", None)
            for name, part in (("pre", pre), ("post", post)):
                if part is not None and not isinstance(part, nn.Module):
                    raise OptPipeError(f"{type(model).__name__}.{name} must be an nn.Module")
            return PipelineParts(pre, list(blocks), post)
    raise OptPipeError(f"cannot split a {type(model).__name__} into pipeline stages; "
                       f"{PROTOCOL_HINT}")


class StageModule(nn.Module):
    """One pipeline stage: ``post(blocks(pre(x)))`` over its share of the model.

    It holds the *original* submodules (no copies), so gradients land on the user's
    model and an optimizer built over the model's parameters keeps working.
    """

    def __init__(self, index: int, blocks: Sequence[nn.Module],
                 pre: nn.Module | None = None, post: nn.Module | None = None) -> None:
        super().__init__()
        self.index = index
        self.pre = pre
        self.blocks = nn.ModuleList(blocks)
        self.post = post

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre is not None:
            x = self.pre(x)
        for block in self.blocks:
            x = block(x)
        if self.post is not None:
            x = self.post(x)
        return x


def module_cost(module: nn.Module | None, how: str = "compute") -> int:
    """Modelled cost of a module: its parameter count, embeddings excluded for "compute"."""
    if module is None:
        return 0
    if how == "params":
        return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
    total = 0
    for sub in module.modules():
        if isinstance(sub, nn.Embedding):
            continue
        total += sum(p.numel() for p in sub.parameters(recurse=False))
    return total


def balanced_partition(costs: Sequence[int], stages: int, first_extra: int = 0,
                       last_extra: int = 0) -> list[int]:
    """Blocks per stage minimizing the largest stage cost (contiguous, >= 1 block each).

    ``first_extra``/``last_extra`` are the costs of ``pre``/``post``, which always sit on
    the first/last stage. Exact dynamic programme; ties keep earlier stages lighter.
    """
    n = len(costs)
    if n < stages:
        raise OptPipeError(f"the model has {n} blocks, fewer than the {stages} stages the "
                           f"schedule needs; use a schedule with at most {n} stages or a "
                           f"deeper model")
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def span(i: int, j: int, k: int) -> int:  # blocks i..j-1 as stage k
        extra = (first_extra if k == 0 else 0) + (last_extra if k == stages - 1 else 0)
        return prefix[j] - prefix[i] + extra

    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    choice = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], span(i, j, k - 1))
                if value < best[k][j]:
                    best[k][j], choice[k][j] = value, i
    sizes, j = [], n
    for k in range(stages, 0, -1):
        i = choice[k][j]
        sizes.append(j - i)
        j = i
    return sizes[::-1]


def check_partition(partition: Sequence[int], stages: int, blocks: int) -> list[int]:
    """Validate a user's partition (blocks per stage) against the schedule and the model."""
    sizes = list(partition)
    if len(sizes) != stages:
        raise OptPipeError(f"partition {sizes} has {len(sizes)} stages but the schedule has "
                           f"{stages}; give one block count per stage")
    if any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in sizes):
        raise OptPipeError(f"partition {sizes} must list positive integers (blocks per "
                           f"stage)")
    if sum(sizes) != blocks:
        raise OptPipeError(f"partition {sizes} covers {sum(sizes)} blocks but the model has "
                           f"{blocks}; the counts must add up to {blocks}")
    return sizes


@dataclass
class StagePlan:
    """The model cut into stages, plus what the runner needs to know about shared weights."""

    partition: list[int]
    modules: list[StageModule]
    shared: list[tuple[nn.Parameter, list[int]]] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)   # id(param) -> name in the model


def split_model(model: nn.Module, stages: int,
                partition: Sequence[int] | str | None = None) -> StagePlan:
    """Cut ``model`` into ``stages`` :class:`StageModule` s.

    ``partition`` is a list of blocks per stage, or ``"compute"`` (default) / ``"params"``
    for a balanced cut by modelled compute or by parameter count.
    """
    parts = pipeline_parts(model)
    how = partition if isinstance(partition, str) else "compute"
    if how not in ("compute", "params"):
        raise OptPipeError(f"partition {partition!r} is not a list of block counts, "
                           f"'compute' or 'params'")
    if partition is None or isinstance(partition, str):
        sizes = balanced_partition([module_cost(b, how) for b in parts.blocks], stages,
                                   module_cost(parts.pre, how), module_cost(parts.post, how))
    else:
        sizes = check_partition(partition, stages, len(parts.blocks))
    modules, start = [], 0
    for s, size in enumerate(sizes):
        modules.append(StageModule(s, parts.blocks[start:start + size],
                                   parts.pre if s == 0 else None,
                                   parts.post if s == stages - 1 else None))
        start += size
    users: dict[int, list[int]] = {}
    params: dict[int, nn.Parameter] = {}
    for s, module in enumerate(modules):
        for p in module.parameters():  # deduplicated within the stage
            users.setdefault(id(p), []).append(s)
            params[id(p)] = p
    shared = [(params[k], v) for k, v in users.items() if len(v) > 1]
    names = {id(p): name for name, p in model.named_parameters()}
    return StagePlan(sizes, modules, shared, names)
