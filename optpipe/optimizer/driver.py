"""``solve``: the optimizer's entry point — engines, time budget, checks, fallback, cache.

Why a driver separate from the engines: whatever an engine returns is only a claim.
The driver re-simulates it (the simulator is the one judge), checks the budget, compares
it with every fixed schedule, and returns the best thing that is actually valid, with
its provenance. It never returns something worse than the best fitting fixed schedule,
and a solve that yields nothing falls back to that schedule and says so.

Flow: infeasible budget? -> cache -> fixed schedules (warm starts, and the bar to beat)
-> periodic and extended warm starts when memory binds hard (where it binds softly, the
V shape's extended schedules) -> the order model (no offload;
fast, usually proves optimality) -> when offload is allowed and memory holds the
schedule back, the tight offload model, hinted with the best so far -> verify ->
provenance -> cache.

This module holds that flow, the search over placements and the choice of the answer;
its parts live beside it: :mod:`.candidates` (the schedules in hand: what fits, what
is the bar to beat), :mod:`.spaces` (the placements searched and their bounds),
:mod:`.warm_starts` (the optimizer's own starts and the time each gets) and
:mod:`.progress` (the live line).
"""

from __future__ import annotations

import importlib.util
import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Sequence

from optpipe.errors import InfeasibleError, OptPipeError
from optpipe.optimizer import cache as cache_mod
from optpipe.optimizer.candidates import (bar_to_beat, budget_holds_back,
                                          fitting_on, fused_is_faster, hint_pool,
                                          memory_binds_hard)
from optpipe.optimizer.gcpause import with_fewer_collections
from optpipe.optimizer.prefix import (MAX_PIECE, PrefixCuts, ladder, prefix_cuts,
                                      truncated_hints)
from optpipe.optimizer.preprocess import (Candidate, FixedSet, best_fitting,
                                          fixed_schedules, infeasible_devices, min_budgets)
from optpipe.optimizer.progress import (SearchProgress, progress_sink, search_heartbeat,
                                        warm_start_heartbeat)
from optpipe.optimizer.result import (ERROR, FEASIBLE, OPTIMAL, EngineResult, ProgressFn,
                                      relative_gap)
from optpipe.optimizer.spaces import (Space, bound_with_offload, build_seconds,
                                      fused_relaxed_bound, least_bound, memory_lifts,
                                      placement_spaces, shape_bounds)
from optpipe.optimizer.warm_starts import (CHUNKED_EXTEND_SHARE, LIST_SCHEDULES_SHARE,
                                           OFFLOAD_STARTS_SHARE,
                                           OFFLOAD_STARTS_SHARE_SOFT, PERIODIC_SHARE,
                                           add_chunked_extended, add_extended,
                                           add_list_schedules, add_offloaded_starts,
                                           add_periodic, add_previous, extend_share,
                                           meets, refine_offloaded)
from optpipe.problem import Problem
from optpipe.schedule import (Schedule, linear_placement, placement_name,
                              searched_placements)
from optpipe.simulator import SimResult, simulate
from optpipe.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from optpipe.optimizer.offload_list import RandomizedSearch

SOLVERS = ("auto", "cpsat", "highs", "gurobi")
#: Placements the search may use (``placements=`` of :func:`solve`, ``--placements``):
#: one stage per device, the V shape, interleaved with 2 chunks per device.
PLACEMENTS = tuple(searched_placements(2))
#: ``offload=None`` allows offload whenever the budget holds the schedule back up to
#: this many cells (S x M); beyond, only when memory binds hard (:func:`_resolve_offload`).
OFFLOAD_AUTO_MAX_CELLS = 256
#: The offload model is not built at all beyond this size (even with ``offload=True``).
OFFLOAD_MAX_CELLS = 256
#: Share of the time limit the order model may use before the offload model starts.
ORDER_SHARE_WITH_OFFLOAD = 0.3
#: The offload model (one stage per device) runs only while one stage per device's best
#: start, which it searches from, is within this share of the incumbent
#: (:func:`_offload_model_reaches`).
OFFLOAD_MODEL_REACH = 0.15
#: Share of the order-model time the most promising placement gets when others remain.
FIRST_SPACE_SHARE = 0.7
#: When other placements are searched too, one stage per device goes first with this
#: share and the full model only (no window search): a proof attempt. It usually closes
#: in seconds at budgets >= S, and what it leaves flows on to the other placements.
LINEAR_PROOF_SHARE = 0.4
#: Share of one stage per device's first run that its prefix cuts (:mod:`.prefix`) may use.
CUTS_SHARE = 0.25
#: The same where pieces above MAX_PIECE are solved too (:func:`~.prefix.ladder`): at
#: 8 x 64, S/2, 25% left ``reach[32]`` unproven (a bound 3.2 s under its value).
LADDER_CUTS_SHARE = 0.4
#: Fitting schedules whose first microbatches hint each piece of the prefix cuts.
HINTS_PER_PIECE = 3
DEFAULT_LEVELS = (1.0,)
FALLBACK = "fallback"
CACHED = "cached"


