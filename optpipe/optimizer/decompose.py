"""Decomposition for problems the full model cannot close: searches over windows.

Why: a large pipeline's full model is more than CP-SAT's own neighbourhoods can improve
in a minute on 2 cores (about 30 of them in 20 s), while the same model with most task
orders pinned solves in seconds. So, starting from the best schedule so far, we free a
window of tasks, keep the relative order of all other tasks on their devices, and let
CP-SAT re-place the window. Two kinds of window:

* :func:`window_search`, consecutive *microbatches* on every stage, sweeping from
  warm-up to cool-down: with a tight budget the optimal steady state is a pattern over
  microbatches (built for budget S/2);
* :func:`time_window_search`, every task that *starts* within a stretch of time
  around some device's idle gap, on every device (the V shape and interleaved chunks,
  every budget): at budget S what is left there is packing every device's warm-up and
  cool-down tightly, which is local in time and spans all microbatches in flight.
  The stretch widens while CP-SAT proves its windows quickly and narrows when it
  runs out of time; the search opens with windows that end at the makespan.

Every accepted step is a complete schedule of the full model (re-timed ASAP like the
simulator), so the result is valid whenever the search stops; the full model's lower
bound stays the proven bound.
"""

from __future__ import annotations

import graphlib
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Collection, Iterable, Sequence

from ortools.sat.python import cp_model

from optpipe.optimizer.result import ProgressFn
from optpipe.problem import Problem


#: A time window's width, in tasks per device: this many times the mean task's
#: duration (how it was chosen: docs/optimizer.md, "Decomposition";
#: `scripts/bench_windows.py --widths` measures others).
TIME_WINDOW_TASKS = 32
#: CP-SAT's limit per time-window step (s); with 32 tasks, 6 s beat 4 s (by hand, V at
#: budget S, 60 s: 8 x 16 52.6 against 52.75 s, 8 x 32 100.6 against 100.8 s).
TIME_STEP_LIMIT = 6.0
#: A time window grows by this factor after a step that proved its window holds no
#: shorter schedule in under half its limit (the neighbourhood is exhausted, so look
#: wider), and shrinks by it after a step that ran to its limit without one; between
#: :data:`TIME_WINDOW_RANGE` times the first width. Why: with the pinned tasks' time
#: windows (:func:`pinned_windows`) most steps at 16 stages prove in a fraction of a
#: second, and windows of 32 tasks then stall (16 x 64 at S, interleaved, CP-SAT alone
#: for 60 s, one run each: 206.4 s at a fixed width, 203.6 s growing; docs/optimizer-log.md).
TIME_WINDOW_GROWTH = 1.5
TIME_WINDOW_RANGE = (0.5, 8.0)
#: Steps in a row without a shorter schedule after which the time-window search stops
#: and leaves the rest of the time to the full model's proof: where the answer was
#: optimal all along, only the full model can show it.
TIME_PATIENCE = 12
#: Before the drawn windows, windows of the first width that end at the makespan, while
#: each finds a shorter schedule (at most this many). Why: the windows are drawn around
#: idle time, and a chunked placement's warm-up holds most of it (much of it forced by
#: memory), so a loose cool-down in the start went unvisited: at 16 x 64, budget S, V,
#: two such steps shorten ZB-V's greedy with admission by 5 s in under a second of
#: CP-SAT, where drawn windows found it after a minute or not at all (CP-SAT alone,
#: 60 s, seeds 1-6: 203.05 s mean against 204.13 s, better on 5 of 6; rerun with
#: `python scripts/bench_window_variants.py --sizes 16x64 --variants plain,no-cooldown
#: --seeds 1,2,3,4,5,6`; docs/optimizer-log.md, "Search revision 19").
COOLDOWN_STEPS = 4
#: The opening runs from this many starts (the fastest first), and the drawn windows
#: go on from the shortest results (:data:`SEARCH_CHAINS`). Why: a start's makespan
#: says little of what the search makes of it; what matters is whether its idle time is where the opening removes it
#: (at the end) or scattered through the steady state. At 16 x 64 on the V shape at
#: budget S, the fastest admission start (205.05 s, 23 gaps of 0.1-0.3 s on the tip's
#: device between 96 s and 190 s) opens to 204.7 s, the second and fourth (206.1 and
#: 206.7 s, none there, 4-5 s of idle at the end) to 202.25 and 202.5 s, in 2-3 s each,
#: and the search from the fourth reached the bound, 201.75 s, in both of two runs
#: (`python scripts/bench_openings.py`; docs/optimizer-log.md, "Search revision 20").
OPENING_STARTS = 4
#: The drawn windows go on from this many of the openings' results, the shortest
#: first, of those within :data:`CHAIN_MARGIN` of the shortest, taking turns: each for
#: :data:`CHAIN_TURN` steps in a row without a shorter schedule, then the next, each
#: with a window width of its own. Why: one opening's result can be a local optimum the
#: drawn windows never leave. At 16 x 64 on the V shape at budget S the shortest
#: opening (202.25 s) stayed there for the last 50 s of every run, while the search
#: from the fourth start's (202.5 s) reached the bound, 201.75 s. Taking turns on both:
#: 201.75 s (proven) in 2 of 4 seeds and 202.0 s in the others, against 202.25 s in
#: all four (CP-SAT alone, 60 s; `python scripts/bench_window_variants.py --sizes
#: 16x64,16x32 --variants plain,one-chain`; docs/optimizer-log.md, "Search revision 21").
SEARCH_CHAINS = 2
CHAIN_TURN = 4
#: How close (a share of its makespan) a second opening must come to the shortest to
#: get turns. Why: where the drawn windows keep finding shorter schedules, a turn on a
#: worse line costs their time. At 16 x 32 (the openings 107.25 and 107.8 s, 0.5%
#: apart) taking turns gave 106.5 s against 106.0 s (seeds 1-4); at 16 x 64 they are
#: 0.12% apart (the 106.5 s: a first run of the script before the margin existed).
#: At S/2 on 16 x 32 and 16 x 64 (openings 0.04-0.22% apart, so taking turns; by
#: hand) the two ways were even over seeds 1-2 (`--budget 0.5`). Fitted on these
#: cells only.
CHAIN_MARGIN = 0.0025


