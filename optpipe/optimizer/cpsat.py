"""The OR-Tools CP-SAT engine: exact models of the simulator's semantics, solved.

The engine picks a complete hint from the candidate schedules, builds a model, runs
CP-SAT on it (after a gap probe where the hint is near its bound, :func:`_gap_probe`;
continuing with the windows of :mod:`.decompose`, and a closing run of the full model,
where the full model alone does not close the problem; past the cell limit of the full
model with prefix cuts, a search and then probes, :mod:`.descent`), extracts the
schedule and reports its figures in seconds; :func:`solve_reach` and
:func:`solve_least` run the order model for proven bounds (:mod:`.prefix`). The models
are modules of their own, one job each:

* :mod:`.cpsat_model`: what both models share: the integer time scale
  (:class:`~.cpsat_model.Ticks`), the hint (:class:`~.cpsat_model.Hint`), the builder
  and the base variables;
* :mod:`.cpsat_order`: the order model (no offload), memory decided by the order of
  compute on each device;
* :mod:`.cpsat_tight`: the tight model (offload allowed), every time pinned to the
  simulator's ASAP rule.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

from ortools.sat.python import cp_model

from optpipe.optimizer.bounds import lower_bound, memory_bounds
from optpipe.optimizer.cpsat_model import (Hint, ModelVars, Ticks, make_hint, make_ticks,
                                           tight_memory_ok)
from optpipe.optimizer.cpsat_order import build_order_model
from optpipe.optimizer.cpsat_tight import build_tight_model
from optpipe.optimizer.extract import orders_from_starts
from optpipe.optimizer.preprocess import Key, canonical_form, graph_placement
from optpipe.optimizer.result import (ERROR, FEASIBLE, INFEASIBLE, OPTIMAL, UNKNOWN,
                                      EngineResult, ProgressFn, relative_gap)
from optpipe.problem import Problem
from optpipe.schedule import Op, Schedule

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
#: 30-36 s, four of five. Past it (16 x 64) the full model searches until it stalls
#: and objective-free probes prove its answer (:func:`descends`, :mod:`.descent`).
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
#: The gap probe (:func:`_gap_probe`): where the full model runs whole and its hint is
#: within ``PROBE_WITHIN`` of the proven bound but further than the gap asked for (at
#: least ``PROBE_GAP``), CP-SAT first asks whether a schedule ``PROBE_GAP`` shorter
#: than the hint exists. Why: at budget S/2 on one stage per device the full model
#: minimizing from the hint neither proves nor moves its bound in the minute (8 x 64:
#: not in 300 s), while the probe, whose horizon narrows every time window, is refuted
#: quickly (`scripts/bench_gap_probe.py`, 2026-12-06, 2 threads, from the driver's
#: answer with its prefix cuts): 4 x 64 325.95 s infeasible in 24 s, 8 x 64 304.75 s in
#: 40 s; 0.3% below 4 x 64's answer still open after 60 s. 2% covers those hints'
#: distances to their bounds (0.82-1.4%); further away the hint is rarely the optimum.
PROBE_GAP = 0.005
PROBE_WITHIN = 0.02
#: Does the gap probe minimize the makespan inside its horizon? No: the question is
#: whether any schedule is there, and without the objective CP-SAT answers it sooner
#: where it matters (`python scripts/bench_probe_objective.py`, table in
#: docs/optimizer-log.md, 2026-12-07, from the driver's answer and cuts at S/2, seeds
#: 1-5, 2 workers: 8 x 64 refuted in 14.6-30.2 s, median 18.3 s, against 17.8-38.1 s,
#: median 33.7 s, with it; 4 x 64 in 13.3-14.2 s against 11.5-13.8 s, within a second).
#: A schedule found inside goes to the full model's run as its hint, which minimizes
#: from there.
PROBE_MINIMIZES = False
#: CP-SAT's work limit for its transitive closure of precedences (its default: 1e6); 0
#: switches the closure off (why: :func:`new_solver`; `scripts/bench_cpsat_params.py`
#: measures both).
TRANSITIVE_PRECEDENCES_WORK_LIMIT = 0
#: CP-SAT's use of the precedences between intervals inside its no-overlap constraints
#: (its default: on), in the runs whose job is a proof (``new_solver(proof=True)``: the
#: prefix cuts' pieces, a full model with the cuts and no windows, the gap probe).
#: Why off there: those runs search little and propagate much (about 110
#: conflicts a second in the 8 x 64 probe, CP-SAT's log), and this propagator reads
#: the thousands of precedences of our order models at every node; without it the
#: pieces, the probes and the 16 x 32 full model with cuts at S/2 were proven sooner
#: (``scripts/bench_disjunctive.py``). Left on elsewhere: the searches for schedules
#: were not measured without it.
PROOF_DISJUNCTIVE_PRECEDENCES = False
DEFAULT_LEVELS: tuple[float, ...] = (1.0,)


# --------------------------------------------------------------------- solve
class _Reporter(cp_model.CpSolverSolutionCallback):
    """Forwards incumbents (and bound moves) to a progress function, in seconds."""

    def __init__(self, scale: float, progress: ProgressFn | None, t0: float) -> None:
        super().__init__()
        self.scale, self.progress, self.t0 = scale, progress, t0
        self.best: float | None = None
        self.bound: float | None = None
        #: when the last better schedule came (monotonic; None before the first)
        self.improved_at: float | None = None

    def on_solution_callback(self) -> None:
        self.improved_at = time.monotonic()
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


def new_solver(seconds: float, threads: int, proof: bool = False) -> cp_model.CpSolver:
    """A CP-SAT solver as every model here runs it: ``seconds``, ``threads`` workers,
    presolve probing off (how the order model was proven in the prototypes), and no
    transitive closure of the precedences when the model is loaded; with ``proof``
    (a run whose job is a bound), :data:`PROOF_DISJUNCTIVE_PRECEDENCES`.

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
    if proof:
        solver.parameters.use_precedences_in_disjunctive_constraint = \
            PROOF_DISJUNCTIVE_PRECEDENCES
    return solver