@dataclass
class SolveResult:
    """What :func:`solve` returns: the schedule, its simulation, and how it was found.

    Unpacks as ``schedule, sim = solve(...)``. ``status`` is ``optimal``, ``feasible``
    (time limit reached), ``fallback`` (a fixed schedule was returned, see ``message``) or
    ``cached``; ``objective`` is the engine's makespan and ``sim.makespan`` the
    simulated one (they agree, and tests check it).
    """

    schedule: Schedule
    sim: SimResult
    status: str
    objective: float | None
    bound: float | None
    gap: float | None
    wall_time: float
    engine: str
    message: str = ""
    fixed: list[Candidate] = field(default_factory=list)
    runs: list[EngineResult] = field(default_factory=list)
    #: What is proven per placement searched: ``{"placement": label, "best": seconds,
    #: "bound": seconds, "gap": ..., "optimal": bool}``. The overall ``bound`` is the least
    #: of them; a placement can be proven optimal while the overall gap stays open.
    placements: list[dict[str, Any]] = field(default_factory=list)
    #: Seconds from the call to the start of the search: the fixed schedules and the
    #: warm starts, some of which are built whatever the time limit (every fixed
    #: schedule, for the comparison and the never-worse rule; the first list schedule of
    #: each kind). None for a cached answer. Why kept: a limit shorter than this is
    #: exceeded, and the command says so with this figure.
    warm_start_time: float | None = None

    def __iter__(self):
        yield self.schedule
        yield self.sim

    @property
    def makespan(self) -> float:
        return self.sim.makespan


