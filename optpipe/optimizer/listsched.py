"""Memory-aware list schedules on any placement: fast warm starts for every placement.

Why: the engines start from the best schedule they are given on each placement, and at
16 stages their minute is too short to travel far from it (the time windows improve a
schedule by a few percent a minute there). The fixed schedules are built for one cost
profile; on the ``gpt-14.6b`` preset at 16 stages (first and last stages heavier) ZB-V
leaves 34% of the step idle and no fixed schedule on the chunked placements beats
zb-auto's 1.944 s on one stage per device, while a list schedule on the V shape runs
1.820 s (the search from it: 1.789 s in the library), and on the 8-stage preset the
interleaved list schedule is the proven optimum (3.501 s).
``scripts/bench_listsched.py`` measures them against the fixed schedules.

A list schedule: whenever a device is idle it runs, of the next task of each (op,
stage) it holds (FIFO, as the engines), the first that is ready by this rule: a
backward (B, or fused BW) first; then a W when ``eager_w``; then a forward if the
budget leaves room for it plus ``reserve`` activations of the device's later stages
(so that the chunk that turns microbatches around is not starved); else a W. Among
ready tasks of one kind, ``rule`` decides: ``"critical"`` takes the longest path to the
end (``preprocess.tails``), ``"depth"`` the latest stage (pushing microbatches through
the device's chunks, as 1F1B does). Memory is counted with the simulator's accounting
(``memory.accounting.memory_delta``), and every result is judged by the simulator
before it is used.

:func:`admission_schedules` adds the other greedy, the one behind ZB-V
(:mod:`optpipe.generators.listsched`), run under the real budget with only a share of
each new microbatch's later-chunk bytes held back when it is admitted. Why: ZB-V holds
them all, so on the V shape device 0 starts at most ``S`` microbatches before the first
one comes back and then idles (16 x 32 at budget S: 8.5 s of its 114 s); holding a
fifth of them lets it run more forwards into that gap, 111.35 s, and the time windows
from there reached 107.65-109.6 s in three 60 s runs where they end at 110.65-111.7 s
from ZB-V (`scripts/bench_listsched.py` measures the starts,
`scripts/bench_window_variants.py` the search from them).
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import replace
from typing import Iterator, Mapping, Sequence

from optpipe.generators import listsched as greedy
from optpipe.generators.base import Order
from optpipe.generators.zbv import VARIANTS
from optpipe.memory.accounting import memory_delta
from optpipe.optimizer.preprocess import Key, TaskGraph, tails, task_graph
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule, from_orders

RULES = ("critical", "depth")
RESERVES = (0, 1, 2)
#: The W policies :func:`list_schedules` tries. Eager W was the only best variant on 3 of
#: 30 placement-problems (the presets, 4 x 16 to 16 x 32 at S/2, S, 2S), all interleaved
#: chunks at S/2, where the V shape starts far ahead; dropping it halves the time (5.1
#: against about 2.5 s for both chunked placements at 16 x 64). ``eager_w=True`` stays
#: for experiments.
EAGER_W = (False,)
_EPS = 1e-12
#: The shares of a new microbatch's later-chunk bytes :func:`admission_schedules` holds
#: back at admission (1.0 is ZB-V's own rule; below 0.1 most runs stall).
RESERVE_SHARES = (0.5, 0.4, 0.3, 0.2, 0.1)
#: How many of their distinct orders (the least estimates first) become candidates:
#: each costs a simulation (0.1 s at 16 x 64), while the engine's run costs 0.03 s.
ADMISSION_KEEP = 4
#: With and without ZB-V's greedy keeping microbatch 0's path clear
#: (``Policy.lookahead``). Why both: with it the V shape's first backward on the tip's
#: device starts at the warm-up bound (16 x 32 at S: 25.75 s against 28.95 s; best start
#: 107.3 s against 111.35 s; 16 x 64: 205.05 s against 210.0 s), without it some
#: interleaved and S/2 starts are faster (`python scripts/bench_openings.py`,
#: `python scripts/bench_listsched.py`).
LOOKAHEADS = (False, True)


def list_schedule(problem: Problem, placement: Sequence[int], split_backward: bool = True,
                  *, rule: str = "critical", reserve: int = 0, eager_w: bool = False,
                  graph: TaskGraph | None = None,
                  tail: Mapping[Key, float] | None = None) -> Schedule | None:
    """A list schedule of ``problem`` on ``placement`` (see the module docstring), or
    None when the rule leaves every device waiting for memory that nothing will free.

    ``graph`` (``task_graph(problem, split_backward, placement)``) and ``tail`` (its
    :func:`~.preprocess.tails`) may be passed in by a caller that runs several rules on
    one placement: building them took most of each run (0.2 s at 16 x 64)."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; choose one of {', '.join(RULES)}")
    if graph is None:
        graph = task_graph(problem, split_backward, placement)
    split = graph.problem
    place = list(placement)
    stages_on = [[s for s in range(split.stages) if place[s] == d]
                 for d in range(split.devices)]
    ops = graph.ops
    M = split.microbatches
    if rule == "critical":
        tail = tails(graph) if tail is None else tail
        prio = {k: (-(tail[k] + graph.duration[k]), k[2]) for k in graph.keys}
    else:
        prio = {k: (-k[1], k[2]) for k in graph.keys}
    succ: dict[Key, list[tuple[Key, float]]] = {k: [] for k in graph.keys}
    for k, preds in graph.deps.items():
        for p, lag in preds:
            succ[p].append((k, lag))
    room = [split.budget[d] - split.static[d] for d in range(split.devices)]
    # per stage: the room a forward must leave for its device's later chunks
    headroom = [reserve * max((split.activation[x] for x in stages_on[place[s]] if x > s),
                              default=0) for s in range(split.stages)]
    last_stage = [max(stages) for stages in stages_on]

    nxt = {(op, s): 0 for s in range(split.stages) for op in ops}
    end: dict[Key, float] = {}
    level = [0.0] * split.devices
    free = [0.0] * split.devices
    order: list[list[Key]] = [[] for _ in range(split.devices)]
    tick = itertools.count()                   # heap tie-breaker
    wake: list[tuple[float, int, int]] = [(0.0, next(tick), d) for d in range(split.devices)]
    left = len(graph.keys)

    def ready(key: Key, t: float) -> bool:
        for p, lag in graph.deps[key]:
            if p not in end or end[p] + lag > t + _EPS:
                return False
        return True

    def pick(d: int, t: float) -> Key | None:
        heads = [(op, s, nxt[(op, s)]) for s in stages_on[d] for op in ops
                 if nxt[(op, s)] < M]
        heads = [k for k in heads if ready(k, t)]
        backward = [k for k in heads if k[0] in (Op.B, Op.BW)]
        if backward:
            return min(backward, key=prio.__getitem__)
        weights = [k for k in heads if k[0] is Op.W]
        if eager_w and weights:
            return min(weights, key=lambda k: (k[2], k[1]))
        forwards = [k for k in heads if k[0] is Op.F]
        fitting = [k for k in forwards if level[d] + split.activation[k[1]]
                   + headroom[k[1]] <= room[d] + 1e-9]
        if not fitting:      # the device's last chunk may always use the room left
            fitting = [k for k in forwards if k[1] == last_stage[d]
                       and level[d] + split.activation[k[1]] <= room[d] + 1e-9]
        if fitting:
            return min(fitting, key=prio.__getitem__)
        if weights:
            return min(weights, key=lambda k: (k[2], k[1]))
        return None

    while wake and left:
        t, devices = pop_waking(wake)
        for d in devices:
            if free[d] > t + _EPS:
                continue
            key = pick(d, t)
            if key is None:
                continue
            op, s, m = key
            end[key] = t + graph.duration[key]
            free[d] = end[key]
            order[d].append(key)
            nxt[(op, s)] += 1
            left -= 1
            # the shared accounting; a release at the task's end is counted now, as the
            # device runs nothing else before then
            level[d] += memory_delta(split, Action(op, s, m))[1]
            heapq.heappush(wake, (end[key], next(tick), d))
            for n, lag in succ[key]:
                heapq.heappush(wake, (end[key] + lag, next(tick), place[n[1]]))
    if left:
        return None
    name = f"list-{rule}-r{reserve}{'-eager' if eager_w else ''}"
    schedule = from_orders(name, place, problem.microbatches, order)
    # the planned step: the simulator re-times the same orders to the same starts
    # (tests/test_listsched.py holds the two to it)
    schedule.provenance = {"source": "optimizer", "name": name,
                           "planned_makespan": max(end.values(), default=0.0)}
    return schedule


