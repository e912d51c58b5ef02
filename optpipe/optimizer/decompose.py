"""Decomposition for problems the full model cannot close: a microbatch-window search.

Why: with a tight budget, a large pipeline (8 x 32 and up) has an optimal steady state
that CP-SAT's generic neighbourhoods rarely find, while the same model over a handful
of microbatches solves in seconds. So, starting from the best schedule so far, we free
the tasks of a window of consecutive microbatches (on every stage), keep the relative
order of all other tasks, and let CP-SAT re-place the window; windows sweep the
pipeline from warm-up to cool-down and back. Every accepted step is a complete
schedule of the full model (re-timed ASAP like the simulator), so the result is valid
whenever the search stops; the full model's lower bound stays the proven bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from optpipe.optimizer.result import ProgressFn
from optpipe.problem import Problem


@dataclass
class WindowStats:
    steps: int = 0
    improvements: int = 0
    window: int = 0


def window_search(problem: Problem, ticks, hint, *, lower: int, deadline: float,
                  threads: int, window: int = 8, step_limit: float = 6.0,
                  progress: ProgressFn | None = None, t0: float | None = None,
                  bound: float | None = None):
    """Improve ``hint`` (a :class:`~.cpsat.Hint`) until ``deadline``; returns (hint, stats).

    Stops early when the incumbent reaches ``lower`` (ticks) or a full sweep finds
    nothing; on a fruitless sweep the window grows by half (larger neighbourhoods).
    """
    from optpipe.optimizer.cpsat import _extract, build_order_model, make_hint, new_solver

    M = problem.microbatches
    stats = WindowStats(window=min(window, M))
    t0 = time.monotonic() if t0 is None else t0
    best = hint
    w = min(window, M)
    stale = 0
    first = 0
    build_time = 0.0
    overrun = 0.0
    while time.monotonic() < deadline - 0.5 and best.makespan > lower:
        starts = list(range(0, max(1, M - w + 1), max(1, w // 2)))
        if starts[-1] != max(0, M - w):
            starts.append(max(0, M - w))
        improved = False
        for m1 in starts[first:] + starts[:first]:
            # a step needs time to build its model (seconds at 16 stages) before CP-SAT
            # starts: do not begin one that cannot finish by the deadline
            if deadline - time.monotonic() < build_time + overrun + 0.5 or \
                    best.makespan <= lower:
                break
            free = set(range(m1, m1 + w))
            fixed = [[k for k in seq if k[2] not in free] for seq in best.order]
            t_build = time.monotonic()
            builder, handles = build_order_model(problem, ticks, best.makespan, lower,
                                                 best, fixed_order=fixed)
            builder.add_hints()
            build_time = max(build_time, time.monotonic() - t_build)
            left = deadline - time.monotonic() - overrun
            if left < 0.3:
                break
            limit = max(0.1, min(step_limit, left - 0.2))
            solver = new_solver(limit, threads)
            t_solve = time.monotonic()
            code = solver.solve(builder.model)
            # what CP-SAT does before its first check of the clock is not interruptible
            # (it ran 11-15 s past 4 s steps at 16 x 32 until the closure of precedences
            # was switched off, :func:`~.cpsat.new_solver`): learn how far past its
            # limit a step runs and plan the next ones with it.
            overrun = max(overrun, time.monotonic() - t_solve - limit)
            stats.steps += 1
            if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                continue
            schedule = _extract(problem, solver, handles, offload=False)
            timed = make_hint(schedule, ticks)
            if timed.makespan < best.makespan:
                best = timed
                improved = True
                stats.improvements += 1
                if progress is not None:
                    progress(time.monotonic() - t0, best.makespan / ticks.scale, bound,
                             None if bound is None else
                             max(0.0, 1 - bound / (best.makespan / ticks.scale)))
        if improved:
            stale = 0
        else:
            stale += 1
            if w >= M or stale > 1:
                break
            w = min(M, w + max(1, w // 2))
            stats.window = w
        first = 0
    return best, stats
