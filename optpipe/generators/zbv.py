"""ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"): V placement, split B/W.

Each device holds two chunks placed in a V (stage ``s`` and stage ``2D-1-s`` on device
``s``), so a microbatch's forward goes down the devices and comes back up, and its
backward does the same in reverse. The first and last stages sit on device 0, which
makes the warm-up and cool-down ramps half as long as 1F1B's, and with W passes
deferred into the remaining gaps the bubble is (nearly) zero when F = B = W, at 1F1B's
peak memory: every device may keep at most ``D`` microbatches (each of its two chunks
holds half a microbatch's activation after :meth:`~optpipe.problem.Problem.split`).

The order is produced by the greedy list scheduler (:mod:`.listsched`) under that memory
cap: B or F first, an F that would delay a B already on its way held back or not, W
deferred into gaps or whenever idle. The paper builds ZB-V with the same kind of greedy;
here the eight variants are judged by the simulator and the shortest kept, so the result
never depends on one tie-breaking rule being right for every cost profile.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from optpipe.generators.base import build, require_base
from optpipe.generators.listsched import MARGIN, Policy, list_schedule
from optpipe.problem import Problem
from optpipe.schedule import Schedule, from_orders, v_placement
from optpipe.simulator import simulate

#: The variants tried, in order; ties keep the earlier one.
VARIANTS = tuple(Policy(prefer=prefer, w_mode=w_mode, guard_b=guard)
                 for prefer in ("B", "F") for w_mode in ("fill", "greedy")
                 for guard in (False, True))


def zb_v(problem: Problem) -> Schedule:
    """ZB-V at 1F1B's memory (D microbatches per device), best of the greedy variants.

    Distinct orders are simulated in order of the greedy's own makespan, an upper bound
    of the simulated one, until that bound is more than ``MARGIN`` above the best
    simulated.
    """
    require_base(problem, "zb-v")
    orders, policy = _kept_choice(problem)     # a Problem hashes: its figures are tuples
    return build("zb-v", v_placement(problem.devices), problem.microbatches,
                 [list(seq) for seq in orders], knobs=policy.describe())


def _choose(problem: Problem) -> tuple[tuple[tuple, ...], Policy]:
    """:func:`zb_v`'s orders and the variant that made them (tuples: see
    :func:`_kept_choice`)."""
    devices = problem.devices
    placement = v_placement(devices)
    split = problem.split(placement)
    cap = tuple(float(devices * problem.activation[d]) for d in range(devices))
    runs = []
    for index, variant in enumerate(VARIANTS):
        policy = replace(variant, mem_cap=cap)
        runs.append((list_schedule(split, placement, policy), index, policy))
    runs.sort(key=lambda run: (run[0].estimate, run[1]))
    best = None
    seen: set[tuple] = set()
    for run, _, policy in runs:
        if best is not None and run.estimate > best[0] * MARGIN:
            break
        key = tuple(map(tuple, run.orders))
        if key in seen:             # variants often agree; judge each order once
            continue
        seen.add(key)
        schedule = from_orders("zb-v", placement, problem.microbatches, run.orders)
        makespan = simulate(problem, schedule).makespan
        if best is None or makespan < best[0]:
            best = (makespan, run.orders, policy)
    _, orders, policy = best
    return tuple(tuple(seq) for seq in orders), policy


#: :func:`_choose` kept for the next call with the same problem. Why: the optimizer's
#: fixed schedules ask for ZB-V twice, as itself and as one of pipeoffload's bases, and
#: at 16 x 64 each choice took 0.5 s (eight greedy runs and their simulations). The
#: orders are tuples, so no caller can change the kept copy.
_kept_choice = functools.lru_cache(maxsize=4)(_choose)