def pop_waking(wake: list[tuple[float, int, int]]) -> tuple[float, list[int]]:
    """Pop the earliest wake-up time off the heap of ``(time, tie, device)`` and every
    device due then (within rounding), in device order: the list schedulers' event step."""
    t = wake[0][0]
    devices = set()
    while wake and wake[0][0] <= t + _EPS:
        devices.add(heapq.heappop(wake)[2])
    return t, sorted(devices)


def past(deadline: float | None, have: Sequence[object]) -> bool:
    """Is it time to stop adding more of one kind of list schedule?

    Why "once one is in hand": a list schedule on a chunked placement is often far
    ahead of every fixed schedule (the 16-stage preset: 1.820 s on the V shape against
    zb-auto's 1.944 s) and one costs 0.03-0.3 s, so even a short ``--time-limit`` gets
    one of each kind; all of them take seconds at 16 x 64 (about 4 s for both chunked
    placements, ``scripts/bench_presearch.py``)."""
    return deadline is not None and bool(have) and time.monotonic() > deadline


def list_schedules(problem: Problem, placement: Sequence[int],
                   split_backward: bool = True, deadline: float | None = None
                   ) -> list[Schedule]:
    """Every rule, reserve and W policy on ``placement`` (each distinct order once);
    past ``deadline`` (``time.monotonic()``) no more once one is made (:func:`past`)."""
    out: list[Schedule] = []
    seen: set[tuple] = set()
    graph = task_graph(problem, split_backward, placement)
    tail = tails(graph)
    for rule in RULES:
        for reserve in RESERVES:
            if reserve and len(placement) == problem.devices:
                continue                      # one stage per device: nothing to reserve
            for eager in EAGER_W:
                if past(deadline, out):
                    return out
                schedule = list_schedule(problem, placement, split_backward, rule=rule,
                                         reserve=reserve, eager_w=eager, graph=graph,
                                         tail=tail)
                if schedule is None:
                    continue
                sig = tuple(tuple((a.op, a.stage, a.microbatch) for a in acts)
                            for acts in schedule.actions)
                if sig not in seen:
                    seen.add(sig)
                    out.append(schedule)
    return out


