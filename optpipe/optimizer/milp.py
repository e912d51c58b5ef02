"""The Pyomo MILP engine: the simulator's rules as a mixed-integer program (HiGHS or Gurobi).

What is modelled (exactly the simulator's semantics, base problem, one stage per device):
a start time per compute task (F, B, W per stage and microbatch, or fused BW), data
dependencies with ``p2p`` between devices, one compute task at a time per device, the
memory budget of each device, and (``offload=True``) activation offload/reload on the
device's two host-link channels. The objective is the makespan.

Why it is tractable (details and measurements in ``docs/milp.md``):

* FIFO per op type and stage (microbatches are interchangeable), so the only decisions
  are how a device interleaves its F, B and W chains;
* preprocessing (:mod:`optpipe.optimizer.milp_prep`) fixes every order that
  dependencies, memory or time windows already decide, and gives tight windows, lower
  bounds and a warm start (the best of the caller's, the shared fixed schedules and our
  greedy family);
* two formulations. **Disjunctive** (any data, and offload): one binary per undecided
  pair of tasks of different chains with a big-M from the two windows, "staircase"
  links between neighbouring pairs, memory as linear counts of the tasks done before
  each F (exact: a compute-only order fixes the memory curve), energy rows tying the
  counts to time. **Time-indexed** (:mod:`optpipe.optimizer.milp_ti`; every duration a
  multiple of one tick): per-stage step functions of started tasks, whose LP carries
  the memory/latency cycle and proves the memory-bound cases where the disjunctive LP
  stalls a few percent short;
* Pyomo's standard-form compiler hands the model to ``highspy`` directly (MIP start,
  callbacks, ``fork``-safe), and on two free cores two different searches run as a
  portfolio.

The extracted schedule is simulated before it is returned: the reported objective is
its simulated makespan (never above the model's, since the simulator starts every task
as early as the extracted order allows), and a schedule over budget is never returned.

Offload model (``offload=True``; why each choice keeps the simulator on the safe side):
an OFFLOAD is listed right after its F; a RELOAD of microbatch ``i`` is listed right after
a compute task ``X`` (an ``F_j``, ``j > i``, or a ``B_k`` or ``W_k``, ``k < i``) between
``F_i`` and ``B_i``, so its buffer is reserved exactly at ``X``'s end, which is where the model
counts it from; reloads run in microbatch order. The simulator may start any task
earlier than the model and never makes a forward wait for an offload, so an offload is
counted as released at a checkpoint only when the compute work listed between its F and
that checkpoint is at least the d2h channel's backlog (an upper bound the model
carries), which holds however the simulator shifts tasks.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from optpipe.errors import InfeasibleError, OptPipeError
from optpipe.optimizer import milp_prep
from optpipe.optimizer.milp_prep import Windows
from optpipe.optimizer.preprocess import (Candidate, Key, TaskGraph, canonical_form,
                                          sequential_schedule, task_graph,
                                          warm_start as shared_warm_start)
from optpipe.optimizer.result import FEASIBLE, OPTIMAL, EngineResult, relative_gap
from optpipe.problem import Problem
from optpipe.schedule import Op, Schedule
from optpipe.simulator import SimResult, simulate

SOLVERS = ("highs", "gurobi")

#: relative slack allowed between the model's objective and the simulated makespan
#: before the difference is noted in ``extra`` (the simulated value is what is reported)
OBJ_TOL = 1e-6

#: room (in model time units, i.e. longest tasks) an offload must leave before it
#: counts as released; far above the solvers' 1e-6 feasibility tolerance
RELEASE_MARGIN = 1e-4


# ====================================================================== entry point
def solve_milp(problem: Problem, *, warm_start: Schedule | None = None,
               time_limit: float = 60, gap: float = 0.0, threads: int = 2,
               solver: str = "highs", offload: bool = False, split_backward: bool = True,
               progress: Callable[..., None] | None = None,
               formulation: str = "auto", own_heuristics: bool = True) -> EngineResult:
    """Solve ``problem`` to (proven) minimal makespan under its per-device budgets.

    ``warm_start`` is any fitting schedule of the problem (it is rewritten into FIFO
    form; an unusable one is ignored); the engine also tries the shared fixed schedules
    and its own greedy ones and starts from the best. ``time_limit`` (seconds) covers
    preprocessing, model building and the solve; ``gap`` is the relative optimality gap
    at which the solver may stop; ``solver`` is ``"highs"`` or ``"gurobi"``.
    ``progress`` is called with the elapsed time, incumbent, bound and gap, periodically
    while the solver runs and once at the end (a one-argument callable gets a dict with
    keys ``elapsed``, ``incumbent``, ``bound``, ``gap``; a four-argument one gets them as
    positional arguments, as :data:`optpipe.optimizer.result.ProgressFn` states).
    ``formulation`` is ``"auto"`` (time-indexed when every duration is a whole multiple
    of one tick and the model is small enough, else disjunctive), ``"disjunctive"`` or
    ``"time-indexed"``; offload is modelled by the disjunctive formulation only.
    ``own_heuristics=False`` starts from ``warm_start`` (or, without one, the
    sequential schedule) alone instead of the best of all fixed schedules; tests use it
    to make the model, not a heuristic, find the optimum.

    With ``offload=True`` "optimal" and the bound refer to the modelled offload policy
    (OFFLOAD right after its F, RELOAD right after an F, B or W, whole activations,
    conservative release accounting; ``extra["optimality"]`` says so): a schedule
    outside that policy could in principle be shorter.

    Returns an :class:`EngineResult` whose schedule carries its provenance. Raises
    :class:`OptPipeError` when the solver is missing or not licensed for the model's
    size, :class:`InfeasibleError` when no schedule fits the budget.
    """
    t0 = time.perf_counter()
    solver = _normalize_solver(solver)
    _check_solver_installed(solver)
    formulation = _normalize_formulation(formulation)
    if problem.chunks != 1:
        raise OptPipeError("the MILP schedules the base problem (one stage per device); "
                           "pass the unsplit problem")
    report = _Progress(progress, t0)
    graph = task_graph(problem, split_backward)
    milp_prep.memory_orders(problem, graph)  # raises InfeasibleError below one activation
    cands = _candidates(problem, graph, warm_start, split_backward, offload,
                        own_heuristics)
    plain = [c for c in cands if not c.schedule.offloads]
    if not plain:
        raise InfeasibleError("no schedule fits the memory budget", min_budget=[
            problem.static[d] + problem.activation[d] for d in range(problem.devices)])
    incumbent = min(plain, key=lambda c: c.makespan)
    horizon = incumbent.makespan
    win = milp_prep.prepare(problem, graph, horizon, use_memory=not offload)
    lower = min(win.lower_bound, horizon)
    extra: dict[str, Any] = {"formulation": "none", "warm_start": incumbent.name,
                             "warm_start_makespan": horizon, "prep": dict(win.stats),
                             "offload": offload, "split_backward": split_backward}
    if lower >= horizon * (1 - 1e-9):
        # the warm start meets a proven lower bound: nothing to solve
        return _finish(problem, incumbent.schedule, incumbent.result, OPTIMAL, horizon,
                       horizon, solver, t0, time_limit, extra, report,
                       "warm start meets the lower bound")
    model = _build_model(problem, graph, win, offload, formulation)
    extra["formulation"] = model.formulation
    extra["model"] = model.size()
    started = False
    for cand in sorted(cands, key=lambda c: c.makespan):
        if cand.makespan <= horizon * (1 + 1e-12) and model.load_schedule(cand.schedule,
                                                                          cand.result):
            started = True
            extra["mip_start"] = cand.name
            if cand.makespan < horizon * (1 - 1e-12):
                # an offloading schedule the model represents beats every plain one:
                # rebuild over its (shorter) horizon, so windows and big-Ms shrink
                win2 = milp_prep.prepare(problem, graph, cand.makespan, use_memory=False)
                model2 = _build_model(problem, graph, win2, offload, formulation)
                if model2.load_schedule(cand.schedule, cand.result):
                    incumbent, horizon, win, model = cand, cand.makespan, win2, model2
                    lower = min(win.lower_bound, horizon)
                    extra.update(warm_start=cand.name, warm_start_makespan=horizon,
                                 model=model.size())
                else:  # pragma: no cover - a shorter horizon only removes schedules
                    model.load_schedule(cand.schedule, cand.result)
            break
    tasks = [_Task(model, started, PORTFOLIO[0])]
    if solver == "highs" and threads >= 2 and _free_cores() >= 1.5:
        tasks.append(_second_task(problem, graph, model, win, started, horizon))
        if tasks[-1] is None:
            # no schedule ends one tick earlier: the warm start is optimal
            return _finish(problem, incumbent.schedule, incumbent.result, OPTIMAL, horizon,
                           horizon, solver, t0, time_limit, extra, report,
                           "no schedule is one tick shorter than the warm start")
    deadline = t0 + max(time_limit, time.perf_counter() - t0 + 1.0)
    run = _run_solver(tasks, solver, deadline, gap, threads, report)
    extra.update(run.extra)
    best_sched, best_res = incumbent.schedule, incumbent.result
    if run.has_solution:
        sched = (run.schedule if run.schedule is not None
                 else run.model.extract(name="milp", provenance={}))
        res = simulate(problem, sched)
        if not res.fits:  # pragma: no cover - the model and simulator disagree: a bug
            extra["rejected"] = (f"extracted schedule peaks at {res.peak_memory}, over "
                                 f"budget {list(problem.budget)}")
        else:
            if res.makespan > run.objective * (1 + OBJ_TOL) + 1e-12:  # pragma: no cover
                # within solver tolerances the model's times may be a hair optimistic;
                # the simulated makespan is the truth and is what gets reported
                extra["model_vs_simulated"] = (run.objective, res.makespan)
            if res.makespan < best_res.makespan * (1 - 1e-12):
                best_sched, best_res = sched, res
        extra["model_objective"] = run.objective
    bound = max(lower, run.bound if run.bound is not None else lower)
    g = relative_gap(best_res.makespan, bound)
    proven = g is not None and g <= max(gap, 1e-9)
    if run.optimal and "rejected" not in extra:
        # the model's optimum is the best schedule (ours, or the warm start if no worse)
        proven = True
    status = OPTIMAL if proven else FEASIBLE
    bound = min(bound, best_res.makespan)
    if run.error:
        extra["solver_error"] = run.error
    before = best_res.makespan
    best_sched, best_res = _not_worse_than_given(problem, warm_start, best_sched, best_res,
                                                 offload)
    if best_res.makespan < before and bound > best_res.makespan * (1 + 1e-9):
        # the given schedule lies outside the modelled space (an offload pattern the
        # model does not represent): the model's bound does not cover it
        status, bound = FEASIBLE, min(lower, best_res.makespan)
    if offload:
        extra["optimality"] = ("within the modelled offload policy (see docs/milp.md); "
                               "the bound covers schedules of that policy")
    bound = min(bound, best_res.makespan)
    return _finish(problem, best_sched, best_res, status, best_res.makespan, bound, solver,
                   t0, time_limit, extra, report, run.message)


def _not_worse_than_given(problem: Problem, given: Schedule | None, sched: Schedule,
                          res: SimResult, offload: bool) -> tuple[Schedule, SimResult]:
    """Return the caller's warm start itself when it simulates shorter than our answer.

    Why: the model only sees FIFO-canonical schedules; a given schedule outside that
    form (say, offload placed differently) may still be the best one known, and the
    engine promises never to do worse than its warm start.
    """
    if given is None or (given.offloads and not offload):
        return sched, res
    try:
        sim = simulate(problem, given)
    except OptPipeError:
        return sched, res
    if sim.fits and sim.makespan < res.makespan * (1 - 1e-12):
        return given, sim
    return sched, res


# ================================================================ warm starts
def _candidates(problem: Problem, graph: TaskGraph, given: Schedule | None,
                split_backward: bool, offload: bool,
                own_heuristics: bool = True) -> list[Candidate]:
    """Every fitting FIFO schedule we can start from, best first.

    Why several sources: the caller's warm start may be missing, fused or non-FIFO; the
    shared fixed schedules are memory-capped 1F1B variants (and the registered
    generators); our greedy family is zero-bubble-like. The horizon, hence every big-M,
    comes from the best of them.
    """
    raw: list[tuple[str, Schedule]] = []
    if given is not None:
        raw.append(("given", given))
    if own_heuristics:
        try:
            ws = shared_warm_start(problem, split_backward=split_backward, offload=offload)
            if ws is not None:
                raw.append((ws[0].name, ws[0]))
        except OptPipeError:
            pass
        for sch in milp_prep.greedy_family(problem, split_backward):
            raw.append((sch.name, sch))
    else:
        raw.append(("sequential", sequential_schedule(problem, split_backward)))
    out: list[Candidate] = []
    for name, sch in raw:
        if sch.offloads and not offload:
            continue
        try:
            canon = canonical_form(sch, problem, split_backward)
            if canon is None and not sch.offloads:
                canon = canonical_form(fifo_relabel(sch), problem, split_backward)
            if canon is None:
                continue
            res = simulate(problem, canon)
        except OptPipeError:
            continue
        if res.fits:
            out.append(Candidate(name, canon, res))
    out.sort(key=lambda c: c.makespan)
    return out


def fifo_relabel(schedule: Schedule) -> Schedule:
    """The same per-device orders with the k-th F (B, W, BW) of each stage on microbatch k.

    Why this is never worse (compute-only schedules): the k-th F of a stage needs k
    distinct upstream F to have ended, so the k-th upstream F has ended too; likewise for
    B (downstream B and its own k-th F) and W (its k-th B). So every relabelled task can
    start no later than the task it replaces, and memory, which depends only on how many
    of each op a device has run, is unchanged.
    """
    from optpipe.schedule import Action

    actions = []
    for acts in schedule.actions:
        count: dict[tuple[Op, int], int] = {}
        seq = []
        for a in acts:
            k = count.get((a.op, a.stage), 0)
            count[(a.op, a.stage)] = k + 1
            seq.append(Action(a.op, a.stage, k, a.fraction))
        actions.append(seq)
    return Schedule(name=schedule.name, stages=schedule.stages, devices=schedule.devices,
                    microbatches=schedule.microbatches, placement=list(schedule.placement),
                    actions=actions, provenance=dict(schedule.provenance))


# ================================================================ the model
def _build_model(problem: Problem, graph: TaskGraph, win: Windows, offload: bool,
                 formulation: str) -> Any:
    """Pick and build the formulation (see :func:`solve_milp`)."""
    from optpipe.optimizer import milp_ti

    choice = _normalize_formulation(formulation)
    if choice != "disjunctive" and not offload:
        tick = milp_ti.tick_for(problem, graph)
        zero = any(graph.duration[k] <= 0 for k in graph.keys if k[0] is not Op.W)
        if tick is not None and not zero and (
                choice == "time-indexed" or _prefer_time_indexed(problem, graph, win, tick)):
            return milp_ti.TimeIndexedModel(problem, graph, win, tick)
    if choice == "time-indexed":
        raise OptPipeError("the time-indexed formulation needs durations that are whole "
                           "multiples of one tick and no offload; use 'disjunctive'")
    return _DisjunctiveModel(problem, graph, win, offload=offload)


def _normalize_formulation(formulation: str) -> str:
    choice = (formulation or "auto").strip().lower().replace("_", "-")
    if choice not in ("auto", "disjunctive", "time-indexed"):
        raise OptPipeError(f"unknown MILP formulation {formulation!r}; choose 'auto', "
                           f"'disjunctive' or 'time-indexed'")
    return choice


def _prefer_time_indexed(problem: Problem, graph: TaskGraph, win: Windows,
                         tick: float) -> bool:
    """The "auto" rule: time-indexed when memory binds and the tick is coarse.

    Why: the time-indexed LP is what proves memory-bound instances (the disjunctive
    one stalls a few percent short), but its size grows with the number of ticks; when
    the tick is much finer than a task (a small p2p, irregular costs) or memory never
    binds, the disjunctive model, whose size does not depend on the tick, is faster.
    Measured in ``docs/milp.md``.
    """
    from optpipe.optimizer import milp_ti

    if not milp_ti.affordable(problem, graph, win.horizon, tick):
        return False
    if not win.stats.get("memory_orders"):
        return False
    tasks_per_stage = len(graph.keys) / problem.stages
    return win.horizon / tick <= 5 * tasks_per_stage


class _DisjunctiveModel:
    """The Pyomo model, the maps from tasks to its variables, MIP start and extraction.

    Time inside the model is in units of ``unit`` seconds (the longest task), so that
    coefficients and big-Ms are O(1…1000) whatever the problem's scale.
    """

    formulation = "disjunctive"

    def __init__(self, problem: Problem, graph: TaskGraph, win: Windows,
                 offload: bool = False) -> None:
        import pyomo.environ as pyo

        self.pyo = pyo
        self.problem = problem
        self.graph = graph
        self.win = win
        self.offload = offload and any(math.isfinite(b) for b in problem.budget)
        positive = [d for d in win.dur if d > 0] + ([problem.p2p] if problem.p2p > 0 else [])
        self.unit = max(positive) if positive else 1.0
        u = self.unit
        N = len(win.keys)
        self.N = N
        self.dur = [d / u for d in win.dur]
        self.est = [e / u for e in win.est]
        self.lst = [max(l, e) / u for l, e in zip(win.lst, win.est)]
        self.tail = [q / u for q in win.tail]
        self.H = win.horizon / u
        self.LB = min(win.lower_bound, win.horizon) / u
        m = pyo.ConcreteModel(name="optpipe_milp")
        self.m = m
        m.s = pyo.Var(range(N), bounds=lambda _, a: (self.est[a], self.lst[a]))
        m.C = pyo.Var(bounds=(self.LB, self.H))
        self.pair_index = {pair: p for p, pair in enumerate(win.free_pairs)}
        m.v = pyo.Var(range(len(win.free_pairs)), within=pyo.Binary)
        self.cons = pyo.ConstraintList()
        m.cons = self.cons
        P = problem
        self.off_stages = [s for s in range(P.stages)
                           if math.isfinite(P.budget[s] - P.static[s])
                           and P.activation[s] > 0 and P.microbatches > 1] \
            if self.offload else []
        self._build_compute()
        if self.offload:
            self._build_offload()
        m.obj = pyo.Objective(expr=m.C, sense=pyo.minimize)

    # ---------------------------------------------------------------- helpers
    def add(self, relation: Any) -> None:
        """Add a row; a relation that folded to a constant must hold and is dropped."""
        if isinstance(relation, bool):
            if not relation:  # pragma: no cover - windows come from a feasible horizon
                raise RuntimeError("MILP: a constant row is violated")
            return
        self.cons.add(relation)

    def before(self, a: int, b: int) -> Any:
        """1 if task ``a`` runs before task ``b`` (same device): a constant or a binary."""
        fixed = self.win.order(a, b)
        if fixed is not None:
            return 1 if fixed else 0
        if a < b:
            return self.m.v[self.pair_index[(a, b)]]
        return 1 - self.m.v[self.pair_index[(b, a)]]

    def k(self, op: Op, s: int, mb: int) -> int:
        return self.win.index[(op, s, mb)]

    def size(self) -> dict[str, int]:
        """Variables, binaries and constraints (what a size-limited license counts)."""
        nv = self.N + 1 + len(self.win.free_pairs) + self._extra_vars
        return {"variables": nv, "binaries": len(self.win.free_pairs) + self._extra_bins,
                "constraints": len(self.cons), "tasks": self.N}

    _extra_vars = 0
    _extra_bins = 0

    # ------------------------------------------------------------ compute model
    def _build_compute(self) -> None:
        m, win, add = self.m, self.win, self.add
        dur, est, lst = self.dur, self.est, self.lst
        lag_u = 1.0 / self.unit
        # data dependencies and chains, then deduced orders
        for a, b, lag in win.edges:
            add(m.s[b] >= m.s[a] + dur[a] + lag * lag_u)
        for a, b in win.added:
            add(m.s[b] >= m.s[a] + dur[a])
        # disjunctions with per-pair big-M from windows
        for p, (a, b) in enumerate(win.free_pairs):
            m_ab = max(0.0, lst[a] + dur[a] - est[b])  # relaxes "a before b" when v = 0
            m_ba = max(0.0, lst[b] + dur[b] - est[a])  # relaxes "b before a" when v = 1
            add(m.s[b] >= m.s[a] + dur[a] - m_ab * (1 - m.v[p]))
            add(m.s[a] >= m.s[b] + dur[b] - m_ba * m.v[p])
        # staircase links between neighbouring pairs of the same two chains
        nxt = self._chain_next()
        for (a, b) in win.free_pairs:
            # a before b  =>  a before next(b);   next(a) before b  =>  a before b
            for x, y in ((a, b), (b, a)):
                ny = nxt[y]
                if ny is not None:
                    lhs, rhs = self.before(x, y), self.before(x, ny)
                    if not (isinstance(lhs, int) or isinstance(rhs, int)):
                        add(lhs <= rhs)
        # makespan: tails, and per device the work that must follow a task
        for a in range(self.N):
            add(m.C >= m.s[a] + self.tail[a])
        for tasks in win.device_tasks:
            head = min(est[t] for t in tasks)
            for a in tasks:
                after = [(dur[b], self.before(a, b)) for b in tasks if b != a]
                if any(not isinstance(x, int) for _, x in after):
                    add(m.C >= m.s[a] + dur[a] + sum(d * x for d, x in after))
                    add(m.s[a] >= head + sum(d * self.before(b, a) for b in tasks if b != a
                                             for d in (dur[b],)))
        # memory at every forward's start
        P = self.problem
        split = self.graph.split_backward
        M = P.microbatches
        for s in range(P.stages):
            room = P.budget[s] - P.static[s]
            act = P.activation[s]
            if not math.isfinite(room) or act <= 0 or s in self.off_stages:
                continue
            scale = float(act)
            for i in range(M):
                f = self.k(Op.F, s, i)
                freed = []
                if split:
                    for j in range(i):
                        freed.append((P.freed_by_b[s], self.before(self.k(Op.B, s, j), f)))
                        freed.append((P.freed_by_w[s], self.before(self.k(Op.W, s, j), f)))
                else:
                    for j in range(i):
                        freed.append((act, self.before(self.k(Op.BW, s, j), f)))
                worst = (i + 1) * act - sum(c * x for c, x in freed if isinstance(x, int))
                if worst <= room + 1e-9 * act:
                    continue
                add((i + 1) - sum((c / scale) * x for c, x in freed) <= room / scale)

    def _chain_next(self) -> list[Optional[int]]:
        nxt: list[Optional[int]] = [None] * self.N
        for chain in self.graph.chains:
            for x, y in zip(chain, chain[1:]):
                nxt[self.win.index[x]] = self.win.index[y]
        return nxt

    # ------------------------------------------------------------ offload model
    def _build_offload(self) -> None:
        """Offload choices, reload attachments, channel backlog and memory checkpoints.

        Per stage and microbatch ``i``: ``o[i]`` offloads it; ``a[i, X]`` says its RELOAD
        is listed right after compute task ``X`` (an ``F_j``, ``j > i``, or a ``B_k`` or
        ``W_k``, ``k < i``, that comes after ``F_i`` and before ``B_i``), so its buffer is
        reserved at ``X``'s end. Memory is checked where it can rise: at each F's start
        and at the end of every task a reload may follow. An offload counts as released
        at a checkpoint only when ``beta[i]`` (an upper bound on how long after ``F_i``'s
        end the d2h channel finishes it, computed from the work listed between forwards)
        is at most the work listed between ``F_i`` and that checkpoint: the simulator
        cannot run that work faster than back to back, so the release really happened.
        """
        pyo, m, add = self.pyo, self.m, self.add
        P = self.problem
        M = P.microbatches
        split = self.graph.split_backward
        dur = self.dur
        big = self.H * 2 + 1.0
        bop = Op.B if split else Op.BW
        st = self.off_stages
        self.cand: dict[tuple[int, int], list[Key]] = {}
        for s in st:
            for i in range(M):
                self.cand[(s, i)] = ([(Op.F, s, j) for j in range(i + 1, M)]
                                     + [(bop, s, k) for k in range(i)]
                                     + ([(Op.W, s, k) for k in range(i)] if split else []))
        idx_o = [(s, i) for s in st for i in range(M)]
        idx_a = [(s, i, c) for s in st for i in range(M) for c in range(len(self.cand[(s, i)]))]
        idx_e = [(s, i, j) for s in st for i in range(M) for j in range(i + 1, M)]
        idx_eb = [(s, i, k) for s in st for i in range(M) for k in range(i)]
        idx_ew = idx_eb if split else []
        m.o = pyo.Var(idx_o, within=pyo.Binary)
        m.ew = pyo.Var(idx_ew, within=pyo.Binary)
        m.a = pyo.Var(idx_a, within=pyo.Binary)
        m.e = pyo.Var(idx_e, within=pyo.Binary)
        m.ef = pyo.Var(idx_e, within=pyo.Binary)
        m.eb = pyo.Var(idx_eb, within=pyo.Binary)
        m.beta = pyo.Var(idx_o, bounds=(0, None))
        m.rs = pyo.Var(idx_o, bounds=(0, self.H))
        m.h = pyo.Var(idx_o, bounds=(0, self.H))
        m.pos = pyo.Var(idx_o, bounds=(0, None))
        # reservation indicators at checkpoints: Fs (F start), Fe (F end), Be (B end),
        # We (W end)
        idx_r = ([(s, i, "Fs", j) for s in st for i in range(M) for j in range(i + 1, M)]
                 + [(s, i, "Fe", j) for s in st for i in range(M) for j in range(i + 1, M)]
                 + [(s, i, "Be", k) for s in st for i in range(M) for k in range(i)]
                 + ([(s, i, "We", k) for s in st for i in range(M) for k in range(i)]
                    if split else []))
        m.rho = pyo.Var(idx_r, bounds=(0, 1))
        self._extra_vars = (len(idx_o) * 5 + len(idx_a) + 2 * len(idx_e) + len(idx_eb)
                            + len(idx_ew) + len(idx_r))
        self._extra_bins = (len(idx_o) + len(idx_a) + 2 * len(idx_e) + len(idx_eb)
                            + len(idx_ew))
        for s in st:
            act = P.activation[s]
            fb = (P.freed_by_b[s] if split else act) / act
            fwr = (P.freed_by_w[s] / act) if split else 0.0
            room = (P.budget[s] - P.static[s]) / act
            delta, rho_d, f_d, b_d, w_d, F, B, W = self._stage_offload_terms(s)
            tasks = self.win.device_tasks[s]
            work_all = sum(dur[t] for t in tasks)
            slack = delta * M + work_all + 1.0   # relaxes the robust-release rows
            # an offload counts as released only with this much room to spare: HiGHS
            # accepts rows violated by ~1e-6, and a transfer of 4e-8 s "fitting" in zero
            # work would let the simulator allocate before the release
            margin = RELEASE_MARGIN
            o = {i: m.o[s, i] for i in range(M)}

            def nb_before(x: int) -> Any:
                return sum(self.before(B[j], x) for j in range(M) if B[j] != x)

            def nw_before(x: int) -> Any:
                return sum(self.before(W[j], x) for j in range(M)) if split else 0

            def pos(x: int) -> Any:
                return sum(self.before(y, x) for y in tasks if y != x)

            nbF = [nb_before(F[i]) for i in range(M)]
            nwF = [nw_before(F[i]) for i in range(M)]
            # channel backlog after F_i, bounded via the work listed between forwards
            for i in range(M):
                add(m.beta[s, i] >= delta * o[i])
                if i > 0:
                    g = f_d + b_d * (nbF[i] - nbF[i - 1]) + w_d * (nwF[i] - nwF[i - 1])
                    add(m.beta[s, i] >= m.beta[s, i - 1] - g + delta * o[i])
            # robust releases at F_j's start (j > i) and at B_k's end (k < i)
            for i in range(M):
                for j in range(i + 1, M):
                    work = f_d * (j - i - 1) + b_d * (nbF[j] - nbF[i]) + w_d * (nwF[j] - nwF[i])
                    add(m.e[s, i, j] <= o[i])
                    add(m.beta[s, i] + margin <= work + slack * (1 - m.e[s, i, j])
                        + slack * self.before(B[i], F[j]))
                    # ... and by F_j's end (F_j itself runs in between)
                    add(m.ef[s, i, j] <= o[i])
                    add(m.beta[s, i] + margin <= work + f_d + slack * (1 - m.ef[s, i, j])
                        + slack * self.before(B[i], F[j]))
                    if j + 1 < M:
                        add(m.e[s, i, j] <= m.e[s, i, j + 1])
                for k in range(i):
                    n_f = sum(self.before(F[j], B[k]) for j in range(i + 1, M))
                    n_b = (k + 1) - sum(self.before(B[kk], F[i]) for kk in range(k + 1))
                    n_w = (sum(self.before(W[q], B[k]) for q in range(M))
                           - sum(self.before(W[q], F[i]) for q in range(M))) if split else 0
                    work = f_d * n_f + b_d * n_b + w_d * n_w
                    add(m.eb[s, i, k] <= o[i])
                    # not allocated yet, so nothing to release (else a phantom release)
                    add(m.eb[s, i, k] <= 1 - self.before(B[k], F[i]))
                    add(m.beta[s, i] + margin <= work + slack * (1 - m.eb[s, i, k])
                        + slack * self.before(B[k], F[i]))
                    if split:
                        # released by the end of W_k (k < i, W_k after F_i)
                        n_f = sum(self.before(F[j], W[k]) for j in range(i + 1, M))
                        n_b = (sum(self.before(B[q], W[k]) for q in range(M))
                               - sum(self.before(B[q], F[i]) for q in range(M)))
                        n_w = (k + 1) - sum(self.before(W[q], F[i]) for q in range(k + 1))
                        work = f_d * n_f + b_d * n_b + w_d * n_w
                        add(m.ew[s, i, k] <= o[i])
                        add(m.ew[s, i, k] <= 1 - self.before(W[k], F[i]))
                        add(m.beta[s, i] + margin <= work + slack * (1 - m.ew[s, i, k])
                            + slack * self.before(W[k], F[i])
                            + slack * self.before(B[i], W[k]))
            # reload attachments: exactly one when offloaded, after F_i, before B_i
            n_tasks = float(len(tasks))
            for i in range(M):
                cand = self.cand[(s, i)]
                add(sum(m.a[s, i, c] for c in range(len(cand))) == o[i])
                for c, key in enumerate(cand):
                    x = self.win.index[key]
                    if key[0] is not Op.F:     # after its OFFLOAD
                        add(m.a[s, i, c] <= 1 - self.before(x, F[i]))
                    if key[0] is not bop:      # before its backward
                        add(m.a[s, i, c] <= self.before(x, B[i]))
                    # list position of the reload, for microbatch order on the channel
                    px = pos(x)
                    add(m.pos[s, i] >= px - n_tasks * (1 - m.a[s, i, c]))
                    add(m.pos[s, i] <= px + n_tasks * (1 - m.a[s, i, c]))
                    # issue at X's end
                    add(m.rs[s, i] >= m.s[x] + dur[x] - big * (1 - m.a[s, i, c]))
                for i2 in range(i + 1, M):
                    add(m.pos[s, i] <= m.pos[s, i2] + n_tasks * (2 - o[i] - o[i2]))
            # reserved by a checkpoint when attached to a task ending no later

            def reserved(i: int, kind: str, y: int) -> Any:
                cand = self.cand[(s, i)]
                rv = m.rho[s, i, kind, {"Fs": F, "Fe": F, "Be": B, "We": W}[kind].index(y)]
                for c, key in enumerate(cand):
                    x = self.win.index[key]
                    inc = (1 if (x == y and kind != "Fs") else
                           (0 if x == y else self.before(x, y)))
                    if isinstance(inc, int) and inc == 0:
                        continue
                    add(rv >= m.a[s, i, c] + inc - 1)
                return rv

            for j in range(M):
                base = (j + 1) - fb * nbF[j] - fwr * nwF[j]
                add(base - sum(m.e[s, i, j] - reserved(i, "Fs", F[j]) for i in range(j))
                    <= room)
                add(base - sum(m.ef[s, i, j] - reserved(i, "Fe", F[j]) for i in range(j))
                    <= room)
            for k in range(M):
                n_f = sum(self.before(F[j], B[k]) for j in range(M))
                level = n_f - fb * (k + 1) - fwr * nw_before(B[k])
                level = level - sum(m.eb[s, i, k] - reserved(i, "Be", B[k])
                                    for i in range(k + 1, M))
                add(level <= room)
            if split:
                # memory at each W_k end (reservations happen there too); microbatches
                # whose B already ran count zero net (reloaded, then released by B/W)
                for k in range(M):
                    n_f = sum(self.before(F[j], W[k]) for j in range(M))
                    n_b = sum(self.before(B[q], W[k]) for q in range(M))
                    level = n_f - fb * n_b - fwr * (k + 1)
                    level = level - sum(m.ew[s, i, k] - reserved(i, "We", W[k])
                                        for i in range(k + 1, M))
                    add(level <= room)
            # reload timing: after its offload, after the previous reload, before B_i
            for i in range(M):
                add(m.rs[s, i] >= m.s[F[i]] + f_d + m.beta[s, i] - big * (1 - o[i]))
                if i > 0:
                    add(m.rs[s, i] >= m.h[s, i - 1] - big * (1 - o[i]))
                    add(m.h[s, i] >= m.h[s, i - 1])
                add(m.h[s, i] >= m.rs[s, i] + rho_d - big * (1 - o[i]))
                add(m.s[B[i]] >= m.rs[s, i] + rho_d - big * (1 - o[i]))

    # ------------------------------------------------------------- MIP start
    def load_schedule(self, schedule: Schedule, result: SimResult) -> bool:
        """Set every variable from a FIFO schedule; True if all constraints hold.

        Why check: a start that violates the model (say an offload the model's
        conservative accounting does not allow) would be rejected by the solver anyway,
        and the horizon must come from a schedule the model accepts.
        """
        m, win, u = self.m, self.win, self.unit
        start = {r.action.key: r.start for r in result.records if r.action.op.is_compute}
        pos: dict[Key, int] = {}
        for acts in schedule.actions:
            n = 0
            for a in acts:
                if a.op.is_compute:
                    pos[a.key] = n
                    n += 1
        try:
            for a, key in enumerate(win.keys):
                m.s[a].set_value(start[key] / u, skip_validation=True)
            for p, (a, b) in enumerate(win.free_pairs):
                m.v[p].set_value(1 if pos[win.keys[a]] < pos[win.keys[b]] else 0,
                                 skip_validation=True)
        except KeyError:
            return False
        m.C.set_value(result.makespan / u, skip_validation=True)
        if self.offload:
            if not self._load_offload(schedule, result):
                return False
        return self.max_violation() <= 1e-6

    def _load_offload(self, schedule: Schedule, result: SimResult) -> bool:
        """Offload choices and reload attachments of a schedule, derived values settled."""
        m, P, u = self.m, self.problem, self.unit
        M = P.microbatches
        rec = {r.action.key: r for r in result.records}
        after: dict[tuple[int, int], Key | None] = {}
        for acts in schedule.actions:
            last = None
            for a in acts:
                if a.op.is_compute:
                    last = a.key
                elif a.op is Op.RELOAD:
                    if a.fraction != 1.0:
                        return False
                    after[(a.stage, a.microbatch)] = last
        for s in self.off_stages:
            for i in range(M):
                cand = self.cand[(s, i)]
                issued = after.get((s, i), "none")
                if issued != "none" and issued not in cand:
                    return False
                m.o[s, i].set_value(0 if issued == "none" else 1, skip_validation=True)
                for c, key in enumerate(cand):
                    m.a[s, i, c].set_value(1 if key == issued else 0, skip_validation=True)
                r = rec.get((Op.RELOAD, s, i))
                m.rs[s, i].set_value(r.start / u if r else 0.0, skip_validation=True)
        self._settle_derived()
        return True

    def _stage_offload_terms(self, s: int) -> tuple[float, float, float, float, float,
                                                    list[Any], list[Any], list[Any]]:
        """Stage ``s``'s transfer and compute lengths in model units, and its F/B/W keys."""
        P, u, M = self.problem, self.unit, self.problem.microbatches
        split = self.graph.split_backward
        bop = Op.B if split else Op.BW
        return (P.offload_time(s) / u, P.reload_time(s) / u, P.forward[s] / u,
                (P.backward_input[s] if split else P.bw_time(s)) / u,
                P.backward_weight[s] / u if split else 0.0,
                [self.k(Op.F, s, i) for i in range(M)],
                [self.k(bop, s, i) for i in range(M)],
                [self.k(Op.W, s, i) for i in range(M)] if split else [])

    def _settle_derived(self) -> None:
        """Give the derived offload variables their tightest values (for a MIP start)."""
        pyo, m, P = self.pyo, self.m, self.problem
        M = P.microbatches
        split = self.graph.split_backward

        def val(expr: Any) -> float:
            return float(pyo.value(expr))

        for s in self.off_stages:
            delta, rho_d, f_d, b_d, w_d, F, B, W = self._stage_offload_terms(s)
            tasks = self.win.device_tasks[s]
            o = [round(val(m.o[s, i])) for i in range(M)]
            nbF = [sum(val(self.before(B[j], F[i])) for j in range(M) if j != i)
                   for i in range(M)]
            nwF = [sum(val(self.before(W[j], F[i])) for j in range(M)) if split else 0
                   for i in range(M)]
            beta: list[float] = []
            for i in range(M):
                b = delta * o[i]
                if i > 0:
                    g = f_d + b_d * (nbF[i] - nbF[i - 1]) + w_d * (nwF[i] - nwF[i - 1])
                    b = max(b, beta[-1] - g + delta * o[i])
                beta.append(b)
                m.beta[s, i].set_value(b, skip_validation=True)
            h = 0.0
            for i in range(M):
                if o[i]:
                    h = max(h, val(m.rs[s, i]) + rho_d)
                m.h[s, i].set_value(h, skip_validation=True)
            for i in range(M):
                for j in range(i + 1, M):
                    work = f_d * (j - i - 1) + b_d * (nbF[j] - nbF[i]) + w_d * (nwF[j] - nwF[i])
                    ok = o[i] and (beta[i] + RELEASE_MARGIN <= work + 1e-12
                                   or val(self.before(B[i], F[j])) > 0.5)
                    m.e[s, i, j].set_value(1 if ok else 0, skip_validation=True)
                    ok = o[i] and (beta[i] + RELEASE_MARGIN <= work + f_d + 1e-12
                                   or val(self.before(B[i], F[j])) > 0.5)
                    m.ef[s, i, j].set_value(1 if ok else 0, skip_validation=True)
                for k in range(i):
                    n_f = sum(val(self.before(F[j], B[k])) for j in range(i + 1, M))
                    n_b = (k + 1) - sum(val(self.before(B[kk], F[i])) for kk in range(k + 1))
                    n_w = (sum(val(self.before(W[q], B[k])) for q in range(M))
                           - sum(val(self.before(W[q], F[i])) for q in range(M))) if split else 0
                    work = f_d * n_f + b_d * n_b + w_d * n_w
                    ok = (o[i] and val(self.before(B[k], F[i])) < 0.5
                          and beta[i] + RELEASE_MARGIN <= work + 1e-12)
                    m.eb[s, i, k].set_value(1 if ok else 0, skip_validation=True)
                    if split:
                        n_f = sum(val(self.before(F[j], W[k])) for j in range(i + 1, M))
                        n_b = (sum(val(self.before(B[q], W[k])) for q in range(M))
                               - sum(val(self.before(B[q], F[i])) for q in range(M)))
                        n_w = (k + 1) - sum(val(self.before(W[q], F[i])) for q in range(k + 1))
                        work = f_d * n_f + b_d * n_b + w_d * n_w
                        ok = (o[i] and val(self.before(W[k], F[i])) < 0.5
                              and (beta[i] + RELEASE_MARGIN <= work + 1e-12
                                   or val(self.before(B[i], W[k])) > 0.5))
                        m.ew[s, i, k].set_value(1 if ok else 0, skip_validation=True)
                cand = self.cand[(s, i)]
                attached = [self.win.index[key] for c, key in enumerate(cand)
                            if round(val(m.a[s, i, c]))]
                x = attached[0] if attached else None
                m.pos[s, i].set_value(
                    sum(val(self.before(y, x)) for y in tasks if y != x) if x is not None
                    else 0.0, skip_validation=True)
                for kind, ys in (("Fs", F), ("Fe", F), ("Be", B), ("We", W)):
                    for n, y in enumerate(ys):
                        if (s, i, kind, n) not in m.rho:
                            continue
                        if x is None:
                            r = 0.0
                        elif x == y:
                            r = 0.0 if kind == "Fs" else 1.0
                        else:
                            r = val(self.before(x, y))
                        m.rho[s, i, kind, n].set_value(r, skip_validation=True)
            for i in range(M):
                if not o[i]:
                    m.rs[s, i].set_value(0.0, skip_validation=True)

    def max_violation(self) -> float:
        """Largest violation of any constraint at the current variable values."""
        return milp_prep.max_violation(self.pyo, self.m)

    # ------------------------------------------------------------- extraction
    def extract(self, name: str, provenance: dict[str, Any]) -> Schedule:
        """The per-device orders of the current solution (and its transfers) as a Schedule.

        Orders come from the pair binaries, not from rounded times, so the memory the
        model counted is the memory the simulator sees; start times only break ties
        between tasks the binaries do not order (none, unless durations are zero).
        """
        from optpipe.optimizer.extract import orders_from_starts

        pyo, m, win = self.pyo, self.m, self.win
        starts = [pyo.value(m.s[a]) for a in range(self.N)]
        position: dict[Key, int] = {}
        for tasks in win.device_tasks:
            rank = {}
            for a in tasks:
                rank[a] = sum(1 for b in tasks if b != a and
                              _as_bool(pyo.value(self.before(b, a))))
            order = sorted(tasks, key=lambda a: (rank[a], starts[a]))
            at = {a: n for n, a in enumerate(order)}
            if any(win.order(a, b) is True and at[a] > at[b]
                   for a in tasks for b in tasks if a < b) or any(
                   win.order(a, b) is False and at[b] > at[a]
                   for a in tasks for b in tasks if a < b):
                # only possible with zero-length ties: keep every fixed order
                order = _topological_by(tasks, win, key=lambda a: (rank[a], starts[a]))
            for p, a in enumerate(order):
                position[win.keys[a]] = p
        offloads: dict[tuple[int, int], float] = {}
        reload_after: dict[tuple[int, int], Key] = {}
        if self.offload:
            for s in self.off_stages:
                for i in range(self.problem.microbatches):
                    if _as_bool(pyo.value(m.o[s, i])):
                        offloads[(s, i)] = 1.0
                        cand = self.cand[(s, i)]
                        c = next(c for c in range(len(cand))
                                 if _as_bool(pyo.value(m.a[s, i, c])))
                        reload_after[(s, i)] = cand[c]
        return orders_from_starts(self.problem, position, offloads=offloads,
                                  reload_after=reload_after, name=name,
                                  provenance=provenance or {"source": "solver", "name": name})


