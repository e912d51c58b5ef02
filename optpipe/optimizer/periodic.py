"""Periodic schedules: one microbatch's pattern, repeated every ``P``, under the budget.

Why: when memory binds, the best schedules of a long pipeline are periodic in their
steady state — every device repeats the same few tasks for each microbatch — and what
decides them is one small question: at which offset in the period does each stage run
its F, B and W, so that no two tasks of a device collide (modulo ``P``), every
microbatch's data flows down and back with the p2p latency, and the activations held
over a microbatch's *lifespan* (its F's start to its B's or W's end) fit the budget.
The fixed schedules answer it for one memory level each (1F1B, ZB-H1/H2, ZB-V); the
"building block" view of Qi et al. 2024 (*Pipeline Parallelism with Controllable
Memory*) shows that a V-shaped block reaches near-zero bubble at half of 1F1B's memory,
where every fixed schedule we ship either does not fit or idles 25-45 %.

This module solves that block as a tiny CP-SAT model (a few dozen offsets, one
modular no-overlap pair per two tasks of a device), for any placement (one stage per
device, V shape, interleaved) and any per-stage costs, over a ladder of periods from
the busiest device's work per microbatch upward, and unrolls each block into a schedule:
microbatch ``j``'s task ``k`` is placed at ``offset[k] + j * P`` and every device runs its
tasks in that order. The simulator then re-times the orders as early as possible, which
squeezes the warm-up and the cool-down.

Memory is guaranteed, not hoped for: between a microbatch's F start and its release
lie ``L`` ticks, so at any moment at most ``ceil(L / P)`` microbatches of that stage hold
those bytes; the CP-SAT block bounds the sum over a device's stages by its room, and the
greedy checks the exact steady-state peak (:func:`steady_peak`). Without offload the
memory at each F depends only on the order of the device's tasks, which the unrolled
order and its ASAP re-timing share, and a finite run (no microbatches before 0 or after
M-1) only holds fewer. Tests check every unrolled schedule in the simulator.

Not done: blocks with offload. Tried (a block with OFFLOAD/RELOAD slots on the two
channels): with transfers, memory depends on times, and the simulator's as-early-as-
possible re-timing rushes the warm-up's forwards and issues reloads early, so small
cases went over budget; where they fit (8-16 stages, 32-64 microbatches, budget S/2) they
were 4-10 % slower than PipeOffload. The offload model stays with :mod:`.cpsat_tight`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

from ortools.sat.python import cp_model

from optpipe.optimizer.preprocess import Key, TaskGraph, choose_scale, task_graph
from optpipe.problem import Problem
from optpipe.schedule import Op, Schedule, from_orders, linear_placement

#: Periods tried: the busiest device's work per microbatch up to this multiple of it.
MAX_PERIOD_FACTOR = 8.0
#: Period step: the busiest device's work per microbatch over this.
PERIODS_PER_WORK = 100
#: Bisection steps of CP-SAT below the greedy's least period.
BISECTIONS = 5
#: Blocks CP-SAT shortens (the best by unrolled length).
REFINED = 3
#: Tick resolution when lengths have no round unit (ticks per shortest task).
TICKS_PER_SHORTEST = 1e4


@dataclass
class Block:
    """One microbatch's offsets (ticks) in a period of ``period`` ticks."""

    period: int
    offset: dict[tuple[Op, int], int]     # (op, stage) -> start within the block
    span: int                            # end of the block's last task


def _one_microbatch(graph: TaskGraph) -> tuple[list[tuple[Op, int]], dict, dict]:
    """Tasks of microbatch 0, their durations (whole ticks) and (predecessor, lag) lists."""
    tasks = [(op, s) for (op, s, m) in graph.keys if m == 0]
    duration = {(op, s): int(graph.duration[(op, s, 0)]) for op, s in tasks}
    deps = {(op, s): [((p[0], p[1]), lag) for p, lag in graph.deps[(op, s, 0)]]
            for op, s in tasks}
    return tasks, duration, deps