@dataclass
class WindowStats:
    """What a window search did (for the run's ``extra``)."""

    #: CP-SAT steps run, the openings' included
    steps: int = 0
    #: steps that found a shorter schedule on their own line (an opening from a start
    #: that did not win, or a chain that is not the shortest, counts too)
    improvements: int = 0
    #: the last window width used (ticks)
    window: int = 0
    #: the drawn windows' steps on each chain of the time-window search (the shortest
    #: opening's first; :data:`SEARCH_CHAINS`)
    chain_steps: list[int] = field(default_factory=list)


class _Stepper:
    """Runs one window step: the full model with the other tasks' orders pinned.

    It learns how long a model takes to build and how far past its limit a step runs
    (what CP-SAT does before its first check of the clock is not interruptible: it ran
    11-15 s past 4 s steps at 16 x 32 until the closure of precedences was switched
    off, :func:`~.cpsat.new_solver`), so that no step is begun that cannot end by the
    deadline.
    """

    def __init__(self, problem: Problem, ticks: Any, lower: int, deadline: float,
                 threads: int, step_limit: float) -> None:
        from optpipe.optimizer.preprocess import graph_placement, memory_implied_orders

        self.problem, self.ticks, self.lower = problem, ticks, lower
        self.deadline, self.threads, self.step_limit = deadline, threads, step_limit
        self.build_time = 0.0
        self.overrun = 0.0
        self.implied = memory_implied_orders(problem, ticks.graph.split_backward,
                                             graph_placement(ticks.graph))
        self.static = static_successors(ticks.graph, self.implied)
        # the last step: did CP-SAT prove its window, and in how many seconds
        self.proven = False
        self.seconds = 0.0

    def room(self) -> bool:
        """Is there time to build and run one more step?"""
        return self.deadline - time.monotonic() >= self.build_time + self.overrun + 0.5

    def run(self, best: Any, free: Collection[Any], stats: WindowStats,
            frozen_before: int | None = None) -> Any | None:
        """The schedule re-placed with the tasks in ``free`` (keys) unpinned, as a
        :class:`~.cpsat_model.Hint`; None when the step found nothing or had no time.

        ``frozen_before`` (ticks): pinned tasks that end by then keep their times. Why:
        they start before every free task, so their ASAP times cannot fall (a free task
        put before one can only delay it), and fixing them spares CP-SAT's presolve
        the propagation along their chains (at 8 x 64 on the V shape, 3.1 s -> 1.0 s).
        Every other task starts within its :func:`pinned_windows`.
        """
        from optpipe.optimizer.cpsat import extract_schedule, new_solver
        from optpipe.optimizer.cpsat_model import make_hint
        from optpipe.optimizer.cpsat_order import build_order_model

        fixed = [[k for k in seq if k not in free] for seq in best.order]
        t_build = time.monotonic()
        windows = pinned_windows(self.ticks.graph, best, fixed, free, self.implied,
                                 frozen_before, self.static)
        builder, handles = build_order_model(self.problem, self.ticks, best.makespan,
                                             self.lower, best, fixed_order=fixed, free=free,
                                             windows=windows, implied=self.implied)
        builder.add_hints()
        self.build_time = max(self.build_time, time.monotonic() - t_build)
        left = self.deadline - time.monotonic() - self.overrun
        if left < 0.3:
            return None
        limit = max(0.1, min(self.step_limit, left - 0.2))
        solver = new_solver(limit, self.threads)
        t_solve = time.monotonic()
        code = self.solve(solver, builder.model, best)
        self.seconds = time.monotonic() - t_solve
        self.proven = code == cp_model.OPTIMAL
        # against the limit CP-SAT ran with (a variant of :meth:`solve` may raise it)
        self.overrun = max(self.overrun,
                           self.seconds - solver.parameters.max_time_in_seconds)
        stats.steps += 1
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        return make_hint(extract_schedule(self.problem, solver, handles, offload=False),
                         self.ticks)

    def solve(self, solver: cp_model.CpSolver, model: cp_model.CpModel, best: Any) -> int:
        """CP-SAT on one step's model, within the limit ``solver`` was given. A seam
        of its own: `scripts/bench_window_variants.py` measures variants of how long a
        step runs (``run-on``: on past the limit while it still finds shorter schedules
        than ``best``)."""
        return solver.solve(model)