def _as_bool(x: Any) -> bool:
    return x is not None and float(x) > 0.5


def _topological_by(tasks: list[int], win: Windows, key: Callable[[int], Any]) -> list[int]:
    """Order a device's tasks by ``key`` while never breaking a fixed order.

    Why: with zero-length tasks two tasks can tie in time; the fixed orders (chains,
    F→B→W of one microbatch, deduced orders) must still hold for the list to be valid.
    """
    remaining = set(tasks)
    out = []
    while remaining:
        ready = [a for a in remaining
                 if not any(win.order(b, a) is True for b in remaining if b != a)]
        a = min(ready, key=key)
        out.append(a)
        remaining.remove(a)
    return out


# ================================================================ solvers
def _free_cores() -> float:
    """CPUs not busy with other work right now.

    Why: the portfolio's two searches only pay off when each gets a core; on a machine
    already busy, two searches halve each other's speed and one search is faster.
    Measured as the idle share of all CPUs over a quarter second (``/proc/stat``; this
    process sleeps meanwhile), not by the load average, which trails by minutes: after
    a previous solve it still reported two busy cores on an idle machine, and the
    second search was dropped.
    """
    import os

    def idle_total() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)     # idle + iowait, all

    cpus = float(os.cpu_count() or 1)
    try:
        idle0, total0 = idle_total()
        time.sleep(0.25)
        idle1, total1 = idle_total()
        return cpus * (idle1 - idle0) / max(1, total1 - total0)
    except (OSError, ValueError, IndexError):
        try:
            return cpus - os.getloadavg()[0]
        except (AttributeError, OSError):  # pragma: no cover - no load average (Windows)
            return cpus