@with_fewer_collections
def solve(problem: Problem, *, solver: str = "auto", offload: bool | None = None,
          split_backward: bool = True, time_limit: float = 60.0, gap: float = 0.0,
          threads: int = 2, cache: bool = True, progress: bool | ProgressFn = True,
          offload_levels: Sequence[float] = DEFAULT_LEVELS,
          placements: Sequence[str] | None = None) -> SolveResult:
    """The fastest schedule found for ``problem`` within its per-device budgets.

    ``solver``: ``auto`` (CP-SAT, the fastest engine in the benchmark, see
    docs/optimizer.md), ``cpsat``, ``highs`` or ``gurobi`` (the Pyomo MILP).
    ``offload``: True allows activation offload, False forbids it, None (auto) allows
    it when the budget is what holds the schedule back (a faster fixed schedule exists
    that does not fit) — beyond 256 stage x microbatch cells only when the budget costs
    the fixed schedules more than 5% (see :func:`_resolve_offload`).
    ``split_backward``: model B and W separately (what zero-bubble schedules need);
    False schedules fused backwards only. ``time_limit`` covers the whole call.
    ``progress``: True prints a live line on stderr during long solves; a callable gets
    ``(elapsed, incumbent, bound, gap)``. ``placements``: the stage placements the
    answer may use, a subset of :data:`PLACEMENTS` (default all), for runtimes that run
    only some (one stage per device, say); fixed schedules on the others are still
    simulated for the comparison but neither returned nor counted in the bound, so
    ``optimal`` then means optimal over these placements. Raises
    :class:`InfeasibleError` with the smallest feasible budgets when no schedule fits.
    """
    t0 = time.monotonic()
    if solver not in SOLVERS:
        raise OptPipeError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    if problem.chunks != 1:
        raise OptPipeError("solve the base problem (one stage per device); the solver "
                           "chooses the order of work itself")
    if time_limit <= 0:
        raise OptPipeError(f"the time limit must be positive, got {time_limit}")
    if not 0 <= gap < 1:
        raise OptPipeError(f"the gap is a fraction of the makespan in [0, 1) (0.01 for one "
                           f"percent), got {gap}")
    _check_budget(problem)
    levels = tuple(sorted(set(float(x) for x in offload_levels)))
    if not levels or any(not 0 < x <= 1 for x in levels):
        raise OptPipeError(f"offload levels must lie in (0, 1], got {list(offload_levels)}")
    _check_engine_available(solver)
    allowed = _check_placements(problem, placements)

    everything = fixed_schedules(problem)
    fixed = _restrict(everything, problem, allowed)
    use_offload = _resolve_offload(problem, offload, fixed, best_fitting(
        [c for c in fixed.candidates if not c.schedule.offloads]), split_backward)
    best_fixed = bar_to_beat(fixed, use_offload, split_backward)
    key = cache_mod.cache_key(problem, solver=solver, split_backward=split_backward,
                              offload=use_offload, levels=levels, placements=allowed)
    if cache:
        hit = cache_mod.lookup(problem, key, time_limit=time_limit, gap=gap)
        if hit is not None and (best_fixed is None
                                or hit.result.makespan <= best_fixed.makespan * (1 + 1e-9)):
            prov = hit.schedule.provenance
            prov["problem"] = problem.to_record()     # entries stored before it was kept
            return SolveResult(schedule=hit.schedule, sim=hit.result, status=CACHED,
                               objective=prov.get("objective"), bound=prov.get("bound"),
                               gap=prov.get("gap"), wall_time=time.monotonic() - t0,
                               engine=str(prov.get("solver", "cache")),
                               message="; ".join(filter(None, [
                                   f"from {hit.path}",
                                   _even_split_note(problem, hit.schedule)])),
                               fixed=_shown(everything, fixed))

    reporter = progress_sink(progress)
    # the live line while warm starts are built (at 16 x 64 they take 8 s or more):
    # between the phases here, and inside the extensions and the offloaded refinement
    heartbeat = warm_start_heartbeat(reporter, t0, fixed, use_offload, split_backward)
    tick = heartbeat or (lambda: None)
    # decided before the warm starts below join the candidates (they fit, and fast)
    binds = memory_binds_hard(fixed, use_offload, split_backward)
    held_back = budget_holds_back(fixed, bar_to_beat(fixed, True, split_backward))
    # what the extended schedules' sources prove on fewer microbatches, for the cuts
    proven = PrefixCuts()
    # the offload-aware list schedules' randomized searches, per placement: kept from
    # the offloaded starts to the time the search leaves over
    searches: dict[str, RandomizedSearch] = {}
    tick()
    # the bounds hold whatever is in hand: known first, they say when a schedule in hand
    # is optimal already, and the warm starts after it would be built for nothing
    bounds = shape_bounds(problem, split_backward, use_offload, allowed)
    floor = least_bound(problem, bounds, split_backward, use_offload)
    add_list_schedules(problem, fixed, split_backward, allowed,
                       deadline=t0 + time_limit * LIST_SCHEDULES_SHARE, floor=floor,
                       use_offload=use_offload)
    if cache:
        add_previous(problem, fixed, key, split_backward, allowed)
    tick()
    optimal_in_hand = meets(fixed, floor, use_offload, split_backward)
    if use_offload and held_back and not optimal_in_hand:
        add_offloaded_starts(problem, fixed, split_backward, allowed,
                             time_limit * (OFFLOAD_STARTS_SHARE if binds
                                           else OFFLOAD_STARTS_SHARE_SOFT), searches)
        tick()
    if optimal_in_hand:
        pass                         # the search below returns it at once, as optimal
    elif binds:
        add_periodic(problem, fixed, split_backward, use_offload,
                     time_limit * PERIODIC_SHARE, threads, allowed)
        tick()
        add_extended(problem, fixed, split_backward, use_offload,
                     time_limit * extend_share(problem), threads, allowed,
                     heartbeat,
                     proven)
    elif solver in ("auto", "cpsat") and not (use_offload and _offload_model_built(problem)):
        # without an offload model the order models search as without offload, and the
        # extensions are their start as there
        add_chunked_extended(problem, fixed, split_backward,
                             time_limit * CHUNKED_EXTEND_SHARE, threads, allowed,
                             heartbeat, None if use_offload else bounds)
    best_fixed = bar_to_beat(fixed, use_offload, split_backward)
    runs: list[EngineResult] = []
    engine = "cpsat" if solver == "auto" else solver
    spaces = placement_spaces(problem, split_backward, fixed, engine, use_offload, allowed,
                              bounds)
    relaxed = fused_relaxed_bound(problem, spaces) if split_backward else None
    notes: list[str] = []
    live = None if reporter is None else SearchProgress(
        reporter, t0, spaces, best_fixed.makespan if best_fixed else None, use_offload,
        relaxed)
    if reporter is not None and hasattr(reporter, "start"):
        reporter.start()       # the live line's clock runs through the engines' runs
    warm_start_time = time.monotonic() - t0
    try:
        union_bound = _search(problem, spaces, runs, fixed, best_fixed, engine=engine,
                              deadline=t0 + time_limit, gap=gap, threads=threads,
                              use_offload=use_offload, split_backward=split_backward,
                              levels=levels, progress=live, notes=notes,
                              memory_binds=binds, proven=proven)
        if use_offload:
            refined = refine_offloaded(problem, fixed, runs, split_backward, allowed,
                                       t0 + time_limit, threads, union_bound,
                                       search_heartbeat(live, fixed, split_backward),
                                       searches)
            if refined:
                notes.append(refined)
            best_fixed = bar_to_beat(fixed, use_offload, split_backward)
    finally:
        if reporter is not None and hasattr(reporter, "close"):
            reporter.close()
    if union_bound is not None:
        if relaxed is not None and relaxed < union_bound:
            union_bound = relaxed
            notes.append("a fused backward is faster than B + W on some stage, and the "
                         "engines model split backwards only: the bound is that of a "
                         "relaxation covering fused and mixed schedules too, so it is weaker")
    result = _choose(problem, runs, best_fixed, time.monotonic() - t0, union_bound, gap)
    estimate = _even_split_note(problem, result.schedule)
    if estimate:
        notes.append(estimate)
    if notes:
        result.message = "; ".join(filter(None, [result.message] + notes))
    result.fixed = _shown(everything, fixed)
    result.runs = runs
    result.warm_start_time = warm_start_time
    result.placements = _placement_proofs(problem, spaces, runs, fixed, use_offload, gap)
    _stamp(result, problem, time_limit=time_limit, gap=gap, threads=threads,
           offload=use_offload, split_backward=split_backward, levels=levels,
           allowed=allowed)
    if cache and result.status in (OPTIMAL, FEASIBLE):
        cache_mod.store(result.schedule, key)
    return result


def _check_budget(problem: Problem) -> None:
    bad = infeasible_devices(problem)
    if not bad:
        return
    need, need_off = min_budgets(problem)
    where = ", ".join(f"device {d} needs {format_bytes(need[d])} "
                      f"(budget {format_bytes(problem.budget[d])})" for d in bad)
    listed = ", ".join(format_bytes(n) for n in need)
    smallest = (f"{listed} with or without offload" if list(need) == list(need_off) else
                f"{listed} without offload and "
                f"{', '.join(format_bytes(n) for n in need_off)} with it")
    raise InfeasibleError(
        f"no schedule fits the budget: {where}. Every device must hold its static bytes "
        f"plus one microbatch's activation at the start of a forward, offload or not "
        f"(offload frees bytes only after the forward ends), so the smallest budgets are "
        f"{smallest}", min_budget=need, min_budget_offload=need_off)