def greedy_block(graph: TaskGraph, period: int) -> Block | None:
    """Modulo list scheduling: each task, in dependency order, at its earliest free slot.

    The compilers' iterative modulo scheduling (Rau 1994) with the devices as the
    resources: a task takes the first start at or after its inputs are ready whose arc
    ``[start mod P, + d)`` misses the arcs already taken on its device. Fast (no search),
    so every period of a dense ladder can be tried; CP-SAT then shortens the best blocks.
    None when some task finds no slot or the block's lifespans exceed a budget.
    """
    tasks, dur, deps = _one_microbatch(graph)
    earliest = _earliest(tasks, dur, deps)
    taken: dict[int, list[tuple[int, int]]] = {}
    x: dict[tuple[Op, int], int] = {}
    for k in sorted(tasks, key=lambda k: (earliest[k], k[0] is Op.W)):
        ready = max((x[q] + dur[q] + int(lag) for q, lag in deps[k]), default=0)
        arcs = taken.setdefault(graph.device(k + (0,)), [])
        start = _first_free(arcs, ready, dur[k], period)
        if start is None:
            return None
        x[k] = start
        if dur[k]:
            arcs.append((start % period, dur[k]))
    block = Block(period=period, offset=x, span=max(x[k] + dur[k] for k in tasks))
    return block if _fits(graph, block) else None


def _first_free(arcs: list[tuple[int, int]], ready: int, length: int,
                period: int) -> int | None:
    """Least ``t >= ready`` whose arc ``[t, t + length)`` modulo ``period`` is free."""
    if length == 0:
        return ready
    candidates = sorted({ready} | {ready + (a + d - ready) % period for a, d in arcs})
    for t in candidates:
        r = t % period
        if all(_disjoint(r, length, a, d, period) for a, d in arcs):
            return t
    return None


def _disjoint(r1: int, d1: int, r2: int, d2: int, period: int) -> bool:
    """Arcs ``[r1, r1 + d1)`` and ``[r2, r2 + d2)`` on a circle of ``period`` miss."""
    return (r2 - r1) % period >= d1 and (r1 - r2) % period >= d2


def _fits(graph: TaskGraph, block: Block) -> bool:
    """Does the block's steady state (:func:`steady_peak`) fit every device's budget?"""
    p = graph.problem
    held: dict[int, list[tuple[int, int, float]]] = {}
    for op, amounts in _releases(graph):
        for s in range(p.stages):
            start = block.offset[(Op.F, s)]
            end = block.offset[(op, s)] + int(graph.duration[(op, s, 0)])
            held.setdefault(graph.device((Op.F, s, 0)), []).append((start, end, amounts[s]))
    return all(steady_peak(spans, block.period) <= p.budget[d] - p.static[d]
               for d, spans in held.items())