@dataclass
class _Task:
    """One search of the portfolio: a model, whether it has a MIP start, HiGHS options,
    and, for a model restricted to a shorter horizon, that horizon (seconds)."""

    model: Any
    warm: bool
    options: dict[str, Any]
    restricted: Optional[float] = None
    probes: Optional["_Probes"] = None     # a horizon-probe search instead of one model


def _second_task(problem: Problem, graph: TaskGraph, model: Any, win: Windows,
                 warm: bool, horizon: float) -> Optional[_Task]:
    """The portfolio's second search; None when it proves the warm start optimal.

    Time-indexed: the same model over a horizon one tick shorter than the warm start.
    Why: every better schedule ends at least one tick earlier, so this model keeps all
    of them while its windows (hence fixed counts) are tighter; its optimum is the
    global optimum and its infeasibility proves the warm start optimal. Disjunctive,
    when every duration and lag is a whole number of ticks: horizon probes
    (:func:`_probe_search`). Otherwise: the same model with another seed.
    """
    from optpipe.optimizer import milp_ti

    if model.formulation != "time-indexed":
        tick = milp_ti.tick_for(problem, graph)
        if tick is None or model.offload:
            return _Task(model, warm, PORTFOLIO[1])
        return _Task(None, False, PORTFOLIO[0],
                     probes=_Probes(problem, graph, win.lower_bound, horizon, tick))

    tick = model.unit
    shorter = horizon - tick
    if math.ceil(win.lower_bound / tick - 1e-6) * tick > shorter + 1e-9 * horizon:
        return None
    try:
        win2 = milp_prep.prepare(problem, graph, shorter, use_memory=True)
    except milp_prep.HorizonTooSmall:
        return None
    if math.ceil(win2.lower_bound / tick - 1e-6) * tick > shorter + 1e-9 * horizon:
        return None
    try:
        model2 = milp_ti.TimeIndexedModel(problem, graph, win2, tick)
    except milp_prep.HorizonTooSmall:
        return None
    return _Task(model2, False, PORTFOLIO[0], restricted=shorter)