def solve_cpsat(problem: Problem, *, warm_start: Schedule | Sequence[Schedule] | None = None,
                time_limit: float = 60.0, gap: float = 0.0, threads: int = 2,
                offload: bool = False, split_backward: bool = True,
                levels: Sequence[float] = DEFAULT_LEVELS,
                progress: ProgressFn | None = None, log: bool = False,
                fix_hint: bool = False, decompose: bool | None = None,
                placement: Sequence[int] | None = None,
                cuts: "PrefixCuts | None" = None, seed: int | None = None,
                proof: bool = False) -> EngineResult:
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
    alone; where the full model runs whole near its bound, a gap probe comes first
    (:data:`PROBE_GAP`); past :data:`WINDOWLESS_MAX_CELLS_WITH_CUTS` with the cuts,
    unless True, the search then probe of :mod:`.descent` (:func:`descends`).
    ``seed``: CP-SAT's random seed for the full model's run (its default, 1, when
    None); of several optimal orders it picks which one is returned, which matters to a
    caller that transforms the answer afterwards (:mod:`.offload_starts`). The caller
    must already have checked that the budget is feasible
    (:func:`~.preprocess.min_budgets`). ``proof``: the caller wants the bound more than
    the schedule (a piece of the prefix cuts, whose hint is usually its optimum), so the
    full model runs as the proofs do (:func:`new_solver`); so does a full model with
    ``cuts`` and no windows.
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
    # past the cell limit of the full model with the cuts, searching or proving
    if decompose is not True and not fix_hint and \
            descends(problem, placement, offload, memory_binds, cuts):
        return _search_then_probe(problem, ticks, hint, lower, cuts, max(gap, PROBE_GAP),
                                  deadline, threads, progress, t0, seed)
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
    # the full model with the prefix cuts and no windows is a proof attempt (a ladder
    # piece, the extended schedules' source, one stage per device at S/2 up to
    # WINDOWLESS_MAX_CELLS_WITH_CUTS): it runs as the proofs do
    whole = not offload and not decompose and not by_time
    proof = proof or (whole and cuts is not None)
    reporter = _Reporter(ticks.scale, progress, t0)
    probe: dict[str, Any] = {}
    if whole:
        reporter.best = hint.makespan / ticks.scale     # the probe's bounds beside it
        outcome = _gap_probe(problem, ticks, hint, lower, cuts, max(gap, PROBE_GAP),
                             deadline, threads, reporter.on_bound)
        if outcome is not None:
            probe = probe_extra(outcome, ticks)
            if outcome.status == "INFEASIBLE":
                lower = outcome.horizon + 1
            elif outcome.found is not None:
                hint, horizon = outcome.found, outcome.found.makespan
                hints = [hint] + hints
                lower = horizon if outcome.status == "OPTIMAL" else \
                    min(max(lower, outcome.bound), horizon)
            reporter.best = horizon / ticks.scale
            reporter.on_bound(lower)
            if outcome.status == "OPTIMAL" or deadline - time.monotonic() < 1:
                # proven, or no time left for the full model: the probe's answer stands
                objective, bound = horizon / ticks.scale, lower / ticks.scale
                return EngineResult(
                    schedule=hint.schedule,
                    status=OPTIMAL if lower >= horizon else FEASIBLE,
                    objective=objective, bound=bound, gap=relative_gap(objective, bound),
                    wall_time=time.monotonic() - t0, engine=ENGINE,
                    extra={**_run_extra(ticks, hint, lower, "order"), **probe,
                           "solver_objective": objective})
    began = time.monotonic()
    if offload:
        builder, handles = build_tight_model(problem, ticks, horizon, lower, hint, levels)
    else:
        builder, handles = build_order_model(problem, ticks, horizon, lower, hint,
                                             cuts=cuts)
    builder.add_hints()
    full_share = FULL_SHARE if decompose else TIME_FULL_SHARE if by_time else 1.0
    built = time.monotonic() - began
    first_limit = max(0.1, (deadline - time.monotonic()) * full_share)
    solver = new_solver(first_limit, threads, proof=proof)
    params = solver.parameters
    params.relative_gap_limit = max(0.0, gap)
    params.log_search_progress = log
    if seed is not None:
        params.random_seed = seed
    if fix_hint:
        params.fix_variables_to_their_hinted_value = True
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
    extra.update(probe)
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
        schedule = extract_schedule(problem, solver, handles, offload)
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