def _check_engine_available(solver: str) -> None:
    if solver in ("highs", "gurobi"):
        if importlib.util.find_spec("optpipe.optimizer.milp") is None:
            raise OptPipeError("the MILP engine (optpipe.optimizer.milp) is not available; "
                               "use --solver cpsat")
    if solver == "gurobi" and importlib.util.find_spec("gurobipy") is None:
        raise OptPipeError("--solver gurobi needs gurobipy, which is not installed "
                           "(pip install gurobipy, and a license); or use --solver highs "
                           "or --solver cpsat")


def _check_placements(problem: Problem, placements: Sequence[str] | None
                      ) -> tuple[str, ...] | None:
    """The placements asked for, in :data:`PLACEMENTS` order; None when that is all of
    them (so an unrestricted solve keeps its cache key and its library entry)."""
    if placements is None:
        return None
    names = {str(p).strip().lower() for p in placements if str(p).strip()}
    unknown = sorted(names - set(PLACEMENTS))
    if unknown or not names:
        raise OptPipeError(f"unknown placement {', '.join(unknown) or '(none given)'}; "
                           f"choose from {', '.join(PLACEMENTS)}, e.g. linear,v")
    if problem.devices < 2:      # one device: every placement is one stage on it
        if "linear" not in names:
            raise OptPipeError("with one device the only placement is linear")
        return None
    if names == set(PLACEMENTS):
        return None
    return tuple(p for p in PLACEMENTS if p in names)


def _restrict(fixed: FixedSet, problem: Problem, allowed: tuple[str, ...] | None
              ) -> FixedSet:
    """The fixed schedules on the allowed placements (all of them when unrestricted)."""
    if allowed is None:
        return fixed
    return FixedSet([c for c in fixed.candidates
                     if placement_name(c.schedule.placement, problem.devices) in allowed],
                    fixed.skipped)


def _shown(everything: FixedSet, fixed: FixedSet) -> list[Candidate]:
    """What the comparison lists: the schedules the search could use (periodic blocks
    included) and, for reference, the fixed schedules on placements it was not allowed."""
    if everything is fixed:
        return fixed.candidates
    used = {id(c) for c in fixed.candidates}
    return fixed.candidates + [c for c in everything.candidates if id(c) not in used]


def _offload_model_built(problem: Problem) -> bool:
    """Is the problem small enough for the offload model (:data:`OFFLOAD_MAX_CELLS`)?
    One rule for the search, its notes, and the extensions that run where it is not."""
    return problem.stages * problem.microbatches <= OFFLOAD_MAX_CELLS


def _resolve_offload(problem: Problem, offload: bool | None, fixed: FixedSet,
                     best_fixed: Candidate | None, split_backward: bool = True) -> bool:
    """Auto: offload when a faster fixed schedule exists that does not fit the budget;
    beyond :data:`OFFLOAD_AUTO_MAX_CELLS` only when memory binds hard
    (:func:`~.candidates.memory_binds_hard`).

    Why the two rules: up to that size the offload model (a circuit per device) is built
    and may take 70% of the minute from the order models (where its start is within
    reach, :func:`_offload_model_reaches`), which pays only where the budget holds the
    schedule back. Beyond it no offload model runs and the order models keep their
    time; offload then costs the offloaded list schedules' share
    (:data:`~.warm_starts.OFFLOAD_STARTS_SHARE`) and reports the weaker bound that holds
    with offload, which pays where memory costs the fixed schedules more than
    :data:`~.candidates.PERIODIC_MIN_LOSS` (at S/2 on the benchmark, 16 x 32: 9.5% bubble
    with offload against 30.0% without; at S, where it does not bind hard, 16 x 64 ended
    at 205.9 s with offload against 204.3 s without).
    """
    if offload is not None:
        return offload
    held_back = budget_holds_back(fixed, best_fixed)
    if problem.stages * problem.microbatches <= OFFLOAD_AUTO_MAX_CELLS:
        return held_back
    return held_back and memory_binds_hard(fixed, False, split_backward)