def steady_peak(spans: Sequence[tuple[int, int, float]], period: int) -> float:
    """Most bytes held at once when every ``[start, end)`` repeats every ``period``.

    Why exact and not ``sum(bytes * ceil(L / P))``: short spans that never overlap (a
    stage's F-to-OFFLOAD and RELOAD-to-B) would each count a whole microbatch. At time
    ``t`` a span holds its bytes for ``floor((t - start) / P) - floor((t - end) / P)``
    microbatches; the total only rises at a span's start, so those are the times to
    check. Releases come before allocations at equal times (half-open spans), as in
    the simulator.
    """
    best = 0.0
    for t, _, _ in spans:
        level = sum(amount * ((t - a) // period - (t - b) // period)
                    for a, b, amount in spans if b > a)
        best = max(best, level)
    return best


def _releases(graph: TaskGraph) -> list[tuple[Op, Sequence[int]]]:
    """What each backward op releases, per stage."""
    p = graph.problem
    return [(Op.B, p.freed_by_b), (Op.W, p.freed_by_w)] if graph.split_backward \
        else [(Op.BW, p.activation)]


def solve_block(graph: TaskGraph, period: int, *, time_limit: float = 1.0,
                threads: int = 1, hint: Block | None = None) -> Block | None:
    """The shortest block of period ``period`` (ticks) that fits every device's budget.

    ``graph`` must be in integer ticks (:meth:`TaskGraph.scaled`). Each offset is a
    residue ``r`` in ``[0, P)`` plus whole periods; a device's tasks are disjoint modulo
    ``P`` exactly when their intervals ``[r, r + d)`` and copies ``[r + P, r + P + d)``
    do not overlap (a plain no-overlap, which CP-SAT propagates well). Memory is the
    exact steady peak (:func:`steady_peak`): a lifespan ``L = q P + r`` holds ``q``
    microbatches' bytes at all times and one more over an arc of length ``r`` from its
    F's residue, so ``sum(bytes * q)`` plus a cumulative over the arcs (each with its
    copy one period on) must fit the room. The earlier rows, ``bytes * ceil(L / P)`` per
    span, over-counted spans that never peak together and missed blocks the greedy's
    exact check accepts (tests/test_periodic.py). Returns ``hint`` (None without one)
    when no better block exists (proven, or by the time-average lifespan check) or none
    is found in ``time_limit``.
    """
    p = graph.problem
    tasks, dur, deps = _one_microbatch(graph)
    by_device: dict[int, list[tuple[Op, int]]] = {}
    for k in tasks:
        by_device.setdefault(graph.device(k + (0,)), []).append(k)
    if any(sum(dur[k] for k in keys) > period for keys in by_device.values()):
        return hint
    earliest = _earliest(tasks, dur, deps)
    releases = _releases(graph)

    def least_held(d: int) -> float:
        """Bytes device ``d`` holds on average at least, from the shortest lifespans
        (Little's law: the peak is at least the time average, ``sum(bytes * L) / P``)."""
        stages = sorted({s for _, s in by_device[d]})
        return sum(amounts[s] * (earliest[(op, s)] + dur[(op, s)] - earliest[(Op.F, s)])
                   for s in stages for op, amounts in releases) / period
    if any(least_held(d) > p.budget[d] - p.static[d] for d in by_device):
        return hint
    horizon = 2 * max(earliest[k] + dur[k] for k in tasks) + 4 * period
    wraps = horizon // period + 1
    m = cp_model.CpModel()
    x = {}
    for k in tasks:
        name = f"{k[0].value}{k[1]}"
        r = m.new_int_var(0, period - 1, "r" + name)
        c = m.new_int_var(0, wraps, "c" + name)
        x[k] = m.new_int_var(earliest[k], horizon, "x" + name)
        m.add(x[k] == r + period * c)
        x[(k, "r")], x[(k, "c")] = r, c
    m.add(x[(Op.F, 0)] == 0)
    for k, preds in deps.items():
        for q, lag in preds:
            m.add(x[k] >= x[q] + dur[q] + int(lag))
    span = m.new_int_var(0, horizon + max(dur.values()), "span")
    for k in tasks:
        m.add(span >= x[k] + dur[k])
    for keys in by_device.values():
        arcs = []
        for k in keys:
            if dur[k] == 0:
                continue
            r = x[(k, "r")]
            arcs.append(m.new_fixed_size_interval_var(r, dur[k], "i"))
            arcs.append(m.new_fixed_size_interval_var(r + period, dur[k], "i+P"))
        m.add_no_overlap(arcs)
    for d, keys in by_device.items():
        room = p.budget[d] - p.static[d]
        if not math.isfinite(room):
            continue
        whole, arcs, demands = [], [], []
        for s in sorted({s for _, s in keys}):
            for op, amounts in releases:
                if amounts[s] == 0:
                    continue
                # exact steady state: a lifespan L = q P + r holds q microbatches' bytes
                # at every moment and one more over the arc [F's residue, + r) of the
                # circle; the arc and its copy one period on cover every phase exactly
                # once, so a cumulative over both is the steady peak (steady_peak)
                q = m.new_int_var(0, wraps + 1, f"q{op.value}{s}")
                r = m.new_int_var(0, period - 1, f"rl{op.value}{s}")
                m.add(q * period + r == x[(op, s)] + dur[(op, s)] - x[(Op.F, s)])
                start = x[((Op.F, s), "r")]
                end = m.new_int_var(0, 2 * period, f"re{op.value}{s}")
                m.add(end == start + r)
                arcs.append(m.new_interval_var(start, r, end, "arc"))
                arcs.append(m.new_interval_var(start + period, r, end + period, "arc+P"))
                demands += [int(amounts[s])] * 2
                whole.append(int(amounts[s]) * q)
        if arcs:
            unit = math.gcd(*demands)          # bytes share a large factor: keep it small
            cap = m.new_int_var(0, int(math.floor(room)) // unit, f"cap{d}")
            m.add(cap * unit == int(math.floor(room)) // unit * unit - sum(whole))
            m.add_cumulative(arcs, [v // unit for v in demands], cap)
    # shortest block first; then everything as early as it can be (a compact block
    # unrolls into a compact order)
    m.minimize(span * (len(tasks) + 1) + sum(x[k] for k in tasks))
    if hint is not None and hint.period == period:
        for k in tasks:
            m.add_hint(x[k], hint.offset[k])
            m.add_hint(x[(k, "r")], hint.offset[k] % period)
            m.add_hint(x[(k, "c")], hint.offset[k] // period)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, time_limit)
    solver.parameters.num_workers = max(1, threads)
    code = solver.solve(m)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return hint
    found = Block(period=period, offset={k: solver.value(x[k]) for k in tasks},
                  span=solver.value(span))
    return hint if hint is not None and hint.span <= found.span else found


def _earliest(tasks: list[tuple[Op, int]], dur: dict, deps: dict) -> dict:
    """Earliest offset of every task of one microbatch (longest path from F of stage 0).

    :func:`~.preprocess.earliest_starts` gives the same for microbatch 0, but over all
    ``M`` microbatches; this runs once per period tried, so it stays this small.
    """
    out: dict[tuple[Op, int], int] = {}

    def visit(k: tuple[Op, int]) -> int:
        if k not in out:
            out[k] = max((visit(q) + dur[q] + int(lag) for q, lag in deps[k]), default=0)
        return out[k]
    for k in tasks:
        visit(k)
    return out


def unroll(problem: Problem, graph: TaskGraph, block: Block, name: str,
           scale: float) -> Schedule:
    """Microbatch ``j`` at ``offset + j * period``; each device runs its tasks in time order."""
    rank = {k: i for i, k in enumerate(sorted(block.offset, key=lambda k: (
        block.offset[k], k[1] if k[0] is Op.F else -k[1], k[0] is not Op.F)))}
    placement = list(graph.placement) if graph.placement else linear_placement(problem.devices)
    timed: list[list[tuple[int, int, Key]]] = [[] for _ in range(problem.devices)]
    for (op, s), off in block.offset.items():
        for j in range(problem.microbatches):
            timed[placement[s]].append((off + j * block.period, rank[(op, s)], (op, s, j)))
    orders = [[(op.value, s, j) for _, _, (op, s, j) in sorted(seq)] for seq in timed]
    return from_orders(name, placement, problem.microbatches, orders,
                       provenance={"source": "optimizer", "name": name,
                                   "period_seconds": block.period / scale,
                                   "block_seconds": block.span / scale})


def periodic_schedules(problem: Problem, placement: Sequence[int] | None = None,
                       split_backward: bool = True, *, time_limit: float = 3.0,
                       threads: int = 1, label: str = "periodic") -> list[Schedule]:
    """Unrolled blocks of the most promising periods on ``placement``.

    Every period from the busiest device's work per microbatch up to
    :data:`MAX_PERIOD_FACTOR` times it is tried with :func:`greedy_block`; the blocks
    that fit are ranked by their unrolled length ``(M - 1) P + span``; CP-SAT looks for
    shorter periods than the greedy's least by bisection, and shortens the best
    :data:`REFINED` of them (:func:`solve_block`, hinted with the
    greedy block) in the time left. Returns [] when no period fits (the budget may
    only allow a non-periodic schedule).
    """
    t0 = time.monotonic()
    seconds = task_graph(problem, split_backward, placement)
    positive = [v for v in list(seconds.duration.values()) + [problem.p2p] if v > 0]
    shortest = min((v for v in seconds.duration.values() if v > 0), default=1.0)
    scale, _ = choose_scale(positive, exact_min_ticks=20, shortest=shortest)
    scale = min(scale, TICKS_PER_SHORTEST / shortest)    # rounding only re-times orders
    graph = seconds.scaled(scale)
    work: dict[int, float] = {}
    for k in graph.keys:
        if k[2] == 0:
            work[graph.device(k)] = work.get(graph.device(k), 0) + graph.duration[k]
    base = int(math.ceil(max(work.values())))
    step = max(1, base // PERIODS_PER_WORK)
    blocks = []
    for period in range(base, int(base * MAX_PERIOD_FACTOR) + 1, step):
        block = greedy_block(graph, period)
        if block is not None:
            blocks.append(block)
        if time.monotonic() - t0 > time_limit / 2:
            break
    # periods below the greedy's least one: tight tilings the greedy cannot find, by
    # bisection between the work (maybe feasible) and that period (feasible)
    lo = base - 1
    hi = min((b.period for b in blocks), default=int(base * MAX_PERIOD_FACTOR) + 1)
    for _ in range(BISECTIONS):
        left = time_limit / 2 - (time.monotonic() - t0)
        if left <= 0.05 or hi - lo <= max(1, base // PERIODS_PER_WORK):
            break
        period = (lo + hi) // 2
        block = solve_block(graph, period, time_limit=left / 2, threads=threads)
        if block is None:
            lo = period           # none found (or none exists): look higher
        else:
            hi = period
            blocks.append(block)
    M = problem.microbatches
    blocks.sort(key=lambda b: (M - 1) * b.period + b.span)
    chosen = blocks[:REFINED]
    for i, block in enumerate(chosen):
        left = time_limit - (time.monotonic() - t0)
        if left <= 0.05:
            break
        chosen[i] = solve_block(graph, block.period, time_limit=left / (len(chosen) - i),
                                threads=threads, hint=block) or block
    return [unroll(problem, graph, block, f"{label}-p{block.period / scale:.4g}", scale)
            for block in chosen]