def static_successors(graph: Any, implied: Iterable[tuple[Any, Any]]
                      ) -> dict[Any, list[tuple[Any, int]]]:
    """Every task's successors (and lags, ticks) over the dependencies, the FIFO
    chains and the orders memory implies: the part of :func:`pinned_windows`'s graph
    that is the same in every step of a search (a stepper keeps it)."""
    succ: dict[Any, list[tuple[Any, int]]] = {k: [] for k in graph.keys}
    for k, before in graph.deps.items():
        for p, lag in before:
            succ[p].append((k, int(lag)))
    for seq in graph.chains:
        for a, b in zip(seq, seq[1:]):
            succ[a].append((b, 0))
    for a, b in implied:
        succ[a].append((b, 0))
    return succ


def pinned_windows(graph: Any, best: Any, pinned: Sequence[Sequence[Any]],
                   free: Collection[Any], implied: Iterable[tuple[Any, Any]],
                   frozen_before: int | None,
                   static: dict[Any, list[tuple[Any, int]]] | None = None
                   ) -> dict[Any, tuple[int, int]]:
    """Least and latest start (ticks) of every task in a window step that ends by
    ``best.makespan``: longest paths over the dependencies, the FIFO chains, the orders
    memory implies and the pinned orders (``pinned``: per device, the tasks outside
    ``free`` in their order), with the tasks that end by ``frozen_before`` at their
    times in ``best``. ``static``: :func:`static_successors` of ``graph`` and
    ``implied``, when the caller keeps it.

    Why: those orders are constraints of the step's model, so these windows cut off
    none of its schedules, but the graph's own windows ignore the device orders, and
    CP-SAT's presolve then spent nearly all of a step propagating thousands of pinned
    tasks' chains: at 16 x 64 on interleaved chunks (budget S), a window in the
    warm-up took 5.5 s of its 6 s before the first schedule and about 0.3 s with
    these windows, the same optimum (by hand, 2026-12-01).

    The paths run in the order of ``best``'s starts: ``best`` keeps every one of these
    orders, and where every task lasts at least a tick each edge goes from an earlier
    start to a later one. (Otherwise a topological sort orders them.)
    """
    dur = graph.duration
    succ = static_successors(graph, implied) if static is None else static
    after = {a: b for seq in pinned for a, b in zip(seq, seq[1:])}
    if all(int(dur[k]) > 0 for k in graph.keys):
        topo = sorted(graph.keys, key=lambda k: best.times[k][0])
    else:
        preds: dict[Any, list[Any]] = {k: [] for k in graph.keys}
        for k, nexts in succ.items():
            for n, _ in nexts:
                preds[n].append(k)
        for a, b in after.items():
            preds[b].append(a)
        topo = list(graphlib.TopologicalSorter(preds).static_order())
    frozen = set() if frozen_before is None else {
        k for k in graph.keys if k not in free and best.times[k][1] <= frozen_before}
    least = {k: 0 for k in graph.keys}
    for k in topo:
        if k in frozen:
            least[k] = best.times[k][0]
        reach = least[k] + int(dur[k])
        for n, lag in succ[k]:
            if reach + lag > least[n]:
                least[n] = reach + lag
        n = after.get(k)
        if n is not None and reach > least[n]:
            least[n] = reach
    tail: dict[Any, int] = {}
    for k in reversed(topo):
        t = max((lag + int(dur[n]) + tail[n] for n, lag in succ[k]), default=0)
        n = after.get(k)
        if n is not None:
            t = max(t, int(dur[n]) + tail[n])
        tail[k] = t
    return {k: (best.times[k][0], best.times[k][0]) if k in frozen else
            (least[k], best.makespan - int(dur[k]) - tail[k]) for k in graph.keys}