def _search(problem: Problem, spaces: list[Space], runs: list[EngineResult],
            fixed: FixedSet, best_fixed: Candidate | None, *, engine: str,
            deadline: float, gap: float, threads: int, use_offload: bool,
            split_backward: bool, levels: Sequence[float],
            progress: SearchProgress | None, notes: list[str],
            memory_binds: bool = False, proven: PrefixCuts | None = None
            ) -> float | None:
    """Run the engines over the placements; return the proven bound over all of them.

    A placement whose lower bound is no better than the incumbent is skipped (it cannot
    win; its bound still counts), except for one stage per device's first proof
    attempt while its no-memory bound is below the incumbent. A chunked placement whose
    best start is no better than what an earlier chunked placement reached waits for the
    second sweep (where the first placement gets what is left): measured at budget S
    (search revision 10), splitting the time between the V shape and interleaved chunks
    left both short of what the one that starts ahead reaches alone (8 x 16: 52.9 s
    against 52.6 s). With offload the order
    models share ``ORDER_SHARE_WITH_OFFLOAD`` of the time, then the offload model (one
    stage per device) gets the rest, hinted with the best schedule so far on that
    placement. The offload model's space contains the order model's, so for one stage
    per device its bound (or the no-memory bound, if it did not run) replaces the order
    model's; the other placements fall back to their no-memory bounds. When
    ``memory_binds`` (hard, :func:`~.candidates.memory_binds_hard`), one stage per device's first
    run is preceded by its prefix cuts (:func:`_cuts_pay`), which raise its bound and
    go into its model; they start from ``proven`` (one stage per device's pieces
    already solved for the extended schedules).
    """
    incumbent = best_fixed.makespan if best_fixed is not None else math.inf
    linear = next((sp for sp in spaces if sp.label == "linear"), None)
    # the offload model (one stage per device) can only help below the incumbent, and
    # only from a start within its reach (checked before each placement's run below)
    offload_model = (use_offload and linear is not None
                     and _offload_model_built(problem)
                     and linear.bound < incumbent * (1 - 1e-9))
    order_deadline = time.monotonic() + (deadline - time.monotonic()) * (
        ORDER_SHARE_WITH_OFFLOAD if offload_model else 1.0)
    pool = hint_pool(fixed, split_backward)
    lb_linear = linear.bound if linear is not None else math.inf
    best_on: dict[str, Schedule] = {}
    cuts: dict[str, PrefixCuts] = {}
    searchable = [sp for sp in spaces
                  if (engine == "cpsat" and sp.hinted) or sp.label == "linear"]
    first = sorted(searchable, key=lambda sp: sp.label != "linear")   # stable
    for sweep in range(2):    # a second sweep gives time left over to open placements
        order = first if sweep == 0 else searchable
        for i, space in enumerate(order):
            if offload_model and (lb_linear >= incumbent * (1 - 1e-9) or
                                  not _offload_model_reaches(problem, linear, fixed, runs,
                                                             incumbent)):
                offload_model = False                 # it can no longer win: its time
                order_deadline = deadline             # goes to the order models
            rest = [sp for sp in order[i + 1:] if sp.search_bound < incumbent * (1 - 1e-9)]
            # one stage per device (the model every engine shares) is first given its
            # proof attempt while its no-memory bound leaves it a chance, even when its
            # memory bound does not: its optimum is reported per placement, and at S/2
            # the V search, given that time instead, returned the same schedules
            # (bench_solver, docs/optimizer.md); where even the no-memory bound rules it
            # out (the headline preset) the V search uses the time and does improve.
            # Where memory does not bind hard (budget S) the chunked search needs the
            # time: there it has no attempt once its memory bound rules it out (16 x 64
            # at S spent 19 s on a proof that did not close; search revision 13)
            proof_attempt = not sweep and space.label == "linear" and bool(rest) \
                and space.free_bound < incumbent * (1 - 1e-9) \
                and space.search_bound < space.best_fixed * (1 - 1e-9) \
                and (memory_binds or space.search_bound < incumbent * (1 - 1e-9))
            if space.search_bound >= incumbent * (1 - 1e-9) and not proof_attempt:
                continue
            if not sweep and space.label != "linear" and \
                    space.best_fixed >= incumbent * (1 - 1e-9) and \
                    any(r.extra.get("space") != "linear" for r in runs):
                continue          # starts behind what another placement reached: leftovers
            if sweep and space.label in best_on and space.bound >= \
                    _makespan_of(runs, space.label) * (1 - 1e-9):
                continue                              # proven on this placement
            left = order_deadline - time.monotonic()
            # after a chunked placement's run, the chunked ones that start behind the
            # incumbent wait for the second sweep (above), where this one comes first
            # again and takes what is left: keeping time back for them only restarted
            # this one's search (16 x 64 at S: 12.6 s of a second run, most of it
            # building and presolving the full model again; search revision 14)
            contenders = rest if space.label == "linear" else \
                [sp for sp in rest if sp.best_fixed < incumbent * (1 - 1e-9)]
            share = left * (LINEAR_PROOF_SHARE if proof_attempt else
                            FIRST_SPACE_SHARE if contenders and not sweep else 1.0)
            # CP-SAT's initial propagation cannot be interrupted: plan with how far past
            # its limit this placement's model is expected to run (or ran before)
            limit = share - space.overrun
            if limit < max(2.0 if sweep else 0.5, build_seconds(problem)) and runs:
                continue                              # it could not finish in time
            hints = ([best_on[space.label]] if space.label in best_on else []) + \
                hint_pool(fixed, space.split)
            if engine == "cpsat" and memory_binds and space.label not in cuts and \
                    _cuts_pay(problem, space, use_offload):
                began = time.monotonic()
                # _cuts_pay admits only "linear", whose space is the problem's own
                # split: the one the extended schedules' sources were proven on
                share = LADDER_CUTS_SHARE if ladder(problem.microbatches, MAX_PIECE) \
                    else CUTS_SHARE
                cuts[space.label] = _prefix_cuts(problem, space, fixed, limit * share,
                                                 threads, progress, proven)
                space.bound = max(space.bound,
                                  cuts[space.label].makespan_bound(problem.microbatches))
                limit -= time.monotonic() - began
            run = _run_engine(engine, problem, hints, max(0.5, limit), gap, threads, False,
                              space.split, levels,
                              progress.run(space.label) if progress else None,
                              space.placement, decompose=False if proof_attempt else None,
                              cuts=cuts.get(space.label))
            run.extra["space"] = space.label
            runs.append(run)
            # a run that ended early says nothing about the overrun: keep the estimate
            space.overrun = max(space.overrun, run.wall_time - max(0.5, limit))
            if run.bound is not None and run.status != ERROR:
                space.bound = max(space.bound, run.bound)
            if run.objective is not None and run.schedule is not None:
                incumbent = min(incumbent, run.objective)
                best_on[space.label] = run.schedule
    best_linear = best_on.get("linear")
    if use_offload:
        for sp in spaces:
            sp.bound = bound_with_offload(sp, lb_linear)
    if use_offload and linear is not None:
        optimal_runs = [r for r in runs if r.extra.get("space") == "linear"
                        and r.status == OPTIMAL and r.objective is not None
                        and r.objective <= lb_linear * (1 + 1e-9)]
        left = deadline - time.monotonic()
        if optimal_runs:
            linear.bound = optimal_runs[0].objective
        elif not _offload_model_built(problem):
            notes.append(f"offload model skipped: {problem.stages} x {problem.microbatches} "
                         f"is over its size limit ({OFFLOAD_MAX_CELLS} stage x microbatch "
                         f"cells); offloading fixed schedules were still compared")
        elif lb_linear >= incumbent * (1 - 1e-9):
            pass                                      # it cannot win
        elif not _offload_model_reaches(problem, linear, fixed, runs, incumbent):
            notes.append(f"offload model skipped: one stage per device's best start is "
                         f"more than {OFFLOAD_MODEL_REACH:.0%} behind the best schedule "
                         f"found")
        elif left > 1.0:
            hints = ([best_linear] if best_linear else []) + pool
            run = _run_engine(engine, problem, hints, left, gap, threads, True,
                              split_backward, levels,
                              progress.run("linear+offload") if progress else None, None)
            run.extra["space"] = "linear+offload"
            # its bound covers its own space: an OFFLOAD that holds the device back
            # comes right after its F there; one listed later holds back a later
            # action, which may be faster, so the placement keeps lb_linear
            run.extra["bound_scope"] = "waits right after the F"
            runs.append(run)
    return min(sp.bound for sp in spaces)


