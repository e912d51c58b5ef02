"""The MILP engine's solver runs: HiGHS (a portfolio of searches, horizon probes) and
Gurobi, on a compiled Pyomo model.

Why a module of its own: how the models are solved is apart from what they state
(:mod:`.milp_disjunctive`, :mod:`.milp_ti`). On HiGHS, Pyomo's standard-form compiler
hands the model to ``highspy`` directly (MIP start, callbacks, ``fork``-safe); on two
free cores two different searches run as a portfolio in child processes, and where
memory binds a bisection of the makespan with horizon-restricted models proves what
the optimization stalls short of (:func:`probe_search`). Gurobi runs through Pyomo's
persistent interface, and its size-limited license is recognised and said plainly.
:func:`run_solver` is the entry (:func:`~.milp.solve_milp` calls it).
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from optpipe.errors import OptPipeError
from optpipe.optimizer import milp_prep
from optpipe.optimizer.milp_disjunctive import DisjunctiveModel
from optpipe.optimizer.preprocess import TaskGraph
from optpipe.optimizer.result import relative_gap
from optpipe.problem import Problem
from optpipe.schedule import Schedule


@dataclass
class Task:
    """One search of the portfolio: a model, whether it has a MIP start, HiGHS options,
    and, for a model restricted to a shorter horizon, that horizon (seconds)."""

    model: Any
    warm: bool
    options: dict[str, Any]
    restricted: Optional[float] = None
    probes: Optional[Probes] = None     # a horizon-probe search instead of one model


@dataclass
class Run:
    """What one solver run found: its model, schedule or solution, the proven bound, and
    the solver's words (``message``, ``error``) and figures (``extra``) for the result."""

    model: Any = None
    schedule: Optional[Schedule] = None   # found by a probe (whose model stays in a child)
    has_solution: bool = False
    optimal: bool = False
    objective: float = math.inf
    bound: Optional[float] = None
    message: str = ""
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def run_solver(tasks: list[Task], solver: str, deadline: float, gap: float,
               threads: int, report: Progress) -> Run:
    """Solve until ``deadline`` (a ``time.perf_counter()`` instant)."""
    if solver == "highs":
        return _run_highs_portfolio(tasks, deadline, gap, threads, report)
    task = tasks[0]
    run = _run_gurobi(task.model, max(0.5, deadline - time.perf_counter()), gap, threads,
                      report, task.warm)
    run.model = task.model
    return run


@dataclass
class Probes:
    """What a horizon-probe search needs: the problem, its bounds and its time grid."""

    problem: Problem
    graph: TaskGraph
    lower: float        # proven lower bound (seconds)
    upper: float        # makespan of the warm start (seconds)
    tick: float         # every makespan is a whole number of these


def probe_search(probes: Probes, deadline: float, gap: float, threads: int,
                 report: Any) -> Run:
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
    run = Run()
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


def _probe(p: Probes, horizon: float, deadline: float, gap: float, threads: int
           ) -> tuple[str, Optional[Run], Any]:
    """One probe: ``(outcome, HiGHS run, model)``; the outcome is ``infeasible
    (preprocessing)`` (the windows or bounds already rule ``horizon`` out), ``infeasible``,
    ``optimal``, ``schedule found`` or ``no answer`` (time ran out)."""
    try:
        win = milp_prep.prepare(p.problem, p.graph, horizon, use_memory=True)
    except milp_prep.HorizonTooSmall:
        return "infeasible (preprocessing)", None, None
    if win.lower_bound > horizon * (1 + 1e-9):
        return "infeasible (preprocessing)", None, None
    model = DisjunctiveModel(p.problem, p.graph, win, offload=False)
    # a probe's own incumbents are not global ones: no progress from inside it
    probe = _HighsJob(model, gap, False).run(deadline, threads, Progress(None, 0.0),
                                             PORTFOLIO[0])
    if probe.has_solution:
        return ("optimal" if probe.optimal else "schedule found"), probe, model
    return ("infeasible" if probe.error else "no answer"), probe, model


#: HiGHS settings of the portfolio's searches
PORTFOLIO = ({"random_seed": 0}, {"random_seed": 1, "mip_heuristic_effort": 0.02})


def _run_highs_portfolio(tasks: list[Task], deadline: float, gap: float, threads: int,
                         report: Progress) -> Run:
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
    from queue import Empty

    import pyomo.environ as pyo

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    per = max(1, int(threads) // len(tasks))

    def work(idx: int) -> None:
        try:
            probes = tasks[idx].probes
            if probes is not None:
                run = probe_search(probes, deadline, gap, per, _QueueReport(queue, idx))
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
    done: dict[int, tuple[Run, list | None]] = {}
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
        run = Run(message="HiGHS: no answer before the deadline", model=tasks[0].model)
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


def _combined_bound(tasks: list[Task], seen: dict[int, float],
                    finals: dict[int, Run]) -> Optional[float]:
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
            options: dict[str, Any] | None = None) -> Run:
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
        run = Run()
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


def _run_gurobi(model: DisjunctiveModel, time_limit: float, gap: float, threads: int,
                report: Progress, warm: bool) -> Run:
    """Gurobi through Pyomo's ``gurobi_persistent`` interface, with the MIP start.

    A size-limited license (the one pip's gurobipy carries) rejects models over 2000
    variables or constraints with error 10010; that becomes an OptPipeError naming the
    model's size and the engines that have no such limit.
    """
    import pyomo.environ as pyo
    from pyomo.opt import TerminationCondition as TC

    size = model.size()
    run = Run()
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


class Progress:
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
