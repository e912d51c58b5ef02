"""The time-indexed ("count") MILP: exact when every duration is a multiple of one tick.

Why a second formulation: a disjunctive model's LP relaxation knows almost nothing about
how memory, latency and device contention interact (its big-M rows vanish at fractional
points), so when memory binds its bound stalls a few percent below the optimum. When all
task lengths and the p2p latency are whole multiples of a tick ``τ`` — uniform costs,
costs rounded to a profiler's resolution — the simulator only ever starts tasks at
multiples of ``τ``, and because microbatches of a stage are interchangeable (FIFO) a
stage's schedule is fully described by three step functions: how many F, B and W it has
started by each tick. Everything the simulator checks is linear in those counts:

* data flow: ``NF[s, t] ≤ NF[s-1, t - f - p2p]`` (the i-th F of stage s needs the i-th F
  upstream to have ended), likewise for B (downstream) and W (own B);
* one task at a time: ``Σ_X (N_X[s, t] - N_X[s, t - d_X]) ≤ 1``;
* memory at every tick: ``act·NF[s, t] - freed_b·NB[s, t-b] - freed_w·NW[s, t-w] ≤ room``
  (releases at a task's end come before an allocation at the same moment, as in the
  simulator);
* makespan: a monotone 0/1 ``z[t]`` ("all work done by t") and the objective
  ``Σ (1 - z[t])``, linked to each stage's last task by the convex hull of "the M-th
  task has started" (not ``M·z ≤ N``, which only bounds the average completion);
* energy: the work a stage has not started by ``t`` fits in the ticks after ``t`` that
  are not yet "all done";
* left-shift dominance: no stage idles for a whole B (W) length while that B (W) is
  ready (some optimum does so; see :meth:`TimeIndexedModel._add_dominance`).

Its LP relaxation carries the memory/latency cycle exactly and device contention in
aggregate, which is what closes the gap on the memory-bound benchmarks (``docs/milp.md``).
Counts outside each task's time window are fixed before building, so only the uncertain
part of each step function becomes integer variables.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from optpipe.optimizer import milp_prep
from optpipe.optimizer.milp_prep import HorizonTooSmall, Windows
from optpipe.optimizer.preprocess import Key, TaskGraph, choose_scale
from optpipe.problem import Problem
from optpipe.schedule import Op, Schedule
from optpipe.simulator import SimResult

#: largest number of (stage, op, tick) cells the time-indexed model is built for, and the
#: most ticks in its horizon: beyond these the rows get long, Python building slow and
#: the LP degenerate, and the disjunctive model (whose size does not grow with the tick
#: resolution) is the better choice
MAX_CELLS = 12000
MAX_TICKS = 600


def tick_for(problem: Problem, graph: TaskGraph) -> float | None:
    """The coarsest tick (seconds) of which every duration and the p2p latency are
    whole multiples, or None when there is none on a usable decimal grid."""
    values = [v for v in list(graph.duration.values()) + [problem.p2p] if v > 0]
    if not values:
        return None
    scale, exact = choose_scale(values)
    if not exact:
        return None
    ints = [int(round(v * scale)) for v in values]
    if any(abs(i - v * scale) > 1e-9 * max(1.0, v * scale) for i, v in zip(ints, values)):
        return None
    g = 0
    for i in ints:
        g = math.gcd(g, i)
    if g == 0:
        return None
    return float(Fraction(g) / Fraction(scale).limit_denominator(10 ** 12))


def cells(problem: Problem, graph: TaskGraph, horizon: float, tick: float) -> int:
    """Size measure used to decide whether the time-indexed model is affordable."""
    return problem.stages * len(graph.ops) * (int(round(horizon / tick)) + 1)


def affordable(problem: Problem, graph: TaskGraph, horizon: float, tick: float) -> bool:
    """Whether the time-indexed model of this horizon is small enough to be worth it."""
    return (cells(problem, graph, horizon, tick) <= MAX_CELLS
            and horizon / tick <= MAX_TICKS)


class TimeIndexedModel:
    """Pyomo model over per-stage step functions of started tasks (see module doc)."""

    formulation = "time-indexed"

    def __init__(self, problem: Problem, graph: TaskGraph, win: Windows, tick: float,
                 dominance: bool = True) -> None:
        import pyomo.environ as pyo

        self.dominance = dominance

        self.pyo = pyo
        self.problem = problem
        self.graph = graph
        self.win = win
        self.unit = tick
        self.offload = False
        S, M = problem.stages, problem.microbatches
        self.ops = list(graph.ops)
        self.d = {(s, op): self._ticks(graph.duration[(op, s, 0)])
                  for s in range(S) for op in self.ops}
        self.lag = self._ticks(problem.p2p)
        self.T = self._ticks(win.horizon)
        T = self.T
        lb_ticks = int(math.ceil(min(win.lower_bound, win.horizon) / tick - 1e-9))
        # windows -> fixed parts of each step function
        self.lo: dict[tuple[int, Op, int], int] = {}
        self.hi: dict[tuple[int, Op, int], int] = {}
        for s in range(S):
            for op in self.ops:
                est = sorted(self._ticks(win.est[win.index[(op, s, i)]], up=True)
                             for i in range(M))
                lst = sorted(self._ticks(win.lst[win.index[(op, s, i)]], up=False)
                             for i in range(M))
                for t in range(T + 1):
                    self.lo[(s, op, t)] = sum(1 for x in lst if x <= t)
                    self.hi[(s, op, t)] = sum(1 for x in est if x <= t)
        free = [key for key in self.lo if self.lo[key] < self.hi[key]]
        m = pyo.ConcreteModel(name="optpipe_milp_ti")
        self.m = m
        m.N = pyo.Var(free, within=pyo.Integers, bounds=lambda _, s, op, t:
                      (self.lo[(s, op, t)], self.hi[(s, op, t)]))
        m.z = pyo.Var(range(T + 1), within=pyo.Binary)
        self.cons = pyo.ConstraintList()
        m.cons = self.cons
        add = self.cons.add
        N = self.N
        split = graph.split_backward
        last = Op.W if split else Op.BW
        for s in range(S):
            f, lag = self.d[(s, Op.F)], self.lag
            bop = Op.B if split else Op.BW
            for t in range(T + 1):
                for op in self.ops:
                    self._row([(1, (s, op, t)), (-1, (s, op, t - 1))], ">=", 0)
                if s > 0:
                    self._row([(1, (s, Op.F, t)),
                               (-1, (s - 1, Op.F, t - self.d[(s - 1, Op.F)] - lag))], "<=", 0)
                self._row([(1, (s, bop, t)), (-1, (s, Op.F, t - f))], "<=", 0)
                if s < S - 1:
                    self._row([(1, (s, bop, t)),
                               (-1, (s + 1, bop, t - self.d[(s + 1, bop)] - lag))], "<=", 0)
                if split:
                    self._row([(1, (s, Op.W, t)), (-1, (s, Op.B, t - self.d[(s, Op.B)]))],
                              "<=", 0)
                self._row(self.busy_terms(s, t), "<=", 1)
            if self.dominance:
                self._add_dominance(s)
            room = problem.budget[s] - problem.static[s]
            act = problem.activation[s]
            if math.isfinite(room) and act > 0:
                fb = (problem.freed_by_b[s] if split else act) / act
                fw = problem.freed_by_w[s] / act if split else 0.0
                for t in range(T + 1):
                    terms = [(1, (s, Op.F, t)), (-fb, (s, bop, t - self.d[(s, bop)]))]
                    if split:
                        terms.append((-fw, (s, Op.W, t - self.d[(s, Op.W)])))
                    self._row(terms, "<=", room / act + 1e-9)
        for t in range(T + 1):
            if t > 0:
                add(m.z[t] >= m.z[t - 1])
            for s in range(S):
                # z[t] = 1 needs the last task started; N >= lo + (M - lo)·z is the
                # convex hull of that for counts known to be >= lo (tighter than M·z <= N)
                tl = t - self.d[(s, last)]
                lo = self.lo[(s, last, min(tl, T))] if tl >= 0 else 0
                self._add((M - lo) * m.z[t] - N(s, last, tl), "<=", -lo)
            if t < lb_ticks:
                m.z[t].fix(0)
        m.z[T].fix(1)
        # energy: work a stage has not started by t runs in ticks t+1 .. C-1, and the
        # ticks after t that are not yet "all done" are exactly R[t] = C - t - 1
        # (R kept as its own variable so that each row stays short)
        m.R = pyo.Var(range(T + 1), bounds=(0, T))
        for t in range(T + 1):
            add(m.R[t] == (m.R[t + 1] + 1 - m.z[t + 1]) if t < T else m.R[t] == 0)
        for s in range(S):
            for t in range(T):
                most = sum(self.d[(s, op)] * (M - self.lo_of(s, op, t)) for op in self.ops)
                if most <= 0:
                    continue
                rest = sum(self.d[(s, op)] * (M - N(s, op, t)) for op in self.ops)
                add(rest - m.R[t] <= 0)
        m.obj = pyo.Objective(expr=sum(1 - m.z[t] for t in range(T + 1)),
                              sense=pyo.minimize)
        self.n_free = len(free)

    # ------------------------------------------------------------- dominance
    def busy_terms(self, s: int, t: int) -> list[tuple[float, tuple[int, Op, int]]]:
        """Tasks of positive length running on stage ``s`` during tick ``t``, as terms."""
        out: list[tuple[float, tuple[int, Op, int]]] = []
        for op in self.ops:
            if self.d[(s, op)] > 0:
                out += [(1, (s, op, t)), (-1, (s, op, t - self.d[(s, op)]))]
        return out

    def _add_dominance(self, s: int) -> None:
        """Left-shift dominance: never leave a stage idle for a task's whole length while
        that task could run.

        Why valid: take an optimal schedule; if stage ``s`` is idle during
        ``[t, t + d)`` while the next B (or W) in FIFO order is ready at ``t``, move it
        there. It releases memory earlier, allocates nothing, and every successor may
        keep its start, so the schedule stays feasible and no longer. Repeating this
        ends (tasks only move earlier on a finite grid) in an optimal schedule that
        satisfies every row added here. B is ready when its downstream input has
        arrived (which implies its own F has ended); on the last stage when its F has
        ended. W is ready when its B has ended. Forwards are left alone: moving one
        earlier allocates memory earlier.
        """
        P, T = self.problem, self.T
        S = P.stages
        split = self.graph.split_backward
        bop = Op.B if split else Op.BW
        db = self.d[(s, bop)]
        for t in range(T + 1):
            if db > 0 and t + db - 1 <= T:
                if s < S - 1:
                    arrived = (s + 1, bop, t - self.d[(s + 1, bop)] - self.lag)
                else:
                    arrived = (s, Op.F, t - self.d[(s, Op.F)])
                top = self.hi_of(*arrived) - self.lo_of(s, bop, t - 1)
                if top >= 1:
                    terms = [(1, arrived), (-1, (s, bop, t - 1))]
                    for u in range(t, t + db):
                        terms += [(-top * c, cell) for c, cell in self.busy_terms(s, u)]
                    self._row(terms, "<=", 0)
            if split:
                dw = self.d[(s, Op.W)]
                if dw > 0 and t + dw - 1 <= T:
                    top = self.hi_of(s, Op.B, t - db) - self.lo_of(s, Op.W, t - 1)
                    if top >= 1:
                        terms = [(1, (s, Op.B, t - db)), (-1, (s, Op.W, t - 1))]
                        for u in range(t, t + dw):
                            terms += [(-top * c, cell) for c, cell in self.busy_terms(s, u)]
                        self._row(terms, "<=", 0)

    def hi_of(self, s: int, op: Op, t: int) -> int:
        """Most tasks of ``op`` stage ``s`` can have started by tick ``t`` (windows)."""
        return 0 if t < 0 else self.hi[(s, op, min(t, self.T))]

    def lo_of(self, s: int, op: Op, t: int) -> int:
        """Fewest tasks of ``op`` stage ``s`` must have started by tick ``t`` (windows)."""
        return 0 if t < 0 else self.lo[(s, op, min(t, self.T))]

    # ---------------------------------------------------------------- helpers
    def _ticks(self, seconds: float, up: bool | None = None) -> int:
        x = seconds / self.unit
        r = round(x)
        if abs(x - r) <= 1e-6 * max(1.0, abs(x)):
            return int(r)
        return int(math.ceil(x) if up else math.floor(x))

    def N(self, s: int, op: Op, t: int) -> Any:
        """Started tasks of ``op`` on stage ``s`` by tick ``t``: a constant or a variable."""
        if t < 0:
            return 0
        t = min(t, self.T)
        key = (s, op, t)
        if self.lo[key] == self.hi[key]:
            return self.lo[key]
        return self.m.N[key]

    def _row(self, terms: list[tuple[float, tuple[int, Op, int]]], sense: str,
             rhs: float) -> None:
        """Add ``Σ coef·N[cell] (<=|>=) rhs`` unless the windows already decide it.

        Rows that hold for every count within its window are dropped (half the rows of
        a typical model, which HiGHS's presolve would otherwise spend seconds on); a
        row that no count within the windows can satisfy proves the horizon too short.
        """
        low = high = 0.0
        expr_terms = []
        for coef, (s, op, t) in terms:
            lo, hi = self.lo_of(s, op, t), self.hi_of(s, op, t)
            if coef >= 0:
                low += coef * lo
                high += coef * hi
            else:
                low += coef * hi
                high += coef * lo
            if lo != hi:
                expr_terms.append((coef, (s, op, min(t, self.T))))
            else:
                pass
        tol = 1e-9
        if sense == "<=":
            if high <= rhs + tol:
                return
            if low > rhs + tol:
                raise HorizonTooSmall("time-indexed model: the time windows leave a row "
                                      "unsatisfiable")
        else:
            if low >= rhs - tol:
                return
            if high < rhs - tol:
                raise HorizonTooSmall("time-indexed model: the time windows leave a row "
                                      "unsatisfiable")
        const = sum(coef * self.lo_of(s, op, t) for coef, (s, op, t) in terms
                    if self.lo_of(s, op, t) == self.hi_of(s, op, t))
        merged: dict[tuple[int, Op, int], float] = {}
        for coef, cell in expr_terms:
            merged[cell] = merged.get(cell, 0.0) + coef
        expr = sum(c * self.m.N[cell] for cell, c in merged.items() if c != 0)
        if isinstance(expr, (int, float)):
            self._add(const + expr, sense, rhs)
            return
        self.cons.add(expr + const <= rhs if sense == "<=" else expr + const >= rhs)

    def _add(self, expr: Any, sense: str, rhs: float) -> None:
        """Add a row unless it is constant (then it must hold, or the windows are wrong)."""
        if isinstance(expr, (int, float)):
            ok = expr <= rhs + 1e-9 if sense == "<=" else expr >= rhs - 1e-9
            if not ok:
                # every count in the row is fixed by the windows: no schedule ends by
                # the horizon (a proof when the horizon is below the best known one)
                raise HorizonTooSmall("time-indexed model: a row fixed by the time "
                                      "windows is violated")
            return
        self.cons.add(expr <= rhs if sense == "<=" else expr >= rhs)

    def size(self) -> dict[str, int]:
        return {"variables": self.n_free + 2 * (self.T + 1), "integers": self.n_free,
                "binaries": self.T + 1, "constraints": len(self.cons),
                "ticks": self.T, "tick_seconds": self.unit}

    # ------------------------------------------------------------- MIP start
    def load_schedule(self, schedule: Schedule, result: SimResult) -> bool:
        """Counts and completion flags of a simulated FIFO schedule; True if it fits."""
        if schedule.offloads:
            return False
        starts: dict[tuple[int, Op], list[int]] = {}
        for r in result.records:
            a = r.action
            if not a.op.is_compute:
                continue
            x = r.start / self.unit
            if abs(x - round(x)) > 1e-6 * max(1.0, x):
                return False
            starts.setdefault((a.stage, a.op), []).append(int(round(x)))
        m = self.m
        for key in m.N:
            s, op, t = key
            m.N[key].set_value(sum(1 for x in starts.get((s, op), []) if x <= t),
                               skip_validation=True)
        C = int(round(result.makespan / self.unit))
        for t in range(self.T + 1):
            if not m.z[t].fixed:
                m.z[t].set_value(1 if t >= C else 0, skip_validation=True)
            m.R[t].set_value(max(0, C - t - 1), skip_validation=True)
        return milp_prep.max_violation(self.pyo, m) <= 1e-6

    def max_violation(self) -> float:
        return milp_prep.max_violation(self.pyo, self.m)

    # ------------------------------------------------------------- extraction
    def extract(self, name: str, provenance: dict[str, Any]) -> Schedule:
        """Per-device orders from the step functions: the i-th X starts where its count
        first reaches i+1; zero-length tasks starting at a tick go before the one task of
        positive length that may start there (their releases come first in the model)."""
        from optpipe.optimizer.extract import orders_from_starts

        pyo = self.pyo
        P = self.problem
        S, M = P.stages, P.microbatches
        start: dict[Key, int] = {}
        for s in range(S):
            for op in self.ops:
                i = 0
                for t in range(self.T + 1):
                    n = int(round(pyo.value(self.N(s, op, t))))
                    while i < min(n, M):
                        start[(op, s, i)] = t
                        i += 1
                if i < M:  # pragma: no cover - the model forces all work by T
                    raise RuntimeError(f"time-indexed solution misses {op.value} on stage {s}")
        rank = {Op.F: 2, Op.B: 0, Op.BW: 0, Op.W: 1}

        def key(k: Key) -> tuple:
            zero = self.d[(k[1], k[0])] == 0
            return (start[k], 0 if zero else 1, rank[k[0]], k[2])

        position: dict[Key, int] = {}
        for s in range(S):
            for p, k in enumerate(sorted((k for k in start if k[1] == s), key=key)):
                position[k] = p
        return orders_from_starts(P, position, name=name,
                                  provenance=provenance or {"source": "solver", "name": name})


