"""The OR-Tools CP-SAT engine: an exact model of the simulator's semantics.

Two models share one module because they share the task graph, the time scale, the
hint and the extraction:

**Order model** (no offload; one stage per device, or several — V shape, interleaved —
via ``placement``). Interval per task, no-overlap per device, data dependencies with
p2p lag between devices, FIFO chains, and memory as booleans ``b[i][j]`` = "B_j (or
W_j, BW_j) has finished when F_i starts", monotone in ``i`` and ``j`` (staircase
implications), with one linear row per F (plus a cumulative when a device holds
several stages). Without transfers the memory level at each
F's start depends only on the *order* of compute on the device, so the simulator,
which recomputes times as early as possible (ASAP) from the extracted orders, sees
exactly the memory the model counted and a makespan no larger.

**Tight model** (offload allowed). With transfers, memory also depends on *when* an
OFFLOAD ends relative to later forwards, which is not fixed by the orders: an ASAP
re-timing could start a forward before an offload it relied on has finished. So this
model pins every time to the simulator's ASAP rule: a circuit per device chooses each
task's predecessor and ``start = max(ready, end of predecessor)``; transfers start at
``max(issue, input, channel free)``; a RELOAD is issued at the end of a chosen compute
action (where it is then listed). Memory is a cumulative resource over the bytes that
are held. Solver times then *are* simulator times (up to tick rounding, which a safety
margin ``delta`` on offload releases absorbs), so the extracted schedule reproduces
the solver's makespan and memory exactly.

Times are integer ticks (:func:`~.preprocess.choose_scale`); reported figures are
converted back, and the driver re-simulates in seconds.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, Callable, Collection, Mapping, NamedTuple,
                    Sequence)

from ortools.sat.python import cp_model

from optpipe.memory.accounting import transfer_bytes
from optpipe.optimizer.extract import orders_from_starts, reload_positions
from optpipe.optimizer.bounds import lower_bound, memory_bounds
from optpipe.optimizer.preprocess import (Key, TaskGraph, asap_ticks, canonical_form,
                                          choose_scale, earliest_starts, graph_placement,
                                          latest_starts, memory_implied_orders, task_graph)
from optpipe.optimizer.result import (ERROR, FEASIBLE, INFEASIBLE, OPTIMAL, UNKNOWN,
                                      EngineResult, ProgressFn, relative_gap)
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule

if TYPE_CHECKING:
    from optpipe.optimizer.prefix import PrefixCuts

ENGINE = "cpsat"
#: Decompose (microbatch windows, :mod:`.decompose`) from this many stage x microbatch
#: cells on, when memory binds, after the full model has had ``FULL_SHARE`` of the time
#: limit.
DECOMPOSE_MIN_CELLS = 128
FULL_SHARE = 0.4
WINDOW = 8
#: One stage per device skips the microbatch windows when its hint is already within
#: this share of the proven bound (the prefix cuts' chain, the memory bounds): what is
#: left is a proof, which only the full model gives, and it needs its time in one run
#: (CP-SAT's learning starts over in each). Measured by hand, 4 x 64 at S/2: hint and
#: optimum 327.6 s, the cuts' bound 324.9 s (0.82%); the full model proves it in 45-72 s
#: with the cuts (four runs), while split into a first run, 25 fruitless window steps
#: and a closing run it did not prove it in 120 s.
WINDOWLESS_GAP = 0.01
#: ... and so does one whose model has the prefix cuts, up to this many stage x
#: microbatch cells, whatever its hint: the cuts make one run of the full model find
#: the optimum and prove it sooner than windows and a closing run. At 16 x 32, S/2,
#: the driver's hint is the extended schedule, 7.9% above the cuts' bound; replaying
#: the driver's call (by hand, 2026-12-04, five runs each, 38.9 s limit) the full model
#: alone proved 161.7 s in 25-37 s, all five; with the windows and a closing run in
#: 30-36 s, four of five.
WINDOWLESS_MAX_CELLS_WITH_CUTS = 512
#: The full model's share before the time windows (chunked placements, every budget).
#: V at S, 60 s, one run each: by hand 0.1 reached 52.65 s at 8 x 16 and proved 100.55 s
#: at 8 x 32 where 0.4 ended at 53.75 s and 101.3 s; `scripts/bench_windows.py
#: --full-shares 0.4` then gave 52.75 s and proven 100.55 s against 52.65 s and 100.65 s,
#: so the two are within the runs' noise; 0.1 proved 8 x 32 both times.
TIME_FULL_SHARE = 0.1
#: ... up to this many stage x microbatch cells; beyond, the time windows start from the
#: hints at once (:func:`_windows_from_hints`). Why: there the full model's share returned
#: nothing better than its hint (CP-SAT alone on the V shape at S, 55 s, by hand
#: 2026-12-02: 8 x 64, 65.8k variables, and 16 x 64, 107.5k, not even the hint after 5 s,
#: 8-11 s with building the model; 16 x 32 only its hint, twice), while the windows
#: improve in nearly every step there. Through the driver, 8 x 64 at S went from 197.15
#: to 196.65 s (docs/optimizer.md, "Decomposition").
TIME_FULL_MAX_CELLS = 256
#: Rows over all stages of a device (not each stage alone) up to this many microbatches.
CROSS_STAGE_MAX_MICROBATCHES = 16
#: CP-SAT's work limit for its transitive closure of precedences (its default: 1e6); 0
#: switches the closure off (why: :func:`new_solver`; `scripts/bench_cpsat_params.py`
#: measures both).
TRANSITIVE_PRECEDENCES_WORK_LIMIT = 0
DEFAULT_LEVELS: tuple[float, ...] = (1.0,)


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
class _Builder:
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
class _Vars:
    """Handles the extraction needs after a solve."""

    start: dict[Key, Any]
    makespan: Any
    level: dict[tuple[int, int, float], Any] = field(default_factory=dict)
    reload_choice: dict[tuple[int, int], list[tuple[Key, Any]]] = field(default_factory=dict)
    wait: dict[tuple[int, int], Any] = field(default_factory=dict)
    size: dict[str, int] = field(default_factory=dict)
    placement: list[int] | None = None


def _memory_units(problem: Problem, s: int, levels: Sequence[float] = ()
                  ) -> tuple[int, int, int, int, list[int], int | None]:
    """Bytes of stage ``s`` divided by their gcd, and the room left by the budget.

    Returns ``(activation, freed_by_b, freed_by_w, unit, moved_per_level, room)`` with
    ``room`` None when the budget cannot bind.
    """
    a, fb, fw = problem.activation[s], problem.freed_by_b[s], problem.freed_by_w[s]
    moved = [transfer_bytes(problem, Action(Op.OFFLOAD, s, 0, x)) for x in levels]
    unit = math.gcd(a, fb, fw, *moved) or 1
    room = problem.budget[s] - problem.static[s]
    if not math.isfinite(room) or problem.microbatches * a <= room:
        return a // unit, fb // unit, fw // unit, unit, [y // unit for y in moved], None
    return (a // unit, fb // unit, fw // unit, unit, [y // unit for y in moved],
            int(math.floor(room / unit)))


def _domains(g: TaskGraph, horizon: int, windows: Mapping[Key, tuple[int, int]] | None
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


def _base_vars(b: _Builder, g: TaskGraph, horizon: int, lower: int,
               hint: Hint | None, domains: Mapping[Key, tuple[int, int]] | None = None,
               devices: Collection[int] | None = None
               ) -> tuple[dict[Key, Any], dict[Key, Any], Any]:
    """Start variables with time windows, fixed-size intervals, makespan.

    ``domains``: each start's least and latest value (:func:`_domains`; default the
    graph's own time windows within ``horizon``). ``devices``: those that run one
    task at a time (default all)."""
    start: dict[Key, Any] = {}
    interval: dict[Key, Any] = {}
    for k, (lo, hi) in (domains or _domains(g, horizon, None)).items():
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


# ---------------------------------------------------------------- order model
def build_order_model(problem: Problem, ticks: Ticks, horizon: int, lower: int,
                      hint: Hint | None,
                      fixed_order: Sequence[Sequence[Key]] | None = None,
                      cuts: "PrefixCuts | None" = None,
                      free: Collection[Key] | None = None,
                      windows: Mapping[Key, tuple[int, int]] | None = None,
                      implied: Sequence[tuple[Key, Key]] | None = None,
                      capacity: Collection[int] | None = None
                      ) -> tuple[_Builder, _Vars]:
    """The no-offload model: memory decided by the order of compute on each device.

    ``fixed_order`` (per device, tasks in order) pins the relative order of those tasks;
    the decomposition (:mod:`.decompose`) uses it to re-optimize a window of tasks
    among the rest. ``free`` (with ``fixed_order`` and ``hint``: the tasks not pinned)
    lets the memory rows take the order of two pinned tasks from the hint as a constant
    instead of a boolean: the window's model then grows with the window, not with the
    problem (at 8 x 64 on the V shape CP-SAT's presolve alone took 5.8 s of a 6 s
    step). ``cuts`` (:mod:`.prefix`) add what smaller problems proved: least distances
    between the first stage's forwards, and the least time from one of them to the end.
    ``windows`` narrow the start variables' domains (:func:`_base_vars`). ``implied``:
    the problem's :func:`~.preprocess.memory_implied_orders` on this placement, when the
    caller has them already (a window search builds one model per step, and they cost
    about 0.035 s each at 16 x 64). ``capacity``: the devices whose one-task-at-a-time
    rule and memory are modelled (default all). With fewer it is a relaxation, so its
    optimum is a lower bound (the others' tasks only pass the dependencies on; their
    memory-implied orders stay, being implied by the full problem): a tool for asking
    which devices a bound comes from (``scripts/bench_relaxation.py``).
    """
    if free is not None and (fixed_order is None or hint is None):
        raise ValueError("free tasks need the pinned orders and the hint they come from")
    b = _Builder()
    g = ticks.graph
    dur = g.duration
    # one set of domains for the variables and for the rows that read them
    domains = _domains(g, horizon, windows)
    start, _, makespan = _base_vars(b, g, horizon, lower, hint, domains, capacity)
    for seq in fixed_order or ():
        for p, k in zip(seq, seq[1:]):
            b.model.add(start[k] >= start[p] + int(dur[p]))
    rows = 0
    placement = graph_placement(g)
    if implied is None:
        implied = memory_implied_orders(problem, g.split_backward, placement)
    for k, f in implied:
        b.model.add(start[f] >= start[k] + int(dur[k]))
    implied_set = set(implied)
    free_set = None if free is None else set(free)
    for d in range(g.devices) if capacity is None else sorted(capacity):
        rows += _order_memory(b, g, d, start, hint, implied_set,
                              cross=problem.microbatches <= CROSS_STAGE_MAX_MICROBATCHES,
                              free=free_set, domains=domains)
    if g.placement:
        # the device's exact memory: its rows see each stage alone beyond
        # CROSS_STAGE_MAX_MICROBATCHES (below, redundant: it helps propagation)
        _chunked_memory(b, g, start, hint, horizon, capacity)
    if cuts is not None:
        _prefix_cuts(b, g, start, makespan, cuts, ticks.scale, horizon, hint)
    b.model.minimize(makespan)
    return b, _Vars(start=start, makespan=makespan, size={"memory_rows": rows},
                    placement=placement)


def _prefix_cuts(b: _Builder, g: TaskGraph, start: dict[Key, Any], makespan: Any,
                 cuts: "PrefixCuts", scale: float, horizon: int,
                 hint: Hint | None) -> None:
    """``F(0, i + d) - F(0, i) >= reach[d]`` and ``end(i + n - 1) - F(0, i) >=
    whole[n]`` for every ``i``, ``end(j)`` being when microbatch ``j`` is done (the
    last window's is bounded by the makespan).

    Valid because microbatches ``i..i+d`` of any schedule form a schedule of ``d + 1``
    microbatches (fewer activations held, the same orders), which starts with ``F(0,
    i)`` and ends when microbatch ``i + d`` is done (FIFO: its tasks are the last of
    their kinds); see :mod:`.prefix`. The windows inside the pipeline bound no more than
    the last one, but they prune: with them CP-SAT proved 4 x 64 at half of 1F1B's
    memory in 45-72 s (four runs) instead of 76 and 80 s (by hand, the same cuts and
    hint).
    """
    M = g.problem.microbatches
    dur = g.duration

    def ticks(seconds: float) -> int:
        return int(math.ceil(seconds * scale - 1e-6))
    for d, reach in cuts.reach.items():
        for i in range(M - d):
            b.model.add(start[(Op.F, 0, i + d)] >= start[(Op.F, 0, i)] + ticks(reach))
    ends: dict[int, Any] = {}

    def end(j: int) -> Any:
        """When microbatch ``j`` is done (a variable, made once)."""
        if j not in ends:
            last = g.last_keys(j)
            value = (max(hint.times[k][0] + int(dur[k]) for k in last)
                     if hint is not None else None)
            ends[j] = b.int_var(0, horizon + max(int(dur[k]) for k in last),
                                f"end_{j}", value)
            b.model.add_max_equality(ends[j], [start[k] + int(dur[k]) for k in last])
        return ends[j]
    for n, whole in cuts.whole.items():
        if 0 < n < M:
            b.model.add(makespan >= start[(Op.F, 0, M - n)] + ticks(whole))
            for i in range(M - n):
                b.model.add(end(i + n - 1) >= start[(Op.F, 0, i)] + ticks(whole))


def _imply(b: _Builder, a: Any, c: Any) -> None:
    """``a => c`` where either side may be a constant (a pinned order, as a bool)."""
    if a is False or c is True:
        return
    if a is True:
        b.model.add_bool_or([c] if c is not False else [])
    elif c is False:
        b.model.add_bool_or([~a])
    else:
        b.model.add_implication(a, c)


def _order_memory(b: _Builder, g: TaskGraph, d: int, start: dict[Key, Any],
                  hint: Hint | None, implied: set[tuple[Key, Key]], cross: bool = True,
                  free: set[Key] | None = None,
                  domains: Mapping[Key, tuple[int, int]] | None = None) -> int:
    """Memory rows of device ``d`` at every forward's start, from order booleans.

    For the row of ``F(s, i)``: ``x[(op, s', j)]`` says task ``(op, s', j)`` on the same
    device ended before ``F(s, i)`` starts (for a forward of another stage: started
    before it — on one device that is the same). FIFO makes each family a staircase:
    monotone in ``j``, and in ``i`` between rows of one stage. The row: activations of
    forwards started minus what finished B/W released <= room. With ``cross`` False, a
    device with several stages gets rows for each stage alone (valid: other stages only
    add memory; the cumulative keeps it exact) — full rows grow as (stages x M)^2.
    With ``free`` (a window step), the order of two tasks outside it is the hint's, a
    constant: their precedence is already pinned; so is the order of any two tasks
    whose start variables' ``domains`` decide it (one ends by the other's earliest
    start however both are placed) — the hint keeps the domains, so its order is that
    one (checked pair by pair: where it is not, the pair keeps its literal). Returns
    the row count.
    """
    p = g.problem
    dur = g.duration
    M = p.microbatches
    stages = g.stages_on(d)
    room_bytes = p.budget[d] - p.static[d]
    if not math.isfinite(room_bytes):
        return 0
    releases = {s: ([(Op.B, p.freed_by_b[s]), (Op.W, p.freed_by_w[s])] if g.split_backward
                    else [(Op.BW, p.activation[s])]) for s in stages}
    amounts = [p.activation[s] for s in stages] + \
        [amt for s in stages for _, amt in releases[s]]
    unit = math.gcd(*amounts) or 1
    room = int(math.floor(room_bytes / unit))
    act = {s: p.activation[s] // unit for s in stages}
    if M * sum(act.values()) <= room:
        return 0
    ends = _sorted_ends(g, stages, hint) if free is not None and hint is not None else None
    free_js: dict[tuple[Op, int], list[int]] = {}
    for op, o, j in sorted(free or (), key=lambda k: k[2]):
        free_js.setdefault((op, o), []).append(j)
    rows = 0
    for s in stages:
        others = sum(M * act[o] for o in stages if o != s) if cross else 0
        first = next((i for i in range(M) if (i + 1) * act[s] + others > room), None)
        if first is None:
            continue
        prev: _Row | None = None
        for i in range(first, M):
            f = (Op.F, s, i)
            families: list[tuple[Op, int, int, int]] = []   # op, stage, count, coefficient
            for o in stages:
                if o != s and not cross:
                    continue
                if o != s:
                    families.append((Op.F, o, M, act[o]))
                for op, amt in releases[o]:
                    if amt:
                        families.append((op, o, i if o == s else M, -(amt // unit)))
            constant = (i + 1) * act[s]
            if ends is not None:
                row = _sparse_row(b, families, f, hint, ends, free, free_js, domains, dur)
                constant += row.constant
            else:
                row = _Row({(op, o): count for op, o, count, _ in families})
                for op, o, count, _ in families:
                    for j in range(count):
                        k = (op, o, j)
                        row.lits[k] = b.bool_var(
                            f"{op.value}{o}_{j}<F{s}_{i}",
                            hint.times[k][1] <= hint.times[f][0] if hint else None)
            terms = []
            for op, o, count, coef in families:       # each literal's meaning
                for j in row.literal_js(op, o):
                    k = (op, o, j)
                    lit = row.lits[k]
                    if (k, f) in implied:
                        b.model.add(lit == 1)
                    b.model.add(start[f] >= start[k] + int(dur[k])).only_enforce_if(lit)
                    b.model.add(start[k] >= start[f] + int(dur[f])).only_enforce_if(~lit)
                    terms.append(coef * lit)
            for op, o, count, _ in families:     # the staircases
                for j in row.touched_js(op, o, count, prev):
                    k = (op, o, j)
                    if j > 0:
                        _imply(b, row[k], row[(op, o, j - 1)])
                    if prev is not None and k in prev:
                        _imply(b, prev[k], row[k])
            for o in stages:          # W_j done => B_j done; B_j done => F_j started
                for j in row.stage_js(o, i if o == s else M):
                    if (Op.W, o, j) in row and (Op.B, o, j) in row:
                        _imply(b, row[(Op.W, o, j)], row[(Op.B, o, j)])
                    for op in (Op.B, Op.BW):
                        if o != s and (op, o, j) in row:
                            _imply(b, row[(op, o, j)], row[(Op.F, o, j)])
            if terms:
                b.model.add(constant + sum(terms) <= room)
            prev = row
            rows += 1
    return rows


class _Row:
    """The order literals of one memory row (:func:`_order_memory`): ``lits`` holds a
    literal for every task that has one; a task without one (in a window step, where
    its order to the row's forward is pinned or decided, :func:`_sparse_row`) has the
    hint's order, a constant: ended by ``at``, the forward's start in the hint.

    Why a class and not a dict of every task: on the V shape at 8 x 64 and 16 x 64
    (budget S) a window step has 64-96 rows per device of about 100 tasks each, nearly
    all of them constants, and walking them all took about half of the step's build;
    the rows' constraints only concern the literals and their neighbours, so a row
    keeps those and answers the rest from the hint.
    """

    def __init__(self, counts: dict[tuple[Op, int], int], at: int | None = None,
                 ends: "dict[tuple[Op, int], list[int]] | None" = None) -> None:
        self.counts = counts              # (op, stage) -> its tasks in the row: j < count
        self.at = at                      # None: every task has a literal
        self.ends = ends
        self.lits: dict[Key, Any] = {}
        self.js: dict[tuple[Op, int], list[int]] = {}   # with a literal, ascending
        self.constant = 0

    def __contains__(self, k: Key) -> bool:
        return k[2] < self.counts.get((k[0], k[1]), 0)

    def __getitem__(self, k: Key) -> Any:
        lit = self.lits.get(k)
        if lit is not None or self.at is None:
            return lit
        return self.ends[(k[0], k[1])][k[2]] <= self.at

    def literal_js(self, op: Op, o: int) -> Sequence[int]:
        """Microbatches of the family ``(op, o)`` that have a literal, ascending."""
        if self.at is None:
            return range(self.counts.get((op, o), 0))
        return self.js.get((op, o), ())

    def touched_js(self, op: Op, o: int, count: int, prev: "_Row | None") -> Sequence[int]:
        """Microbatches ``j < count`` whose staircase links (to ``j - 1`` here, to ``j``
        in ``prev``) involve a literal: between two constants they say nothing (the
        hint is FIFO, :func:`_sorted_ends`)."""
        if self.at is None or (prev is not None and prev.at is None):
            return range(count)
        js = set()
        for j in self.literal_js(op, o):
            js.update((j, j + 1))
        if prev is not None:
            js.update(prev.literal_js(op, o))
        return sorted(j for j in js if j < count)

    def stage_js(self, o: int, count: int) -> Sequence[int]:
        """Microbatches ``j < count`` of stage ``o`` with a literal in some family."""
        if self.at is None:
            return range(count)
        return sorted({j for (_, o2), js in self.js.items() if o2 == o
                       for j in js if j < count})


def _sorted_ends(g: TaskGraph, stages: Sequence[int], hint: Hint
                 ) -> dict[tuple[Op, int], list[int]] | None:
    """Per (op, stage) of the device, the hint's task ends in microbatch order; None
    unless every family's ends ascend, as FIFO makes them: what lets a window step's
    row count its constants by bisection and skip the links between two constants."""
    M = g.problem.microbatches
    ends = {}
    for o in stages:
        for op in g.ops:
            e = [hint.times[(op, o, j)][1] for j in range(M)]
            if any(a > b for a, b in zip(e, e[1:])):
                return None
            ends[(op, o)] = e
    return ends


def _sparse_row(b: _Builder, families: Sequence[tuple[Op, int, int, int]], f: Key,
                hint: Hint, ends: dict[tuple[Op, int], list[int]], free: set[Key],
                free_js: dict[tuple[Op, int], list[int]],
                domains: Mapping[Key, tuple[int, int]] | None,
                dur: Mapping[Key, float]) -> _Row:
    """The row of forward ``f`` in a window step, with literals only for the tasks
    whose order to ``f`` is open: one of the two free (``free_js``: per family, the
    free microbatches, ascending) and the ``domains`` not deciding it the way the hint
    has it. Literals are created in the order the full row creates them; the other
    tasks' part of the row is a constant (``row.constant``) from the hint's order."""
    at = hint.times[f][0]
    row = _Row({(op, o): count for op, o, count, _ in families}, at, ends)
    s, i = f[1], f[2]
    f_free = f in free
    lf, uf = domains[f] if domains is not None else (None, None)
    for op, o, count, coef in families:
        e = ends[(op, o)]
        done = bisect.bisect_right(e, at, 0, count)
        js = []
        for j in (range(count) if f_free else free_js.get((op, o), ())):
            if j >= count:
                break
            k = (op, o, j)
            value = e[j] <= at
            if domains is not None:
                lk, uk = domains[k]
                if (uk + int(dur[k]) <= lf and value) or (uf + int(dur[f]) <= lk and not value):
                    continue        # the domains decide it, as the hint has it
            done -= value
            row.lits[k] = b.bool_var(f"{op.value}{o}_{j}<F{s}_{i}", value)
            js.append(j)
        row.js[(op, o)] = js
        row.constant += coef * done
    return row


def _chunked_memory(b: _Builder, g: TaskGraph, start: dict[Key, Any], hint: Hint | None,
                    horizon: int, devices: Collection[int] | None = None) -> None:
    """Held bytes per device as a cumulative: [F start, B end) and [F start, W end).

    Exact without offload: all intervals of a device start and end with compute on that
    device, so whether a release precedes an allocation is fixed by the order alone.
    """
    p = g.problem
    dur = g.duration
    for d in range(g.devices) if devices is None else sorted(devices):
        stages = g.stages_on(d)
        room = p.budget[d] - p.static[d]
        if not math.isfinite(room) or \
                p.microbatches * sum(p.activation[s] for s in stages) <= room:
            continue
        parts: list[tuple[int, Op, int]] = []
        for s in stages:
            parts += ([(s, Op.B, p.freed_by_b[s]), (s, Op.W, p.freed_by_w[s])]
                      if g.split_backward else [(s, Op.BW, p.activation[s])])
        unit = math.gcd(*[amt for _, _, amt in parts]) or 1
        intervals, demands = [], []
        for s, op, amount in parts:
            if amount == 0:
                continue
            for mb in range(p.microbatches):
                f, k = (Op.F, s, mb), (op, s, mb)
                size = b.int_var(0, horizon, f"held{s}_{op.value}{mb}",
                                 (hint.times[k][1] - hint.times[f][0]) if hint else None)
                b.model.add(size == start[k] + int(dur[k]) - start[f])
                intervals.append(b.model.new_interval_var(start[f], size,
                                                          start[k] + int(dur[k]), "held"))
                demands.append(amount // unit)
        b.model.add_cumulative(intervals, demands, int(math.floor(room / unit)))


# ---------------------------------------------------------------- tight model
def build_tight_model(problem: Problem, ticks: Ticks, horizon: int, lower: int,
                      hint: Hint | None, levels: Sequence[float]
                      ) -> tuple[_Builder, _Vars]:
    """The offload model: solver times equal the simulator's ASAP times."""
    b = _Builder()
    m_ = b.model
    g = ticks.graph
    dur = {k: int(v) for k, v in g.duration.items()}
    H = horizon
    start, _, makespan = _base_vars(b, g, horizon, lower, hint)
    S, M = problem.stages, problem.microbatches
    split = g.split_backward
    bwd = Op.B if split else Op.BW
    last_op = Op.W if split else Op.BW
    T = hint.times if hint else {}
    out = _Vars(start=start, makespan=makespan)

    def end(k: Key) -> Any:
        return start[k] + dur[k]

    def hend(k: Key) -> int | None:
        return T[k][1] if hint else None

    # ---------------- transfers: offload choice, channel chains, reload issue
    offloaded: dict[tuple[int, int], Any] = {}
    reload_end0: dict[tuple[int, int], Any] = {}      # reload end if offloaded, else 0
    transfer_vars: dict[tuple[int, int], dict[str, Any]] = {}

    def equals_after(var: Any, c: Key, lit: Any) -> None:
        """``var`` is the time the device issues what it lists after compute action
        ``c`` (when ``lit``): ``c``'s end, or, after an F whose OFFLOAD holds the device
        back, that offload's end (>= the F's end)."""
        held = transfer_vars.get((c[1], c[2])) if c[0] is Op.F else None
        if held is None:
            m_.add(var == end(c)).only_enforce_if(lit)
        else:
            m_.add(var == end(c)).only_enforce_if([lit, ~held["w"]])
            m_.add(var == held["oe"]).only_enforce_if([lit, held["w"]])

    arcs_total = 0
    for s in range(S):
        if problem.activation[s] == 0:
            continue
        cf = b.int_var(0, 0, f"cf{s}_0", 0)           # offload channel free
        for mb in range(M):
            f = (Op.F, s, mb)
            hx = hint.offloads.get((s, mb)) if hint else None
            lits = []
            for x in levels:
                lit = b.bool_var(f"off{s}_{mb}_{x}",
                                 (hx is not None and abs(hx - x) < 1e-12) if hint else None)
                out.level[(s, mb, x)] = lit
                lits.append((x, lit))
            o = b.bool_var(f"o{s}_{mb}", (hx is not None) if hint else None)
            m_.add(sum(l for _, l in lits) == o)
            offloaded[(s, mb)] = o
            # held back: what the device issues after this F waits for the offload's end
            w = b.bool_var(f"w{s}_{mb}", ((s, mb) in hint.waits) if hint else None)
            m_.add_implication(w, o)
            out.wait[(s, mb)] = w
            h_on = hint is not None and hx is not None
            # offload: starts at max(F end, channel free)
            h_cf = b.hint.get(cf) if hint else None
            h_os = max(hend(f), h_cf) if hint else None
            os_ = b.int_var(0, H, f"os{s}_{mb}", h_os)
            m_.add_max_equality(os_, [end(f), cf])
            osz_vals = [ticks.transfer[(Op.OFFLOAD, s, x)] for x, _ in lits]
            osz = b.int_var(0, max(osz_vals), f"osz{s}_{mb}",
                            ticks.transfer[(Op.OFFLOAD, s, hx)] if h_on else (0 if hint else None))
            m_.add(osz == sum(v * l for v, (_, l) in zip(osz_vals, lits)))
            oe = b.int_var(0, H, f"oe{s}_{mb}", (h_os + b.hint[osz]) if hint else None)
            m_.add(oe == os_ + osz)
            off_iv = m_.new_optional_interval_var(os_, osz, oe, o, f"OFF{s}_{mb}")
            cf = _running_max(b, cf, oe, o, H, f"cf{s}_{mb + 1}",
                              (b.hint[oe] if h_on else 0) if hint else None)
            # its bytes count as freed delta ticks after its end; a waited one's exactly
            # then: whatever the device issues after it starts no sooner in the simulator
            freed = b.int_var(0, H + ticks.delta, f"fr{s}_{mb}",
                              (b.hint[oe] + (0 if (s, mb) in hint.waits else ticks.delta))
                              if hint else None)
            m_.add(freed == oe + ticks.delta - ticks.delta * w)
            transfer_vars[(s, mb)] = {"oe": oe, "freed": freed, "lits": lits, "o": o,
                                      "w": w, "off": off_iv}
        rcf = b.int_var(0, 0, f"rcf{s}_0", 0)         # reload channel free
        li = b.int_var(0, 0, f"li{s}_0", 0)           # latest reload issue so far
        for mb in range(M):
            f = (Op.F, s, mb)
            t = transfer_vars[(s, mb)]
            o, oe = t["o"], t["oe"]
            hx = hint.offloads.get((s, mb)) if hint else None
            h_on = hint is not None and hx is not None
            # reload issue: the end of one compute action listed before B_m, at/after F_m
            # (after a waited F: its offload's end, which holds the device back)
            cands: list[Key] = [(Op.F, s, k) for k in range(mb, M)]
            cands += [(bwd, s, k) for k in range(mb)]
            if split:
                cands += [(Op.W, s, k) for k in range(mb)]
            h_after = hint.reload_after.get((s, mb)) if h_on else None
            h_iss = T[(Op.RELOAD, s, mb)][2] if h_on else (0 if hint else None)
            iss = b.int_var(0, H, f"iss{s}_{mb}", h_iss)
            choice = []
            for c in cands:
                r = b.bool_var(f"r{s}_{mb}_{c[0].value}{c[2]}",
                               (c == h_after) if hint else None)
                equals_after(iss, c, r)
                choice.append((c, r))
            out.reload_choice[(s, mb)] = choice
            m_.add(sum(r for _, r in choice) == o)
            m_.add(iss >= end(f)).only_enforce_if(o)
            m_.add(iss <= start[(bwd, s, mb)]).only_enforce_if(o)
            m_.add(iss >= li).only_enforce_if(o)
            li = _running_max(b, li, iss, o, H, f"li{s}_{mb + 1}",
                              h_iss if h_on else (0 if hint else None))
            # reload: starts at max(issue, offload end, channel free)
            h_rs = max(b.hint[iss], b.hint[oe], b.hint[rcf]) if hint else None
            rs = b.int_var(0, H, f"rs{s}_{mb}", h_rs)
            m_.add_max_equality(rs, [iss, oe, rcf])
            rsz_vals = [ticks.transfer[(Op.RELOAD, s, x)] for x, _ in t["lits"]]
            rsz = b.int_var(0, max(rsz_vals), f"rsz{s}_{mb}",
                            ticks.transfer[(Op.RELOAD, s, hx)] if h_on else (0 if hint else None))
            m_.add(rsz == sum(v * l for v, (_, l) in zip(rsz_vals, t["lits"])))
            re_ = b.int_var(0, H, f"re{s}_{mb}", (h_rs + b.hint[rsz]) if hint else None)
            m_.add(re_ == rs + rsz)
            t["rld"] = m_.new_optional_interval_var(rs, rsz, re_, o, f"RLD{s}_{mb}")
            rcf, reload_end0[(s, mb)] = _running_max(
                b, rcf, re_, o, H, f"rcf{s}_{mb + 1}",
                (b.hint[re_] if h_on else 0) if hint else None, gated_too=True)
            t["iss"] = iss
        m_.add_no_overlap([transfer_vars[(s, mb)]["off"] for mb in range(M)])
        m_.add_no_overlap([transfer_vars[(s, mb)]["rld"] for mb in range(M)])

    # ---------------- compute: start = max(ready, end of predecessor on the device)
    for s in range(S):
        nodes = g.device_keys(s)
        index = {k: i + 1 for i, k in enumerate(nodes)}
        pred_of: dict[Key, Key | None] = {}
        if hint:
            seq = hint.order[s]
            pred_of = {k: (seq[i - 1] if i else None) for i, k in enumerate(seq)}
        arcs = [(0, index[(Op.F, s, 0)], b.true()), (index[(last_op, s, M - 1)], 0, b.true())]
        incoming: dict[Key, list[tuple[Key, Any]]] = {k: [] for k in nodes}
        for i_key in nodes:
            for j_key in nodes:
                if i_key != j_key and _arc_allowed(i_key, j_key, split):
                    lit = b.bool_var(f"a{s}_{i_key[0].value}{i_key[2]}_{j_key[0].value}{j_key[2]}",
                                     (pred_of.get(j_key) == i_key) if hint else None)
                    arcs.append((index[i_key], index[j_key], lit))
                    incoming[j_key].append((i_key, lit))
        arcs_total += len(arcs)
        m_.add_circuit(arcs)
        for k in nodes:
            op, _, mb = k
            deps = [end(p) + int(lg) for p, lg in g.deps[k]]
            if op is bwd and (s, mb) in reload_end0:
                deps.append(reload_end0[(s, mb)])
            if k == (Op.F, s, 0):
                if deps:
                    m_.add_max_equality(start[k], deps)
                else:
                    m_.add(start[k] == 0)
                continue
            h_pe = hend(pred_of[k]) if hint and pred_of.get(k) else (0 if hint else None)
            pred = pred_of.get(k) if hint else None
            if pred is not None and pred[0] is Op.F and (s, pred[2]) in hint.waits:
                h_pe = b.hint[transfer_vars[(s, pred[2])]["oe"]]   # held back until then
            pe = b.int_var(0, H, f"pe{s}_{op.value}{mb}", h_pe)
            for i_key, lit in incoming[k]:
                equals_after(pe, i_key, lit)
            m_.add_max_equality(start[k], deps + [pe])

    # ---------------- memory: cumulative of held bytes per device
    for s in range(S):
        a, fb, fw, unit, moved, room = _memory_units(problem, s, levels)
        if room is None:
            continue
        intervals: list[Any] = []
        demands: list[int] = []
        for mb in range(M):
            f = (Op.F, s, mb)
            t = transfer_vars.get((s, mb))
            ends_by: list[tuple[Key, int]] = ([((Op.B, s, mb), fb), ((Op.W, s, mb), fw)]
                                              if split else [((Op.BW, s, mb), a)])
            variants: list[tuple[Any, list[int], int]] = []   # presence, kept-per-part, moved
            if t is None:
                variants.append((b.true(), [amt for _, amt in ends_by], 0))
            else:
                variants.append((~t["o"], [amt for _, amt in ends_by], 0))
                for (x, lit), y in zip(t["lits"], moved):
                    parts, left = [], y
                    for _, amt in ends_by:          # offload comes out of B's part first
                        take = min(left, amt)
                        parts.append(amt - take)
                        left -= take
                    variants.append((lit, parts, y))
            for presence, parts, y in variants:
                for (k, _), keep in zip(ends_by, parts):
                    if keep > 0:
                        size = b.int_var(0, H, f"kz{s}_{mb}_{k[0].value}",
                                         (hend(k) - T[f][0]) if hint else None)
                        intervals.append(m_.new_optional_interval_var(
                            start[f], size, end(k), presence, "keep"))
                        demands.append(keep)
                if y > 0 and t is not None:
                    hx = hint.offloads.get((s, mb)) if hint else None
                    on = hint is not None and hx is not None
                    # held until the offload frees it, then again from the issue
                    size = b.int_var(0, H + ticks.delta, f"hz{s}_{mb}",
                                     (b.hint[t["freed"]] - T[f][0]) if on
                                     else (0 if hint else None))
                    intervals.append(m_.new_optional_interval_var(
                        start[f], size, t["freed"], presence, "held"))
                    demands.append(y)
                    left = y
                    for (k, amt) in ends_by:
                        back = min(left, amt)
                        left -= back
                        if back > 0:
                            size = b.int_var(0, H, f"bz{s}_{mb}_{k[0].value}",
                                             (hend(k) - b.hint[t["iss"]]) if on
                                             else (0 if hint else None))
                            intervals.append(m_.new_optional_interval_var(
                                t["iss"], size, end(k), presence, "back"))
                            demands.append(back)
        m_.add_cumulative(intervals, demands, room)
    m_.minimize(makespan)
    out.size = {"arcs": arcs_total, "delta_ticks": ticks.delta}
    return b, out


def _running_max(b: _Builder, prev: Any, value: Any, present: Any, horizon: int, name: str,
                 gated_hint: int | None, gated_too: bool = False) -> Any:
    """``max(prev, value if present else 0)``: a channel's free time (or the latest reload
    issue) after one more microbatch, whose transfer exists only if it is offloaded.

    Returns the new running max, and with ``gated_too`` also the gated value itself
    (the reload's end, or 0). ``gated_hint`` is the gated value's hint (None: no hint).
    """
    gated = b.int_var(0, horizon, "g_" + name, gated_hint)
    b.model.add(gated == value).only_enforce_if(present)
    b.model.add(gated == 0).only_enforce_if(~present)
    nxt = b.int_var(0, horizon, name,
                    None if gated_hint is None else max(b.hint[prev], gated_hint))
    b.model.add_max_equality(nxt, [prev, gated])
    return (nxt, gated) if gated_too else nxt


def _arc_allowed(i: Key, j: Key, split: bool) -> bool:
    """Can compute task ``j`` immediately follow ``i`` on a device (FIFO + data order)?"""
    (oi, _, mi), (oj, _, mj) = i, j
    if oi is oj:
        return mj == mi + 1
    if oi is Op.F:
        return mj <= mi if oj in (Op.B, Op.BW) else mj < mi      # F_m -> B_k (k<=m), W_k (k<m)
    if oj is Op.F:
        return mj > mi                                          # B_k/W_k -> F_m (m>k)
    if oi is Op.B and oj is Op.W:
        return mj <= mi
    if oi is Op.W and oj is Op.B:
        return mj > mi
    return False


# --------------------------------------------------------------------- solve
class _Reporter(cp_model.CpSolverSolutionCallback):
    """Forwards incumbents (and bound moves) to a progress function, in seconds."""

    def __init__(self, scale: float, progress: ProgressFn | None, t0: float) -> None:
        super().__init__()
        self.scale, self.progress, self.t0 = scale, progress, t0
        self.best: float | None = None
        self.bound: float | None = None

    def on_solution_callback(self) -> None:
        self.best = self.ObjectiveValue() / self.scale
        self.bound = self.BestObjectiveBound() / self.scale
        self._emit()

    def on_bound(self, bound: float) -> None:
        self.bound = bound / self.scale
        self._emit()

    def _emit(self) -> None:
        if self.progress is not None:
            self.progress(time.monotonic() - self.t0, self.best, self.bound,
                          relative_gap(self.best, self.bound))


def _pick_hint(problem: Problem, ticks: Ticks, tight: bool, levels: Sequence[float],
               candidates: Sequence[Schedule]) -> Hint:
    """The fastest candidate the model accepts as a complete, feasible hint."""
    return _pick_hints(problem, ticks, tight, levels, candidates)[0]


def _pick_hints(problem: Problem, ticks: Ticks, tight: bool, levels: Sequence[float],
                candidates: Sequence[Schedule]) -> list[Hint]:
    """Every distinct candidate the model accepts as a complete, feasible hint, fastest
    first (ties in the candidates' order); raises :class:`NoHint` when there is none.

    The sequential schedule (one microbatch in flight) is always in the pool for one
    stage per device, so a hint exists whenever any schedule does.
    """
    from optpipe.optimizer.preprocess import sequential_schedule
    from optpipe.simulator import simulate

    placement = graph_placement(ticks.graph)
    pool = list(candidates)
    if not ticks.graph.placement:
        pool.append(sequential_schedule(problem, ticks.graph.split_backward))
    hints: list[Hint] = []
    seen: set[str] = set()
    for schedule in pool:
        canon = canonical_form(schedule, problem, ticks.graph.split_backward,
                               offload_levels=levels if tight else None,
                               placement=placement)
        if canon is None or (canon.offloads and not tight):
            continue
        fingerprint = str([[(a.key, a.wait) for a in acts] for acts in canon.actions])
        if fingerprint in seen:
            continue
        seen.add(fingerprint)
        if not simulate(problem, canon).fits:
            continue
        hint = make_hint(canon, ticks)
        if tight and not tight_memory_ok(hint, problem, ticks.delta):
            continue
        hints.append(hint)
    if hints:
        return sorted(hints, key=lambda hint: hint.makespan)
    if not ticks.graph.placement:
        raise AssertionError("the sequential schedule always fits a feasible budget")
    raise NoHint(f"no fitting schedule with placement {placement} to start from")


class NoHint(Exception):
    """No fixed schedule on the requested placement fits (only for chunked placements)."""


def new_solver(seconds: float, threads: int) -> cp_model.CpSolver:
    """A CP-SAT solver as every model here runs it: ``seconds``, ``threads`` workers,
    presolve probing off (how the order model was proven in the prototypes), and no
    transitive closure of the precedences when the model is loaded.

    Why the last: our models are thousands of precedences (dependencies, FIFO chains,
    the orders memory implies, enforced order literals), and CP-SAT's closure of them
    runs inside its full-problem worker's first step, which no time limit interrupts:
    `scripts/bench_cpsat_params.py` measured the V shape's model at 8 x 64 (budget S)
    5 s past a 10 s limit and a window-search step at 16 x 32 (S/2) 11 s past a 4 s
    limit with it, on time without it. It does not pay for itself either: every proof
    in that script came faster without it (one stage per device at S/2, 4 x 32: 6.3 s,
    not proven in 60 s with it).
    """
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = max(1, threads)
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.transitive_precedences_work_limit = TRANSITIVE_PRECEDENCES_WORK_LIMIT
    return solver


def solve_cpsat(problem: Problem, *, warm_start: Schedule | Sequence[Schedule] | None = None,
                time_limit: float = 60.0, gap: float = 0.0, threads: int = 2,
                offload: bool = False, split_backward: bool = True,
                levels: Sequence[float] = DEFAULT_LEVELS,
                progress: ProgressFn | None = None, log: bool = False,
                fix_hint: bool = False, decompose: bool | None = None,
                placement: Sequence[int] | None = None,
                cuts: "PrefixCuts | None" = None, seed: int | None = None) -> EngineResult:
    """Solve ``problem`` with CP-SAT; the best schedule found, or the hint's if none.

    ``warm_start`` (one schedule or several, best first) becomes a complete hint and its
    makespan the horizon, so the result is never worse. ``offload`` selects the tight
    model (transfers allowed at the fractions in ``levels``). ``fix_hint`` solves with
    every variable fixed to its hinted value: a check that hints are complete and valid.
    ``cuts`` (no offload): bounds proven on fewer microbatches of the same placement
    (:func:`~.prefix.prefix_cuts`), added to the model and to its lower bound.
    ``decompose`` (no offload, from ``DECOMPOSE_MIN_CELLS`` cells): None lets the run
    continue from the full model's share with windows (:mod:`.decompose`): time
    windows on chunked placements, microbatch windows on one stage per device where
    memory binds the round trip; True forces microbatch windows, False the full model
    alone. ``seed``: CP-SAT's random seed for the full model's run (its default, 1, when
    None); of several optimal orders it picks which one is returned, which matters to a
    caller that transforms the answer afterwards (:mod:`.offload_starts`). The caller
    must already have checked that the budget is feasible
    (:func:`~.preprocess.min_budgets`).
    """
    t0 = time.monotonic()
    decompose_auto = decompose is None
    if placement is not None and list(placement) == list(range(problem.devices)):
        placement = None
    if offload and placement is not None:
        raise ValueError("offload is modelled for one stage per device only")
    ticks = make_ticks(problem, split_backward, offload, levels, placement)
    starts = ([warm_start] if isinstance(warm_start, Schedule) else list(warm_start or []))
    hints = _pick_hints(problem, ticks, offload, levels, starts)
    hint = hints[0]
    horizon = hint.makespan
    # without offload the memory bounds (round trip, warm-up) count too
    free = lower_bound(ticks.graph)
    trip, warm = (free, free) if offload else memory_bounds(ticks.graph, free)
    lower = int(math.ceil(max(trip, warm) - 1e-9))
    # the round trip bounds the makespan above the no-memory bound: memory binds the
    # steady state (the warm-up bound rises at budget S too, where it does not)
    memory_binds = not offload and math.ceil(trip - 1e-9) > math.ceil(free - 1e-9)
    if cuts is not None and not offload:
        lower = max(lower, int(math.ceil(cuts.makespan_bound(problem.microbatches)
                                         * ticks.scale - 1e-6)))
    lower = min(lower, horizon)
    deadline = t0 + time_limit
    cells = problem.stages * problem.microbatches
    large = cells >= DECOMPOSE_MIN_CELLS
    # the chunked placements are packed by time windows (:func:`~.decompose.
    # time_window_search`) once the full model has had its share
    by_time = decompose_auto and not offload and large and placement is not None
    if by_time and windows_from_the_start(problem):
        return _windows_from_hints(problem, ticks, hints, lower, deadline, threads,
                                   progress, t0)
    began = time.monotonic()
    if offload:
        builder, handles = build_tight_model(problem, ticks, horizon, lower, hint, levels)
    else:
        builder, handles = build_order_model(problem, ticks, horizon, lower, hint,
                                             cuts=cuts)
    builder.add_hints()
    if decompose is None:
        # one stage per device: microbatch windows where memory binds the round trip
        # (the optimal steady state is a pattern over microbatches), unless what is
        # left is a proof (the hint near the bound) or the cuts make the full model
        # the better search (a model with them up to its cell limit); elsewhere the
        # full model keeps the whole time, and proves it (S and 2S at every size)
        decompose = (not by_time and memory_binds and problem.microbatches >= 2 * WINDOW
                     and large and horizon > lower * (1 + WINDOWLESS_GAP)
                     and not (cuts is not None
                              and cells <= WINDOWLESS_MAX_CELLS_WITH_CUTS))
    full_share = FULL_SHARE if decompose else TIME_FULL_SHARE if by_time else 1.0
    built = time.monotonic() - began
    first_limit = max(0.1, (deadline - time.monotonic()) * full_share)
    solver = new_solver(first_limit, threads)
    params = solver.parameters
    params.relative_gap_limit = max(0.0, gap)
    params.log_search_progress = log
    if seed is not None:
        params.random_seed = seed
    if fix_hint:
        params.fix_variables_to_their_hinted_value = True
    reporter = _Reporter(ticks.scale, progress, t0)
    solver.best_bound_callback = reporter.on_bound
    solving = time.monotonic()
    code = solver.solve(builder.model, reporter)
    # what a second run of the full model costs before it can stop: building it, and
    # how far past its limit the first ran (its load is not interruptible)
    full_model_start = built + max(0.0, time.monotonic() - solving - first_limit)
    wall = time.monotonic() - t0
    extra = {**_run_extra(ticks, hint, lower, "tight" if offload else "order"),
             "variables": len(builder.model.proto.variables),
             "constraints": len(builder.model.proto.constraints), **handles.size}
    if offload:
        extra["offload_levels"] = list(levels)
    status = {cp_model.OPTIMAL: OPTIMAL, cp_model.FEASIBLE: FEASIBLE,
              cp_model.INFEASIBLE: INFEASIBLE, cp_model.MODEL_INVALID: ERROR}.get(code, UNKNOWN)
    # CP-SAT stopped before it reported even the hint: the hint is still a valid answer,
    # and with time left the window search below starts from it
    from_hint = status == UNKNOWN
    if from_hint and not ((decompose or by_time) and not offload
                          and deadline - time.monotonic() > 1):
        return EngineResult(schedule=hint.schedule, status=FEASIBLE,
                            objective=hint.makespan / ticks.scale,
                            bound=lower / ticks.scale,
                            gap=relative_gap(hint.makespan / ticks.scale, lower / ticks.scale),
                            wall_time=wall, engine=ENGINE,
                            message="time limit reached before CP-SAT reported a "
                                    "schedule; returning its hint", extra=extra)
    if status not in (OPTIMAL, FEASIBLE, UNKNOWN):
        message = ("CP-SAT proved the model infeasible, though a hint exists: a bug"
                   if status == INFEASIBLE else
                   f"CP-SAT stopped with status {solver.status_name(code)} and no schedule")
        return EngineResult(schedule=None, status=status, objective=None, bound=None,
                            gap=None, wall_time=wall, engine=ENGINE, message=message,
                            extra=extra)
    if from_hint:
        # the full model did not even load within its share (V shape, 16 x 64 at S/2:
        # 131k variables); its windows are smaller problems, so search them from the hint
        status, timed, raw = FEASIBLE, hint, hint.makespan
        schedule = hint.schedule
        best_bound = float(lower)
        extra["full_model"] = "no schedule within its share; windows from the hint"
    else:
        schedule = _extract(problem, solver, handles, offload)
        timed = make_hint(schedule, ticks)
        raw = solver.objective_value
        best_bound = solver.best_objective_bound
    windows = "microbatch" if decompose else "time" if by_time else None
    if windows:
        # the search chose windows, whether or not any runs (the full model's share may
        # already have proven the optimum): recorded, so that the rule can be checked
        extra["windows"] = windows
    if windows and status != OPTIMAL and not offload and timed.makespan > best_bound and \
            deadline - time.monotonic() > 1:
        from optpipe.optimizer.decompose import time_window_search, window_search
        before = timed.makespan
        common = dict(lower=int(math.ceil(best_bound - 1e-9)), deadline=deadline,
                      threads=threads, progress=progress, t0=t0,
                      bound=best_bound / ticks.scale)
        if windows == "microbatch":
            timed, stats = window_search(problem, ticks, timed, window=WINDOW, **common)
            extra.update(window_steps=stats.steps, window_improvements=stats.improvements,
                         window_final=stats.window)
        else:
            timed, stats = time_window_search(problem, ticks, timed, **common,
                                              proof_seconds=full_model_start)
            extra.update(_time_window_extra(stats))
        # windows that stop finding shorter schedules before the deadline leave the
        # rest to the full model: a proof attempt (4 x 64 at S/2, one stage per device:
        # the microbatch windows stalled after 25 steps, 10 s, and the driver then
        # restarted the full model for a second run of 10 s, again 40% of it before
        # windows that found nothing)
        if timed.makespan > best_bound and \
                deadline - time.monotonic() > 1 + full_model_start:
            timed, closing_bound, extra["closing_run"], proven = _closing_run(
                problem, ticks, timed, lower, cuts, deadline, threads)
            best_bound = max(best_bound, closing_bound)
            if proven:
                status = OPTIMAL
        schedule = timed.schedule
        extra["window_gain"] = (before - timed.makespan) / ticks.scale
        raw = min(raw, timed.makespan)
    # The extracted orders, re-timed ASAP, are a solution of the same model (memory in
    # the order model depends on orders only; the tight model is already ASAP), so
    # their makespan is a legitimate objective value, never above the solver's.
    objective_ticks = min(raw, timed.makespan)
    extra["solver_objective"] = raw / ticks.scale
    if offload and timed.makespan != int(round(raw)):
        extra["asap_mismatch_ticks"] = int(round(raw)) - timed.makespan
    bound_ticks = min(best_bound, objective_ticks)
    wall = time.monotonic() - t0          # the window search's time included
    objective = objective_ticks / ticks.scale
    bound = bound_ticks / ticks.scale
    if status == FEASIBLE and bound_ticks >= objective_ticks:
        status = OPTIMAL
    return EngineResult(schedule=schedule, status=status, objective=objective, bound=bound,
                        gap=relative_gap(objective, bound), wall_time=wall, engine=ENGINE,
                        extra=extra)


def _windows_from_hints(problem: Problem, ticks: Ticks, hints: Sequence[Hint], lower: int,
                        deadline: float, threads: int, progress: ProgressFn | None,
                        t0: float) -> EngineResult:
    """A chunked placement past :data:`TIME_FULL_MAX_CELLS`: the time windows from the
    hints (fastest first; the search opens from several) until ``deadline``, the full
    model neither built nor run. The bound is ``lower`` (the memory bounds), all the
    full model proved there too."""
    from optpipe.optimizer.decompose import time_window_search

    hint = hints[0]
    timed, stats = time_window_search(problem, ticks, hint, lower=lower, deadline=deadline,
                                      threads=threads, progress=progress, t0=t0,
                                      bound=lower / ticks.scale, proof_seconds=math.inf,
                                      others=hints[1:])
    objective, bound = timed.makespan / ticks.scale, min(lower, timed.makespan) / ticks.scale
    extra = {**_run_extra(ticks, hint, lower, "order"), **_time_window_extra(stats),
             "full_model": f"not run: over {TIME_FULL_MAX_CELLS} stage x microbatch cells",
             "window_gain": (hint.makespan - timed.makespan) / ticks.scale,
             "solver_objective": objective}
    return EngineResult(schedule=timed.schedule,
                        status=OPTIMAL if timed.makespan <= lower else FEASIBLE,
                        objective=objective, bound=bound, gap=relative_gap(objective, bound),
                        wall_time=time.monotonic() - t0, engine=ENGINE, extra=extra)


def windows_from_the_start(problem: Problem) -> bool:
    """Does a chunked placement's run begin with the time windows, the full model
    neither built nor run first (past :data:`TIME_FULL_MAX_CELLS`)? The driver plans
    such a run's time by it too (:func:`~.spaces.expected_overrun`)."""
    return problem.stages * problem.microbatches > TIME_FULL_MAX_CELLS


def _run_extra(ticks: Ticks, hint: Hint, lower: int, model: str) -> dict[str, Any]:
    """What every run's ``extra`` says of its model and start."""
    return {"tick_seconds": 1.0 / ticks.scale, "exact_ticks": ticks.exact, "model": model,
            "hint": hint.schedule.name, "hint_makespan": hint.makespan / ticks.scale,
            "lower_bound": lower / ticks.scale, "placement": graph_placement(ticks.graph)}


def _time_window_extra(stats: Any) -> dict[str, Any]:
    """A time-window search's figures for ``extra`` (:class:`~.decompose.WindowStats`)."""
    return {"time_window_steps": stats.steps, "time_window_improvements": stats.improvements,
            "time_window_ticks": stats.window, "time_window_chain_steps": stats.chain_steps}


def _closing_run(problem: Problem, ticks: Ticks, timed: Hint, lower: int,
                 cuts: "PrefixCuts | None", deadline: float, threads: int
                 ) -> tuple[Hint, float, str, bool]:
    """The full model again until ``deadline``, hinted with ``timed`` and its horizon
    there: a proof attempt once the time windows stop finding shorter schedules.

    Returns the better of ``timed`` and what the run found, the run's proven bound
    (ticks; ``lower`` when it reported nothing), CP-SAT's status name, and whether it
    proved optimality.
    """
    builder, handles = build_order_model(problem, ticks, timed.makespan, lower, timed,
                                         cuts=cuts)
    builder.add_hints()
    solver = new_solver(max(0.1, deadline - time.monotonic()), threads)
    code = solver.solve(builder.model)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return timed, float(lower), solver.status_name(code), False
    found = make_hint(_extract(problem, solver, handles, False), ticks)
    return (found if found.makespan < timed.makespan else timed,
            solver.best_objective_bound, solver.status_name(code), code == cp_model.OPTIMAL)


class ReachBound(NamedTuple):
    """What :func:`solve_reach` proved: a bound in seconds, and whether it is exact (a
    piece proven exactly need not be solved again, :mod:`.prefix`)."""

    seconds: float
    optimal: bool


def solve_reach(problem: Problem, *, warm_start: Sequence[Schedule], time_limit: float,
                threads: int = 2, split_backward: bool = True,
                placement: Sequence[int] | None = None,
                cuts: "PrefixCuts | None" = None) -> ReachBound | None:
    """A proven lower bound on the start of the last microbatch's first forward,
    ``F(0, M - 1)``, over every schedule of ``problem`` (seconds, and whether it is the
    least start itself; None without a hint).

    Why: :mod:`.prefix` bounds how fast a pipeline can take in microbatches. The model
    is the order model with that start as the objective; its horizon is one no
    schedule's re-timing exceeds (the summed work and lags: every path of the ASAP
    re-timing of some optimal order visits each task once), so the horizon cuts off no
    optimum and the bound holds. ``cuts``: what fewer microbatches proved
    (:mod:`.prefix`), valid here too; they make the large pieces' proofs cheap.
    """
    return solve_least(problem, lambda start, makespan, dur:
                       start[(Op.F, 0, problem.microbatches - 1)],
                       warm_start=warm_start, time_limit=time_limit, threads=threads,
                       split_backward=split_backward, placement=placement, cuts=cuts)


def solve_least(problem: Problem, objective: Callable[..., Any], *,
                warm_start: Sequence[Schedule], time_limit: float, threads: int = 2,
                split_backward: bool = True, placement: Sequence[int] | None = None,
                cuts: "PrefixCuts | None" = None,
                condition: Callable[..., Any] | None = None) -> ReachBound | None:
    """A proven lower bound on ``objective(start, makespan, durations)`` (a linear
    expression of the order model's start variables, in ticks) over every schedule of
    ``problem`` that meets ``condition`` (same arguments, a constraint; None: every
    schedule): seconds, and whether it is the least value itself; ``inf`` when no
    schedule meets the condition; None without a hint. :func:`solve_reach` and
    ``scripts/bench_split_link.py`` build on it.

    The horizon is the summed work and lags: closing every stretch in which no task
    runs or is in flight between devices keeps every order, every memory row and any
    condition on which tasks end before which start, and lengthens no objective that
    measures from one task to another or to the end, so some optimum lies inside it.
    """
    if placement is not None and list(placement) == list(range(problem.devices)):
        placement = None
    ticks = make_ticks(problem, split_backward, False, DEFAULT_LEVELS, placement)
    try:
        hint = _pick_hint(problem, ticks, False, DEFAULT_LEVELS, list(warm_start))
    except NoHint:
        return None
    g = ticks.graph
    safe = int(sum(g.duration.values()) + len(g.keys) * g.lag) + 1
    builder, handles = build_order_model(problem, ticks, max(safe, hint.makespan), 0, hint,
                                         cuts=cuts)
    if condition is not None:
        builder.model.add(condition(handles.start, handles.makespan, g.duration))
    builder.model.minimize(objective(handles.start, handles.makespan, g.duration))
    builder.add_hints()
    solver = new_solver(max(0.05, time_limit), threads)
    code = solver.solve(builder.model)
    if code == cp_model.INFEASIBLE:
        return ReachBound(math.inf, True)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return ReachBound(solver.best_objective_bound / ticks.scale, code == cp_model.OPTIMAL)


def _extract(problem: Problem, solver: cp_model.CpSolver, handles: _Vars,
             offload: bool) -> Schedule:
    starts = {k: solver.value(v) for k, v in handles.start.items()}
    if not offload:
        return orders_from_starts(problem, starts, name="optpipe",
                                  placement=handles.placement)
    offloads: dict[tuple[int, int], float] = {}
    for (s, mb, x), lit in handles.level.items():
        if solver.boolean_value(lit):
            offloads[(s, mb)] = x
    after: dict[tuple[int, int], Key] = {}
    for sm in offloads:
        for c, r in handles.reload_choice[sm]:
            if solver.boolean_value(r):
                after[sm] = c
    waits = {sm for sm, w in handles.wait.items() if sm in offloads and solver.boolean_value(w)}
    return orders_from_starts(problem, starts, offloads=offloads, reload_after=after,
                              waits=waits, name="optpipe")