def descends(problem: Problem, placement: Sequence[int] | None, offload: bool,
             memory_binds: bool, cuts: "PrefixCuts | None") -> bool:
    """Does one stage per device search then probe (:mod:`.descent`) instead of
    running the full model and its windows? Where memory binds the round trip, with
    the prefix cuts, past :data:`WINDOWLESS_MAX_CELLS_WITH_CUTS` cells (16 x 64: why
    in :mod:`.descent`); below that the full model with the cuts proves the optimum."""
    return (placement is None and not offload and memory_binds and cuts is not None
            and problem.stages * problem.microbatches > WINDOWLESS_MAX_CELLS_WITH_CUTS)


def _search_then_probe(problem: Problem, ticks: Ticks, hint: Hint, lower: int,
                       cuts: "PrefixCuts", gap: float, deadline: float, threads: int,
                       progress: ProgressFn | None, t0: float, seed: int | None
                       ) -> EngineResult:
    """The full model minimizing from ``hint`` until it stalls (:data:`~.descent.
    STALL_SECONDS`) or leaves :data:`~.descent.PROBE_RESERVE` for the probes (but keeps
    :data:`~.descent.SEARCH_MIN_SHARE` of the time left), then the
    descent by probes (:func:`~.descent.probe_descent`) from its answer: the search
    finds, the probes prove (why: :mod:`.descent`)."""
    from optpipe.optimizer.descent import (PROBE_RESERVE, SEARCH_MIN_SHARE, STALL_SECONDS,
                                           probe_descent, stop_on_stall)

    start_lower = lower
    builder, handles = build_order_model(problem, ticks, hint.makespan, lower, hint,
                                         cuts=cuts)
    builder.add_hints()
    reporter = _Reporter(ticks.scale, progress, t0)
    left = deadline - time.monotonic()
    solver = new_solver(max(0.1, left - PROBE_RESERVE, left * SEARCH_MIN_SHARE), threads)
    if seed is not None:
        solver.parameters.random_seed = seed
    solver.best_bound_callback = reporter.on_bound
    watch = stop_on_stall(solver, lambda: reporter.improved_at, STALL_SECONDS)
    try:
        code = solver.solve(builder.model, reporter)
    finally:
        watch.set()
    searched = time.monotonic() - t0
    start = hint
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        found = make_hint(extract_schedule(problem, solver, handles, False), ticks)
        if found.makespan < start.makespan:
            start = found
        lower = max(lower, int(math.ceil(solver.best_objective_bound - 1e-9)))
    found, proven, stats = probe_descent(problem, ticks, start,
                                         lower=min(lower, start.makespan), cuts=cuts,
                                         gap=gap, deadline=deadline, threads=threads,
                                         progress=progress, t0=t0)
    proven = min(proven, found.makespan)
    objective, bound = found.makespan / ticks.scale, proven / ticks.scale
    # the last refutation under the gap probe's keys: the status line names it
    refuted = [o for o in stats.probes if o.status == "INFEASIBLE"]
    probe = probe_extra(refuted[-1], ticks) if refuted else {}
    return EngineResult(
        schedule=found.schedule, status=OPTIMAL if proven >= found.makespan else FEASIBLE,
        objective=objective, bound=bound, gap=relative_gap(objective, bound),
        wall_time=time.monotonic() - t0, engine=ENGINE,
        extra={**_run_extra(ticks, hint, start_lower, "order"), **probe,
               "search": "search then probe",
               "searched_seconds": round(searched, 2),
               "search_status": solver.status_name(code),
               "searched_makespan": start.makespan / ticks.scale,
               "descent_probes": stats.record(ticks.scale), "solver_objective": objective,
               "variables": len(builder.model.proto.variables),
               "constraints": len(builder.model.proto.constraints), **handles.size})


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
    code, solver, found = order_run(problem, ticks, timed.makespan, lower, timed, cuts,
                                    deadline, threads)
    if found is None:
        return timed, float(lower), solver.status_name(code), False
    return (found if found.makespan < timed.makespan else timed,
            solver.best_objective_bound, solver.status_name(code), code == cp_model.OPTIMAL)


