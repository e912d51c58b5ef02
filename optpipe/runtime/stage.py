"""One pipeline stage's compute: F, B (input gradient only), W (weight gradients), BW.

B and W split the backward without recomputing the stage: B runs
``torch.distributed.pipelining._backward.stage_backward_input``, which computes the input
gradient with the graph retained and remembers, per parameter group, the gradients
flowing into the graph nodes that lead to the weights; W runs
``stage_backward_weight``, which resumes from exactly those nodes. Only the weight part
of the graph is executed a second time, never the forward.

The first stage has no input gradient to produce (its input is data), so its B only
stores the output gradient and its W runs the whole backward — the choice PyTorch's own
runtime makes; nothing waits for stage 0's B, so no schedule loses time by it.

The loss of the last stage is divided by the number of microbatches before its
backward, so after a step every ``.grad`` is the gradient of the *mean* microbatch loss
(equal to the full-batch loss for a mean-reduced loss and equal-sized microbatches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from optpipe.errors import OptPipeError
from optpipe.runtime.activations import ActivationTracker, SavedStore
from optpipe.runtime.partition import StageModule


@dataclass
class _Pending:
    """What one microbatch of a stage keeps between its F and its W."""

    input: torch.Tensor | None
    output: torch.Tensor          # stage output, or the scaled loss on the last stage
    grad: torch.Tensor | None = None      # output gradient kept for a deferred full W
    param_groups: list[dict[str, Any]] | None = None


class StageWorker:
    """Runs F/B/W/BW for one stage; the runner decides when and with which tensors."""

    def __init__(self, module: StageModule, stages: int, microbatches: int,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
                 tracker: ActivationTracker) -> None:
        self.module = module
        self.index = module.index
        self.is_first = self.index == 0
        self.is_last = self.index == stages - 1
        self.microbatches = microbatches
        self.loss_fn = loss_fn
        self.tracker = tracker
        self.pending: dict[int, _Pending] = {}
        self.losses: dict[int, torch.Tensor] = {}

    def forward(self, microbatch: int, x: torch.Tensor, target: torch.Tensor | None,
                store: SavedStore) -> torch.Tensor:
        """F: run the stage, keep what backward needs; returns the output (or the loss)."""
        if not self.is_first:
            x.requires_grad_(True)
        with self.tracker.capture(store):
            out = self.module(x)
            if not isinstance(out, torch.Tensor):
                raise OptPipeError(f"stage {self.index} returned a {type(out).__name__}; a "
                                   f"stage boundary carries exactly one tensor")
            if self.is_last:
                if self.loss_fn is None:
                    raise OptPipeError("the runner needs loss_fn to compute the last stage's "
                                       "loss")
                loss = self.loss_fn(out, target)
                self.losses[microbatch] = loss.detach()
                out = loss / self.microbatches
        self.pending[microbatch] = _Pending(None if self.is_first else x, out)
        return out

    def backward_input(self, microbatch: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        """B: the input gradient only (None on the first stage), weights left for W."""
        state = self.pending[microbatch]
        if self.is_first:
            state.grad = grad
            return None
        dinputs, groups = stage_backward_input(
            [state.output], None if grad is None else [grad], [state.input],
            self.module.parameters())
        state.param_groups = groups
        dx = dinputs[0]
        state.input.grad = None
        state.input = None
        return dx

    def backward_weight(self, microbatch: int) -> None:
        """W: the weight gradients of a microbatch whose B has run."""
        state = self.pending.pop(microbatch)
        if self.is_first:
            grads = None if state.grad is None else [state.grad]
            torch.autograd.backward([state.output], grads)
        else:
            stage_backward_weight(self.module.parameters(), state.param_groups or [])
        state.param_groups = None

    def backward_full(self, microbatch: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        """BW: input and weight gradients in one backward."""
        state = self.pending.pop(microbatch)
        torch.autograd.backward([state.output], None if grad is None else [grad])
        if state.input is None:
            return None
        dx = state.input.grad
        state.input.grad = None
        return dx

    def mean_loss(self) -> torch.Tensor | None:
        """The step's loss: mean over microbatches (last stage only)."""
        if not self.losses:
            return None
        loss = torch.stack([self.losses[m] for m in sorted(self.losses)]).mean()
        self.losses.clear()
        return loss
