"""CP-SAT's order model (no offload): memory decided by the order of compute.

One stage per device, or several (V shape, interleaved) via ``placement``. Interval per
task, no-overlap per device, data dependencies with p2p lag between devices, FIFO
chains, and memory as booleans ``b[i][j]`` = "B_j (or W_j, BW_j) has finished when F_i
starts", monotone in ``i`` and ``j`` (staircase implications), with one linear row per
F (plus a cumulative when a device holds several stages). Without transfers the memory
level at each F's start depends only on the *order* of compute on the device, so the
simulator, which recomputes times as early as possible (ASAP) from the extracted
orders, sees exactly the memory the model counted and a makespan no larger.

Why apart from the tight model (:mod:`.cpsat_tight`): past the shared base variables
(:mod:`.cpsat_model`) the two have no constraint in common, and this one is built on
its own beyond the engine's full run: by the window searches (:mod:`.decompose`), by
the prefix bounds (:func:`~.cpsat.solve_reach`, :func:`~.cpsat.solve_least`) and by
the scripts.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING, Any, Collection, Mapping, Sequence

from optpipe.optimizer.cpsat_model import (Builder, Hint, ModelVars, Ticks, base_vars,
                                           start_domains)
from optpipe.optimizer.preprocess import (Key, TaskGraph, graph_placement,
                                          memory_implied_orders)
from optpipe.problem import Problem
from optpipe.schedule import Op

if TYPE_CHECKING:
    from optpipe.optimizer.prefix import PrefixCuts

#: Rows over all stages of a device (not each stage alone) up to this many microbatches.
CROSS_STAGE_MAX_MICROBATCHES = 16


# ---------------------------------------------------------------- order model
def build_order_model(problem: Problem, ticks: Ticks, horizon: int, lower: int,
                      hint: Hint | None,
                      fixed_order: Sequence[Sequence[Key]] | None = None,
                      cuts: "PrefixCuts | None" = None,
                      free: Collection[Key] | None = None,
                      windows: Mapping[Key, tuple[int, int]] | None = None,
                      implied: Sequence[tuple[Key, Key]] | None = None,
                      capacity: Collection[int] | None = None
                      ) -> tuple[Builder, ModelVars]:
    """The no-offload model: memory decided by the order of compute on each device.

    ``fixed_order`` (per device, tasks in order) pins the relative order of those tasks;
    the decomposition (:mod:`.decompose`) uses it to re-optimize a window of tasks
    among the rest. ``free`` (with ``fixed_order`` and ``hint``: the tasks not pinned)
    lets the memory rows take the order of two pinned tasks from the hint as a constant
    instead of a boolean: the window's model then grows with the window, not with the
    problem (at 8 x 64 on the V shape CP-SAT's presolve alone took 5.8 s of a 6 s
    step). ``cuts`` (:mod:`.prefix`) add what smaller problems proved: least distances
    between the first stage's forwards, and the least time from one of them to the end.
    ``windows`` narrow the start variables' domains (:func:`~.cpsat_model.base_vars`). ``implied``:
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
    b = Builder()
    g = ticks.graph
    dur = g.duration
    # one set of domains for the variables and for the rows that read them
    domains = start_domains(g, horizon, windows)
    start, _, makespan = base_vars(b, g, horizon, lower, hint, domains, capacity)
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
    return b, ModelVars(start=start, makespan=makespan, size={"memory_rows": rows},
                        placement=placement)


def _prefix_cuts(b: Builder, g: TaskGraph, start: dict[Key, Any], makespan: Any,
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


def _order_memory(b: Builder, g: TaskGraph, d: int, start: dict[Key, Any],
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


def _sparse_row(b: Builder, families: Sequence[tuple[Op, int, int, int]], f: Key,
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


def _chunked_memory(b: Builder, g: TaskGraph, start: dict[Key, Any], hint: Hint | None,
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


def _imply(b: Builder, a: Any, c: Any) -> None:
    """``a => c`` where either side may be a constant (a pinned order, as a bool)."""
    if a is False or c is True:
        return
    if a is True:
        b.model.add_bool_or([c] if c is not False else [])
    elif c is False:
        b.model.add_bool_or([~a])
    else:
        b.model.add_implication(a, c)
