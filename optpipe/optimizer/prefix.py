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
and as constraints in the order model (:func:`~.cpsat_order.build_order_model`) they let
CP-SAT prove 8 x 32 in 23 s instead of 50-90 s (measured by hand, hinted with the
fixed schedules). They cannot close long pipelines by themselves: each link of the
chain starts from an empty pipeline. Leading microbatches do not change that (the
least ``F(0, e + d) - F(0, e)`` over ``e + d + 1`` microbatches is valid too, but equals
``reach[d]``: the lead can drain before the window starts; docs/optimizer.md). Nor,
in the time there is, does splitting a link on how far the microbatch before it has
got: valid, but its pieces must be proven above these cuts (``scripts/
bench_split_link.py``; docs/optimizer-log.md, "Split links").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from optpipe.optimizer.result import OPTIMAL
from optpipe.problem import Problem
from optpipe.schedule import Schedule

#: The largest sub-problem solved from scratch (microbatches): beyond it a proof takes
#: too long without cuts of its own.
MAX_PIECE = 16
#: Share of the cuts' time kept for the ladder's pieces (:func:`ladder`), when there are any.
LADDER_SHARE = 0.5


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
    #: the same for ``reach[d]``.
    exact_reach: set[int] = field(default_factory=set)

    def record_whole(self, n: int, bound: float | None, optimal: bool) -> None:
        """Keep what a solve on ``n`` microbatches proved (the best bound so far)."""
        _record(self.whole, self.exact, n, bound, optimal)

    def record_reach(self, d: int, bound: float | None, optimal: bool) -> None:
        """Keep what a solve of ``reach[d]`` proved (the best bound so far)."""
        _record(self.reach, self.exact_reach, d, bound, optimal)

    def merge(self, other: "PrefixCuts") -> None:
        """Keep what ``other`` proved too (the best bound of each piece)."""
        for n, bound in other.whole.items():
            self.record_whole(n, bound, n in other.exact)
        for d, bound in other.reach.items():
            self.record_reach(d, bound, d in other.exact_reach)

    def copy(self) -> "PrefixCuts":
        out = PrefixCuts()
        out.merge(self)
        return out

    def makespan_bound(self, microbatches: int) -> float:
        """The best chain ``reach[d1] + reach[d2] + ... + whole[n]`` covering
        ``microbatches`` (a dynamic programme over how many are left)."""
        best = [0.0] * (microbatches + 1)
        for n in range(1, microbatches + 1):
            best[n] = max([self.whole.get(n, 0.0)] +
                          [r + best[n - d] for d, r in self.reach.items() if 0 < d < n])
        return best[microbatches]


def _record(values: dict[int, float], exact: set[int], n: int, bound: float | None,
            optimal: bool) -> None:
    """One table of :class:`PrefixCuts`: keep the larger bound, and mark it exact."""
    if bound is None:
        return
    values[n] = max(values.get(n, 0.0), bound)
    if optimal:
        exact.add(n)


def truncated_hints(schedules: Sequence[Schedule]) -> Callable[[Problem], list[Schedule]]:
    """Hints for the pieces: the first microbatches of ``schedules`` (of the whole
    problem), which are valid schedules of each piece and cost nothing to make
    (:func:`~.extend.first_microbatches`); running every generator on 32 pieces took
    5-9 s."""
    from optpipe.optimizer.extend import first_microbatches

    def hints(smaller: Problem) -> list[Schedule]:
        return [first_microbatches(s, smaller.microbatches) for s in schedules]
    return hints