def order_run(problem: Problem, ticks: Ticks, horizon: int, lower: int, hint: Hint,
              cuts: "PrefixCuts | None", deadline: float, threads: int,
              on_bound: Callable[[float], None] | None = None, proof: bool = False,
              minimize: bool = True) -> tuple[int, cp_model.CpSolver, Hint | None]:
    """The order model within ``[lower, horizon]``, hinted with ``hint``, solved until
    ``deadline``: CP-SAT's status code, the solver (for its bound) and the schedule it
    found, re-timed (None when it found none). What the closing run and the gap probe
    both run; ``on_bound`` sees CP-SAT's bound as it rises; ``proof`` as in
    :func:`new_solver` (the probe's; the closing run, which also searches, keeps
    CP-SAT's default: not measured without it). ``minimize`` False drops the makespan
    objective: a feasibility question, answered by the first schedule inside the
    horizon or a refutation (the gap probe's, :data:`PROBE_MINIMIZES`)."""
    builder, handles = build_order_model(problem, ticks, horizon, lower, hint, cuts=cuts)
    if not minimize:
        builder.model.clear_objective()
    builder.add_hints()
    solver = new_solver(max(0.1, deadline - time.monotonic()), threads, proof=proof)
    if on_bound is not None:
        solver.best_bound_callback = on_bound
    code = solver.solve(builder.model)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return code, solver, None
    return code, solver, make_hint(extract_schedule(problem, solver, handles, False), ticks)


class ProbeOutcome(NamedTuple):
    """What :func:`_gap_probe` found: CP-SAT's status name for the model cut at
    ``horizon`` (ticks); ``found``, a schedule within it (FEASIBLE, or OPTIMAL when the
    probe minimizes), and ``bound``, CP-SAT's bound inside it (a global bound once a
    schedule is inside: every schedule shorter than the hint is; the probe's lower
    bound when it does not minimize)."""

    status: str
    horizon: int
    found: Hint | None
    bound: int
    seconds: float


def probe_horizon(makespan: int, gap: float) -> int:
    """The gap probe's horizon (ticks) from an answer of ``makespan`` ticks: the
    longest makespan whose refutation leaves the answer within ``gap`` of the bound
    (one tick under ``(1 - gap)`` of it). One definition for :func:`_gap_probe` and the
    benchmark that times it (``scripts/bench_gap_probe.py``)."""
    return int(math.ceil(makespan * (1 - gap) - 1e-9)) - 1


