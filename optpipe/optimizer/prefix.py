"""Prefix cuts: what smaller problems prove about a long pipeline.

Why: at a tight budget the bounds in :mod:`.preprocess` see a microbatch's memory
round trip but not the waits inside it for devices busy with other microbatches, so on
8 x 32 at half of 1F1B's memory they stop at 147.6 s against the optimum's 156.7 s,
and CP-SAT needs 50-90 s to close the rest. Small problems, though, CP-SAT solves
exactly in seconds, waits included, and two facts carry their answers to the large
one. For any schedule (FIFO per op type, no offload) of ``M`` microbatches:

* the tasks of microbatches ``i .. i + d`` form a schedule of ``d + 1`` microbatches
  (every dependency stays inside a microbatch or a FIFO chain, and fewer activations
  are held), which starts with ``F(0, i)``. So ``F(0, i + d) - F(0, i) >= reach[d]``,
  the least start of ``F(0, d)`` in a ``(d + 1)``-microbatch problem
  (:func:`~.cpsat.solve_reach`);
* the last ``n`` microbatches likewise form a schedule of ``n`` microbatches, so the
  makespan is at least ``F(0, M - n) + whole[n]``, ``whole[n]`` being the optimum (a
  proven bound) for ``n`` microbatches.

Chained, these give a bound (:meth:`PrefixCuts.makespan_bound`: 154.5 s at 8 x 32),
and as constraints in the order model (:func:`~.cpsat.build_order_model`) they let
CP-SAT prove 8 x 32 in 23 s instead of 50-90 s (measured by hand, hinted with the
fixed schedules). They cannot close long pipelines by themselves: each link of the
chain starts from an empty pipeline. Leading microbatches do not change that (the
least ``F(0, e + d) - F(0, e)`` over ``e + d + 1`` microbatches is valid too, but equals
``reach[d]``: the lead can drain before the window starts; docs/optimizer.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from optpipe.optimizer.result import OPTIMAL
from optpipe.problem import Problem
from optpipe.schedule import Schedule

#: The largest sub-problem solved (microbatches): beyond it a proof takes too long.
MAX_PIECE = 16


@dataclass
class PrefixCuts:
    """Proven bounds from fewer microbatches of one problem and placement (seconds)."""

    #: ``d`` -> least start of ``F(0, d)`` over schedules of ``d + 1`` microbatches.
    reach: dict[int, float] = field(default_factory=dict)
    #: ``n`` -> least makespan (a proven bound) of ``n`` microbatches.
    whole: dict[int, float] = field(default_factory=dict)
    #: the ``n`` whose ``whole[n]`` is the proven optimum, not only a bound: solving
    #: them again can add nothing.
    exact: set[int] = field(default_factory=set)

    def record_whole(self, n: int, bound: float | None, optimal: bool) -> None:
        """Keep what a solve on ``n`` microbatches proved (the best bound so far)."""
        if bound is None:
            return
        self.whole[n] = max(self.whole.get(n, 0.0), bound)
        if optimal:
            self.exact.add(n)

    def makespan_bound(self, microbatches: int) -> float:
        """The best chain ``reach[d1] + reach[d2] + ... + whole[n]`` covering
        ``microbatches`` (a dynamic programme over how many are left)."""
        best = [0.0] * (microbatches + 1)
        for n in range(1, microbatches + 1):
            best[n] = max([self.whole.get(n, 0.0)] +
                          [r + best[n - d] for d, r in self.reach.items() if 0 < d < n])
        return best[microbatches]


def truncated_hints(schedules: Sequence[Schedule]) -> Callable[[Problem], list[Schedule]]:
    """Hints for the pieces: the first microbatches of ``schedules`` (of the whole
    problem), which are valid schedules of each piece and cost nothing to make
    (:func:`~.extend.first_microbatches`); running every generator on 32 pieces took
    5-9 s."""
    from optpipe.optimizer.extend import first_microbatches

    def hints(smaller: Problem) -> list[Schedule]:
        return [first_microbatches(s, smaller.microbatches) for s in schedules]
    return hints


def prefix_cuts(problem: Problem, placement: Sequence[int] | None, split_backward: bool,
                *, time_limit: float, threads: int = 2,
                hints: Callable[[Problem], list[Schedule]],
                heartbeat: Callable[[], None] | None = None,
                known: PrefixCuts | None = None, largest: int = MAX_PIECE) -> PrefixCuts:
    """Solve the pieces, largest first, until ``time_limit``: for each ``n`` from
    ``min(largest, M - 1)`` down, ``whole[n]`` (CP-SAT's proven bound on ``n``
    microbatches) and ``reach[n]`` (on ``n + 1``), each followed by its complement
    (``reach[M - n]``, ``whole[M - n]``) when that is a piece too, so that a chain
    covering ``M`` exists early. Largest first, because the large pieces carry the
    bound (at 8 x 32, ``reach[16] + whole[16]`` alone is 152.7 s of 154.5 s), and the
    small ones are cheap to skip. ``hints(smaller)``: fitting schedules of a smaller
    problem on the placement, for CP-SAT to start from. ``known``: what solves of the
    same problem on fewer microbatches already proved (the extended schedules' sources,
    :func:`~.extend.extended_schedules`); it is kept, and the pieces it solved to
    optimality are not solved again (at 16 x 32, S/2, the 16-microbatch optimum took
    3-14 s). ``largest``: the largest piece; on the chunked placements, whose pieces
    take longer to prove, 8 (``scripts/bench_chunked_proofs.py``)."""
    from optpipe.optimizer.cpsat import NoHint, solve_cpsat, solve_reach

    t0 = time.monotonic()
    cuts = PrefixCuts() if known is None else \
        PrefixCuts(whole=dict(known.whole), exact=set(known.exact))
    M = problem.microbatches
    top = min(largest, M - 1)
    tasks: list[tuple[str, int]] = []
    for n in range(top, 0, -1):
        for task in (("whole", n), ("reach", M - n), ("reach", n), ("whole", M - n)):
            if 0 < task[1] <= top and task not in tasks and \
                    not (task[0] == "whole" and task[1] in cuts.exact):
                tasks.append(task)
    for kind, n in tasks:
        left = time_limit - (time.monotonic() - t0)
        if left <= 0.05:
            break
        piece = n if kind == "whole" else n + 1
        smaller = replace(problem, microbatches=piece)
        starts = hints(smaller)
        if not starts:
            continue
        # what is left, front-loaded: the pieces still to solve sum to about
        # piece^2 microbatches, and a proof's cost grows faster than its size
        share = left * min(1.0, 4 / (piece + 1))
        if kind == "whole":
            try:
                run = solve_cpsat(smaller, warm_start=starts, time_limit=share,
                                  threads=threads, split_backward=split_backward,
                                  placement=placement, decompose=False)
            except NoHint:
                continue
            cuts.record_whole(n, run.bound, run.status == OPTIMAL)
        else:
            reach = solve_reach(smaller, warm_start=starts, time_limit=share,
                                threads=threads, split_backward=split_backward,
                                placement=placement)
            if reach is not None:
                cuts.reach[n] = reach
        if heartbeat is not None:
            heartbeat()
    return cuts