def _report(progress: ProgressFn | None, t0: float, best: Any, ticks: Any,
            bound: float | None) -> None:
    if progress is not None:
        value = best.makespan / ticks.scale
        progress(time.monotonic() - t0, value, bound,
                 None if bound is None else max(0.0, 1 - bound / value))


def window_search(problem: Problem, ticks, hint, *, lower: int, deadline: float,
                  threads: int, window: int = 8, step_limit: float = 6.0,
                  progress: ProgressFn | None = None, t0: float | None = None,
                  bound: float | None = None):
    """Improve ``hint`` (a :class:`~.cpsat_model.Hint`) until ``deadline``; returns (hint, stats).

    Stops early when the incumbent reaches ``lower`` (ticks) or a full sweep finds
    nothing; on a fruitless sweep the window grows by half (larger neighbourhoods).
    """
    M = problem.microbatches
    stats = WindowStats(window=min(window, M))
    t0 = time.monotonic() if t0 is None else t0
    stepper = _Stepper(problem, ticks, lower, deadline, threads, step_limit)
    best = hint
    w = min(window, M)
    stale = 0
    while time.monotonic() < deadline - 0.5 and best.makespan > lower:
        starts = list(range(0, max(1, M - w + 1), max(1, w // 2)))
        if starts[-1] != max(0, M - w):
            starts.append(max(0, M - w))
        improved = False
        for m1 in starts:
            if not stepper.room() or best.makespan <= lower:
                break
            free = set(range(m1, m1 + w))
            timed = stepper.run(best, {k for seq in best.order for k in seq
                                       if k[2] in free}, stats)
            if timed is not None and timed.makespan < best.makespan:
                best = timed
                improved = True
                stats.improvements += 1
                _report(progress, t0, best, ticks, bound)
        if improved:
            stale = 0
        else:
            stale += 1
            if w >= M or stale > 1:
                break
            w = min(M, w + max(1, w // 2))
            stats.window = w
    return best, stats


@dataclass
class _Chain:
    """One line of the time-window search: its schedule, window width and steps in a
    row without a shorter schedule."""

    best: Any
    width: int
    idle: int = 0


def time_window_search(problem: Problem, ticks: Any, hint: Any, *, lower: int,
                       deadline: float, threads: int, tasks: float | None = None,
                       step_limit: float | None = None,
                       progress: ProgressFn | None = None, t0: float | None = None,
                       bound: float | None = None, seed: int = 0,
                       patience: int | None = None,
                       proof_seconds: float = 0.0,
                       others: Sequence[Any] = ()) -> tuple[Any, WindowStats]:
    """Improve ``hint`` (a :class:`~.cpsat_model.Hint`) until ``deadline``; returns (hint, stats).

    Each step frees the compute tasks that start within a window of ``tasks`` mean task
    durations (default :data:`TIME_WINDOW_TASKS`), on every device at once, around an
    idle gap drawn at random (:func:`_window_start`; seeded, so the same run makes the
    same choices), and gives CP-SAT up to ``step_limit`` seconds (default
    :data:`TIME_STEP_LIMIT`). After a step without a shorter schedule the width adapts
    (:func:`_next_width`): wider where CP-SAT proves windows quickly, narrower where
    it runs out of time. A step that finds an equally short schedule is kept too:
    it moves the search along the plateau, which is where the next step finds room.
    Before the drawn windows, up to :data:`COOLDOWN_STEPS` windows of the first width
    end at the makespan (while each finds a shorter schedule), from ``hint`` and from
    the next :data:`OPENING_STARTS` - 1 of ``others`` (further starts, fastest first);
    the drawn windows go on from the shortest results, taking turns
    (:data:`SEARCH_CHAINS`), each with a width of its own. Stops when the incumbent
    reaches ``lower`` (ticks) or after ``patience`` steps in a row without a shorter
    schedule (default :data:`TIME_PATIENCE`), so that the caller can spend the time left
    on a proof — unless less time is left than that proof needs to start
    (``proof_seconds``): then the steps go on to the deadline.
    """
    patience = TIME_PATIENCE if patience is None else patience
    step_limit = TIME_STEP_LIMIT if step_limit is None else step_limit
    t0 = time.monotonic() if t0 is None else t0
    first = first_width(ticks.graph, tasks)
    narrowest, widest = (max(1, int(first * r)) for r in TIME_WINDOW_RANGE)
    stats = WindowStats(window=first)
    stepper = _Stepper(problem, ticks, lower, deadline, threads, step_limit)
    rng = random.Random(seed)
    opened: list[_Chain] = []
    best = None                   # the first shortest opening
    for start in [hint, *others[:OPENING_STARTS - 1]]:
        if best is not None and best.makespan <= lower:
            break
        opened.append(_Chain(_opening(stepper, start, first, lower, stats), first))
        if best is None or opened[-1].best.makespan < best.makespan:
            best = opened[-1].best
    if best.makespan < hint.makespan:
        _report(progress, t0, best, ticks, bound)
    # the drawn windows take turns on the shortest openings (see SEARCH_CHAINS)
    near = best.makespan * (1 + CHAIN_MARGIN)
    chains = sorted((c for c in opened if c.best.makespan <= near),
                    key=lambda c: c.best.makespan)[:SEARCH_CHAINS]
    turn = 0
    stats.chain_steps = [0] * len(chains)
    idle_steps = 0
    while stepper.room() and best.makespan > lower and (
            idle_steps < patience or deadline - time.monotonic() < 1 + proof_seconds):
        idle_steps += 1
        chain = chains[turn]
        stats.chain_steps[turn] += 1
        at = _window_start(chain.best, chain.width, rng)
        timed = stepper.run(chain.best, started_within(chain.best, at, at + chain.width),
                            stats, frozen_before=at)
        if timed is None or timed.makespan >= chain.best.makespan:
            chain.width = _next_width(chain.width, stepper, narrowest, widest)
            stats.window = chain.width
            chain.idle += 1
            if chain.idle >= CHAIN_TURN and len(chains) > 1:
                chain.idle = 0
                turn = (turn + 1) % len(chains)
        if timed is None or timed.makespan > chain.best.makespan:
            continue
        if timed.makespan < chain.best.makespan:
            chain.idle = 0
            stats.improvements += 1
        chain.best = timed
        if timed.makespan < best.makespan:
            idle_steps = 0
            _report(progress, t0, timed, ticks, bound)
            best = timed
    return best, stats


def _opening(stepper: _Stepper, start: Any, first: int, lower: int,
             stats: WindowStats) -> Any:
    """``start`` after the search's opening: up to :data:`COOLDOWN_STEPS` windows of
    the ``first`` width that end at the makespan, while each finds a shorter schedule."""
    best = start
    for _ in range(COOLDOWN_STEPS):
        if not stepper.room() or best.makespan <= lower:
            break
        at = best.makespan - first
        timed = stepper.run(best, started_within(best, at), stats, frozen_before=at)
        if timed is None or timed.makespan >= best.makespan:
            break
        stats.improvements += 1
        best = timed
    return best


def first_width(graph: Any, tasks: float | None = None) -> int:
    """A time window's first width, in ticks: ``tasks`` (default
    :data:`TIME_WINDOW_TASKS`) times the mean task's duration of ``graph``."""
    tasks = TIME_WINDOW_TASKS if tasks is None else tasks
    mean = sum(int(graph.duration[k]) for k in graph.keys) / max(1, len(graph.keys))
    return max(1, int(round(tasks * mean)))


def started_within(best: Any, at: int, until: float = math.inf) -> set[Any]:
    """The tasks of ``best`` (a :class:`~.cpsat_model.Hint`) that start in ``[at, until)``
    ticks: a time window's free tasks."""
    return {k for seq in best.order for k in seq if at <= best.times[k][0] < until}


def _next_width(width: int, stepper: _Stepper, narrowest: int, widest: int) -> int:
    """The next time window's width after a step that found no shorter schedule:
    wider when CP-SAT proved the window in under half its limit, narrower when it ran
    out of time (:data:`TIME_WINDOW_GROWTH`)."""
    if stepper.proven and stepper.seconds < stepper.step_limit / 2:
        return min(widest, int(width * TIME_WINDOW_GROWTH))
    if not stepper.proven:
        return max(narrowest, int(width / TIME_WINDOW_GROWTH))
    return width


def _window_start(best: Any, width: int, rng: random.Random) -> int:
    """Where the next time window begins: around an idle gap of some device, drawn with
    probability proportional to its length (ties to the schedule's own idle time:
    only where a device waits can a re-placement shorten anything), the gap's position
    in the window itself at random. Uniform over the schedule when nothing idles."""
    gaps = idle_gaps(best)
    total = sum(b - a for a, b in gaps)
    if total <= 0:
        return rng.randrange(-(width // 2), max(1 - width // 2, best.makespan - width // 2))
    pick = rng.uniform(0, total)
    for a, b in gaps:
        if pick <= b - a:
            point = a + int(pick)
            break
        pick -= b - a
    else:
        point = gaps[-1][0]
    return point - rng.randrange(0, width)


def idle_gaps(best: Any) -> list[tuple[int, int]]:
    """Every device's idle stretches in ``best`` (a :class:`~.cpsat_model.Hint`), in ticks
    from 0 to its makespan, as (begin, end)."""
    return [gap for seq in best.order for gap in device_idle_gaps(best, seq)]


def device_idle_gaps(best: Any, seq: Sequence[Any]) -> list[tuple[int, int]]:
    """One device's idle stretches in ``best``: ``seq`` (its tasks), in ticks from 0 to
    the makespan, as (begin, end) in time order."""
    gaps: list[tuple[int, int]] = []
    edge = 0
    for begin, end in sorted(best.times[k][:2] for k in seq):
        if begin > edge:
            gaps.append((edge, begin))
        edge = max(edge, end)
    if best.makespan > edge:
        gaps.append((edge, best.makespan))
    return gaps
