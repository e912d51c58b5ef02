"""Per-action memory deltas: the one accounting shared by simulator, optimizers and runtime.

Memory on a device = its static bytes + the activation bytes that are kept there. Every
action changes the kept bytes at one moment of its life:

========  ==========  =====================================================
action    moment      change
========  ==========  =====================================================
F         start       + activation[stage]
B         end         - freed_by_b[stage]
W         end         - freed_by_w[stage]
BW        end         - activation[stage]
OFFLOAD   end         - fraction x activation[stage]  (now on the host)
RELOAD    issue       + fraction x activation[stage]  (the buffer is reserved
                                                       when the reload is issued)
========  ==========  =====================================================

A RELOAD is *issued* when the compute action listed before it on its device ends (at
time 0 if none does); see :mod:`optpipe.simulator`. Allocations are conservative (at the
start, or at issue) and releases happen when the work that frees them is done (at the
end), so the accounting never under-states what a real run needs. At equal times,
releases are applied before allocations.

Transfers move ``fraction x activation`` bytes, rounded down to whole bytes, the same
way here and everywhere else.
"""

from __future__ import annotations

from typing import Literal

from optpipe.problem import Problem
from optpipe.schedule import Action, Op

Moment = Literal["start", "end", "issue"]


def transfer_bytes(problem: Problem, action: Action) -> int:
    """Bytes an OFFLOAD or RELOAD moves: ``fraction`` of the stage's kept activation."""
    return int(problem.activation[action.stage] * action.fraction)


def memory_delta(problem: Problem, action: Action) -> tuple[Moment, int]:
    """The moment in ``action``'s life at which device memory changes, and by how much."""
    s = action.stage
    if action.op is Op.F:
        return "start", problem.activation[s]
    if action.op is Op.B:
        return "end", -problem.freed_by_b[s]
    if action.op is Op.W:
        return "end", -problem.freed_by_w[s]
    if action.op is Op.BW:
        return "end", -problem.activation[s]
    if action.op is Op.OFFLOAD:
        return "end", -transfer_bytes(problem, action)
    if action.op is Op.RELOAD:
        return "issue", transfer_bytes(problem, action)
    raise ValueError(f"unknown op {action.op}")


def duration(problem: Problem, action: Action) -> float:
    """Seconds ``action`` occupies its compute stream or host-link channel."""
    s = action.stage
    if action.op is Op.F:
        return problem.forward[s]
    if action.op is Op.B:
        return problem.backward_input[s]
    if action.op is Op.W:
        return problem.backward_weight[s]
    if action.op is Op.BW:
        return problem.bw_time(s)   # measured fused backward, else B + W
    if action.op is Op.OFFLOAD:
        return transfer_bytes(problem, action) / problem.d2h_bandwidth
    if action.op is Op.RELOAD:
        return transfer_bytes(problem, action) / problem.h2d_bandwidth
    raise ValueError(f"unknown op {action.op}")
