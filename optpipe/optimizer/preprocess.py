"""Preprocessing shared by every optimization engine (CP-SAT and the Pyomo MILP).

Why a shared module: both engines must model exactly the simulator's semantics, and the
facts below are where a mistake would make them disagree. Everything here is derived
from :mod:`optpipe.simulator`'s rules for the base problem (one stage per device):

* the task set (``F``, ``B``, ``W`` per stage and microbatch, or fused ``BW``) and each
  task's duration, taken from :mod:`optpipe.memory.accounting` (the one source);
* data dependencies with their lag (``p2p`` only between different devices);
* implied orders: microbatches are interchangeable, so each op type on a stage can run
  its microbatches in FIFO order without losing optimality (:func:`fifo_chains`);
* time windows (:func:`earliest_starts`, :func:`latest_starts`) and lower bounds on the
  makespan (:func:`lower_bound`);
* the smallest feasible budgets (:func:`min_budgets`);
* the warm start: the best fixed schedule that fits (:func:`fixed_schedules`,
  :func:`best_fitting`), with memory-capped fallbacks of our own so that a warm start
  exists for every feasible budget (:func:`capped_1f1b`, :func:`sequential_schedule`);
* conversion of a fixed schedule into the canonical form the engines model
  (:func:`canonical_form`) and extraction of a schedule from solved start times
  (:func:`orders_from_starts`, re-exported from :mod:`.extract`).

Stable public API (the MILP engine imports it): ``Key``, ``TaskGraph``, ``task_graph``,
``fifo_chains``, ``earliest_starts``, ``latest_starts``, ``lower_bound``,
``min_budgets``, ``fixed_schedules``, ``best_fitting``, ``warm_start``,
``canonical_form``, ``orders_from_starts``, ``capped_1f1b``, ``sequential_schedule``.
Keys are ``(Op, stage, microbatch)`` tuples, the same as :attr:`Action.key`.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, Sequence

from optpipe.errors import OptPipeError
from optpipe.memory.accounting import duration as action_duration
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule, linear_placement
from optpipe.simulator import SimResult, dependency_function, simulate

Key = tuple[Op, int, int]


# ----------------------------------------------------------------- task graph
@dataclass(frozen=True)
class TaskGraph:
    """The compute tasks of a base problem, their durations, dependencies and devices.

    ``deps[k]`` lists ``(predecessor, lag)``: ``k`` may start at ``end(pred) + lag``.
    ``chains`` are the FIFO orders (one per op type and stage, microbatch order), kept
    apart from ``deps`` because they are an optimality-preserving choice, not data flow.
    ``duration`` may be in seconds or in integer ticks (:meth:`scaled`).
    """

    problem: Problem                 # the problem judged (split into chunks if any)
    split_backward: bool
    keys: tuple[Key, ...]
    duration: Mapping[Key, float]
    deps: Mapping[Key, tuple[tuple[Key, float], ...]]
    chains: tuple[tuple[Key, ...], ...]
    lag: float
    placement: tuple[int, ...] = ()  # stage -> device; () means stage s on device s

    @property
    def backward_ops(self) -> tuple[Op, ...]:
        return (Op.B, Op.W) if self.split_backward else (Op.BW,)

    @property
    def ops(self) -> tuple[Op, ...]:
        return (Op.F, *self.backward_ops)

    def device(self, key: Key) -> int:
        """Device of a task (``placement[stage]``)."""
        return self.placement[key[1]] if self.placement else key[1]

    @property
    def devices(self) -> int:
        return self.problem.devices

    @property
    def chunks(self) -> int:
        return self.problem.stages // self.problem.devices

    def device_keys(self, device: int) -> list[Key]:
        return list(self._keys_by_device.get(device, ()))

    @functools.cached_property
    def _keys_by_device(self) -> dict[int, tuple[Key, ...]]:
        """Each device's tasks, in ``keys`` order. Kept, like :meth:`topological`'s
        order and the longest paths (:func:`earliest_starts`, :func:`tails`): a
        time-window search builds a model of the same graph in every step."""
        by: dict[int, list[Key]] = {}
        for k in self.keys:
            by.setdefault(self.device(k), []).append(k)
        return {d: tuple(ks) for d, ks in by.items()}

    def stages_on(self, device: int) -> list[int]:
        return [s for s in range(self.problem.stages) if self.device((Op.F, s, 0)) == device]

    def last_keys(self, microbatch: int | None = None) -> list[Key]:
        """Tasks with no successor: the makespan is the latest of their ends. With
        ``microbatch``: that microbatch's tasks with no successor in it, the latest of
        whose ends is when the microbatch is done."""
        j = self.problem.microbatches - 1 if microbatch is None else microbatch
        if self.split_backward:
            return [(Op.W, s, j) for s in range(self.problem.stages)]
        return [(Op.BW, 0, j)]

    def scaled(self, ticks_per_second: float) -> "TaskGraph":
        """The same graph with durations and lag rounded to integer ticks."""
        return TaskGraph(
            problem=self.problem, split_backward=self.split_backward, keys=self.keys,
            duration={k: int(round(d * ticks_per_second)) for k, d in self.duration.items()},
            deps={k: tuple((p, int(round(lag * ticks_per_second))) for p, lag in v)
                  for k, v in self.deps.items()},
            chains=self.chains, lag=int(round(self.lag * ticks_per_second)),
            placement=self.placement)

    def topological(self) -> list[Key]:
        """All keys in an order compatible with ``deps`` and ``chains``."""
        return list(self._topological)

    @functools.cached_property
    def _topological(self) -> tuple[Key, ...]:
        succ: dict[Key, list[Key]] = {k: [] for k in self.keys}
        indeg = {k: 0 for k in self.keys}
        for k, preds in self.deps.items():
            for p, _ in preds:
                succ[p].append(k)
                indeg[k] += 1
        for chain in self.chains:
            for a, b in zip(chain, chain[1:]):
                succ[a].append(b)
                indeg[b] += 1
        ready = [k for k in self.keys if indeg[k] == 0]
        out: list[Key] = []
        while ready:
            k = ready.pop()
            out.append(k)
            for n in succ[k]:
                indeg[n] -= 1
                if indeg[n] == 0:
                    ready.append(n)
        if len(out) != len(self.keys):  # pragma: no cover - the graph is a DAG by construction
            raise RuntimeError("task graph has a cycle")
        return tuple(out)

    @functools.cached_property
    def _earliest(self) -> dict[Key, float]:
        es: dict[Key, float] = {}
        chain_pred: dict[Key, Key] = {}
        for chain in self.chains:
            for a, b in zip(chain, chain[1:]):
                chain_pred[b] = a
        for key in self._topological:
            t = 0
            for p, lag in self.deps[key]:
                t = max(t, es[p] + self.duration[p] + lag)
            if key in chain_pred:
                p = chain_pred[key]
                t = max(t, es[p] + self.duration[p])
            es[key] = t
        return es

    @functools.cached_property
    def _tails(self) -> dict[Key, float]:
        succ: dict[Key, list[tuple[Key, float]]] = {k: [] for k in self.keys}
        for k, preds in self.deps.items():
            for p, lag in preds:
                succ[p].append((k, lag))
        for chain in self.chains:
            for a, b in zip(chain, chain[1:]):
                succ[a].append((b, 0))
        tail: dict[Key, float] = {}
        for key in reversed(self._topological):
            tail[key] = max((lag + self.duration[n] + tail[n] for n, lag in succ[key]),
                            default=0)
        return tail


def graph_placement(graph: "TaskGraph") -> list[int]:
    """The stage -> device list of a graph (linear when it has no explicit placement)."""
    return list(graph.placement) if graph.placement else linear_placement(graph.devices)


def _require_base(problem: Problem) -> None:
    if problem.chunks != 1:
        raise OptPipeError("the optimizer schedules the base problem (one stage per device); "
                           "pass the unsplit problem")


def task_graph(problem: Problem, split_backward: bool = True,
               placement: Sequence[int] | None = None) -> TaskGraph:
    """Tasks, durations (seconds), data dependencies and FIFO chains of ``problem``.

    ``placement`` (stage -> device, e.g. :func:`~optpipe.schedule.v_placement`) puts
    several stages on each device: the graph is then of ``problem.split(placement)``,
    whose stages carry ``1/v`` of the base costs; the lag applies only between stages on
    different devices.
    """
    _require_base(problem)
    place: tuple[int, ...] = ()
    if placement is not None and list(placement) != linear_placement(problem.devices):
        problem = problem.split(list(placement))
        place = tuple(placement)
    S, M = problem.stages, problem.microbatches

    def lag_between(a: int, b: int) -> float:
        return (problem.p2p if (place[a] if place else a) != (place[b] if place else b)
                else 0.0)
    bops = (Op.B, Op.W) if split_backward else (Op.BW,)
    bwd = bops[0]
    keys: list[Key] = []
    duration: dict[Key, float] = {}
    deps: dict[Key, tuple[tuple[Key, float], ...]] = {}
    lag = problem.p2p
    for s in range(S):
        for m in range(M):
            for op in (Op.F, *bops):
                key = (op, s, m)
                keys.append(key)
                duration[key] = action_duration(problem, Action(op, s, m))
            deps[(Op.F, s, m)] = (((Op.F, s - 1, m), lag_between(s - 1, s)),) \
                if s > 0 else ()
            back: list[tuple[Key, float]] = [((Op.F, s, m), 0.0)]
            if s < S - 1:
                back.append(((bwd, s + 1, m), lag_between(s + 1, s)))
            deps[(bwd, s, m)] = tuple(back)
            if split_backward:
                deps[(Op.W, s, m)] = (((Op.B, s, m), 0.0),)
    return TaskGraph(problem=problem, split_backward=split_backward, keys=tuple(keys),
                     duration=duration, deps=deps,
                     chains=tuple(fifo_chains(problem, split_backward)), lag=lag,
                     placement=place)


def fifo_chains(problem: Problem, split_backward: bool = True) -> list[tuple[Key, ...]]:
    """Implied orders: on each stage, each op type runs microbatches in increasing order.

    Why this loses nothing: microbatches of one stage are identical (same durations,
    same bytes), so swapping two of them in any schedule gives another valid schedule
    with the same times and memory; hence some optimal schedule is FIFO per op type.
    """
    bops = (Op.B, Op.W) if split_backward else (Op.BW,)
    return [tuple((op, s, m) for m in range(problem.microbatches))
            for s in range(problem.stages) for op in (Op.F, *bops)]


# --------------------------------------------------------------- time windows
def earliest_starts(graph: TaskGraph) -> dict[Key, float]:
    """Earliest start of every task from dependencies and FIFO chains: a longest-path
    pass over ``deps`` and ``chains`` (kept on the graph; the caller gets a copy)."""
    return dict(graph._earliest)


def tails(graph: TaskGraph) -> dict[Key, float]:
    """Least time from a task's end to the end of the schedule (reverse longest path;
    kept on the graph, the caller gets a copy)."""
    return dict(graph._tails)


def latest_starts(graph: TaskGraph, horizon: float) -> dict[Key, float]:
    """Latest start of every task in a schedule that ends by ``horizon``."""
    tail = tails(graph)
    return {k: horizon - graph.duration[k] - tail[k] for k in graph.keys}


def lower_bound(graph: TaskGraph) -> float:
    """A makespan no schedule can beat, whatever the memory budget.

    The larger of: the critical path of the task graph (one microbatch's round trip plus
    FIFO effects); per device, its one-machine bound with heads and tails
    (:func:`device_bound`: e.g. the time before its first forward can start + all of its
    work + the least tail); and for one stage per device, the time before its first
    forward + its work + the backward chain that must still run on upstream devices
    after its last input-gradient (which only its own weight-gradient work can overlap).
    """
    es = earliest_starts(graph)
    best = max(es[k] + graph.duration[k] for k in graph.keys)
    # per device, the strongest head + work + tail over any subset of its tasks
    best = max(best, device_bound(graph, es, tails(graph)))
    if graph.placement:
        return best
    p = graph.problem
    S, M = p.stages, p.microbatches
    dur = graph.duration
    for s in range(S):
        head = es[(Op.F, s, 0)]
        f = dur[(Op.F, s, 0)]
        if graph.split_backward:
            b, w = dur[(Op.B, s, 0)], dur[(Op.W, s, 0)]
            chain = sum(dur[(Op.B, u, 0)] + graph.lag for u in range(s)) + dur[(Op.W, 0, 0)] \
                if s > 0 else 0
            bound = head + M * (f + b) + max(M * w, chain)
        else:
            bw = dur[(Op.BW, s, 0)]
            chain = sum(dur[(Op.BW, u, 0)] + graph.lag for u in range(s))
            bound = head + M * (f + bw) + chain
        best = max(best, bound)
    return best


def preemptive_single_machine(jobs: Iterable[tuple[float, float, float]]) -> float:
    """Least ``max(completion + tail)`` of ``(release, duration, tail)`` jobs on one
    machine when jobs may be preempted: Jackson's preemptive schedule (always run the
    released job with the longest tail), which is optimal for it.

    Why: it equals the strongest "head + body + tail" bound over every subset of the
    jobs (least release + summed durations + least tail), in O(n log n).
    """
    order = sorted(jobs)
    heap: list[tuple[float, int]] = []
    left: dict[int, float] = {}
    t, i, best = 0.0, 0, 0.0
    while i < len(order) or heap:
        if not heap:
            t = max(t, order[i][0])
        while i < len(order) and order[i][0] <= t:
            release, length, tail = order[i]
            left[i] = length
            heapq.heappush(heap, (-tail, i))
            i += 1
        neg_tail, j = heap[0]
        run = min(left[j], (order[i][0] if i < len(order) else math.inf) - t)
        t += run
        left[j] -= run
        if left[j] <= 1e-12:
            heapq.heappop(heap)
            best = max(best, t - neg_tail)
    return best


def device_bound(graph: TaskGraph, es: Mapping[Key, float],
                 tail: Mapping[Key, float]) -> float:
    """The largest, over devices, single-machine bound of its tasks with releases ``es``
    and tails ``tail`` (:func:`preemptive_single_machine`).

    Why: a device runs one task at a time, so its tasks form a one-machine problem with
    heads and tails, whose preemptive optimum bounds the makespan. It dominates "first
    start + all work + least tail": tasks released late with long tails (a chunked
    device's later stages, or backwards behind a memory round trip) are counted.
    """
    return max(preemptive_single_machine((es[k], graph.duration[k], tail[k])
                                         for k in graph.device_keys(d))
               for d in range(graph.devices))


def _release_options(problem: Problem, s: int, i: int, split_backward: bool,
                     device: int | None = None) -> list[tuple[int, int]] | None:
    """The least ``(n_B, n_W)`` (or ``(n_BW, 0)``) that let ``F(s, i)`` fit, or None.

    None means the budget does not bind at that forward. Each pair is minimal: ``n_B``
    from the fewest that could work up to ``i``, with the fewest ``n_W <= n_B`` that
    then fit. The row is ``(i+1)A - fb n_B - fw n_W <= room`` of stage ``s`` taken alone
    against the room of ``device`` (default: ``s``, one stage per device).
    """
    a, fb, fw = problem.activation[s], problem.freed_by_b[s], problem.freed_by_w[s]
    d = s if device is None else device
    room = problem.budget[d] - problem.static[d]
    if a == 0 or not math.isfinite(room):
        return None
    need = (i + 1) * a - int(math.floor(room))
    if need <= 0:
        return None
    if not split_backward:
        return [(-(-need // a), 0)]
    out = []
    for n_b in range(i + 1):
        if fw == 0:
            if fb * n_b >= need:
                out.append((n_b, 0))
                break
            continue
        n_w = max(0, -(-(need - fb * n_b) // fw))
        if n_w <= n_b:
            out.append((n_b, n_w))
    return out


def device_ancestor_work(graph: TaskGraph) -> dict[Key, float]:
    """Per task, the summed durations of its ancestors on its own device.

    Why: every one of them must have run, one at a time, on that device before the task
    starts — a rule the longest path misses when the device is busy (the backwards of a
    memory-bound stage wait behind its forwards). Data dependencies stay within a
    microbatch and the FIFO chains link microbatch ``j - 1`` to ``j`` of one (op,
    stage), so ``(op', s', j')`` is an ancestor of ``(op, s, j)`` exactly when ``j' <=
    j`` and ``(op', s')`` precedes ``(op, s)`` within one microbatch, or it is the same
    (op, stage) with ``j' < j``: the work is ``(j+1) x`` the former's durations on the
    device plus ``j x`` its own — no per-task closure needed.
    """
    pairs = sorted({(k[0], k[1]) for k in graph.keys}, key=lambda x: (x[1], x[0].value))
    parents: dict[tuple[Op, int], list[tuple[Op, int]]] = {pair: [] for pair in pairs}
    for (op, s, m), preds in graph.deps.items():
        if m == 0:
            parents[(op, s)] += [(p[0], p[1]) for p, _ in preds]
    ancestors: dict[tuple[Op, int], set[tuple[Op, int]]] = {}

    def collect(pair: tuple[Op, int]) -> set[tuple[Op, int]]:
        if pair not in ancestors:
            found: set[tuple[Op, int]] = set()
            for parent in parents[pair]:
                found |= {parent} | collect(parent)
            ancestors[pair] = found
        return ancestors[pair]

    per_microbatch = {}
    for op, s in pairs:
        d = graph.device((op, s, 0))
        per_microbatch[(op, s)] = sum(graph.duration[(o, u, 0)] for o, u in collect((op, s))
                                      if graph.device((o, u, 0)) == d)
    return {k: (k[2] + 1) * per_microbatch[(k[0], k[1])] + k[2] * graph.duration[k]
            for k in graph.keys}


def memory_bound(graph: TaskGraph, no_memory: float | None = None) -> float:
    """A makespan bound that counts memory (no offload): the larger of the round trip
    (:func:`memory_bounds`) and the warm-up (:func:`first_backward_bound`)."""
    return max(memory_bounds(graph, no_memory))


def memory_bounds(graph: TaskGraph, no_memory: float | None = None) -> tuple[float, float]:
    """``(round trip, warm-up)``: two makespan bounds that count memory (no offload).

    Why apart: the round trip sets a memory-bound pipeline's steady pace (CP-SAT's
    window search is for those, :func:`~.cpsat.solve_cpsat`), while the warm-up bound
    (:func:`first_backward_bound`, over the same earliest starts) also rises at 1F1B's
    budget, where the steady state is free.

    The round trip: at a tight budget the pace is set by a cycle the other bounds
    miss — forward ``i`` of a stage cannot start until enough earlier microbatches have
    come back through every later stage and released memory here, *and* the device
    has run the work that came before. Earliest starts are propagated microbatch by
    microbatch through the task graph with that rule added to every forward (every
    task a forward waits on belongs to an earlier microbatch), and the bound is the
    latest ``start + duration + tail``, or per device the one-machine bound over those
    starts (:func:`device_bound`). Every task also waits for its ancestors on its own
    device to have run (:func:`device_ancestor_work`).

    * One stage per device: the release counts that let ``F(s, i)`` fit form a small
      set of options (:func:`_release_options`); for each the forward waits for the
      last B (and W) needed and for the device to have run all earlier forwards plus
      those backwards, and it can do no better than the cheapest option. Per stage the
      last forward also leaves the backward work still to run.
    * Several stages per device (V shape, interleaved chunks): see
      :func:`_shared_ready` — the device's stages share its room, and a later chunk's
      forward finds the earlier chunk's activations of the same microbatches held.

    Valid for the schedules the engines search (FIFO per op type, as
    :func:`memory_implied_orders`); not with offload, which frees memory without
    backward work. Measured on the benchmark's uniform problems at S/2 (``python
    scripts/bench_bounds.py``): 4 x 64 gives 298.6 s where the no-memory bound is
    195.2 s; where the optimum is proven the bound is 84-92% of it.

    ``no_memory`` is :func:`lower_bound` of the same graph when the caller has it (the
    bound starts from it), so it is not computed twice.
    """
    base = lower_bound(graph) if no_memory is None else no_memory
    p = graph.problem
    dur = graph.duration
    split = graph.split_backward
    bwd = Op.B if split else Op.BW
    pos = {k: n for n, k in enumerate(graph.topological())}
    order = sorted(graph.keys, key=lambda k: (k[2], pos[k]))
    chain_pred: dict[Key, Key] = {}
    for chain in graph.chains:
        for a, b in zip(chain, chain[1:]):
            chain_pred[b] = a
    es: dict[Key, float] = {}
    tail = tails(graph)
    best = base
    M = p.microbatches
    before = device_ancestor_work(graph)
    ends: dict[tuple[Op, int], list[float]] = {}    # per (backward op, stage), j order
    on = {d: graph.stages_on(d) for d in range(graph.devices)}
    # every task of a device descends from its first forward (of its earliest stage)
    first = {d: (Op.F, min(on[d]), 0) for d in range(graph.devices)}
    for k in order:
        t = 0.0
        for pred, lag in graph.deps[k]:
            t = max(t, es[pred] + dur[pred] + lag)
        if k in chain_pred:
            t = max(t, es[chain_pred[k]] + dur[chain_pred[k]])
        if k != first[graph.device(k)]:
            t = max(t, es[first[graph.device(k)]] + before[k])
        op, s, i = k
        if op == Op.F and graph.placement:
            t = max(t, _shared_ready(graph, es, ends, on[graph.device(k)], s, i))
        options = _release_options(p, s, i, split) \
            if op == Op.F and not graph.placement else None
        if options:
            f, b = dur[(Op.F, s, 0)], dur[(bwd, s, 0)]
            w = dur[(Op.W, s, 0)] if split else 0.0

            def ready(n_b: int, n_w: int) -> float:
                at = es[(Op.F, s, 0)] + i * f + n_b * b + n_w * w
                if n_b:
                    at = max(at, es[(bwd, s, n_b - 1)] + b)
                if n_w:
                    at = max(at, es[(Op.W, s, n_w - 1)] + w)
                return at
            cheapest = min(ready(n_b, n_w) for n_b, n_w in options)
            if i == M - 1:
                # the schedule may have run more W's than an option needs before this
                # forward (while waiting for the last B), leaving fewer after it
                best = max(best, min(ready(n_b, m) + f + (M - n_b) * b + (M - m) * w
                                     for n_b, n_w in options
                                     for m in range(n_w, (n_b if split else n_w) + 1)))
            t = max(t, cheapest)
        es[k] = t
        if op != Op.F:
            ends.setdefault((op, s), []).append(t + dur[k])
        best = max(best, t + dur[k] + tail[k])
    return max(best, device_bound(graph, es, tail)), first_backward_bound(graph, es)


def offload_area_bound(graph: TaskGraph) -> float:
    """A makespan bound that counts memory and holds with offload (waits included):
    each device's room above static memory, over the whole step, must hold the
    byte-seconds its microbatches' activations are kept.

    Why: with offload allowed the other memory bounds do not hold (an OFFLOAD frees
    bytes without backward work), so every placement fell back to its no-memory bound,
    far below what a device whose room holds one or two activations can reach
    (``optpipe solve --model gpt3-13b --stages 4 --mem 60GB``: one stage per device's
    best 6.26 s against a no-memory bound of 2.96 s). Where the host link is slow
    against the round trip, sending an activation away is not free in memory either:
    it stays counted while it crosses the link both ways.

    The argument, per device ``d`` with room ``R = budget - static``: memory never
    exceeds the budget, so over ``[h, T]`` (``h``: the earliest start of its first
    forward, before which nothing of it is kept) the kept bytes integrate to at most
    ``R (T - h)``. Each microbatch of stage ``s`` on ``d`` (activation ``a``, F/B/W
    times ``f, b, w``) keeps, by :mod:`optpipe.memory.accounting`: ``a`` during its F
    (allocated at the start), ``a`` during its B (a reload ends before it), ``a -
    freed_by_b`` from B's end to W's end (``>= w``); and between F's end and B's start,
    a gap of at least ``g`` (the longest dependency path between them, the same for
    every microbatch), with a fraction ``x`` offloaded: ``(1 - x) a`` for the whole gap
    and ``x a`` while it crosses the link each way (counted until the OFFLOAD ends and
    from the RELOAD's issue), ``x a`` bytes over ``x c`` seconds, ``c = a / d2h + a /
    h2d`` — one OFFLOAD per microbatch and stage, any fraction. The least of ``(1 - x) g
    + x^2 c`` over ``x`` in [0, 1] is ``g - g^2 / 4c`` below ``g = 2c``, else ``c``;
    it grows with the gap, so the least gap gives a bound. So ``T >= h + sum over
    microbatches of those byte-seconds / R``. Transfers move whole bytes (rounded down),
    which the result allows for by a relative 1e-9.

    It needs room of only a few activations to bind: on one stage per device, where
    the round trip is long; on chunked placements a chunk moves half the bytes in half
    the time, so the gap is cheap to bridge and this rarely passes their no-memory
    bound (measured on presets and the benchmark: docs/optimizer.md, "Lower bounds").
    """
    p = graph.problem
    es = earliest_starts(graph)
    dur = graph.duration
    bwd = Op.B if graph.split_backward else Op.BW
    best = 0.0
    for d in range(graph.devices):
        room = p.budget[d] - p.static[d]
        stages = graph.stages_on(d)
        if room <= 0 or not stages:
            continue
        kept = 0.0                    # byte-seconds per microbatch over the device's stages
        for s in stages:
            a = p.activation[s]
            f, b = dur[(Op.F, s, 0)], dur[(bwd, s, 0)]
            gap = es[(bwd, s, 0)] - es[(Op.F, s, 0)] - f
            cross = a / p.d2h_bandwidth + a / p.h2d_bandwidth
            between = gap - gap * gap / (4 * cross) if gap < 2 * cross else cross
            kept += a * (f + between + b)
            if graph.split_backward:
                kept += (a - p.freed_by_b[s]) * dur[(Op.W, s, 0)]
        head = min(es[(Op.F, s, 0)] for s in stages)
        best = max(best, head + p.microbatches * kept / room)
    return best * (1 - 1e-9)


def offload_warmup_bound(graph: TaskGraph) -> float:
    """The warm-up's memory bound with offload: before its first backward a device frees
    bytes only by sending activations to the host, no faster than its link.

    Why: :func:`first_backward_bound` does not hold with offload, and the no-memory
    bound lets a device run every forward it has before its first backward comes back;
    where the room holds a few activations and the link moves one slower than the
    device runs its forward, the device must idle in the warm-up however it offloads
    (``optpipe solve --stages 8 --mem 40GB``: room for about four chunks' activations,
    a chunk's copy 0.033 s against its forward's 0.018 s).

    The argument, per device with room ``R = budget - static``: let ``t`` be the start
    of its first backward, no earlier than ``e``, the least earliest start of its
    stages' first backwards (a W needs its B, so only forwards run before ``t``). Each
    forward holds its activation from its start, and only OFFLOADs free bytes before
    ``t``, one at a time on the device-to-host channel, none ending before the first
    forward has (``opened``): the forwards run before ``t`` hold at most ``R +
    d2h (t - opened)`` bytes, so their work is at most the most forward work that fits
    those bytes (:func:`_forward_room`), and at most ``t - head`` (they run one at a
    time from the earliest forward start ``head``). Everything else the device runs
    comes after ``t``: the makespan is at least ``t + work - that``, for the ``t >= e``
    that makes it least. The forward work that fits only grows at the byte sums of
    whole forwards, so the least is at ``e`` or at one of those; and where the link
    frees bytes for at most ``pace < 1`` seconds of forward per second, none past ``e +
    f_max / (1 - pace)`` can be lower than at ``e`` (the forward work that fits grows
    by at most ``pace`` per second plus one forward). Where the link keeps pace with
    the forwards the device need not idle: no term; nor where that window holds more
    than :data:`MAX_BYTE_SUMS` byte sums (a link nearly as fast as the forwards).
    """
    p = graph.problem
    es = earliest_starts(graph)
    dur = graph.duration
    bwd = Op.B if graph.split_backward else Op.BW
    best = 0.0
    for d in range(graph.devices):
        room = p.budget[d] - p.static[d]
        stages = graph.stages_on(d)
        forwards = [(dur[(Op.F, s, 0)], p.activation[s]) for s in stages]
        if not stages or not math.isfinite(room) or room < 0 \
                or any(a <= 0 for _, a in forwards):
            continue
        pace = max(f / a for f, a in forwards) * p.d2h_bandwidth
        if pace >= 1:
            continue
        work = sum(dur[k] for k in graph.device_keys(d))
        head = min(es[(Op.F, s, 0)] for s in stages)
        first = min(es[(bwd, s, 0)] for s in stages)
        opened = head + min(f for f, _ in forwards)

        def held(t: float) -> float:
            return room + p.d2h_bandwidth * max(0.0, t - opened)

        def rest_from(t: float, kept: float) -> float:
            """``t`` less the most forward work run before it within ``kept`` bytes:
            the earliest the device's other work can all have started by."""
            return t - min(t - head, _forward_room(forwards, kept, p.microbatches))

        last = first + max(f for f, _ in forwards) / (1 - pace)
        sums = set(itertools.islice(_byte_sums(
            [a for _, a in forwards], p.microbatches, held(first), held(last)),
            MAX_BYTE_SUMS + 1))
        if len(sums) > MAX_BYTE_SUMS:   # a link nearly as fast as the forwards: no term
            continue
        least = rest_from(first, held(first))
        for total in sums:
            # a byte sum of whole forwards, reached at this t; a hair more bytes, so a
            # float rounded down still counts every forward that fits (the bound only
            # gets lower)
            at = opened + (total - room) / p.d2h_bandwidth
            least = min(least, rest_from(at, total * (1 + 1e-12) + 1.0))
        best = max(best, least + work)
    return best * (1 - 1e-9)


#: the most byte sums :func:`offload_warmup_bound` looks at per device (each costs a
#: knapsack over the device's stages); only a link nearly as fast as the forwards needs
#: more, and there the bound gives little
MAX_BYTE_SUMS = 2000


def _byte_sums(sizes: Sequence[float], count: int, low: float, high: float
               ) -> Iterator[float]:
    """Every ``n_1 a_1 + n_2 a_2 + ...`` (``0 <= n_i <= count``) in ``(low, high]``,
    the last count drawn only from those that land there."""
    def walk(i: int, total: float) -> Iterator[float]:
        a = sizes[i]
        most = min(count, math.floor((high - total) / a))
        if i == len(sizes) - 1:
            for n in range(max(0, math.floor((low - total) / a)), most + 1):
                if low < total + n * a <= high:
                    yield total + n * a
            return
        for n in range(most + 1):
            yield from walk(i + 1, total + n * a)
    return walk(0, 0.0)


def first_backward_bound(graph: TaskGraph, es: Mapping[Key, float]) -> float:
    """The warm-up's memory bound: a device idles when its room fills before its first
    backward can start.

    Until a device runs its first backward nothing it holds is freed (a W needs its B),
    so the forward work it can do before then is at most what fits its room
    (:func:`_forward_room`); its first backward starts no earlier than the earliest
    ``es`` of its stages' first backwards, and everything else it runs comes after.
    So the makespan is at least that start plus the device's work minus the forward
    work that fits. Why it matters: at 1F1B's budget the V shape's middle device can
    hold four microbatches of both its chunks when its first backward comes back, so
    on the benchmark's 4 stages it idles 0.3 s, and the proven optima at S (4 x 8,
    4 x 12, 4 x 16: 25.95, 37.95, 49.95 s) are exactly this bound, where the other
    bounds stop at 0.3 s below. ``es``: earliest starts valid for every schedule (the
    round trip's, or :func:`earliest_starts`).
    """
    return max([0.0] + [term for term, _ in first_backward_terms(graph, es)])


def first_backward_terms(graph: TaskGraph, es: Mapping[Key, float]
                         ) -> list[tuple[float, Key]]:
    """:func:`first_backward_bound`'s term of every device with a finite budget, with
    the device's first backward (the one with the least ``es``): which device and which
    task the bound comes from (`scripts/bench_window_variants.py`'s ``tip-first``)."""
    p = graph.problem
    bwd = Op.B if graph.split_backward else Op.BW
    terms: list[tuple[float, Key]] = []
    for d in range(graph.devices):
        room = p.budget[d] - p.static[d]
        if not math.isfinite(room):
            continue
        stages = graph.stages_on(d)
        fits = _forward_room([(graph.duration[(Op.F, s, 0)], p.activation[s]) for s in stages],
                             room, p.microbatches)
        work = sum(graph.duration[k] for k in graph.device_keys(d))
        first, key = min((es[(bwd, s, 0)], (bwd, s, 0)) for s in stages)
        terms.append((first + work - fits, key))
    return terms


def _forward_room(forwards: Sequence[tuple[float, float]], room: float, count: int) -> float:
    """The most forward work (duration, bytes per forward; at most ``count`` of each)
    whose bytes fit ``room``: exact over the counts of all but the last stage (a device
    holds one to three), the fractional knapsack beyond (an upper bound, so still
    valid)."""
    if not forwards or room < 0:
        return 0.0
    if len(forwards) > 3:
        total, left = 0.0, room
        for f, a in sorted(forwards, key=lambda x: -x[0] / x[1] if x[1] > 0 else -math.inf):
            n = count if a <= 0 else min(count, left / a)
            total += n * f
            left -= n * a
        return total
    (f, a), rest = forwards[0], forwards[1:]
    most = count if a <= 0 else min(count, int(room // a))
    if not rest:
        return most * f
    return max(n * f + _forward_room(rest, room - n * a, count) for n in range(most + 1))


def _release_pieces(avail_b: int, avail_w: int, freed_b: float, freed_w: float,
                    cost_b: float, cost_w: float) -> list[tuple[float, float]]:
    """The cheapest device time to release ``x`` bytes of one stage, as convex pieces.

    Returns ``(seconds per byte, bytes)`` pieces of the LP ``min cost_b n_B + cost_w n_W``
    with ``freed_b n_B + freed_w n_W >= x``, ``n_W <= n_B <= avail_b``, ``n_W <=
    avail_w`` (a W needs its B): B's first when they free bytes more cheaply, else B+W
    pairs first and then lone B's. For a fused backward pass ``freed_w = 0``.
    """
    pieces: list[tuple[float, float]] = []
    if freed_w <= 0 or avail_w == 0:
        if freed_b > 0 and avail_b:
            pieces.append((cost_b / freed_b, avail_b * freed_b))
        return pieces
    if freed_b <= 0:
        return [((cost_b + cost_w) / freed_w, avail_w * freed_w)]
    if cost_b / freed_b <= cost_w / freed_w:
        return [(cost_b / freed_b, avail_b * freed_b), (cost_w / freed_w, avail_w * freed_w)]
    pieces.append(((cost_b + cost_w) / (freed_b + freed_w), avail_w * (freed_b + freed_w)))
    if avail_b > avail_w:
        pieces.append((cost_b / freed_b, (avail_b - avail_w) * freed_b))
    return pieces


def _shared_ready(graph: TaskGraph, es: Mapping[Key, float],
                  ends: Mapping[tuple[Op, int], list[float]], stages: Sequence[int],
                  s: int, i: int) -> float:
    """Earliest start of ``F(s, i)`` on a device that holds several stages (a bound).

    Why it binds: the device's stages share its room, and when ``F(s, i)`` starts, every
    earlier stage ``u`` on the device (same microbatch, upstream: the first chunk of a
    V) has run ``F(u, 0..i)`` and released only what its backwards freed — and those
    backwards need ``B(s, j)`` first, so only microbatches ``j < i`` count. So the row
    ``(i+1) (a_s + sum a_u) - releases <= room`` must hold; later stages on the device
    only add held bytes (counted as 0). Releases come from B/W of ``s`` and of the
    earlier stages with ``j < i``; the forward then waits for (a) the latest of their
    earliest ends and (b) the device having run ``F(s, 0..i-1)``, ``F(u, 0..i)``, the
    releasing tasks and, for each ``B(s, j)``, the later stages' ``F`` and ``B`` of
    ``j`` it depends on (all distinct tasks) from its first possible start. Over the
    sets of releases that fit, with the device time relaxed to the LP over counts
    (:func:`_release_pieces`), the least of ``max(a, b)`` is a bound: scan the latest
    end ``tau`` (a) — (b) only falls as more releases are available. ``ends`` holds
    the earliest ends of each stage's backwards so far, in microbatch order; ``stages``
    those on the forward's device.
    """
    p = graph.problem
    dur = graph.duration
    d = graph.device((Op.F, s, 0))
    room = p.budget[d] - p.static[d]
    lower = [u for u in stages if u < s]
    need = (i + 1) * (p.activation[s] + sum(p.activation[u] for u in lower)) - room
    if not math.isfinite(room) or need <= 0 or i == 0:
        return 0.0
    split = graph.split_backward
    bwd = Op.B if split else Op.BW
    upper_work = sum(dur[(Op.F, v, 0)] + dur[(bwd, v, 0)] for v in stages if v > s)
    head = es[(Op.F, min(stages), 0)] + i * dur[(Op.F, s, 0)] + \
        (i + 1) * sum(dur[(Op.F, u, 0)] for u in lower)
    # per releasing stage: the earliest ends of its B's and W's (j < i, non-decreasing)
    releasing = []
    for u in [s] + lower:
        b_end = ends.get((bwd, u), [])[:i]
        w_end = ends.get((Op.W, u), [])[:i] if split else []
        cost_b = dur[(bwd, u, 0)] + (upper_work if u == s else 0.0)
        cost_w = dur[(Op.W, u, 0)] if split else 0.0
        freed_b = p.freed_by_b[u] if split else p.activation[u]
        freed_w = p.freed_by_w[u] if split else 0
        releasing.append((b_end, w_end, freed_b, freed_w, cost_b, cost_w))

    def device_time(tau: float) -> float:
        pieces = []
        for b_end, w_end, freed_b, freed_w, cost_b, cost_w in releasing:
            pieces += _release_pieces(bisect.bisect_right(b_end, tau),
                                      bisect.bisect_right(w_end, tau),
                                      freed_b, freed_w, cost_b, cost_w)
        left, spent = float(need), 0.0
        for rate, amount in sorted(pieces):
            take = min(left, amount)
            spent += take * rate
            left -= take
            if left <= 0:
                return head + spent
        return math.inf

    taus = sorted([x for e in releasing for part in e[:2] for x in part])   # sorted runs
    lo, hi = 0, len(taus) - 1                 # first tau with tau >= device_time(tau)
    if not taus or device_time(taus[-1]) == math.inf:
        return 0.0                            # no fitting schedule: say nothing
    while lo < hi:
        mid = (lo + hi) // 2
        if taus[mid] >= device_time(taus[mid]):
            hi = mid
        else:
            lo = mid + 1
    best = max(taus[lo], device_time(taus[lo]))
    if lo > 0:
        best = min(best, max(taus[lo - 1], device_time(taus[lo - 1])))
    return best


# ------------------------------------------------------------------ budgets
def min_budgets(problem: Problem) -> tuple[list[int], list[int]]:
    """Per device, the smallest budget at which a schedule exists: (no offload, offload).

    Why these are exact: an F allocates its whole activation at its start, so every
    device holding a stage needs static + one activation at some moment, offload or not
    (offload frees bytes only after the F that made them has ended). The sequential
    schedule (:func:`sequential_schedule`) keeps exactly one activation per stage at a
    time on every device at once, so that bound is reached, for all devices together.
    """
    _require_base(problem)
    need = [problem.static[d] + problem.activation[d] for d in range(problem.devices)]
    return list(need), list(need)


def infeasible_devices(problem: Problem) -> list[int]:
    """Devices whose budget is below :func:`min_budgets` (empty when a schedule exists)."""
    need, _ = min_budgets(problem)
    return [d for d in range(problem.devices) if problem.budget[d] < need[d]]


def memory_implied_orders(problem: Problem, split_backward: bool = True,
                          placement: Sequence[int] | None = None
                          ) -> list[tuple[Key, Key]]:
    """Orders the budget forces without offload: ``(pred, F_i)`` = pred ends before F_i.

    Why: when a stage's budget holds ``k`` activations, forward ``i`` cannot start before
    enough backward work has released memory. With ``n_B`` B's and ``n_W`` W's done
    (``n_W <= n_B <= i``, FIFO) the row ``(i+1)A - fb n_B - fw n_W <= room`` gives
    ``n_B >= need / (fb + fw)`` and ``n_W >= (need - fb i) / fw``; so ``B_{n_B-1}``
    (and ``W_{n_W-1}``) must end before ``F_i`` starts. Engines add these as hard
    precedences: they expose the round-trip cycle that bounds a memory-bound pipeline.
    The rows are :func:`_release_options`' (the bound uses the same). Not valid when
    offload is allowed (an offload frees memory without backward work). With several
    stages per device each stage is taken alone against its device's room (still
    valid, other stages only use more).
    """
    _require_base(problem)
    place = list(range(problem.devices))
    if placement is not None and list(placement) != place:
        problem = problem.split(list(placement))
        place = list(placement)
    out: list[tuple[Key, Key]] = []
    for s in range(problem.stages):
        for i in range(problem.microbatches):
            # every option releases at least the fewest B's and the fewest W's of all
            options = _release_options(problem, s, i, split_backward, place[s])
            if not options:
                continue
            f = (Op.F, s, i)
            n_b = min(n for n, _ in options)
            n_w = min(n for _, n in options)
            out.append(((Op.B if split_backward else Op.BW, s, n_b - 1), f))
            if n_w > 0:
                out.append(((Op.W, s, n_w - 1), f))
    return out


# ----------------------------------------------------- our own fixed schedules
def capped_1f1b(problem: Problem, cap: int | None = None, split_backward: bool = True,
                name: str | None = None) -> Schedule:
    """1F1B whose warm-up keeps at most ``cap`` microbatches in flight on any stage.

    Stage ``s`` runs ``min(S - s, cap, M)`` forwards, then alternates one backward and one
    forward. With ``split_backward`` each W follows its B at once (same memory as a
    fused BW). ``cap=None`` is plain 1F1B. Valid for every cap >= 1 because warm-up
    counts never increase along the pipeline.
    """
    _require_base(problem)
    S, M = problem.stages, problem.microbatches
    orders = []
    for s in range(S):
        warm = min(S - s, M if cap is None else max(1, cap), M)
        seq: list[tuple[Op, int, int]] = [(Op.F, s, m) for m in range(warm)]
        nxt = warm
        for m in range(M):
            seq.extend([(Op.B, s, m), (Op.W, s, m)] if split_backward else [(Op.BW, s, m)])
            if nxt < M:
                seq.append((Op.F, s, nxt))
                nxt += 1
        orders.append(seq)
    label = name or (f"1f1b-cap{cap}" if cap is not None else "1f1b")
    return _from_orders(label, problem, orders)


def sequential_schedule(problem: Problem, split_backward: bool = True) -> Schedule:
    """One microbatch at a time through the whole pipeline: the least memory possible."""
    return capped_1f1b(problem, cap=1, split_backward=split_backward, name="sequential")


def greedy_schedule(problem: Problem, split_backward: bool = True, *,
                    eager_w: bool = False, reserve: int = 0, protect_b: bool = False,
                    name: str | None = None) -> Schedule:
    """A memory-aware list schedule on the engines' placement (one stage per device).

    Why our own: the engines need a good *linear-placement* warm start at every budget,
    and capped 1F1B idles badly when fewer than ``S`` microbatches fit. Each device,
    whenever idle, runs the first ready of: its next B; its next W if ``eager_w``; its
    next F if the budget leaves room for it (plus ``reserve`` activations on all but the
    last stage); its oldest pending W. Memory is exact (the device is idle, so every
    earlier action has ended). Never deadlocks: the last stage can always run F then B.
    """
    _require_base(problem)
    S, M, lag = problem.stages, problem.microbatches, problem.p2p
    bops = (Op.B, Op.W) if split_backward else (Op.BW,)
    bwd = bops[0]

    def length(op: Op, s: int) -> float:
        return action_duration(problem, Action(op, s, 0))

    end: dict[Key, float] = {}
    order: list[list[Key]] = [[] for _ in range(S)]
    free = [0.0] * S
    nf, nb, nw = [0] * S, [0] * S, [0] * S
    level = [0] * S
    room = [problem.budget[s] - problem.static[s] for s in range(S)]
    t = 0.0
    total = S * M * len((Op.F, *bops))
    done = 0
    # every time something may change: each action's end, and its end plus the p2p lag
    # (a heap, not a scan of every end: at 16 x 64 the scan took 1.8 s of the solve)
    events: list[float] = []
    while done < total:
        progressed = False
        for s in range(S):
            if free[s] > t + 1e-12:
                continue
            choice: Key | None = None
            b_key = (bwd, s, nb[s])
            b_ready = math.inf
            if nb[s] < nf[s]:
                up = (bwd, s + 1, nb[s])
                b_ready = end[(Op.F, s, nb[s])] if s == S - 1 else (
                    end[up] + lag if up in end else math.inf)
                if b_ready <= t + 1e-12:
                    choice = b_key
            if choice is None and split_backward and eager_w and nw[s] < nb[s]:
                choice = (Op.W, s, nw[s])
            if choice is None and nf[s] < M:
                ready = 0.0 if s == 0 else (end[(Op.F, s - 1, nf[s])] + lag
                                            if (Op.F, s - 1, nf[s]) in end else math.inf)
                keep = problem.activation[s] * (1 + (reserve if s < S - 1 else 0))
                if ready <= t + 1e-12 and level[s] + keep <= room[s] + 1e-9:
                    choice = (Op.F, s, nf[s])
                elif ready <= t + 1e-12 and level[s] + problem.activation[s] <= room[s] \
                        and nb[s] >= nf[s] and (not split_backward or nw[s] >= nb[s]):
                    choice = (Op.F, s, nf[s])      # nothing else could ever free memory
            if choice is None and split_backward and nw[s] < nb[s]:
                choice = (Op.W, s, nw[s])
            if choice is None:
                continue
            if protect_b and choice[0] is not bwd and \
                    b_ready < t + length(choice[0], s) - 1e-12:
                continue                            # keep the device free for that B
            op = choice[0]
            start = max(t, free[s])
            end[choice] = start + length(op, s)
            free[s] = end[choice]
            heapq.heappush(events, end[choice])
            heapq.heappush(events, end[choice] + lag)
            order[s].append(choice)
            if op is Op.F:
                nf[s] += 1
                level[s] += problem.activation[s]
            elif op is Op.B:
                nb[s] += 1
                level[s] -= problem.freed_by_b[s]
            elif op is Op.BW:
                nb[s] += 1
                level[s] -= problem.activation[s]
            else:
                nw[s] += 1
                level[s] -= problem.freed_by_w[s]
            done += 1
            progressed = True
        if not progressed:
            while events and events[0] <= t + 1e-12:
                heapq.heappop(events)
            if not events:     # nothing runs and nothing may start: the budget is too small
                raise OptPipeError(f"greedy schedule stuck at {t:.6g}s: no forward fits "
                                   f"the memory budget")
            t = events[0]
    label = name or (f"greedy{'-eager' if eager_w else ''}{'-protect' if protect_b else ''}"
                     f"{f'-r{reserve}' if reserve else ''}")
    return _from_orders(label, problem, order)


def _from_orders(name: str, problem: Problem, orders: Sequence[Sequence[Key]]) -> Schedule:
    actions = [[Action(op, s, m) for op, s, m in seq] for seq in orders]
    return Schedule(name=name, stages=problem.stages, devices=problem.devices,
                    microbatches=problem.microbatches,
                    placement=linear_placement(problem.devices), actions=actions,
                    provenance={"source": "generator", "name": name}).validate()


# -------------------------------------------------------------- fixed schedules
@dataclass
class Candidate:
    """A fixed schedule simulated on the problem."""

    name: str
    schedule: Schedule
    result: SimResult

    @property
    def fits(self) -> bool:
        return self.result.fits

    @property
    def makespan(self) -> float:
        return self.result.makespan


@dataclass
class FixedSet:
    """Every fixed schedule tried: candidates that simulate, and why others did not."""

    candidates: list[Candidate] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def fixed_schedules(problem: Problem, include_own: bool = True) -> FixedSet:
    """Simulate every registered generator (and our capped 1F1B family) on ``problem``.

    Generators that do not apply, or fail, are recorded in ``skipped`` with the reason;
    nothing here raises for a generator's sake, because the warm start must exist even
    when some generator does not.
    """
    out = FixedSet()
    try:
        from optpipe import generators as gens
        names = list(getattr(gens, "GENERATORS", {}))
    except ImportError:
        gens, names = None, []
    for name in names:
        try:
            applicable = getattr(gens, "applicable", None)
            if applicable is not None:
                ok = applicable(name, problem)
                if ok is not True:
                    out.skipped[name] = str(ok)
                    continue
            schedule = gens.generate(name, problem)
            out.candidates.append(Candidate(name, schedule, simulate(problem, schedule)))
        except Exception as exc:  # a broken generator must not break the solver
            out.skipped[name] = f"{type(exc).__name__}: {exc}"
    if include_own:
        for split in (True, False):
            for eager in ((False, True) if split else (False,)):
                for reserve in (0, 1):
                    try:
                        schedule = greedy_schedule(problem, split, eager_w=eager,
                                                   reserve=reserve)
                        schedule.name += "" if split else "-fused"
                        out.candidates.append(Candidate(schedule.name, schedule,
                                                        simulate(problem, schedule)))
                    except OptPipeError as exc:
                        out.skipped["greedy"] = str(exc)
        offloading = next((c for c in out.candidates if c.name == "pipeoffload"), None)
        if offloading is not None and \
                offloading.schedule.placement != linear_placement(problem.devices):
            # the offload model (one stage per device) needs a linear warm start too
            try:
                schedule = gens.generate("pipeoffload", problem, bases=("zb-h1", "1f1b"))
                schedule.name = "pipeoffload-linear"
                out.candidates.append(Candidate(schedule.name, schedule,
                                                simulate(problem, schedule)))
            except OptPipeError as exc:
                out.skipped["pipeoffload-linear"] = str(exc)
        S = problem.stages
        for cap in sorted({S, max(1, S // 2), 1} | _fitting_caps(problem)):
            for split in (True, False):
                try:
                    schedule = capped_1f1b(problem, cap=cap, split_backward=split,
                                           name=f"1f1b-cap{cap}{'' if split else '-fused'}")
                    out.candidates.append(Candidate(schedule.name, schedule,
                                                    simulate(problem, schedule)))
                except OptPipeError as exc:
                    out.skipped[f"1f1b-cap{cap}"] = str(exc)
    return out


def _fitting_caps(problem: Problem) -> set[int]:
    """The largest in-flight cap each device's budget allows (1F1B-style memory)."""
    caps = set()
    for d in range(problem.devices):
        room = problem.budget[d] - problem.static[d]
        if problem.activation[d] > 0 and math.isfinite(room):
            caps.add(max(1, min(problem.stages, int(room // problem.activation[d]))))
    return {min(caps)} if caps else set()


def best_fitting(candidates: Iterable[Candidate], *, linear_only: bool = False,
                 split_backward: bool | None = None,
                 offload: bool | None = None) -> Candidate | None:
    """The fitting candidate with the least makespan, optionally filtered.

    ``linear_only`` keeps one-stage-per-device schedules (the engines' placement);
    ``split_backward=False`` keeps fused-backward schedules only (a fused schedule is
    always usable by the split model, see :func:`canonical_form`); ``offload=False``
    drops schedules that offload.
    """
    best = None
    for c in candidates:
        if not c.fits:
            continue
        sch = c.schedule
        if linear_only and sch.placement != linear_placement(sch.devices):
            continue
        if split_backward is False and sch.splits_backward:
            continue
        if offload is False and sch.offloads:
            continue
        if best is None or c.makespan < best.makespan - 1e-12:
            best = c
    return best


def warm_start(problem: Problem, split_backward: bool = True, offload: bool = False,
               fixed: FixedSet | None = None) -> tuple[Schedule, SimResult] | None:
    """The best fitting fixed schedule the engines can use as a complete hint.

    Returned in canonical form (:func:`canonical_form`) and re-simulated; None when no
    usable fixed schedule fits (then no schedule exists below :func:`min_budgets`).
    """
    fixed = fixed or fixed_schedules(problem)
    usable = []
    for c in fixed.candidates:
        if not c.fits or (c.schedule.offloads and not offload):
            continue
        if not split_backward and c.schedule.splits_backward:
            continue
        canon = canonical_form(c.schedule, problem, split_backward)
        if canon is None:
            continue
        result = simulate(problem, canon)
        if result.fits and result.makespan <= c.makespan * (1 + 1e-12):
            usable.append(Candidate(c.name, canon, result))
    best = best_fitting(usable)
    return (best.schedule, best.result) if best else None


# --------------------------------------------------------------- canonical form
def canonical_form(schedule: Schedule, problem: Problem, split_backward: bool = True,
                   offload_levels: Sequence[float] | None = None,
                   placement: Sequence[int] | None = None) -> Schedule | None:
    """Rewrite a fixed schedule into the form the engines model, or None if it cannot be.

    The engines assume: one stage per device; FIFO per op type and stage; split B/W when
    ``split_backward`` (a fused BW becomes B then W at once: the same memory, and the
    same times unless ``backward_fused`` is shorter than B + W — then the hint is slower
    than its source, and the driver's bound covers fused schedules by a relaxation);
    every OFFLOAD listed right after its F (issuing it later never helps; one that holds
    its device back, ``wait``, then holds it back from there, which the simulator
    judges again); reloads in microbatch order; fractions among ``offload_levels`` when
    given.
    """
    want = list(placement) if placement is not None else linear_placement(problem.devices)
    if list(schedule.placement) != want:
        return None
    if schedule.offloads and want != linear_placement(problem.devices):
        return None                 # offload is modelled for one stage per device only
    if not split_backward and schedule.splits_backward:
        return None
    actions: list[list[Action]] = []
    for acts in schedule.actions:
        compute: list[Action] = []
        for a in acts:
            if a.op is Op.BW and split_backward:
                compute.extend([Action(Op.B, a.stage, a.microbatch),
                                Action(Op.W, a.stage, a.microbatch)])
            elif a.op.is_compute:
                compute.append(a)
        # FIFO check per op type and stage
        last: dict[tuple[Op, int], int] = {}
        for a in compute:
            if a.microbatch <= last.get((a.op, a.stage), -1):
                return None
            last[(a.op, a.stage)] = a.microbatch
        offloads = {a.microbatch: a for a in acts if a.op is Op.OFFLOAD}
        reloads = [a for a in acts if a.op is Op.RELOAD]
        if [a.microbatch for a in reloads] != sorted(a.microbatch for a in reloads):
            return None
        if offload_levels is not None and any(
                not any(abs(a.fraction - x) < 1e-12 for x in offload_levels)
                for a in offloads.values()):
            return None
        # reload positions: after the same compute action as in the original list
        reload_after: dict[int, list[Action]] = {}
        seen_compute = -1
        index_of = {}
        for a in acts:
            if a.op.is_compute:
                seen_compute += 1
                index_of[a.key] = seen_compute
            elif a.op is Op.RELOAD:
                reload_after.setdefault(seen_compute, []).append(a)
        # map original compute positions to new ones (a BW split into B, W: after W)
        new_pos: dict[int, int] = {}
        pos = -1
        orig = -1
        for a in acts:
            if not a.op.is_compute:
                continue
            orig += 1
            pos += 2 if (a.op is Op.BW and split_backward) else 1
            new_pos[orig] = pos
        out: list[Action] = []
        for r in reload_after.get(-1, []):
            out.append(r)
        for i, a in enumerate(compute):
            out.append(a)
            if a.op is Op.F and a.microbatch in offloads:
                out.append(offloads[a.microbatch])
            for orig_pos, rs in reload_after.items():
                if orig_pos >= 0 and new_pos[orig_pos] == i:
                    out.extend(rs)
        actions.append(out)
    canon = Schedule(name=schedule.name, stages=schedule.stages, devices=schedule.devices,
                     microbatches=schedule.microbatches, placement=list(schedule.placement),
                     actions=actions, provenance=dict(schedule.provenance))
    try:
        return canon.validate()
    except OptPipeError:
        return None


def orders_from_starts(problem: Problem, starts: Mapping[Key, float], **kwargs) -> Schedule:
    """Per-device orders from solved start times (see :func:`.extract.orders_from_starts`)."""
    from optpipe.optimizer.extract import orders_from_starts as _extract
    return _extract(problem, starts, **kwargs)


# ------------------------------------------------------------------ time scale
def choose_scale(values: Iterable[float], exact_min_ticks: int = 1,
                 inexact_resolution: float = 1e6,
                 shortest: float | None = None) -> tuple[float, bool]:
    """Ticks per second for integer-time engines, and whether rounding is exact.

    Why: CP-SAT needs integer times, but the simulator works in floats and has the last
    word. When every duration is (to 1e-9) an integer multiple of a round unit, that
    unit is used, refined until the shortest positive duration spans at least
    ``exact_min_ticks`` ticks; otherwise the shortest positive duration (``shortest``,
    default the least value: pass the shortest *compute* time so that a tiny latency does
    not blow up the horizon) spans ``inexact_resolution`` ticks. Each task then rounds by
    at most 0.5 / resolution of the shortest task, so a path's drift stays under 1e-6 of
    its length.
    """
    positive = [v for v in values if v > 0]
    if not positive:
        return 1.0, True
    unit = shortest if shortest else min(positive)
    shortest = min(positive)
    for exponent in range(-3, 10):
        for mantissa in (1, 2, 4, 5, 8):
            scale = mantissa * 10.0 ** exponent
            if shortest * scale > 1e6:      # no round unit: fall through to inexact
                break
            if all(abs(v * scale - round(v * scale)) <= 1e-9 * max(1.0, v * scale)
                   for v in positive):
                while shortest * scale < exact_min_ticks - 1e-9:
                    scale *= 10
                return scale, True
    return 10.0 ** math.ceil(math.log10(inexact_resolution / unit)), False


def asap_ticks(schedule: Schedule, compute: Mapping[Key, int], lag: int,
               transfer: Mapping[tuple[Op, int, float], int]
               ) -> dict[Key, tuple[int, int, int]]:
    """``(start, end, issue)`` of every action under the simulator's rules, in ticks.

    Used only to turn a fixed schedule into a complete, exactly consistent hint for an
    integer-time engine (reported figures always come from :func:`simulate`).
    ``compute[key]`` is a compute task's length (a fused ``BW`` may be given or is taken
    as ``B + W``), ``transfer[(op, stage, fraction)]`` a transfer's, ``lag`` the p2p
    latency (base problem: stage s on device s).
    """
    D = schedule.devices
    place = schedule.placement

    def hop(a: int, b: int) -> int:
        return lag if place[a] != place[b] else 0

    dependencies = dependency_function(schedule)
    end: dict[Key, int] = {}
    out: dict[Key, tuple[int, int, int]] = {}
    pointer = [0] * D
    stream = [0] * D
    last_compute = [0] * D
    held = [0] * D                  # the end of the last OFFLOAD marked wait
    channel = {(d, op): 0 for d in range(D) for op in (Op.OFFLOAD, Op.RELOAD)}
    remaining = sum(len(a) for a in schedule.actions)
    while remaining:
        progressed = False
        for d in range(D):
            acts = schedule.actions[d]
            while pointer[d] < len(acts):
                a = acts[pointer[d]]
                s, m = a.stage, a.microbatch
                deps = [(k, hop(k[1], s)) for k in dependencies(a)]
                if any(k not in end for k, _ in deps):
                    break
                ready = max((end[k] + lg for k, lg in deps), default=0)
                if a.op.is_compute:
                    issue = max(stream[d], held[d])
                    start = max(issue, ready)
                    length = compute.get(a.key)
                    if length is None:  # fused BW timed from a split graph
                        length = compute[(Op.B, s, m)] + compute[(Op.W, s, m)]
                    finish = start + length
                    stream[d] = last_compute[d] = finish
                else:
                    issue = max(last_compute[d], held[d])
                    start = max(issue, ready, channel[(d, a.op)])
                    finish = start + transfer[(a.op, s, a.fraction)]
                    channel[(d, a.op)] = finish
                    if a.wait:
                        held[d] = finish
                end[a.key] = finish
                out[a.key] = (start, finish, issue)
                pointer[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise OptPipeError(f"schedule '{schedule.name}' deadlocks")
    return out