@dataclass
class _Run:
    model: Any = None
    schedule: Optional[Schedule] = None   # found by a probe (whose model stays in a child)
    has_solution: bool = False
    optimal: bool = False
    objective: float = math.inf
    bound: Optional[float] = None
    message: str = ""
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _normalize_solver(solver: str) -> str:
    name = (solver or "highs").strip().lower()
    aliases = {"appsi_highs": "highs", "highspy": "highs", "gurobi_persistent": "gurobi",
               "gurobi_direct": "gurobi", "gurobipy": "gurobi"}
    name = aliases.get(name, name)
    if name not in SOLVERS:
        raise OptPipeError(f"unknown MILP solver {solver!r}; choose 'highs' or 'gurobi' "
                           f"(or --solver cpsat for the CP-SAT engine)")
    return name


def _check_solver_installed(solver: str) -> None:
    """Fail early, with the command that fixes it, when the solver's package is missing."""
    import importlib.util

    if solver == "highs":
        if importlib.util.find_spec("highspy") is None:
            raise OptPipeError("the HiGHS solver is not installed: run `pip install highspy` "
                               "(optpipe depends on it) or choose --solver cpsat")
    elif importlib.util.find_spec("gurobipy") is None:
        raise OptPipeError("Gurobi is not installed: run `pip install optpipe[gurobi]` "
                           "(needs a Gurobi license for models over 2000 variables or "
                           "constraints) or choose --solver highs")


