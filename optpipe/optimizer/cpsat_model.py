"""What the two CP-SAT models share: the time scale, the hint, the builder.

Both models (:mod:`.cpsat_order`, no offload; :mod:`.cpsat_tight`, offload) are built
over the same task graph in the same integer time scale, start from the same kind of
complete hint, and hand the engine the same handles to extract a schedule from
(:class:`ModelVars`, :func:`~.cpsat.extract_schedule`). That shared part is this
module, apart from either model, so that each model's module holds only its own
formulation, neither model depends on the other, and none of them on the engine
(:mod:`.cpsat`, which imports all three).

Times are integer ticks (:func:`~.preprocess.choose_scale`, :func:`make_ticks`, with a
safety margin ``delta`` on offload releases for the tight model); reported figures are
converted back, and the driver re-simulates in seconds. A :class:`Hint` is a schedule
timed in ticks under the simulator's rules (:func:`make_hint`): every model is given
one as a complete hint. :class:`Builder` is a CpModel that keeps every variable's hint
value; :func:`base_vars` makes the start variables, fixed-size intervals and makespan
both models begin with, within :func:`start_domains`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Sequence

from ortools.sat.python import cp_model

from optpipe.memory.accounting import transfer_bytes
from optpipe.optimizer.extract import reload_positions
from optpipe.optimizer.preprocess import (Key, TaskGraph, asap_ticks, choose_scale,
                                          earliest_starts, latest_starts, task_graph)
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule


# --------------------------------------------------------------------- scale
@dataclass
class Ticks:
    """The problem in integer ticks: compute graph, transfer lengths, safety margin."""

    scale: float                                    # ticks per second
    exact: bool                                     # every length is a whole tick
    graph: TaskGraph                                # durations and lag in ticks
    transfer: dict[tuple[Op, int, float], int]      # (OFFLOAD|RELOAD, stage, fraction)
    delta: int                                      # margin on offload releases (ticks)

    def seconds(self, ticks: float) -> float:
        return ticks / self.scale


def make_ticks(problem: Problem, split_backward: bool, offload: bool,
               levels: Sequence[float], placement: Sequence[int] | None = None) -> Ticks:
    """Choose the tick, round every length, and size ``delta`` from the rounding drift.

    Why ``delta``: solver and simulator times differ by at most the sum of all rounding
    errors (max and + are 1-Lipschitz along every path). An offload's release is counted
    ``delta >= 2 x drift`` ticks late, so a forward that the model lets use the freed
    bytes starts after the offload ended in the simulator too. One extra tick covers
    float summation in the simulator when lengths are exact.
    """
    graph_s = task_graph(problem, split_backward, placement)
    transfers_s: dict[tuple[Op, int, float], float] = {}
    if offload:
        for s in range(problem.stages):
            for x in levels:
                moved = transfer_bytes(problem, Action(Op.OFFLOAD, s, 0, x))
                transfers_s[(Op.OFFLOAD, s, x)] = moved / problem.d2h_bandwidth
                transfers_s[(Op.RELOAD, s, x)] = moved / problem.h2d_bandwidth
    values = list(graph_s.duration.values()) + [problem.p2p] + list(transfers_s.values())
    scale, exact = choose_scale(values, exact_min_ticks=1000 if offload else 1,
                                shortest=min((v for v in graph_s.duration.values() if v > 0),
                                             default=None))

    def err(v: float) -> float:
        return abs(v * scale - round(v * scale))

    drift = sum(err(d) for d in graph_s.duration.values())
    drift += 2 * (problem.stages - 1) * problem.microbatches * err(problem.p2p)
    drift += 2 * problem.microbatches * sum(err(v) for v in transfers_s.values())
    return Ticks(scale=scale, exact=exact, graph=graph_s.scaled(scale),
                 transfer={k: int(round(v * scale)) for k, v in transfers_s.items()},
                 delta=int(math.ceil(2 * drift)) + 1)


# ---------------------------------------------------------------------- hint
@dataclass
class Hint:
    """A schedule timed in ticks under the simulator's rules: a complete hint's source."""

    schedule: Schedule
    times: dict[Key, tuple[int, int, int]]         # action key -> (start, end, issue)
    order: list[list[Key]]                         # compute keys per device, in order
    offloads: dict[tuple[int, int], float]         # (stage, mb) -> fraction
    reload_after: dict[tuple[int, int], Key | None]
    makespan: int
    waits: frozenset[tuple[int, int]] = frozenset()  # offloads that hold their device back


def make_hint(schedule: Schedule, ticks: Ticks) -> Hint:
    """Time ``schedule`` in ticks (ASAP, like the simulator)."""
    times = asap_ticks(schedule, ticks.graph.duration, int(ticks.graph.lag), ticks.transfer)
    order = [[a.key for a in acts if a.op.is_compute] for acts in schedule.actions]
    offloads = {(a.stage, a.microbatch): a.fraction for _, a in schedule
                if a.op is Op.OFFLOAD}
    first = min(t[0] for t in times.values())
    return Hint(schedule=schedule, times=times, order=order, offloads=offloads,
                reload_after=reload_positions(schedule),
                makespan=max(t[1] for t in times.values()) - first,
                waits=frozenset((a.stage, a.microbatch) for _, a in schedule
                                if a.op is Op.OFFLOAD and a.wait))


def tight_memory_ok(hint: Hint, problem: Problem, delta: int) -> bool:
    """Does the hint fit the budget when offload releases count ``delta`` ticks late?"""
    events: list[list[tuple[int, int, int]]] = [[] for _ in range(problem.devices)]
    for (op, s, m), (start, end, issue) in hint.times.items():
        a = problem.activation[s]
        if op is Op.F:
            events[s].append((start, 1, a))
        elif op is Op.B:
            events[s].append((end, 0, -problem.freed_by_b[s]))
        elif op is Op.W:
            events[s].append((end, 0, -problem.freed_by_w[s]))
        elif op is Op.BW:
            events[s].append((end, 0, -a))
        else:
            moved = transfer_bytes(problem, Action(op, s, m, hint.offloads[(s, m)]))
            if op is Op.OFFLOAD:     # a waited one is released exactly (see the model)
                events[s].append((end + (0 if (s, m) in hint.waits else delta), 0, -moved))
            else:
                events[s].append((issue, 1, moved))
    for d, evs in enumerate(events):
        level, room = 0, problem.budget[d] - problem.static[d]
        for _, _, change in sorted(evs):
            level += change
            if level > room:
                return False
    return True


# ------------------------------------------------------------------- builder
class Builder:
    """A CpModel plus the hint value of every variable it creates."""

    def __init__(self) -> None:
        self.model = cp_model.CpModel()
        self.hint: dict[Any, int] = {}
        self._true: Any = None

    def int_var(self, lo: int, hi: int, name: str, hint: int | None = None) -> Any:
        var = self.model.new_int_var(int(lo), int(max(lo, hi)), name)
        if hint is not None:
            self.hint[var] = int(hint)
        return var

    def bool_var(self, name: str, hint: bool | None = None) -> Any:
        var = self.model.new_bool_var(name)
        if hint is not None:
            self.hint[var] = int(bool(hint))
        return var

    def true(self) -> Any:
        if self._true is None:
            self._true = self.model.new_bool_var("true")
            self.model.add(self._true == 1)
            self.hint[self._true] = 1
        return self._true

    def add_hints(self) -> None:
        for var, value in self.hint.items():
            self.model.add_hint(var, value)


@dataclass
class ModelVars:
    """Handles the extraction needs after a solve."""

    start: dict[Key, Any]
    makespan: Any
    level: dict[tuple[int, int, float], Any] = field(default_factory=dict)
    reload_choice: dict[tuple[int, int], list[tuple[Key, Any]]] = field(default_factory=dict)
    wait: dict[tuple[int, int], Any] = field(default_factory=dict)
    size: dict[str, int] = field(default_factory=dict)
    placement: list[int] | None = None


def start_domains(g: TaskGraph, horizon: int, windows: Mapping[Key, tuple[int, int]] | None
                  ) -> dict[Key, tuple[int, int]]:
    """Every start variable's domain: the graph's own time windows within ``horizon``,
    narrowed by ``windows`` where given (ticks, per task: least and latest start; the
    caller vouches that they cut off no schedule of the model within ``horizon``, as a
    window step's :func:`~.decompose.pinned_windows`)."""
    es = earliest_starts(g)
    ls = latest_starts(g, horizon)
    out = {}
    for k in g.keys:
        lo, hi = es[k], ls[k]
        if windows is not None and k in windows:
            lo, hi = max(lo, windows[k][0]), min(hi, windows[k][1])
        out[k] = (lo, hi)
    return out


def base_vars(b: Builder, g: TaskGraph, horizon: int, lower: int,
              hint: Hint | None, domains: Mapping[Key, tuple[int, int]] | None = None,
              devices: Collection[int] | None = None
              ) -> tuple[dict[Key, Any], dict[Key, Any], Any]:
    """Start variables with time windows, fixed-size intervals, makespan.

    ``domains``: each start's least and latest value (:func:`start_domains`; default the
    graph's own time windows within ``horizon``). ``devices``: those that run one
    task at a time (default all)."""
    start: dict[Key, Any] = {}
    interval: dict[Key, Any] = {}
    for k, (lo, hi) in (domains or start_domains(g, horizon, None)).items():
        name = f"{k[0].value}_{k[1]}_{k[2]}"
        start[k] = b.int_var(lo, hi, name, hint.times[k][0] if hint else None)
        interval[k] = b.model.new_fixed_size_interval_var(start[k], int(g.duration[k]),
                                                          "i" + name)
    mk_hint = hint.makespan if hint else None
    makespan = b.int_var(lower, horizon, "makespan", mk_hint)
    for k in g.last_keys():
        b.model.add(makespan >= start[k] + int(g.duration[k]))
    for k, preds in g.deps.items():
        for p, lag in preds:
            b.model.add(start[k] >= start[p] + int(g.duration[p]) + int(lag))
    for chain in g.chains:
        for p, k in zip(chain, chain[1:]):
            b.model.add(start[k] >= start[p] + int(g.duration[p]))
    for d in range(g.problem.devices) if devices is None else sorted(devices):
        b.model.add_no_overlap([interval[k] for k in g.device_keys(d)])
    return start, interval, makespan