def _offload_model_reaches(problem: Problem, linear: Space, fixed: FixedSet,
                           runs: list[EngineResult], incumbent: float) -> bool:
    """Is one stage per device's best start (the order model's answer there, or a
    fitting schedule on it, offloading or not: what the offload model searches from)
    within :data:`OFFLOAD_MODEL_REACH` of ``incumbent``?

    Why: hinted with its start, the offload model ends at most about 12% below it in
    the minute (2026-12-04, by hand: 4 x 8 at half of 1F1B's memory with a 2 s
    transfer, 42.0 to 36.9-38.7 s; on the presets where it runs much less — llama2-13b on 8
    A100-40GB 11.177 s in 51 s and the 4-stage preset at 80 GB 11.139 s in 27 s, both
    unchanged; the 8-stage preset 3.749 to 3.746 s at 60 GB, 6.032 to 5.965 s at
    40 GB), so where that start is further behind it cannot win, and the order models
    need the time: the 4-stage preset at 80 GB, 39% behind, ended at 8.099 s on the V
    shape with 7 s of search there, and at 7.86-7.92 s with this rule (``python
    scripts/bench_offload_reach.py`` compares the presets with and without it). On the
    benchmark's problems it did not run at all (its cells up to 256 stage x microbatch
    cells at S/2 and S with offload, the same day, by hand).
    """
    start = min([_makespan_of(runs, "linear")] +
                [c.makespan for c in fitting_on(fixed, linear.placement, linear.split,
                                                fused_is_faster(problem), True)])
    return start <= incumbent * (1 + OFFLOAD_MODEL_REACH)


def _cuts_pay(problem: Problem, space: Space, use_offload: bool) -> bool:
    """Prefix cuts (:mod:`.prefix`) for one stage per device, without offload, when
    memory binds (its memory bound is above its no-memory bound) and the problem has
    more microbatches than the pieces: where CP-SAT's proofs stall. Not for the
    chunked placements: at S/2 their pieces up to 8 microbatches are proven in 6-15 s
    (4 x 16, 8 x 16) and shorten the V shape's proof at 4 x 16 1.6-3.5x, but it still
    takes 31-49 s once the answer is found, and from 8 stages or 32 microbatches on
    their chain is below the memory bound, so in the minute they cost time and close
    nothing (``scripts/bench_chunked_proofs.py``, docs/optimizer-log.md)."""
    return (space.label == "linear" and problem.microbatches > MAX_PIECE
            and memory_lifts(space.bound, space.free_bound, use_offload))


def _prefix_cuts(problem: Problem, space: Space, fixed: FixedSet, seconds: float,
                 threads: int, progress: SearchProgress | None,
                 known: PrefixCuts | None = None) -> PrefixCuts:
    """Solve the pieces for ``space``, hinted with the first microbatches of its best
    fitting schedules (:func:`~.prefix.truncated_hints`), beyond what ``known`` (of one
    stage per device, the only placement the cuts are built for) already holds."""
    on = fitting_on(fixed, space.placement, space.split, fused_is_faster(problem), False)
    return prefix_cuts(problem, space.placement, space.split, time_limit=seconds,
                       threads=threads,
                       hints=truncated_hints([c.schedule for c in on[:HINTS_PER_PIECE]]),
                       heartbeat=progress.emit if progress else None, known=known)