def _run_solver(tasks: list[_Task], solver: str, deadline: float, gap: float,
                threads: int, report: "_Progress") -> _Run:
    """Solve until ``deadline`` (a ``time.perf_counter()`` instant)."""
    if solver == "highs":
        return _run_highs_portfolio(tasks, deadline, gap, threads, report)
    task = tasks[0]
    run = _run_gurobi(task.model, max(0.5, deadline - time.perf_counter()), gap, threads,
                      report, task.warm)
    run.model = task.model
    return run


@dataclass
class _Probes:
    """What a horizon-probe search needs: the problem, its bounds and its time grid."""

    problem: Problem
    graph: TaskGraph
    lower: float        # proven lower bound (seconds)
    upper: float        # makespan of the warm start (seconds)
    tick: float         # every makespan is a whole number of these


def _probe_search(probes: _Probes, deadline: float, gap: float, threads: int,
                  report: Any) -> _Run:
    """Bisect the makespan with models restricted to a horizon ("is there a schedule
    that ends by h?").

    Why: on memory-bound pipelines HiGHS's optimization stalls a few percent above its
    bound until it stumbles on a near-optimal schedule, while a model whose horizon is
    just below the optimum has such tight windows that its infeasibility is proven
    quickly (8 x 16 at S/2 with p2p: 4 s at 80.25 s, 25 s at 81.85 s), and one just
    above it finds and proves the optimum (32 s at 81.95 s, optimum 81.9 s). Every
    makespan is a whole number of ticks, so an infeasible probe at ``h`` lifts the
    bound to the next tick; a probe that ends optimal has the global optimum (every
    better schedule is inside its horizon); one that only finds a schedule lowers the
    upper end. Stops when the two meet, at the deadline, or when a probe ends with
    neither answer.
    """
    p = probes
    lo = int(math.ceil(p.lower / p.tick - 1e-6))       # ticks: the optimum lies in [lo, hi]
    hi = int(round(p.upper / p.tick))
    run = _Run()
    probes_run: list[tuple[float, str]] = []
    while lo < hi and deadline - time.perf_counter() > 1.0:
        mid = (lo + hi) // 2
        outcome, probe, model = _probe(p, mid * p.tick, deadline, gap, threads)
        probes_run.append((mid * p.tick, outcome))
        if outcome.startswith("infeasible"):       # nothing ends by h
            lo = mid + 1
        elif outcome in ("optimal", "schedule found"):
            hi = min(hi, int(round(probe.objective / p.tick)))
            run.has_solution, run.objective = True, hi * p.tick
            run.schedule = model.extract(name="milp", provenance={})
            if probe.optimal:          # the restricted optimum is the global one
                # (within ``gap``, which is what HiGHS's optimal status guarantees)
                proven = max(probe.bound or 0.0, hi * p.tick * (1 - gap))
                lo = max(lo, int(math.ceil(proven / p.tick - 1e-6)))
                run.optimal = True
        report.emit(run.objective if run.has_solution else None, min(lo, hi) * p.tick, None)
        if outcome in ("optimal", "no answer"):
            break
    run.bound = min(lo, hi) * p.tick
    run.optimal = run.optimal or lo >= hi
    run.extra["probes"] = probes_run
    run.message = (f"HiGHS horizon probes: {len(probes_run)}"
                   + (", optimal" if run.optimal else ""))
    return run