def ladder(microbatches: int, largest: int) -> list[int]:
    """Piece sizes above ``largest`` worth solving with the smaller pieces' cuts in their
    models: ``M / 2``, ``M / 4``, ... (rounded both ways) while above ``largest``,
    smallest first, so that each is proven with the cuts of the one below.

    Why: a chain of pieces loses a warm-up per link (each piece starts from an empty
    pipeline), and with pieces up to 16 microbatches a chain over 64 has four links:
    at 4 x 64, S/2, 319.5 s against the optimum 327.6 s. Two links lose one warm-up:
    ``reach[32] + whole[32]`` = 324.9 s. Those pieces are too slow to prove from
    scratch in the cuts' time, but with the smaller pieces' cuts in their models CP-SAT
    proves them in 1-7 s (by hand: ``reach[32]`` at 4 stages in 4.0 s against 8.9 s
    without; docs/optimizer.md, "Prefix cuts")."""
    sizes: set[int] = set()
    level = {microbatches}
    while level:
        halves = {h for m in level for h in (m // 2, m - m // 2) if h > largest}
        sizes |= halves
        level = halves
    return sorted(n for n in sizes if n < microbatches)


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
    :func:`~.extend.extended_schedules`, which solve the source's own pieces first
    where the cuts pay); it is kept, and the pieces it solved to optimality,
    ``whole`` and ``reach`` alike, are not solved again (at 16 x 32, S/2, the
    16-microbatch optimum took 3-14 s). ``largest``: the largest piece; on the chunked
    placements, whose pieces take longer to prove, 8
    (``scripts/bench_chunked_proofs.py``). Then, in what is left (at least
    :data:`LADDER_SHARE` of ``time_limit``), the :func:`ladder`'s
    larger pieces, each with the cuts so far in its model: ``whole[n]`` (often proven
    quickly, or already ``known``) before ``reach[n]``."""
    from optpipe.optimizer.cpsat import NoHint, solve_cpsat, solve_reach

    t0 = time.monotonic()
    cuts = PrefixCuts() if known is None else known.copy()
    M = problem.microbatches
    top = min(largest, M - 1)

    def unproven(task: tuple[str, int]) -> bool:
        """Worth solving: not a piece ``known`` already proved exactly."""
        kind, n = task
        return n not in (cuts.exact if kind == "whole" else cuts.exact_reach)

    tasks: list[tuple[str, int]] = []
    for n in range(top, 0, -1):
        for task in (("whole", n), ("reach", M - n), ("reach", n), ("whole", M - n)):
            if 0 < task[1] <= top and task not in tasks and unproven(task):
                tasks.append(task)
    rungs = [task for n in ladder(M, top) for task in (("whole", n), ("reach", n))
             if unproven(task)]
    base_limit = time_limit * (1 - LADDER_SHARE) if rungs else time_limit

    def size(kind: str, n: int) -> int:
        """Microbatches of the piece: ``reach[n]`` is a start in ``n + 1``."""
        return n if kind == "whole" else n + 1

    def solve_piece(kind: str, n: int, share: float, model_cuts: PrefixCuts | None) -> None:
        smaller = replace(problem, microbatches=size(kind, n))
        starts = hints(smaller)
        if not starts:
            return
        if kind == "whole":
            try:
                run = solve_cpsat(smaller, warm_start=starts, time_limit=share,
                                  threads=threads, split_backward=split_backward,
                                  placement=placement, decompose=False,
                                  cuts=model_cuts, proof=True)
            except NoHint:
                return
            cuts.record_whole(n, run.bound, run.status == OPTIMAL)
        else:
            reach = solve_reach(smaller, warm_start=starts, time_limit=share,
                                threads=threads, split_backward=split_backward,
                                placement=placement, cuts=model_cuts)
            if reach is not None:
                cuts.record_reach(n, reach.seconds, reach.optimal)
        if heartbeat is not None:
            heartbeat()

    for kind, n in tasks:
        left = base_limit - (time.monotonic() - t0)
        if left <= 0.05:
            break
        # what is left, front-loaded: the pieces still to solve sum to about
        # piece^2 microbatches, and a proof's cost grows faster than its size
        solve_piece(kind, n, left * min(1.0, 4 / (size(kind, n) + 1)), None)
    for i, (kind, n) in enumerate(rungs):
        left = time_limit - (time.monotonic() - t0)
        if left <= 0.05:
            break
        solve_piece(kind, n, left / (len(rungs) - i), cuts)
    return cuts
