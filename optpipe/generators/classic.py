"""GPipe and 1F1B: the two fused-backward baselines every other schedule is measured against.

Both put stage ``s`` on device ``s`` and run one fused backward ``BW`` per microbatch.
They differ only in when the backward passes start:

* **GPipe** runs all M forwards, then all M backwards: every device keeps all M
  microbatches' activations at its peak.
* **1F1B** (PipeDream-Flush) runs ``S - s`` forwards on stage ``s`` (0-based) and then
  alternates one backward with one forward, so at most ``S - s`` microbatches are ever kept
  there; the makespan is the same as GPipe's, ``(M + S - 1)(F + B + W)`` with uniform
  stages and no latency.
"""

from __future__ import annotations

from optpipe.generators.base import Order, build, require_base
from optpipe.problem import Problem
from optpipe.schedule import Schedule, linear_placement


def gpipe_orders(stages: int, microbatches: int) -> list[Order]:
    """All forwards, then all fused backwards in microbatch order, on every stage."""
    return [[("F", s, m) for m in range(microbatches)]
            + [("BW", s, m) for m in range(microbatches)] for s in range(stages)]


def one_f_one_b_orders(stages: int, microbatches: int, backward: tuple[str, ...] = ("BW",)
                       ) -> list[Order]:
    """The 1F1B order; ``backward=("B", "W")`` gives the same order with a split backward.

    Stage ``s`` warms up with ``min(S - s - 1, M)`` forwards, then pairs each further
    forward with the oldest backward, then drains the remaining backwards.
    """
    orders = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        order: Order = [("F", s, m) for m in range(warmup)]
        for k in range(microbatches - warmup):
            order.append(("F", s, warmup + k))
            order.extend((op, s, k) for op in backward)
        for k in range(microbatches - warmup, microbatches):
            order.extend((op, s, k) for op in backward)
        orders.append(order)
    return orders


def gpipe(problem: Problem) -> Schedule:
    """GPipe (Huang et al. 2019): fill, then drain; memory grows with M."""
    require_base(problem, "gpipe")
    return build("gpipe", linear_placement(problem.devices), problem.microbatches,
                 gpipe_orders(problem.stages, problem.microbatches))


def one_f_one_b(problem: Problem) -> Schedule:
    """1F1B (Narayanan et al. 2019, PipeDream-Flush): GPipe's time, memory capped at S - s."""
    require_base(problem, "1f1b")
    return build("1f1b", linear_placement(problem.devices), problem.microbatches,
                 one_f_one_b_orders(problem.stages, problem.microbatches))