def _probe(p: _Probes, horizon: float, deadline: float, gap: float, threads: int
           ) -> tuple[str, Optional[_Run], Any]:
    """One probe: ``(outcome, HiGHS run, model)``; the outcome is ``infeasible
    (preprocessing)`` (the windows or bounds already rule ``horizon`` out), ``infeasible``,
    ``optimal``, ``schedule found`` or ``no answer`` (time ran out)."""
    try:
        win = milp_prep.prepare(p.problem, p.graph, horizon, use_memory=True)
    except milp_prep.HorizonTooSmall:
        return "infeasible (preprocessing)", None, None
    if win.lower_bound > horizon * (1 + 1e-9):
        return "infeasible (preprocessing)", None, None
    model = _DisjunctiveModel(p.problem, p.graph, win, offload=False)
    # a probe's own incumbents are not global ones: no progress from inside it
    probe = _HighsJob(model, gap, False).run(deadline, threads, _Progress(None, 0.0),
                                             PORTFOLIO[0])
    if probe.has_solution:
        return ("optimal" if probe.optimal else "schedule found"), probe, model
    return ("infeasible" if probe.error else "no answer"), probe, model


#: HiGHS settings of the portfolio's searches
PORTFOLIO = ({"random_seed": 0}, {"random_seed": 1, "mip_heuristic_effort": 0.02})


