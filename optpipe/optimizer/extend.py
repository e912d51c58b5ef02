"""Extended schedules: a good schedule of fewer microbatches, its steady state repeated.

Why: when memory binds, one stage per device settles into *groups*. At half of 1F1B's
memory, 8 stages run four forwards close together, wait for their backwards, then run
the next four: 18.7 s per four microbatches (4.675 s each; CP-SAT's proven 8 x 32
optimum). The one-microbatch periodic blocks (:mod:`.periodic`) cannot express a
pattern over several microbatches; their best period there is 5.1 s. And the search on
64 microbatches does not find it from the fixed schedules within a minute: it ended
4 % above the extended schedule at 8 x 64. What it finds well is the optimum of a
*small* problem: 8 x 16 is proven in 2 s and already holds the pattern. So: solve the
problem with half the microbatches (recursively: 64 from 32 from 16), find a window of
each device's order that holds exactly ``K`` consecutive microbatches of every task
type it runs, and repeat that window until the microbatches are all there. This is the
issue's "optimize the warm-up and cool-down and repeat a steady-state pattern", with
the pattern and its ends taken from a solved schedule instead of guessed.

Every extension is judged by the simulator (a bad window deadlocks or runs over the
budget and is dropped); the best become warm starts for the search on the full
problem (:func:`optpipe.optimizer.driver.solve`), like the periodic blocks. Without
offload, memory at each forward depends only on each device's order, which a repeated
window preserves locally, so the steady state that fitted in the source fits again.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence

from optpipe.errors import OptPipeError
from optpipe.optimizer.result import OPTIMAL
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule, from_orders
from optpipe.simulator import SimResult, simulate

if TYPE_CHECKING:
    from optpipe.optimizer.prefix import PrefixCuts

#: The smallest source solved: below it the pipeline has no steady state to repeat.
MIN_SOURCE_MICROBATCHES = 16
#: Share of the time an extension to ``M`` gives to building its own source (``M / 2``)
#: by extension, when that source is itself large enough to be extended.
INNER_SHARE = 0.35
#: Share of the time kept for trying windows (simulations) once the source is solved.
WINDOW_SHARE = 0.15
#: Schedules of the half whose first microbatches hint each of its prefix-cut pieces.
CUT_HINTS = 3


def repeat_window(schedule: Schedule, group: int, copies: int, first: int) -> Schedule | None:
    """``schedule`` with ``copies`` more groups of ``group`` microbatches, or None.

    On every device, the window repeated is the first run of consecutive actions that
    holds exactly ``group`` actions of each (op, stage) the device runs (so, FIFO, the
    same ``group`` consecutive microbatches of each), and whose forwards of the device's
    first stage begin at microbatch ``first``. The window's copies follow it, each
    shifted by ``group`` microbatches more, and the rest of the device's order follows
    them, shifted by ``copies * group``. None when a device has no such window or the
    result is not a valid schedule; offloading schedules are not extended.
    """
    if schedule.offloads or group < 1 or copies < 0:
        return None
    orders = []
    for acts in schedule.actions:
        found = _window(acts, group, first)
        if found is None:
            return None
        at, width = found
        window = acts[at:at + width]
        order = acts[:at + width]
        for q in range(1, copies + 1):
            order += _shifted(window, q * group)
        order += _shifted(acts[at + width:], copies * group)
        orders.append([(a.op, a.stage, a.microbatch) for a in order])
    try:
        return from_orders(schedule.name, list(schedule.placement),
                           schedule.microbatches + copies * group, orders)
    except OptPipeError:
        return None


def first_microbatches(schedule: Schedule, microbatches: int) -> Schedule:
    """``schedule`` restricted to its first ``microbatches`` microbatches.

    Why: the tasks of microbatches ``0..n-1`` of a valid schedule are a valid schedule
    of ``n`` microbatches (dependencies stay within a microbatch or a FIFO chain, and
    fewer activations are held), so a large problem's schedule is a free warm start for
    its smaller pieces (:mod:`.prefix`).
    """
    orders = [[(a.op, a.stage, a.microbatch) for a in acts if a.microbatch < microbatches]
              for acts in schedule.actions]
    return from_orders(f"{schedule.name}-first{microbatches}", list(schedule.placement),
                       microbatches, orders)


def _shifted(actions: Sequence[Action], by: int) -> list[Action]:
    return [replace(a, microbatch=a.microbatch + by) for a in actions]


def _window(acts: Sequence[Action], group: int, first: int) -> tuple[int, int] | None:
    """Start and width of the first window of ``acts`` with ``group`` actions of each
    (op, stage) whose first-stage forwards begin at microbatch ``first`` (a sliding
    count)."""
    types = {(a.op, a.stage) for a in acts}
    width = group * len(types)
    if width > len(acts):
        return None
    lead = min(a.stage for a in acts if a.op is Op.F)
    count = Counter((a.op, a.stage) for a in acts[:width])
    for at in range(len(acts) - width + 1):
        if at:
            count[(acts[at - 1].op, acts[at - 1].stage)] -= 1
            count[(acts[at + width - 1].op, acts[at + width - 1].stage)] += 1
        if all(count[t] == group for t in types):
            starts = [a.microbatch for a in acts[at:at + width]
                      if a.op is Op.F and a.stage == lead]
            if starts and starts[0] == first:
                return at, width
    return None


def extensions(problem: Problem, source: Schedule, *, keep: int = 2,
               deadline: float | None = None, label: str = "extended"
               ) -> list[tuple[Schedule, SimResult]]:
    """The fastest fitting extensions of ``source`` to ``problem``'s microbatches, named
    ``<label>-k<group>``.

    Tries every group size ``K`` up to half the source's microbatches that divides the
    microbatches to add, and every window start, middle windows first (until
    ``deadline``, once something fits); each candidate is simulated on
    ``problem`` (schedules that deadlock or run over the budget are dropped). Returns up
    to ``keep`` of different makespans, fastest first.
    """
    grow = problem.microbatches - source.microbatches
    if grow <= 0:
        return []
    found: dict[float, tuple[Schedule, SimResult, int]] = {}
    M0 = source.microbatches
    tries = [(group, first) for group in range(1, M0 // 2 + 1)
             if grow % group == 0 for first in range(M0 - group + 1)]
    # windows in the middle of the source first (its steady state, away from the
    # warm-up and the cool-down), larger groups first: what won where measured
    tries.sort(key=lambda t: (abs(t[1] + t[0] / 2 - M0 / 2), -t[0]))
    for group, first in tries:
        if deadline is not None and time.monotonic() > deadline and found:
            break
        extended = repeat_window(source, group, grow // group, first)
        if extended is None:
            continue
        try:
            result = simulate(problem, extended)
        except OptPipeError:                     # a cyclic wait: not a schedule
            continue
        if result.fits:
            found.setdefault(round(result.makespan, 9), (extended, result, group))
    best = sorted(found.items())[:keep]
    out = []
    for _, (extended, result, group) in best:
        extended.name = f"{label}-k{group}"
        extended.provenance = {"source": "optimizer", "name": extended.name,
                               "extended_from": source.name,
                               "source_microbatches": source.microbatches,
                               "group": group}
        out.append((extended, result))
    return out


def extended_schedules(problem: Problem, placement: Sequence[int], split_backward: bool,
                       *, time_limit: float, threads: int = 2, label: str = "extended",
                       hints: Callable[[Problem], list[Schedule]],
                       heartbeat: Callable[[], None] | None = None,
                       proven: "PrefixCuts | None" = None, recurse: bool = True,
                       cuts_share: float = 0.0
                       ) -> list[tuple[Schedule, SimResult]]:
    """Schedules of ``problem`` extended from a search on half its microbatches.

    The half problem is searched by CP-SAT on ``placement`` (hinted with ``hints(half)``
    and, when the half is large enough, with its own extensions: 64 from 32 from 16),
    and its best schedule is extended (:func:`extensions`). [] when the problem has
    fewer than twice :data:`MIN_SOURCE_MICROBATCHES` microbatches or nothing fits.
    ``proven`` (when given) keeps each half's proven bound (:meth:`.PrefixCuts.
    record_whole`), so the prefix cuts need not solve those pieces again. ``recurse``
    False: the half is searched from ``hints(half)`` only, with no extensions of its own.

    ``cuts_share`` (with ``proven``; no offload, where memory binds hard): that share of
    the time left before the half's search goes to its prefix cuts (pieces up to
    :data:`~.prefix.MAX_PIECE` microbatches, :func:`~.prefix.prefix_cuts`), which go
    into the half's model and into ``proven``. Why: the half's optimum is often found at
    once (extended from its own half) but not proven in the search's time, which then
    runs out; with the cuts the proof is quick (4 x 32 at half of 1F1B's memory: not
    proven in 11 s without, 4.6 s with), and the pieces are needed later anyway.
    """
    from optpipe.optimizer.cpsat import NoHint, solve_cpsat
    from optpipe.optimizer.prefix import MAX_PIECE, prefix_cuts, truncated_hints

    t0 = time.monotonic()
    M = problem.microbatches
    if M < 2 * MIN_SOURCE_MICROBATCHES or time_limit <= 0.5:
        return []
    half = replace(problem, microbatches=M // 2)
    starts = hints(half)
    if recurse and half.microbatches >= 2 * MIN_SOURCE_MICROBATCHES:
        inner = extended_schedules(half, placement, split_backward,
                                   time_limit=time_limit * INNER_SHARE, threads=threads,
                                   label=label, hints=hints, heartbeat=heartbeat,
                                   proven=proven, cuts_share=cuts_share)
        starts = [s for s, _ in inner] + starts
    if not starts:
        return []
    cuts = None
    if proven is not None and cuts_share > 0 and half.microbatches > MAX_PIECE:
        left = time_limit - (time.monotonic() - t0)
        cuts = prefix_cuts(half, placement, split_backward, time_limit=left * cuts_share,
                           threads=threads, hints=truncated_hints(starts[:CUT_HINTS]),
                           heartbeat=heartbeat, known=proven)
        proven.merge(cuts)
    left = time_limit - (time.monotonic() - t0)
    progress = (lambda *_: heartbeat()) if heartbeat else None
    try:
        run = solve_cpsat(half, warm_start=starts, time_limit=max(0.5, left * (1 - WINDOW_SHARE)),
                          threads=threads, split_backward=split_backward,
                          placement=placement, progress=progress, cuts=cuts,
                          # with the cuts the full model proves, where windows only
                          # search (4 x 32 at S/2: windows left it open after 8.6 s)
                          decompose=False if cuts is not None else None)
    except NoHint:
        return []
    if proven is not None:
        proven.record_whole(half.microbatches, run.bound, run.status == OPTIMAL)
    source = run.schedule if run.schedule is not None else starts[0]
    return extensions(problem, source, deadline=t0 + time_limit, label=label)