def _placement_proofs(problem: Problem, spaces: list[Space], runs: list[EngineResult],
                      fixed: FixedSet, use_offload: bool, gap: float
                      ) -> list[dict[str, Any]]:
    """Best schedule, proven bound and status on each placement searched.

    Why report it: the overall bound is the least over placements, so one open
    placement (the V shape at tight budgets) hides that another (one stage per device,
    the model the MILP also builds) was solved to optimality.
    """
    out = []
    faster = fused_is_faster(problem)
    for sp in spaces:
        label = "linear+offload" if sp.label == "linear" and use_offload else sp.label
        best = min([_makespan_of(runs, sp.label), _makespan_of(runs, label)]
                   + [c.makespan for c in fitting_on(fixed, sp.placement, sp.split, faster,
                                                     use_offload)],
                   default=math.inf)
        if not math.isfinite(best):
            continue
        bound = min(sp.bound, best)
        g = relative_gap(best, bound)
        out.append({"placement": label, "best": best, "bound": bound, "gap": g,
                    "optimal": g is not None and g <= gap + 1e-9})
    return out


def _even_split_note(problem: Problem, schedule: Schedule) -> str | None:
    """A warning when the answer's figures are an estimate, else None.

    Why: a chunked answer (several stages per device) on a problem with no measured or
    modelled cut of its placement is judged on an even split of each device's figures.
    That is exact for identical stages and an estimate otherwise. The V shape regroups
    a real model, and on a GPU such an answer exceeded its budget (docs/gpu.md).
    """
    placement = list(schedule.placement)
    if placement == list(range(problem.devices)) or problem.chunk_profile(placement):
        return None
    per_stage = (problem.forward, problem.backward_input, problem.backward_weight,
                 problem.activation, problem.freed_by_b) + (
                     (problem.backward_fused,) if problem.backward_fused else ())
    if all(len(set(values)) == 1 for values in per_stage):
        return None
    return (f"the answer puts {len(placement) // problem.devices} stages on each device "
            f"(placement {placement}) and is judged on an even split of each device's "
            f"times and bytes: the problem has no measured cut of that placement, so its "
            f"step time and memory are estimates (optpipe profile writes the cuts; "
            f"check with optpipe run)")


def _makespan_of(runs: list[EngineResult], label: str) -> float:
    """Best objective the runs found on one placement (inf if none)."""
    return min((r.objective for r in runs if r.extra.get("space") == label
                and r.objective is not None), default=math.inf)


def _run_engine(engine: str, problem: Problem, hints: list[Schedule], time_limit: float,
                gap: float, threads: int, offload: bool, split_backward: bool,
                levels: Sequence[float], progress: ProgressFn | None,
                placement: list[int] | None = None,
                decompose: bool | None = None,
                cuts: PrefixCuts | None = None) -> EngineResult:
    t0 = time.monotonic()
    try:
        if engine == "cpsat":
            from optpipe.optimizer.cpsat import solve_cpsat
            return solve_cpsat(problem, warm_start=hints, time_limit=time_limit, gap=gap,
                               threads=threads, offload=offload,
                               split_backward=split_backward, levels=levels,
                               progress=progress, placement=placement,
                               decompose=decompose, cuts=cuts)
        from optpipe.optimizer.milp import solve_milp  # the Pyomo engine
        linear = [h for h in hints if list(h.placement) == linear_placement(problem.devices)]
        return solve_milp(problem, warm_start=linear[0] if linear else None,
                          time_limit=time_limit, gap=gap, threads=threads, solver=engine,
                          offload=offload, split_backward=split_backward, progress=progress)
    except OptPipeError:
        raise
    except Exception as exc:  # engine failures become a fallback, explained
        license_error = _gurobi_license_error(exc)
        if license_error:
            raise OptPipeError(license_error) from None
        return EngineResult(schedule=None, status=ERROR, objective=None, bound=None, gap=None,
                            wall_time=time.monotonic() - t0, engine=engine,
                            message=f"{type(exc).__name__}: {exc}")