def _run_highs_portfolio(tasks: list[_Task], deadline: float, gap: float, threads: int,
                         report: "_Progress") -> _Run:
    """Run HiGHS searches in parallel, one per core, and combine what they prove.

    Why: HiGHS's branch-and-bound is essentially sequential, and the time it needs to
    close the last ticks of a memory-bound instance varies by a factor of two with the
    random seed alone. Two different searches (see :func:`_second_task`) use both cores
    and stop as soon as one settles the question. Each model is loaded into HiGHS
    before the workers are forked. One task runs in a child as well (so the backstop
    can stop it); without ``fork``, in process.
    """
    import multiprocessing as mp

    jobs = [_HighsJob(t.model, gap, t.warm) if t.probes is None else None for t in tasks]
    # one task runs in a child too: HiGHS can run far past its time limit (20 s over a
    # 52 s limit at 16 x 64, in presolve and the root LP), and only a child can be
    # stopped at the backstop
    if "fork" not in mp.get_all_start_methods():
        run = jobs[0].run(deadline, threads, report, tasks[0].options)
        run.model = tasks[0].model
        return run
    import pyomo.environ as pyo
    from queue import Empty

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    per = max(1, int(threads) // len(tasks))

    def work(idx: int) -> None:
        try:
            probes = tasks[idx].probes
            if probes is not None:
                run = _probe_search(probes, deadline, gap, per, _QueueReport(queue, idx))
                queue.put(("done", idx, run, None))
                return
            run = jobs[idx].run(deadline, per, _QueueReport(queue, idx), tasks[idx].options)
            m = tasks[idx].model.m
            values = ([v.value for v in m.component_data_objects(pyo.Var)]
                      if run.has_solution else None)
            queue.put(("done", idx, run, values))
        except BaseException as exc:  # reported to the parent, never raised in a child
            queue.put(("error", idx, f"{type(exc).__name__}: {exc}", None))

    procs = [ctx.Process(target=work, args=(i,), daemon=True) for i in range(len(tasks))]
    for proc in procs:
        proc.start()
    done: dict[int, tuple[_Run, list | None]] = {}
    errors: list[str] = []
    inc_seen: float | None = None
    bounds_seen: dict[int, float] = {}
    settled = False
    hard_stop = deadline + 1.5  # HiGHS mostly stops itself at the deadline; a backstop
    try:
        while len(done) + len(errors) < len(tasks) and not settled:
            try:
                msg = queue.get(timeout=0.25)
            except Empty:
                if time.perf_counter() > hard_stop or not any(p.is_alive() for p in procs):
                    break
                continue
            kind, idx, payload, values = msg
            if kind == "progress":
                inc, bnd = payload
                if inc is not None:
                    inc_seen = inc if inc_seen is None else min(inc_seen, inc)
                if bnd is not None:
                    bounds_seen[idx] = max(bnd, bounds_seen.get(idx, -math.inf))
                shown = _combined_bound(tasks, bounds_seen, {})
                report.emit(inc_seen, shown, relative_gap(inc_seen, shown))
            elif kind == "done":
                payload.extra["worker"] = idx
                done[idx] = (payload, values)
                settled = payload.optimal or (tasks[idx].restricted is not None
                                              and bool(payload.error))
            else:
                errors.append(payload)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=5)
        queue.close()
    if not done:
        if errors:
            raise RuntimeError(f"HiGHS failed: {errors[0]}")
        run = _Run(message="HiGHS: no answer before the deadline", model=tasks[0].model)
        run.bound = _combined_bound(tasks, bounds_seen, {})
        return run
    with_sol = [(i, r, v) for i, (r, v) in done.items() if r.has_solution]
    if with_sol:
        idx, run, values = min(with_sol, key=lambda x: (not x[1].optimal, x[1].objective))
        if values is not None:
            for var, val in zip(tasks[idx].model.m.component_data_objects(pyo.Var), values):
                var.set_value(val, skip_validation=True)
            run.model = tasks[idx].model
        else:                       # a probe's schedule travelled as a schedule
            run.model = tasks[0].model
    else:
        idx, (run, _) = next(iter(done.items()))
        run.model = tasks[0].model
    finals = {i: r for i, (r, _) in done.items()}
    run.bound = _combined_bound(tasks, bounds_seen, finals)
    # a restricted search that is infeasible or optimal settles the whole question
    for i, r in finals.items():
        if tasks[i].restricted is not None and (r.optimal or r.error):
            run.optimal = True
            run.error = ""
            run.message = ("HiGHS: no schedule is a tick shorter than the warm start"
                           if not r.has_solution else r.message)
    run.extra["portfolio"] = len(tasks)
    return run


def _combined_bound(tasks: list[_Task], seen: dict[int, float],
                    finals: dict[int, _Run]) -> Optional[float]:
    """The best valid lower bound from all searches.

    A full search's bound is a bound. A search restricted to horizon ``h`` bounds only
    the schedules that end by ``h``; any other schedule ends after ``h``, so
    ``min(its bound, h)`` is valid (``h`` itself when it proved infeasibility).
    """
    out: Optional[float] = None
    for i, task in enumerate(tasks):
        b = seen.get(i)
        r = finals.get(i)
        if r is not None:
            if r.bound is not None:
                b = max(b, r.bound) if b is not None else r.bound
            if task.restricted is not None and r.error:
                b = math.inf
        if b is None:
            continue
        if task.restricted is not None:
            h = task.restricted
            if b > h * (1 + 1e-9):
                # nothing ends by h, and every other schedule ends a tick later or more
                b = h + task.model.unit
        out = b if out is None else max(out, b)
    return out


class _QueueReport:
    """Progress sink of a portfolio worker: forwards (incumbent, bound) to the parent."""

    def __init__(self, queue: Any, idx: int) -> None:
        self.queue, self.idx = queue, idx
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def emit(self, incumbent: float | None, bound: float | None, gap: float | None) -> None:
        self.queue.put(("progress", self.idx, (incumbent, bound), None))


class _HighsJob:
    """A Pyomo model compiled to a matrix and loaded into ``highspy`` directly.

    Why not Pyomo's ``appsi_highs``: it wraps every load and solve in a file-descriptor
    capture that can fail under heavy machine load ("Deadlock starting capture_output")
    and does not survive ``fork``. Pyomo stays the modelling layer: its standard-form
    compiler turns the model into ``min c·x, A x (<=|=|>=) b`` with the columns' bounds
    and integrality, which HiGHS receives as one LP; the MIP start is set with
    ``setSolution``; solutions go back into the Pyomo variables.
    """

    def __init__(self, model: Any, gap: float, warm: bool) -> None:
        import highspy
        import numpy as np
        from pyomo.repn.plugins.standard_form import LinearStandardFormCompiler

        repn = LinearStandardFormCompiler().write(model.m, mixed_form=True)
        self.columns = list(repn.columns)
        inf = highspy.kHighsInf
        lp = highspy.HighsLp()
        n, m_rows = len(self.columns), len(repn.rows)
        lp.num_col_ = n
        lp.num_row_ = m_rows
        lp.col_cost_ = np.asarray(repn.c.toarray()[0] if n else [], dtype=float)
        lp.offset_ = float(repn.c_offset[0]) if len(repn.c_offset) else 0.0
        lp.col_lower_ = np.array([-inf if v.lb is None else float(v.lb) for v in self.columns])
        lp.col_upper_ = np.array([inf if v.ub is None else float(v.ub) for v in self.columns])
        rhs = np.asarray(repn.rhs, dtype=float)
        sense = np.array([sgn for _, sgn in repn.rows])
        lp.row_lower_ = np.where(sense >= 0, np.where(sense == 0, rhs, -inf), rhs)
        lp.row_upper_ = np.where(sense <= 0, np.where(sense == 0, rhs, inf), rhs)
        A = repn.A.tocsc()
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = A.indptr.astype(np.int32)
        lp.a_matrix_.index_ = A.indices.astype(np.int32)
        lp.a_matrix_.value_ = A.data.astype(float)
        lp.a_matrix_.num_col_ = n
        lp.a_matrix_.num_row_ = m_rows
        lp.integrality_ = [highspy.HighsVarType.kInteger if v.is_integer()
                           else highspy.HighsVarType.kContinuous for v in self.columns]
        h = _quiet_highs()
        h.passModel(lp)
        self.start = None
        if warm and all(v.value is not None for v in self.columns):
            self.start = np.array([float(v.value) for v in self.columns])
        self.h = h
        self.model = model
        self.gap = gap

    def run(self, deadline: float, threads: int, report: Any,
            options: dict[str, Any] | None = None) -> _Run:
        import highspy

        h, model = self.h, self.model
        settings = {"threads": max(1, int(threads)), "mip_rel_gap": float(self.gap),
                    "mip_abs_gap": 1e-9, "output_flag": False,
                    "time_limit": max(0.5, deadline - time.perf_counter()),
                    **(options or {})}
        for key, value in settings.items():
            h.setOptionValue(key, value)
        if self.start is not None:
            sol = highspy.HighsSolution()
            sol.col_value = list(self.start)
            sol.value_valid = True
            h.setSolution(sol)
        run = _Run()
        unit = model.unit
        state = {"last": -1.0}
        interrupt = _highs_cb("kCallbackMipInterrupt")

        def on_event(event: Any) -> None:
            out = event.data_out
            inc = out.mip_primal_bound
            bnd = out.mip_dual_bound
            inc = inc * unit if inc is not None and math.isfinite(inc) and abs(inc) < 1e29 \
                else None
            bnd = bnd * unit if bnd is not None and math.isfinite(bnd) and abs(bnd) < 1e29 \
                else None
            now = report.elapsed()
            if event.callback_type == interrupt and now - state["last"] < 1.0:
                return
            state["last"] = now
            report.emit(inc, bnd, relative_gap(inc, bnd))

        try:
            h.cbMipImprovingSolution.subscribe(on_event)
            h.cbMipInterrupt.subscribe(on_event)
        except Exception:  # pragma: no cover - older highspy without event callbacks
            pass
        # HiGHS keeps one thread scheduler per process, sized by the first run: a later
        # run asking for another thread count returns at once with status "Not Set".
        # The portfolio's thread count per search follows the idle CPUs it measures, and
        # a forked worker inherits its parent's scheduler without its threads; so every
        # run starts a scheduler of its own (runs in one process never overlap).
        # Found when two test runs shared the machine: four proofs came back 'feasible'.
        highspy.Highs.resetGlobalScheduler(True)
        h.run()
        status = h.getModelStatus()
        info = h.getInfo()
        MS = highspy.HighsModelStatus
        run.extra["solver_status"] = h.modelStatusToString(status)
        run.extra["nodes"] = int(getattr(info, "mip_node_count", -1))
        sol = h.getSolution()
        if info.primal_solution_status == 2 and sol.value_valid:  # 2: feasible
            for var, val in zip(self.columns, sol.col_value):
                var.set_value(float(val), skip_validation=True)
            run.has_solution = True
            run.objective = float(info.objective_function_value) * unit
        bound = getattr(info, "mip_dual_bound", None)
        if bound is not None and math.isfinite(bound) and abs(bound) < 1e29:
            run.bound = float(bound) * unit
        run.optimal = status == MS.kOptimal
        if status == MS.kInfeasible:
            run.error = "HiGHS reports the model infeasible"
        run.message = f"HiGHS: {h.modelStatusToString(status)}"
        return run