def probe_status_name(solver: cp_model.CpSolver, code: int, minimized: bool) -> str:
    """CP-SAT's status name for a probe's run, except that a schedule found by a model
    without objective is FEASIBLE: CP-SAT calls any solution of such a model OPTIMAL,
    which a caller would take for a proven optimum. One rule for :func:`_gap_probe`
    and the benchmark that times it (``scripts/bench_gap_probe.py``)."""
    name = solver.status_name(code)
    return "FEASIBLE" if name == "OPTIMAL" and not minimized else name


def _gap_probe(problem: Problem, ticks: Ticks, hint: Hint, lower: int,
               cuts: "PrefixCuts | None", gap: float, deadline: float, threads: int,
               on_bound: Callable[[float], None] | None = None) -> ProbeOutcome | None:
    """Is there a schedule at most ``horizon``, the longest makespan whose refutation
    leaves the hint within ``gap`` of the bound? The full model with its horizon there,
    until ``deadline``; None where no probe is worth it (see :data:`PROBE_GAP`).

    INFEASIBLE raises the bound to ``horizon + 1`` tick; a schedule found is shorter
    than the hint (FEASIBLE: the probe has no objective, :data:`PROBE_MINIMIZES`, and
    stops at the first; with one, OPTIMAL would make it the optimum: every shorter
    schedule is inside). The hint is outside the horizon, so it guides CP-SAT only as a
    partial solution. ``on_bound`` (ticks; only with an objective) sees CP-SAT's bound
    as it rises: a bound of the problem too (the optimum is inside the horizon if any
    schedule is, else above every bound).
    Only with prefix cuts: every measured refutation used them (their least distances
    between forwards pin the first stage's forwards to windows a tick-wide horizon
    cut narrows further).
    """
    if cuts is None or hint.makespan <= lower:
        return None
    distance = relative_gap(hint.makespan, lower) or 0.0
    if not gap < distance <= PROBE_WITHIN:
        return None
    horizon = probe_horizon(hint.makespan, gap)
    if horizon < lower:
        return None
    return run_probe(problem, ticks, hint, lower, cuts, gap, deadline, threads, on_bound)


def run_probe(problem: Problem, ticks: Ticks, hint: Hint, lower: int,
              cuts: "PrefixCuts | None", gap: float, deadline: float, threads: int,
              on_bound: Callable[[float], None] | None = None) -> ProbeOutcome:
    """One probe, whoever decided it is worth it (:func:`_gap_probe`, the descent of
    :mod:`.descent`): the order model cut at :func:`probe_horizon` of ``hint``'s
    makespan, with or without its objective (:data:`PROBE_MINIMIZES`), until
    ``deadline``."""
    horizon = probe_horizon(hint.makespan, gap)
    began = time.monotonic()
    code, solver, found = order_run(problem, ticks, horizon, lower, hint, cuts, deadline,
                                    threads, on_bound if PROBE_MINIMIZES else None,
                                    proof=True, minimize=PROBE_MINIMIZES)
    bound = lower if found is None or not PROBE_MINIMIZES else \
        int(math.ceil(solver.best_objective_bound - 1e-9))
    if found is not None and found.makespan > horizon:   # re-timed ASAP: never; a guard
        found = None
    return ProbeOutcome(status=probe_status_name(solver, code, PROBE_MINIMIZES),
                        horizon=horizon, found=found, bound=bound,
                        seconds=time.monotonic() - began)


def probe_extra(outcome: ProbeOutcome, ticks: Ticks) -> dict[str, Any]:
    """A probe's figures in a run's ``extra``, the keys the driver's status line reads
    (``driver._probe_note``)."""
    return {"gap_probe_horizon": outcome.horizon / ticks.scale,
            "gap_probe_status": outcome.status,
            "gap_probe_seconds": round(outcome.seconds, 3)}


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
    solver = new_solver(max(0.05, time_limit), threads, proof=True)
    code = solver.solve(builder.model)
    if code == cp_model.INFEASIBLE:
        return ReachBound(math.inf, True)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return ReachBound(solver.best_objective_bound / ticks.scale, code == cp_model.OPTIMAL)


def extract_schedule(problem: Problem, solver: cp_model.CpSolver, handles: ModelVars,
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