def _gurobi_license_error(exc: BaseException) -> str | None:
    """Gurobi's size-limited license (error 10010) in plain words, else None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        code = getattr(exc, "errno", None)
        text = str(exc)
        if code == 10010 or "size-limited license" in text.lower():
            return ("the model is over the size allowed by your Gurobi license (size-limited "
                    "license, error 10010); use --solver highs or --solver cpsat, or a full "
                    "Gurobi license")
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def _choose(problem: Problem, runs: list[EngineResult], best_fixed: Candidate | None,
            wall: float, bound: float | None, gap: float) -> SolveResult:
    """The best valid schedule among the engines' and the fixed ones, with its status.

    ``bound`` is the proven lower bound over everything searched (see :func:`_search`);
    the status is ``optimal`` when the returned schedule is within ``gap`` of it.
    """
    best: SolveResult | None = None
    best_run: EngineResult | None = None
    notes: list[str] = []
    for run in runs:
        if run.schedule is None:
            notes.append(f"{run.engine}: {run.status}" + (f" ({run.message})"
                                                          if run.message else ""))
            continue
        try:
            sim = simulate(problem, run.schedule)
        except OptPipeError as exc:
            notes.append(f"{run.engine} returned an invalid schedule: {exc}")
            continue
        if not sim.fits:
            notes.append(f"{run.engine} returned a schedule over budget on devices "
                         f"{sim.over_budget()}")
            continue
        if run.objective is not None and abs(sim.makespan - run.objective) > \
                1e-6 * max(sim.makespan, 1e-30):
            run.extra["objective_mismatch"] = sim.makespan - run.objective
        if best is None or sim.makespan < best.sim.makespan * (1 - 1e-12):
            best = SolveResult(schedule=run.schedule, sim=sim, status=run.status,
                               objective=run.objective, bound=None, gap=None,
                               wall_time=wall, engine=run.engine)
            best_run = run
    if best_fixed is not None and best is None and not runs and bound is not None and \
            best_fixed.makespan <= bound * (1 + 1e-9):
        return SolveResult(schedule=best_fixed.schedule, sim=best_fixed.result,
                           status=OPTIMAL, objective=best_fixed.makespan, bound=bound,
                           gap=0.0, wall_time=wall, engine="bound",
                           message=f"{_what(best_fixed)} meets the lower bound")
    own = False
    if best_fixed is not None and (best is None or
                                   best_fixed.makespan < best.sim.makespan * (1 - 1e-9)):
        if best is None and not runs:
            why = (f"{_what(best_fixed)} returned: the lower bounds of the "
                   f"placements the engine models already reach it")
        else:
            why = ("; ".join(notes) if best is None else
                   f"{_what(best_fixed)} is faster than the best the solver "
                   f"found")
        # the optimizer's own warm starts (offloaded list schedules, which no engine
        # searches on) are its answer, not a fallback to a fixed schedule
        own = best_fixed.schedule.provenance.get("source") == "optimizer"
        best = SolveResult(schedule=best_fixed.schedule, sim=best_fixed.result,
                           status=FEASIBLE if own else FALLBACK, objective=None,
                           bound=None, gap=None, wall_time=wall,
                           engine=runs[-1].engine if runs else "-",
                           message=why or "the solver returned no schedule")
    if best is None:  # pragma: no cover - the sequential schedule always fits
        raise OptPipeError("no schedule found: " + "; ".join(notes))
    if bound is not None:
        best.bound = min(bound, best.sim.makespan)
        best.gap = relative_gap(best.sim.makespan, best.bound)
        if best.status in (OPTIMAL, FEASIBLE):
            best.status = OPTIMAL if best.gap <= gap + 1e-9 else FEASIBLE
    if best.status != FALLBACK and not own:
        best.message = "; ".join(notes + _probe_note(best, best_run))
    return best


def _probe_note(best: SolveResult, run: EngineResult | None) -> list[str]:
    """Where the answer's bound is a refuted gap probe's (:func:`~.cpsat._gap_probe`),
    say so: the bound then comes from no schedule existing below a horizon, not from
    CP-SAT's search, which a reader of the status line would otherwise assume."""
    if run is None or run.schedule is not best.schedule or best.bound is None or \
            run.extra.get("gap_probe_status") != "INFEASIBLE":
        return []
    horizon = float(run.extra["gap_probe_horizon"])
    if best.bound < horizon:
        return []
    return [f"bound from a gap probe: no schedule of at most {format_seconds(horizon)} "
            f"(refuted in {float(run.extra['gap_probe_seconds']):.0f} s)"]


def _what(candidate: Candidate) -> str:
    """How a message names a returned candidate: a fixed schedule, or one of the
    optimizer's own warm starts (list schedules, periodic blocks, extensions)."""
    prov = candidate.schedule.provenance
    own = prov.get("source") == "optimizer"
    how = (f" ({prov.get('planned_by', 'a list schedule')} planned for "
           f"{prov['planned_for']}, fitted by offloading)" if "planned_for" in prov else "")
    return f"{'warm start' if own else 'fixed schedule'} {candidate.name}{how}"


def _stamp(result: SolveResult, problem: Problem, **options: Any) -> None:
    """Write status, figures and options into the schedule's provenance."""
    prov = dict(result.schedule.provenance)
    name = result.schedule.name
    # the optimizer's own warm starts (a list schedule meeting the bound) are its answer
    # too; a fixed schedule meeting the bound keeps its name
    own = prov.get("source") == "optimizer"
    if result.status != FALLBACK and (result.engine != "bound" or own):
        prov.update(source="solver", name="optpipe")
        if own:
            prov["warm_start"] = name
        name = "optpipe"
    prov.update(
        solver=result.engine, status=result.status, objective=result.objective,
        bound=result.bound, gap=result.gap, wall_time=round(result.wall_time, 3),
        time_limit=options["time_limit"], problem_hash=problem.hash(),
        makespan=result.sim.makespan, offload=options["offload"],
        split_backward=options["split_backward"], threads=options["threads"],
        requested_gap=options["gap"], search_revision=cache_mod.SEARCH_REVISION,
        problem=problem.to_record())
    if result.warm_start_time is not None:
        prov["warm_start_time"] = round(result.warm_start_time, 3)
    if options["offload"]:
        prov["offload_levels"] = list(options["levels"])
    if options["allowed"] is not None:
        prov["allowed_placements"] = list(options["allowed"])
    if result.message:
        prov["message"] = result.message
    if result.placements:
        prov["placements"] = [dict(p) for p in result.placements]
    prov["runs"] = [{"engine": r.engine, "status": r.status, "objective": r.objective,
                     "bound": r.bound, "wall_time": round(r.wall_time, 3),
                     **{k: v for k, v in r.extra.items() if isinstance(v, (int, float, str,
                                                                           bool, list))}}
                    for r in result.runs]
    # a copy: a returned fixed schedule is also listed, unchanged, in ``result.fixed``
    result.schedule = replace(result.schedule, name=name, provenance=prov)
    result.sim.schedule = result.schedule
