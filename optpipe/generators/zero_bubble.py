"""ZB-H1 and ZB-H2 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"), as fixed orders.

Both split the backward into B (input gradient, on the critical path) and W (weight
gradient, free to move), one stage per device.

**ZB-H1** keeps 1F1B's warm-up and its in-flight count, runs B where 1F1B runs its fused
backward, and delays the W passes: stage ``s`` starts its W's only after ``s`` steady-state
steps, so every stage keeps ``S`` microbatches started and not yet W-finished, and the
deferred W's fill the cool-down bubbles. Peak memory on stage 0 equals 1F1B's (``S``
microbatches); stage ``s`` keeps ``(S - s)`` whole microbatches plus ``s`` that already
released ``freed_by_b``. With zero p2p latency, ``F, B >= W`` and ``M >= S`` the makespan
is ``M(F+B+W) + (S-1)(F+B-W)``.

**ZB-H2** fills the warm-up bubble with more forwards (``2(S-1-s)+1`` on stage ``s``),
lets at most ``2S-1`` microbatches be started and not W-finished on any stage, and in the
tail runs one W after each B so that each stage ends on its ``2s+1`` deferred W's: the
trapezoid becomes a parallelogram. Peak memory on stage 0 is ``2S-1`` microbatches. With
``M >= 2S-1``, ``W <= F`` and ``2W <= F+B`` every device's span is
``M(F+B+W) + (S-1)(F+B-2W+2c)`` for p2p latency ``c``: zero bubble when F = B = W and c = 0.

Both orders are deadlock-free for any costs and latency: a stage never needs a forward
that its upstream stage has not already been given before the backward it waits on.
"""

from __future__ import annotations

from typing import Sequence

from optpipe.generators.base import Order, build, require_base
from optpipe.problem import Problem
from optpipe.schedule import Schedule, linear_placement


def zb_h1_orders(stages: int, microbatches: int, delays: Sequence[int] | None = None
                 ) -> list[Order]:
    """1F1B's order with B in place of BW and W delayed by ``s`` steps on stage ``s``.

    ``delays[s]`` overrides the delay of stage ``s`` (0 gives 1F1B with a split backward,
    and 1F1B's memory on that stage). The F/B order does not depend on the delays, so any
    mix of delays over the stages stays deadlock-free.
    """
    orders = []
    for s in range(stages):
        delay = s if delays is None else delays[s]
        warmup = min(stages - s - 1, microbatches)
        order: Order = [("F", s, m) for m in range(warmup)]
        done_w = 0
        for k in range(microbatches - warmup):
            order += [("F", s, warmup + k), ("B", s, k)]
            if k >= delay:
                order.append(("W", s, done_w))
                done_w += 1
        for k in range(microbatches - warmup, microbatches):
            order.append(("B", s, k))
            order.append(("W", s, done_w))
            done_w += 1
        order += [("W", s, m) for m in range(done_w, microbatches)]
        orders.append(order)
    return orders


def zb_h2_orders(stages: int, microbatches: int) -> list[Order]:
    """The parallelogram: long warm-up, at most 2S-1 in flight, W's deferred to the tail."""
    cap = 2 * stages - 1
    orders = []
    for s in range(stages):
        warmup = min(microbatches, 2 * (stages - 1 - s) + 1)
        order: Order = [("F", s, m) for m in range(warmup)]
        done_f, done_w = warmup, 0
        for k in range(microbatches):
            order.append(("B", s, k))
            if done_f < microbatches:
                if done_f - done_w >= cap:          # memory cap: finish one first
                    order.append(("W", s, done_w))
                    done_w += 1
                order.append(("F", s, done_f))
                done_f += 1
            elif k < microbatches - 1:              # tail: one W per B, rest at the end
                order.append(("W", s, done_w))
                done_w += 1
        order += [("W", s, m) for m in range(done_w, microbatches)]
        orders.append(order)
    return orders


def zb_h1(problem: Problem) -> Schedule:
    """ZB-H1: 1F1B's memory, about a third of its bubble."""
    require_base(problem, "zb-h1")
    return build("zb-h1", linear_placement(problem.devices), problem.microbatches,
                 zb_h1_orders(problem.stages, problem.microbatches))


def zb_h2(problem: Problem) -> Schedule:
    """ZB-H2: about twice 1F1B's memory, no bubble in the steady state."""
    require_base(problem, "zb-h2")
    return build("zb-h2", linear_placement(problem.devices), problem.microbatches,
                 zb_h2_orders(problem.stages, problem.microbatches))
