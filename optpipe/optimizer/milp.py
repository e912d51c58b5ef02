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

The formulations live beside this module: :mod:`.milp_disjunctive` (the disjunctive
model, offload included) and :mod:`.milp_ti` (the time-indexed one); the solver runs
(HiGHS's portfolio and horizon probes, Gurobi) in :mod:`.milp_run`.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional

from optpipe.errors import InfeasibleError, OptPipeError
from optpipe.optimizer import milp_prep
from optpipe.optimizer.milp_disjunctive import DisjunctiveModel
from optpipe.optimizer.milp_prep import Windows
from optpipe.optimizer.milp_run import PORTFOLIO, Probes, Progress, Task, run_solver
from optpipe.optimizer.preprocess import (Candidate, TaskGraph, canonical_form,
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
    report = Progress(progress, t0)
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
    tasks = [Task(model, started, PORTFOLIO[0])]
    if solver == "highs" and threads >= 2 and _free_cores() >= 1.5:
        tasks.append(_second_task(problem, graph, model, win, started, horizon))
        if tasks[-1] is None:
            # no schedule ends one tick earlier: the warm start is optimal
            return _finish(problem, incumbent.schedule, incumbent.result, OPTIMAL, horizon,
                           horizon, solver, t0, time_limit, extra, report,
                           "no schedule is one tick shorter than the warm start")
    deadline = t0 + max(time_limit, time.perf_counter() - t0 + 1.0)
    run = run_solver(tasks, solver, deadline, gap, threads, report)
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
    return DisjunctiveModel(problem, graph, win, offload=offload)


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


def _second_task(problem: Problem, graph: TaskGraph, model: Any, win: Windows,
                 warm: bool, horizon: float) -> Optional[Task]:
    """The portfolio's second search; None when it proves the warm start optimal.

    Time-indexed: the same model over a horizon one tick shorter than the warm start.
    Why: every better schedule ends at least one tick earlier, so this model keeps all
    of them while its windows (hence fixed counts) are tighter; its optimum is the
    global optimum and its infeasibility proves the warm start optimal. Disjunctive,
    when every duration and lag is a whole number of ticks: horizon probes
    (:func:`probe_search`). Otherwise: the same model with another seed.
    """
    from optpipe.optimizer import milp_ti

    if model.formulation != "time-indexed":
        tick = milp_ti.tick_for(problem, graph)
        if tick is None or model.offload:
            return Task(model, warm, PORTFOLIO[1])
        return Task(None, False, PORTFOLIO[0],
                    probes=Probes(problem, graph, win.lower_bound, horizon, tick))

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
    return Task(model2, False, PORTFOLIO[0], restricted=shorter)


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


def _finish(problem: Problem, schedule: Schedule, result: SimResult, status: str,
            objective: float, bound: float, solver: str, t0: float, time_limit: float,
            extra: dict[str, Any], report: Progress, message: str) -> EngineResult:
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