def _quiet_highs() -> Any:
    """A ``highspy.Highs`` with output off; its one-time banner kept off stdout.

    Why: the CLI may print JSON on stdout, and HiGHS prints "Running HiGHS ..." from the
    constructor, before any option can silence it.
    """
    import os
    import sys

    import highspy

    global _BANNER_DONE
    if _BANNER_DONE:
        h = highspy.Highs()
    else:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _BANNER_DONE = True
    h.setOptionValue("output_flag", False)
    return h


_BANNER_DONE = False


def _highs_cb(name: str) -> Any:
    import highspy
    return getattr(highspy.cb.HighsCallbackType, name)


def _run_gurobi(model: _DisjunctiveModel, time_limit: float, gap: float, threads: int,
                report: "_Progress", warm: bool) -> _Run:
    """Gurobi through Pyomo's ``gurobi_persistent`` interface, with the MIP start.

    A size-limited license (the one pip's gurobipy carries) rejects models over 2000
    variables or constraints with error 10010; that becomes an OptPipeError naming the
    model's size and the engines that have no such limit.
    """
    import pyomo.environ as pyo
    from pyomo.opt import TerminationCondition as TC

    size = model.size()
    run = _Run()
    opt = None
    try:
        # own environment, silent from its start (no license banner on stdout)
        opt = pyo.SolverFactory("gurobi_persistent", manage_env=True,
                                options={"OutputFlag": 0})
        opt.set_instance(model.m)
        opt.set_gurobi_param("OutputFlag", 0)
        opt.set_gurobi_param("TimeLimit", float(time_limit))
        opt.set_gurobi_param("MIPGap", float(gap))
        opt.set_gurobi_param("Threads", max(1, int(threads)))
        unit = model.unit
        try:
            from gurobipy import GRB

            state = {"last": -1.0}

            def callback(cb_m: Any, cb_opt: Any, where: int) -> None:
                if where != GRB.Callback.MIP:
                    return
                now = report.elapsed()
                if now - state["last"] < 1.0:
                    return
                state["last"] = now
                inc = cb_opt.cbGet(GRB.Callback.MIP_OBJBST)
                bnd = cb_opt.cbGet(GRB.Callback.MIP_OBJBND)
                inc = inc * unit if abs(inc) < 1e29 else None
                bnd = bnd * unit if abs(bnd) < 1e29 else None
                report.emit(inc, bnd, relative_gap(inc, bnd))

            opt.set_callback(callback)
        except Exception:  # pragma: no cover - progress is optional
            pass
        results = opt.solve(warmstart=warm, load_solutions=False, tee=False)
    except Exception as exc:  # gurobipy.GurobiError, wrapped or not
        if opt is not None:
            try:
                opt.close()
            except Exception:  # pragma: no cover
                pass
        if _is_size_limit(exc):
            raise OptPipeError(
                f"the MILP ({size['variables']} variables, {size['constraints']} "
                f"constraints) is over the size-limited Gurobi license (2000 variables "
                f"or constraints); use --solver highs or --solver cpsat, or install a full "
                f"Gurobi license") from None
        if "license" in str(exc).lower():
            raise OptPipeError(f"Gurobi cannot run: {exc}; use --solver highs or --solver "
                               f"cpsat") from None
        raise
    try:
        tc = results.solver.termination_condition
        grb = opt._solver_model
        run.extra["solver_status"] = str(tc)
        if grb.SolCount > 0:
            opt.load_vars()
            run.has_solution = True
            run.objective = grb.ObjVal * model.unit
        try:
            run.bound = grb.ObjBound * model.unit
        except Exception:  # pragma: no cover - no bound after an early stop
            run.bound = None
        run.optimal = tc == TC.optimal
        run.message = f"Gurobi: {tc}"
    finally:
        try:
            opt.close()
        except Exception:  # pragma: no cover
            pass
    return run


def _is_size_limit(exc: BaseException) -> bool:
    """True for Gurobi's 'Model too large for size-limited license' (error 10010)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if getattr(exc, "errno", None) == 10010 or "size-limited" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


# ================================================================ progress
class _Progress:
    """Calls the user's progress hook with whichever signature it has."""

    def __init__(self, fn: Callable[..., None] | None, t0: float) -> None:
        self.fn = fn
        self.t0 = t0
        self.positional = False
        if fn is not None:
            try:
                params = [p for p in inspect.signature(fn).parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                          and p.default is p.empty]
                self.positional = len(params) >= 2 or any(
                    p.kind is p.VAR_POSITIONAL
                    for p in inspect.signature(fn).parameters.values())
            except (TypeError, ValueError):
                self.positional = False

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def emit(self, incumbent: float | None, bound: float | None, gap: float | None) -> None:
        if self.fn is None:
            return
        try:
            if self.positional:
                self.fn(self.elapsed(), incumbent, bound, gap)
            else:
                self.fn({"elapsed": self.elapsed(), "incumbent": incumbent,
                         "bound": bound, "gap": gap})
        except Exception:  # a broken progress hook must not abort a solve
            pass


# ================================================================ result
def _finish(problem: Problem, schedule: Schedule, result: SimResult, status: str,
            objective: float, bound: float, solver: str, t0: float, time_limit: float,
            extra: dict[str, Any], report: _Progress, message: str) -> EngineResult:
    """Stamp provenance on the schedule and wrap everything into an EngineResult."""
    wall = time.perf_counter() - t0
    bound = min(bound, objective)
    g = relative_gap(objective, bound)
    sched = Schedule(name=f"milp-{solver}", stages=schedule.stages, devices=schedule.devices,
                     microbatches=schedule.microbatches, placement=list(schedule.placement),
                     actions=[list(a) for a in schedule.actions])
    sched.provenance = {
        "source": "solver", "name": sched.name, "engine": "milp", "solver": solver,
        "status": status, "objective": objective, "bound": bound, "gap": g,
        "wall_time": wall, "time_limit": time_limit, "problem_hash": problem.hash(),
        "simulated_makespan": result.makespan,
    }
    for key in ("warm_start", "warm_start_makespan", "model", "mip_start", "model_objective",
                "formulation", "optimality"):
        if key in extra:
            sched.provenance[key] = extra[key]
    report.emit(objective, bound, g)
    return EngineResult(schedule=sched, status=status, objective=objective, bound=bound,
                        gap=g, wall_time=wall, engine=solver, message=message, extra=extra)
