"""Preprocessing shared by every optimization engine (CP-SAT and the Pyomo MILP).

Why a shared module: both engines must model exactly the simulator's semantics, and the
facts below are where a mistake would make them disagree. Everything here is derived
from :mod:`optpipe.simulator`'s rules for the base problem (one stage per device):

* the task set (``F``, ``B``, ``W`` per stage and microbatch, or fused ``BW``) and each
  task's duration, taken from :mod:`optpipe.memory.accounting` (the one source);
* data dependencies with their lag (``p2p`` only between different devices);
* implied orders: microbatches are interchangeable, so each op type on a stage can run
  its microbatches in FIFO order without losing optimality (:func:`fifo_chains`);
* time windows (:func:`earliest_starts`, :func:`latest_starts`); the lower bounds on
  the makespan built on them are in :mod:`.bounds`;
* the smallest feasible budgets (:func:`min_budgets`);
* the warm start: the best fixed schedule that fits (:func:`fixed_schedules`,
  :func:`best_fitting`), with memory-capped fallbacks of our own so that a warm start
  exists for every feasible budget (:func:`capped_1f1b`, :func:`sequential_schedule`);
* conversion of a fixed schedule into the canonical form the engines model
  (:func:`canonical_form`) and extraction of a schedule from solved start times
  (:func:`orders_from_starts`, re-exported from :mod:`.extract`).

Stable public API (the MILP engine imports it): ``Key``, ``TaskGraph``, ``task_graph``,
``fifo_chains``, ``earliest_starts``, ``latest_starts``,
``min_budgets``, ``fixed_schedules``, ``best_fitting``, ``warm_start``,
``canonical_form``, ``orders_from_starts``, ``capped_1f1b``, ``sequential_schedule``.
Keys are ``(Op, stage, microbatch)`` tuples, the same as :attr:`Action.key`.
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from optpipe.errors import OptPipeError
from optpipe.memory.accounting import duration as action_duration
from optpipe.optimizer.waves import wave_schedule
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


def release_options(problem: Problem, s: int, i: int, split_backward: bool,
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
    The rows are :func:`release_options`' (the bound uses the same). Not valid when
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
            options = release_options(problem, s, i, split_backward, place[s])
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
        # the no-wait waves (optimizer.waves) on one stage per device: a start that
        # paces the round trip. Not on the chunked placements: there the V shape's
        # waves beat every other V start, but the search from them ended no better
        # (docs/optimizer-log.md, the revision-39 item)
        schedule = wave_schedule(problem)
        if schedule is not None:
            out.candidates.append(Candidate(schedule.name, schedule,
                                            simulate(problem, schedule)))
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