def admission_runs(problem: Problem, placement: Sequence[int],
                   deadline: float | None = None
                   ) -> list[tuple[list[Order], greedy.Policy]]:
    """ZB-V's greedy on a chunked ``placement`` under ``problem``'s budget with every
    :data:`RESERVE_SHARES` share, ZB-V variant and :data:`LOOKAHEADS` setting: the
    distinct orders that fit, as (orders, policy), least estimated makespan first.

    The engine's memory is exact for compute-only orders, so whether an order fits is
    known without simulating it. `scripts/bench_openings.py` reads every run from here.
    Past ``deadline`` no more runs once one fits (:func:`past`).
    """
    place = list(placement)
    split = problem.split(place)
    cap = tuple(float(problem.budget[d] - problem.static[d]) for d in range(problem.devices))
    runs = []
    seen: set[tuple] = set()
    for share, variant, lookahead in itertools.product(RESERVE_SHARES, VARIANTS,
                                                       LOOKAHEADS):
        if past(deadline, runs):
            break
        policy = replace(variant, mem_cap=cap, reserve=share, lookahead=lookahead)
        try:
            run = greedy.list_schedule(split, place, policy)
        except greedy.Stalled:
            continue
        key = tuple(map(tuple, run.orders))
        if key in seen or any(peak > room + 1e-6 for peak, room in zip(run.peak_kept, cap)):
            continue
        seen.add(key)
        runs.append((run.estimate, len(runs), run.orders, policy))
    runs.sort(key=lambda run: run[:2])
    return [(orders, policy) for _, _, orders, policy in runs]


def admission_schedules(problem: Problem, placement: Sequence[int],
                        deadline: float | None = None) -> list[Schedule]:
    """ZB-V's greedy on a chunked ``placement`` under ``problem``'s budget, holding only
    :data:`RESERVE_SHARES` of each new microbatch's later-chunk bytes at admission
    (see the module docstring): of every share and ZB-V variant, the
    :data:`ADMISSION_KEEP` distinct orders that fit with the least estimated makespan
    (:func:`admission_runs`, until ``deadline``); the caller simulates the few kept.
    """
    place = list(placement)
    out = []
    for orders, policy in admission_runs(problem, place, deadline)[:ADMISSION_KEEP]:
        name = f"admit-r{policy.reserve:g}-{policy.prefer}-{policy.w_mode}" + (
            "-guard" if policy.guard_b else "") + ("-look" if policy.lookahead else "")
        schedule = from_orders(name, place, problem.microbatches, orders)
        schedule.provenance = {"source": "optimizer", "name": name, **policy.describe()}
        out.append(schedule)
    return out


def warm_start_kinds(problem: Problem, placement: Sequence[int],
                     split_backward: bool = True, deadline: float | None = None
                     ) -> Iterator[list[Schedule]]:
    """What the driver starts a chunked placement from besides the fixed schedules, kind
    by kind: the list schedules and, with split backwards (ZB-V's greedy models no fused
    backward), the admission schedules; past ``deadline`` at least one of each
    (:func:`past`). Unsimulated; the caller keeps those that fit. A generator, so that a
    caller holding an optimal schedule after one kind need not build the next."""
    yield list_schedules(problem, placement, split_backward, deadline)
    if split_backward:
        yield admission_schedules(problem, placement, deadline)


def warm_starts(problem: Problem, placement: Sequence[int],
                split_backward: bool = True, deadline: float | None = None
                ) -> list[Schedule]:
    """Every kind of :func:`warm_start_kinds`, in one list."""
    return [s for kind in warm_start_kinds(problem, placement, split_backward, deadline)
            for s in kind]
