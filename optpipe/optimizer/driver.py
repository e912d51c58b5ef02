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
"""

from __future__ import annotations

import importlib.util
import math
import sys
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from optpipe.errors import InfeasibleError, OptPipeError
from optpipe.optimizer import cache as cache_mod
from optpipe.optimizer.gcpause import with_fewer_collections
from optpipe.optimizer.prefix import (MAX_PIECE, PrefixCuts, ladder, prefix_cuts,
                                      truncated_hints)
from optpipe.optimizer.preprocess import (Candidate, FixedSet, fixed_schedules,
                                          infeasible_devices, lower_bound, memory_bound,
                                          min_budgets, offload_area_bound,
                                          offload_warmup_bound, task_graph)
from optpipe.optimizer.result import (ERROR, FEASIBLE, OPTIMAL, EngineResult, ProgressFn,
                                      relative_gap)
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
#: Starts within this share of the best count as equally promising: the lowest bound
#: among them goes first (:func:`_room_first`).
CLOSE_STARTS = 0.01
#: When other placements are searched too, one stage per device goes first with this
#: share and the full model only (no window search): a proof attempt. It usually closes
#: in seconds at budgets >= S, and what it leaves flows on to the other placements.
LINEAR_PROOF_SHARE = 0.4
#: Expected first-run overrun of CP-SAT per stage x microbatch x chunk on a chunked
#: placement (seconds; see :func:`_expected_overrun`).
OVERRUN_PER_CHUNK_CELL = 0.001
#: Share of the time limit for periodic blocks (:mod:`.periodic`), over all placements.
PERIODIC_SHARE = 0.08
#: ... and at most this many seconds per placement.
PERIODIC_MAX_SECONDS = 3.0
#: Periodic blocks are computed only when the budget costs the fixed schedules more
#: than this share of makespan (see :func:`_add_periodic`).
PERIODIC_MIN_LOSS = 0.05
#: Share of one stage per device's first run that its prefix cuts (:mod:`.prefix`) may use.
CUTS_SHARE = 0.25
#: The same where pieces above MAX_PIECE are solved too (:func:`~.prefix.ladder`): at
#: 8 x 64, S/2, 25% left ``reach[32]`` unproven (a bound 3.2 s under its value).
LADDER_CUTS_SHARE = 0.4
#: Share of the time before the extended schedules' largest source search that goes to
#: that source's prefix cuts (:func:`~.extend.extended_schedules`), where the cuts pay.
SOURCE_CUTS_SHARE = 0.4
#: Fitting schedules whose first microbatches hint each piece of the prefix cuts.
HINTS_PER_PIECE = 3
#: Share of the time limit for extended schedules (:mod:`.extend`), when they are built.
EXTEND_SHARE = 0.25
#: ... and when their source (half the microbatches) has at least
#: :data:`EXTEND_LARGE_SOURCE_CELLS` stage x microbatch cells. Why more there: such a
#: source is not proven within a minute, so the time its search gets decides the
#: extension, while the search on the full problem (twice as large) does not move from
#: that hint (16 x 64 at S/2, one stage per device: 334.8 s with 0.25 in three runs,
#: 323.2-323.7 s with 0.6 in three, 312.5 s with 0.8; with 0.75 312.5 s twice and 318.1 s
#: in the benchmark's run). Smaller sources are found in seconds (8 x 32's optimum,
#: though its proof takes 49-90 s), and there a larger share only takes time from the
#: prefix cuts (8 x 64 with 0.6: the same 306.3 s, bound 296.9 s against 297.6 s).
EXTEND_SHARE_LARGE = 0.75
EXTEND_LARGE_SOURCE_CELLS = 512
#: Share of the time limit for the V shape's extended schedules
#: (:func:`_add_chunked_extended`), where memory binds but not hard; their source is
#: searched with at most :data:`CHUNKED_EXTEND_MAX_SOURCE_CELLS` stage x microbatch
#: cells. Why that limit (``python scripts/bench_extend.py``, table in
#: docs/optimizer-log.md): at S the search on 8 x 32 (V shape, 256 cells) reaches 101.0 s
#: in 30 s and extends to 197.0 s at 8 x 64; the one on 16 x 32 (512 cells)
#: ends near 111 s, 15 s over the work, which extended to 16 x 64 is slower than the
#: 203.8-204.6 s the search there reaches alone.
CHUNKED_EXTEND_SHARE = 0.3
CHUNKED_EXTEND_MAX_SOURCE_CELLS = 256
#: Share of the time limit for offloaded list schedules (:mod:`.offload_starts`), when
#: offload is allowed and the budget holds the schedule back (:func:`_add_offloaded_starts`)
#: and binds hard (:func:`_memory_binds_hard`); where it does not bind hard
#: :data:`OFFLOAD_STARTS_SHARE_SOFT`. Why less there: at budget S the plans either fit at
#: once (8 x 16 and 16 x 32: the no-memory bound, in 0.2-1.3 s a try) or not at all
#: (16 x 64: no factor on any placement, 14.5 s of the minute gone, 206.4 s against
#: 204.3 s without offload); time the search leaves over comes back to them anyway
#: (:func:`_refine_offloaded`).
OFFLOAD_STARTS_SHARE = 0.2
OFFLOAD_STARTS_SHARE_SOFT = 0.08
#: The time the offload-aware list schedules (:mod:`.offload_list`) may take before the
#: plans fitted by offloading, as a share of theirs (added to it); the first variant on
#: every placement runs whatever the time. Why first: where the host link is slow next
#: to compute they are far ahead (``--stages 8 --mem 40GB``: 4.05 s against the fitted
#: plans' 5.21 s), and a variant costs 0.02-0.3 s up to 16 x 32, while where the link
#: is fast the fitted plans can win and still run.
OFFLOAD_LIST_SHARE = 0.5
#: After the fitted plans, when an offloading schedule leads, the randomized runs
#: (:func:`_add_randomized`) get this share of the offloaded starts' time again (search
#: revision 30): where an engine keeps the rest of the minute, the time left over is
#: too little (``--stages 16 --mem 40GB``: 3 s of runs, about 20, before).
OFFLOAD_LIST_AFTER_SHARE = 0.5
#: Time the search leaves over goes to the winning offloaded start's neighbours
#: (:func:`_refine_offloaded`): CP-SAT's plans get this share of it, each at most
#: :data:`REFINE_PLAN_SECONDS` (16 x 16 at S/2: optimal for the looser budget in 5-11 s),
#: the finer factors the rest, then the plans not yet tried whatever is left.
REFINE_PLAN_SHARE = 0.6
#: Where an offload-aware list schedule (:mod:`.offload_list`) won, randomized runs
#: (:func:`_add_randomized`) get this share of the time left first.
REFINE_RANDOMIZED_SHARE = 0.5
#: The randomized runs (:func:`_add_randomized`) go round the placements whose best
#: offload-aware list schedule is within this share of the best one's, this long each.
RANDOMIZED_REACH = 0.05
RANDOMIZED_SLICE_SECONDS = 2.0
REFINE_PLAN_SECONDS = 15.0
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
    use_offload = _resolve_offload(problem, offload, fixed, _best(
        [c for c in fixed.candidates if not c.schedule.offloads]), split_backward)
    best_fixed = _bar(fixed, use_offload, split_backward)
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

    reporter = _progress_sink(progress)
    # the live line while warm starts are built (at 16 x 64 they take 8 s or more):
    # between the phases here, and inside the extensions and the offloaded refinement
    heartbeat = _heartbeat(reporter, t0, fixed, use_offload, split_backward)
    tick = heartbeat or (lambda: None)
    # decided before the warm starts below join the candidates (they fit, and fast)
    binds = _memory_binds_hard(fixed, use_offload, split_backward)
    held_back = _held_back(fixed, _bar(fixed, True, split_backward))
    # what the extended schedules' sources prove on fewer microbatches, for the cuts
    proven = PrefixCuts()
    # the offload-aware list schedules' randomized searches, per placement: kept from
    # the offloaded starts to the time the search leaves over
    searches: dict[str, RandomizedSearch] = {}
    tick()
    _add_list_schedules(problem, fixed, split_backward, allowed)
    if cache:
        _add_previous(problem, fixed, key, split_backward, allowed)
    tick()
    if use_offload and held_back:
        _add_offloaded_starts(problem, fixed, split_backward, allowed,
                              time_limit * (OFFLOAD_STARTS_SHARE if binds
                                            else OFFLOAD_STARTS_SHARE_SOFT), searches)
        tick()
    if binds:
        _add_periodic(problem, fixed, split_backward, use_offload,
                      time_limit * PERIODIC_SHARE, threads, allowed)
        tick()
        _add_extended(problem, fixed, split_backward, use_offload,
                      time_limit * _extend_share(problem), threads, allowed,
                      heartbeat,
                      proven)
    elif solver in ("auto", "cpsat") and not (use_offload and _offload_model_built(problem)):
        # without an offload model the order models search as without offload, and the
        # extensions are their start as there
        _add_chunked_extended(problem, fixed, split_backward,
                              time_limit * CHUNKED_EXTEND_SHARE, threads, allowed,
                              heartbeat)
    best_fixed = _bar(fixed, use_offload, split_backward)
    runs: list[EngineResult] = []
    engine = "cpsat" if solver == "auto" else solver
    spaces = _spaces(problem, split_backward, fixed, engine, use_offload, allowed)
    relaxed = _fused_relaxed_bound(problem, spaces) if split_backward else None
    notes: list[str] = []
    live = None if reporter is None else _SearchProgress(
        reporter, t0, spaces, best_fixed.makespan if best_fixed else None, use_offload,
        relaxed)
    try:
        union_bound = _search(problem, spaces, runs, fixed, best_fixed, engine=engine,
                              deadline=t0 + time_limit, gap=gap, threads=threads,
                              use_offload=use_offload, split_backward=split_backward,
                              levels=levels, progress=live, notes=notes,
                              memory_binds=binds, proven=proven)
        if use_offload:
            refined = _refine_offloaded(problem, fixed, runs, split_backward, allowed,
                                        t0 + time_limit, threads, union_bound,
                                        _search_beat(live, fixed, split_backward),
                                        searches)
            if refined:
                notes.append(refined)
            best_fixed = _bar(fixed, use_offload, split_backward)
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
    result.placements = _placement_proofs(problem, spaces, runs, fixed, use_offload, gap)
    _stamp(result, problem, time_limit=time_limit, gap=gap, threads=threads,
           offload=use_offload, split_backward=split_backward, levels=levels,
           allowed=allowed)
    if cache and result.status in (OPTIMAL, FEASIBLE):
        cache_mod.store(result.schedule, key)
    return result


# --------------------------------------------------------------------- checks
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


def _best(candidates: Sequence[Candidate]) -> Candidate | None:
    fitting = [c for c in candidates if c.fits]
    return min(fitting, key=lambda c: c.makespan) if fitting else None


def _bar(fixed: FixedSet, use_offload: bool, split_backward: bool) -> Candidate | None:
    """The bar to beat: the best fixed schedule the caller allows (no offloading ones if
    offload is off; fused-backward ones only when B and W may not be split)."""
    return _best([c for c in fixed.candidates
                  if (use_offload or not c.schedule.offloads)
                  and (split_backward or not c.schedule.splits_backward)])


def _memory_binds_hard(fixed: FixedSet, use_offload: bool, split_backward: bool) -> bool:
    """Is the best fitting fixed schedule more than :data:`PERIODIC_MIN_LOSS` slower
    than the fastest one that does not fit? Then memory, not the pipeline's shape, sets
    the pace, and the steady-state constructions (periodic blocks, extensions) pay."""
    unfit = [c for c in fixed.candidates if not c.fits and not c.schedule.offloads]
    bar = _bar(fixed, use_offload, split_backward)     # offloaders count only if allowed
    return bool(unfit) and (bar is None or bar.makespan >
                            min(c.makespan for c in unfit) * (1 + PERIODIC_MIN_LOSS))


def _add_list_schedules(problem: Problem, fixed: FixedSet, split_backward: bool,
                        allowed: tuple[str, ...] | None = None) -> None:
    """Add the fitting list schedules (:mod:`.listsched`) of the chunked placements.

    Why: at every budget they are cheap (about 2.5 s for both chunked placements at
    16 x 64, simulation included) and on the chunked placements often far better than
    any fixed schedule, which the engines' minute at 16 stages cannot make up (the
    16-stage preset: 1.820 s on the V shape against zb-auto's 1.944 s, which the search
    had returned). Added after the
    periodic blocks' trigger is decided (:func:`_memory_binds_hard` compares fixed
    schedules only). Not on one stage per device: the fixed schedules hold memory-aware
    greedy list schedules there already (``preprocess.greedy_schedule``), and these
    were never faster than the best fixed schedule there
    (``scripts/bench_listsched.py``), only one more set of hints to sort. With split
    backwards, ZB-V's greedy holding back only part of each microbatch's later-chunk
    bytes (:func:`~.listsched.admission_schedules`; about 0.7 s per placement at 16 x 32).
    """
    from optpipe.optimizer.listsched import warm_starts

    for label, place, split in _shapes(problem, split_backward, allowed):
        if place == linear_placement(problem.devices):
            continue
        _add_fitting(problem, fixed, warm_starts(problem, place, split), label)


def _add_previous(problem: Problem, fixed: FixedSet, key: str, split_backward: bool,
                  allowed: tuple[str, ...] | None) -> None:
    """Add the cached answer that :func:`~.cache.lookup` did not accept (an older
    search's, or one with less time, not proven) as a warm start named ``cached``.

    Why: solving again should never return slower than the schedule it replaces; the
    search starts from it on its placement, and the driver's never-worse rule returns
    it when nothing beats it. Added with the other warm starts, after the decisions
    taken on the fixed schedules alone (whether memory binds hard, whether offloading
    can help).
    """
    hit = cache_mod.previous(problem, key)
    if hit is None or (not split_backward and hit.schedule.splits_backward):
        return
    label = placement_name(hit.schedule.placement, problem.devices)
    if allowed is not None and label not in allowed:
        return
    schedule = replace(hit.schedule, name="cached", provenance={
        **hit.schedule.provenance, "source": "optimizer", "name": "cached",
        "cached_from": str(hit.path), "placement": label})
    fixed.candidates.append(Candidate("cached", schedule, hit.result))


def _add_fitting(problem: Problem, fixed: FixedSet, schedules: Sequence[Schedule],
                 label: str) -> None:
    """Simulate the optimizer's own ``schedules`` on ``label``'s placement and add
    those that fit to the candidates (each stamped with its placement)."""
    for schedule in schedules:
        result = simulate(problem, schedule)
        if result.fits:
            schedule.provenance["placement"] = label
            fixed.candidates.append(Candidate(schedule.name, schedule, result))


def _add_offloaded_starts(problem: Problem, fixed: FixedSet, split_backward: bool,
                          allowed: tuple[str, ...] | None, seconds: float,
                          searches: dict[str, RandomizedSearch]) -> None:
    """Add the fitting offloaded list schedules (:mod:`.offload_starts`) of every placement.

    Why: with offload allowed no engine searches the chunked placements, and the tight
    offload model on one stage per device found nothing faster than pipeoffload within
    the minute from 4 x 16 on (S/2 on the benchmark); these plans for a looser budget, fitted by offloading, beat pipeoffload
    on the benchmark at S/2 (docs/optimizer.md, "Offloaded list schedules"). Only when
    some schedule without offload is faster but does not fit (otherwise offloading
    cannot help); the caller decides that on the fixed schedules, before its own warm
    starts join them (since search revision 16: the admission schedules at budget S
    start ahead of every fixed schedule that does not fit, 54.9 s against ZB-H2's 55.4 s
    at 8 x 16, and deciding after them dropped these starts where they are the answer:
    8 x 16 with offload went from 51.85 s, proven, to 52.55 s, and 16 x 32 from 104.25 s
    to 108.95 s, in the table's run). The chunked placements first, factor by factor
    (they gave every fastest one; interleaved chunks before the V shape), one stage
    per device last, until ``seconds`` have passed.

    Before them (search revision 29) the offload-aware list schedules
    (:mod:`.offload_list`), which decide the transfers as they are built: the first
    variant on every placement whatever the time, the others and then randomized runs
    (:func:`_add_randomized`) within :data:`OFFLOAD_LIST_SHARE` of ``seconds`` (on top
    of it: the fitted plans keep their own ``seconds``; a variant costs 0.02-0.3 s up
    to 16 x 32). Randomized runs here too, not only with the time the search leaves
    over: at ``--stages 4 --mem 80GB`` the V shape's order model keeps the whole
    minute (and the library's 180 s) without beating the offloaded start, 7.249 s.
    """
    from optpipe.optimizer.offload_list import VARIANTS, offload_list_schedules
    from optpipe.optimizer.offload_starts import FACTORS, offloaded_list_schedules

    linear = linear_placement(problem.devices)
    shapes = _shapes(problem, split_backward, allowed)
    # the offload-aware list schedules first (chunked placements first): the first
    # variant on each placement, then the others while OFFLOAD_LIST_SHARE of the time lasts
    until = time.monotonic() + seconds * OFFLOAD_LIST_SHARE
    ordered = sorted(shapes, key=lambda s: (s[1] == linear, s[0] != "interleaved"))
    for variants, by in ((VARIANTS[:1], None), (VARIANTS[1:], until)):
        for label, place, split in ordered:
            _add_fitting(problem, fixed, offload_list_schedules(
                problem, place, split, variants=variants, deadline=by), label)
    # what is left of that share: randomized runs, here rather than only with time the
    # search leaves over, which an engine may keep
    _add_randomized(problem, fixed, until, searches)
    tries = sorted(((factor, shape) for factor in FACTORS for shape in shapes),
                   key=lambda t: (t[1][1] == linear, FACTORS.index(t[0]),
                                  t[1][0] != "interleaved"))
    deadline = time.monotonic() + seconds
    for factor, (label, place, split) in tries:
        if time.monotonic() > deadline:
            break
        _add_fitting(problem, fixed, offloaded_list_schedules(
            problem, place, split, factor, deadline=deadline,
            bar=_bar_makespan(fixed, split_backward)), label)
    # an offloading schedule leads: the randomized runs again (the fitted plans may have
    # overtaken the offload-aware ones, which the runs can take back)
    best = _bar(fixed, True, split_backward)
    if best is not None and best.schedule.offloads:
        _add_randomized(problem, fixed,
                        time.monotonic() + seconds * OFFLOAD_LIST_AFTER_SHARE, searches)


def _best_listed(fixed: FixedSet, label: str | None = None) -> Candidate | None:
    """The fastest offload-aware list schedule (:mod:`.offload_list`) in hand (on
    ``label``'s placement when given)."""
    return _best([c for c in fixed.candidates if "offload_list" in c.schedule.provenance
                  and (label is None or c.schedule.provenance["placement"] == label)])


def _add_randomized(problem: Problem, fixed: FixedSet, deadline: float,
                    searches: dict[str, RandomizedSearch],
                    bound: float | None = None) -> int:
    """Randomized runs of the offload-aware list schedules' greedy
    (:class:`.offload_list.RandomizedSearch`) until ``deadline``, round-robin in slices
    of :data:`RANDOMIZED_SLICE_SECONDS` over every placement whose best such schedule
    is within :data:`RANDOMIZED_REACH` of the best one's; each placement's search is
    kept in ``searches`` (by label) from call to call, and what it finds joins
    ``fixed`` (a placement's best is also its warm start); they stop early once one
    meets ``bound``. Returns how many runs were made (0 when there is no such
    schedule).

    Why every placement, not only the best one's: the greedy's first variants do not
    rank the placements as the randomized runs do (``python
    scripts/bench_offload_list.py --detail``: on the benchmark's 8 x 16 at S/2 the
    interleaved chunks start 52.5 s against the V shape's 53.1 s, and reach 51.9 s in
    20 s where the V shape reaches 51.85 s, the optimum; 8 x 32 likewise, 99.9 s
    against 99.85 s, the bound)."""
    from optpipe.optimizer.offload_list import RandomizedSearch

    leader = _best_listed(fixed)
    if leader is None or time.monotonic() >= deadline:
        return 0
    bests: dict[str, Candidate] = {}          # each placement's best, in one pass
    for c in fixed.candidates:
        label = c.schedule.provenance.get("placement")
        if c.fits and "offload_list" in c.schedule.provenance and (
                label not in bests or c.makespan < bests[label].makespan):
            bests[label] = c
    labels = sorted((label for label, best in bests.items()
                     if best.makespan <= leader.makespan * (1 + RANDOMIZED_REACH)),
                    key=lambda label: bests[label].makespan)
    for label in labels:
        own = bests[label]
        if label not in searches or own.makespan < searches[label].makespan * (1 - 1e-9):
            searches[label] = RandomizedSearch(
                problem, own.schedule.placement, own.schedule.splits_backward,
                own.schedule.provenance["offload_list"], own.makespan,
                seed=len(searches))
    before = sum(searches[label].runs for label in labels)

    def done() -> bool:
        return time.monotonic() >= deadline or (bound is not None and min(
            searches[label].makespan for label in labels) <= bound * (1 + 1e-9))

    while not done():
        for label in labels:
            if done():
                break
            now = time.monotonic()
            found = searches[label].run(min(deadline, now + RANDOMIZED_SLICE_SECONDS))
            _add_fitting(problem, fixed, [found] if found else [], label)
    return sum(searches[label].runs for label in labels) - before


def _bar_makespan(fixed: FixedSet, split_backward: bool) -> float | None:
    """The makespan of the best fitting schedule in hand, offloading ones included."""
    best = _bar(fixed, True, split_backward)
    return None if best is None else best.makespan


def _refine_offloaded(problem: Problem, fixed: FixedSet, runs: list[EngineResult],
                      split_backward: bool, allowed: tuple[str, ...] | None,
                      deadline: float, threads: int, bound: float | None,
                      heartbeat: Callable[[], None] | None,
                      searches: dict[str, RandomizedSearch]) -> str | None:
    """Spend the time the search left over on offloaded starts near the one that won:
    CP-SAT's plans for looser budgets (:data:`~.offload_starts.SEARCHED_FACTORS`) on the
    chunked placements (the winner's placement first), then list plans for the finer
    factors on the winner's placement.

    Why: at S/2 with offload the offloaded list schedules are ahead of every engine's
    reach, so the search ended after 6-24 s of the minute (search revision 11), and the
    searched plans are often better (``scripts/bench_offload_starts.py``, 5 s each: 4 x 8
    on the V shape 25.65 s, the no-memory bound, against 26.8 s; 16 x 16 interleaved
    58.05 s against 59.8 s, 57.8 s given the driver's 15 s), though not at every factor (8 x 32: 103.6 s at 2.25 against
    the list plans' 102.4 s, 101.9 s at 2). On the benchmark at S/2 this took 8 x 16
    from 53.2 s to 51.95 s and proved 4 x 8 (docs/optimizer-log.md, search revision 12).
    CP-SAT's plans get :data:`REFINE_PLAN_SHARE` of the time left, each run at most
    :data:`REFINE_PLAN_SECONDS`; once every factor and placement has had CP-SAT's default
    seed, the others of :data:`~.offload_starts.PLAN_SEEDS` (a plan's fit depends on
    which optimal order the seed picks: 4 x 8 at S/2, 26.0 s with the default alone,
    25.65 s, proven, with seed 0). Since search revision 29, randomized runs of the
    offload-aware list schedules' greedy (:func:`_add_randomized`, until one meets
    ``bound``) get :data:`REFINE_RANDOMIZED_SHARE` of the time first (revision 29's,
    20 s each, ``python
    scripts/bench_offload_list.py --detail``: 4.05 -> 3.912 s at ``--stages 8 --mem
    40GB``, 7.249 -> 7.122 s at ``--stages 4 --mem 80GB``). Only when
    the answer would be an offloading schedule (pipeoffload's too, since revision 29;
    no engine run beat it), until one meets ``bound``. Returns what it did, for the
    result's message (the time is otherwise unaccounted for: no engine's run shows it),
    or None when it did not run.
    """
    from optpipe.optimizer.offload_starts import (FINER_FACTORS, PLAN_SEEDS,
                                                  SEARCHED_FACTORS,
                                                  offloaded_list_schedules,
                                                  offloaded_searched_plan)

    best = _bar(fixed, True, split_backward)
    if best is None or not best.schedule.offloads or any(
            r.objective is not None and r.objective < best.makespan * (1 - 1e-9)
            for r in runs):
        return None
    began, before = time.monotonic(), best.makespan
    listed = _best_listed(fixed)
    won = best.schedule.provenance.get("placement") or (
        listed.schedule.provenance["placement"] if listed else None)
    linear = linear_placement(problem.devices)
    shapes = sorted(_shapes(problem, split_backward, allowed), key=lambda s: s[0] != won)
    plans = [(seed, factor, shape) for seed in PLAN_SEEDS for factor in SEARCHED_FACTORS
             for shape in shapes if shape[1] != linear]
    planned = len(plans)
    finer_tried = 0

    def proven() -> bool:
        now = _bar_makespan(fixed, split_backward)
        return bound is not None and now is not None and now <= bound * (1 + 1e-9)

    def search_plans(until: float) -> None:
        while plans and not proven():
            seed, factor, (label, place, split) = plans[0]
            limit = min(until - time.monotonic(), REFINE_PLAN_SECONDS) \
                - _expected_overrun(problem, place, "cpsat")
            if limit < max(1.0, _build_seconds(problem)):
                return
            plans.pop(0)
            _add_fitting(problem, fixed, offloaded_searched_plan(
                problem, place, split, factor, time_limit=limit, threads=threads,
                bar=_bar_makespan(fixed, split_backward), seed=seed), label)
            if heartbeat:
                heartbeat()

    label, place, split = shapes[0]                  # the winner's placement
    # randomized runs of the offload-aware list schedules first (every close placement)
    randomized_runs = 0 if listed is None else _add_randomized(
        problem, fixed, time.monotonic() + (deadline - time.monotonic())
        * REFINE_RANDOMIZED_SHARE, searches, bound)
    search_plans(time.monotonic() + (deadline - time.monotonic()) * REFINE_PLAN_SHARE)
    for finer in FINER_FACTORS:
        if time.monotonic() > deadline or proven():
            break
        finer_tried += 1
        _add_fitting(problem, fixed, offloaded_list_schedules(
            problem, place, split, finer, deadline=deadline,
            bar=_bar_makespan(fixed, split_backward)), label)
        if heartbeat:
            heartbeat()
    search_plans(deadline)           # what the finer factors left: the plans not tried
    after = _bar_makespan(fixed, split_backward)
    found = (f"{format_seconds(before)} -> {format_seconds(after)}"
             if after is not None and after < before * (1 - 1e-9) else "nothing faster")
    randomized_note = (f"{randomized_runs} randomized offload-aware list schedules, "
                       if randomized_runs else "")
    return (f"then {time.monotonic() - began:.0f} s on offloaded plans ({randomized_note}"
            f"{planned - len(plans)} of CP-SAT's for looser budgets, {finer_tried} finer "
            f"list-plan factors): {found}")


def _add_periodic(problem: Problem, fixed: FixedSet, split_backward: bool,
                  use_offload: bool, seconds: float, threads: int,
                  allowed: tuple[str, ...] | None = None) -> None:
    """Add periodic schedules (:mod:`.periodic`) on every placement to ``fixed``.

    Why: when memory binds they are often far better than any fixed schedule (a V-shaped
    block at half of 1F1B's memory), and the engines start from the best schedule on
    each placement, so a better start is a better answer in the same time. Called only
    when memory binds hard (:func:`_memory_binds_hard`): measured at budget S (1F1B's
    memory) the blocks never beat the fixed schedules, and their time is better spent
    searching.
    """
    from optpipe.optimizer.periodic import periodic_schedules

    # fused backwards too when they are faster: the engines search those spaces as well
    runs = [(label.replace("/", "-"), place, split)
            for label, place, split in _shapes(problem, split_backward, allowed)]
    t0 = time.monotonic()
    for i, (label, place, split) in enumerate(runs):
        left = seconds - (time.monotonic() - t0)
        if left <= 0.1:
            break
        try:
            found = periodic_schedules(problem, place, split,
                                       time_limit=min(PERIODIC_MAX_SECONDS,
                                                      left / (len(runs) - i)),
                                       threads=threads, label=f"periodic-{label}")
        except OptPipeError as exc:
            fixed.skipped[f"periodic-{label}"] = str(exc)
            continue
        for schedule in found:
            result = simulate(problem, schedule)
            if result.fits:     # guaranteed by construction; the simulator has the word
                fixed.candidates.append(Candidate(schedule.name, schedule, result))
            else:  # pragma: no cover - a bug in the block's memory bound
                fixed.skipped[schedule.name] = "over budget in the simulator"


def _add_extended(problem: Problem, fixed: FixedSet, split_backward: bool,
                  use_offload: bool, seconds: float, threads: int,
                  allowed: tuple[str, ...] | None,
                  heartbeat: Callable[[], None] | None = None,
                  proven: PrefixCuts | None = None) -> None:
    """Add schedules extended from a search on half the microbatches (:mod:`.extend`).

    Why: with one stage per device and memory binding, the best schedules run groups of
    several microbatches, which neither the fixed nor the periodic schedules express,
    and which the search on many microbatches does not find in its time; a small
    problem's optimum holds the pattern (8 x 16 at S/2: proven in 2 s). Built for one
    stage per device only when memory binds hard (as the periodic blocks), from
    ``2 * MIN_SOURCE_MICROBATCHES`` microbatches on, and only while that placement's
    memory bound leaves it a chance to win. Not for the chunked placements: there,
    measured at 8 x 64 and 16 x 64, S/2, extensions of a 15 s search were 14-33 %
    slower than the periodic V blocks, which already are their steady state.
    What the searches on fewer microbatches prove goes into ``proven``, for the prefix
    cuts (:func:`_search`); where those cuts pay (without offload, memory above the
    no-memory bound) and the source is small enough to be proven in the time, the small
    pieces are solved before the largest source's search and go into its model
    (:data:`SOURCE_CUTS_SHARE`).
    """
    from optpipe.optimizer.extend import MIN_SOURCE_MICROBATCHES, extended_schedules

    if problem.microbatches < 2 * MIN_SOURCE_MICROBATCHES or \
            (allowed is not None and "linear" not in allowed):
        return
    place = linear_placement(problem.devices)
    incumbent = _bar(fixed, use_offload, split_backward)
    graph = task_graph(problem, split_backward)
    free = lower_bound(graph)
    held = memory_bound(graph, free)
    if incumbent is not None and held >= incumbent.makespan * (1 - 1e-9):
        return                                   # one stage per device cannot win
    # a large source (16 x 32) is searched best with its windows and not proven in the
    # time anyway: its pieces (8.7 s at 16 stages) would only take from its search
    # (16 x 64 at S/2: the source reached 165.7 s with them, 161.7 s without; by hand)
    cuts_pay = _memory_lifts(held, free, use_offload) and not _large_source(problem)

    def hints(half: Problem) -> list[Schedule]:
        on = [c for c in fixed_schedules(half).candidates
              if c.fits and list(c.schedule.placement) == place and not c.schedule.offloads]
        return [c.schedule for c in sorted(on, key=lambda c: c.makespan)]

    for schedule, result in extended_schedules(problem, place, split_backward,
                                               time_limit=seconds, threads=threads,
                                               label="extended-linear", hints=hints,
                                               heartbeat=heartbeat, proven=proven,
                                               cuts_share=SOURCE_CUTS_SHARE if cuts_pay
                                               else 0.0):
        fixed.candidates.append(Candidate(schedule.name, schedule, result))


def _add_chunked_extended(problem: Problem, fixed: FixedSet, split_backward: bool,
                          seconds: float, threads: int, allowed: tuple[str, ...] | None,
                          heartbeat: Callable[[], None] | None = None) -> None:
    """Add schedules of the V shape, when searched first among the chunked placements,
    extended from a search on half the microbatches (:mod:`.extend`), where memory
    binds but not hard.

    Why: at budget S the optimum on the V shape keeps its warm-up and cool-down as the
    microbatches double and only its steady state grows (8 x 32: 100.55 s, 4.55 s over
    the work; 8 x 64's bound 196.55 s, the same 4.55 s), yet the search on 64
    microbatches does not find that steady state within its minute (8 x 64: 197.55 s
    in three runs of search revision 14) while a search on 32 gets within 0.5% of its
    optimum in 30 s (101.05 s; extended to 64: 197.05 s, by hand). So the half is
    searched on the V shape and its steady state repeated; the result is a warm start
    like any fixed schedule. Only where it pays, as measured at S (see
    :data:`CHUNKED_EXTEND_MAX_SOURCE_CELLS`):

    * on the V shape, when the search takes it first: CP-SAT's schedules on interleaved
      chunks hold no window to repeat (none of the 134 group sizes and starts at 8 x 64
      of the 8-stage preset at 64 GB, where the search lost 17 s to it; none at the
      benchmark's 8 x 64 at S);
    * the half has at least twice ``MIN_SOURCE_MICROBATCHES`` microbatches (a
      16-microbatch half searched for 15 s ended 4% above its optimum at 8 x 16, and
      nothing extended from it fitted) and is small enough to be searched well;
    * the V shape's best start is above its bound (at 2S the fixed schedules are
      optimal already).

    Where memory binds hard the periodic V blocks are the better start
    (:func:`_add_extended`). With offload allowed, only beyond ``OFFLOAD_MAX_CELLS``
    (the caller's rule), where no offload model takes the time: 8 x 64 at S with
    offload, 196.7 s (gap 0.43% to the no-memory bound) against 197.55 s without them.
    """
    from optpipe.optimizer.extend import MIN_SOURCE_MICROBATCHES, extended_schedules

    source_microbatches = problem.microbatches // 2
    if source_microbatches < 2 * MIN_SOURCE_MICROBATCHES or \
            problem.stages * source_microbatches > CHUNKED_EXTEND_MAX_SOURCE_CELLS:
        return
    linear = linear_placement(problem.devices)
    chunked = [sp for sp in _spaces(problem, split_backward, fixed, "cpsat", False, allowed)
               if sp.placement != linear and sp.hinted]
    if not chunked or chunked[0].best_fixed <= chunked[0].bound * (1 + 1e-9) or \
            chunked[0].label.split("/")[0] != "v":
        return
    space = chunked[0]
    hints = chunked_source_hints(space.label, space.placement, space.split,
                                 _fused_faster(problem))
    for schedule, result in extended_schedules(problem, space.placement, space.split,
                                               time_limit=seconds, threads=threads,
                                               label=f"extended-{space.label}",
                                               hints=hints, heartbeat=heartbeat,
                                               recurse=False):
        schedule.provenance["placement"] = space.label
        fixed.candidates.append(Candidate(schedule.name, schedule, result))


def chunked_source_hints(label: str, place: list[int], split: bool, fused_faster: bool
                         ) -> Callable[[Problem], list[Schedule]]:
    """The hints a chunked placement's extensions start their source from: for a
    problem with fewer microbatches, its fitting fixed, list and admission schedules on
    ``place``, fastest first (what the search on the full problem starts from too).
    Public for ``scripts/bench_extend.py``, which measures the same sources."""
    from optpipe.optimizer.listsched import warm_starts

    def hints(half: Problem) -> list[Schedule]:
        half_fixed = fixed_schedules(half)
        _add_fitting(half, half_fixed, warm_starts(half, place, split), label)
        return [c.schedule for c in _fitting_on(half_fixed, place, split, fused_faster,
                                                 False)]
    return hints


def _offload_model_built(problem: Problem) -> bool:
    """Is the problem small enough for the offload model (:data:`OFFLOAD_MAX_CELLS`)?
    One rule for the search, its notes, and the extensions that run where it is not."""
    return problem.stages * problem.microbatches <= OFFLOAD_MAX_CELLS


def _extend_share(problem: Problem) -> float:
    """The share of the time limit the extended schedules get (see
    :data:`EXTEND_SHARE_LARGE`)."""
    return EXTEND_SHARE_LARGE if _large_source(problem) else EXTEND_SHARE


def _large_source(problem: Problem) -> bool:
    """Is the extended schedules' source (half the microbatches) too large to be proven
    in the time (:data:`EXTEND_LARGE_SOURCE_CELLS`)? One rule for their share and for
    whether its pieces are solved first (:func:`_add_extended`)."""
    return problem.stages * (problem.microbatches // 2) >= EXTEND_LARGE_SOURCE_CELLS


def _heartbeat(reporter: ProgressFn | None, t0: float, fixed: FixedSet, use_offload: bool,
               split_backward: bool) -> Callable[[], None] | None:
    """Keeps the live line ticking while warm starts are built (incumbent: the best
    fitting schedule in hand; no bound yet)."""
    if reporter is None:
        return None

    def beat() -> None:
        best = _bar(fixed, use_offload, split_backward)
        reporter(time.monotonic() - t0, best.makespan if best else None, None, None)
    return beat


def _search_beat(live: "_SearchProgress | None", fixed: FixedSet, split_backward: bool
                 ) -> Callable[[], None] | None:
    """Keeps the live line ticking after the search (the offloaded plans that use the
    time it left): the search's bound stays on the line, the incumbent is the best
    fitting schedule in hand (:func:`_heartbeat` is for before the search, with no
    bound yet)."""
    if live is None:
        return None

    def beat() -> None:
        best = _bar(fixed, True, split_backward)
        if best is not None:
            live.best = best.makespan if live.best is None else min(live.best, best.makespan)
        live.emit()
    return beat


def _resolve_offload(problem: Problem, offload: bool | None, fixed: FixedSet,
                     best_fixed: Candidate | None, split_backward: bool = True) -> bool:
    """Auto: offload when a faster fixed schedule exists that does not fit the budget;
    beyond :data:`OFFLOAD_AUTO_MAX_CELLS` only when memory binds hard
    (:func:`_memory_binds_hard`).

    Why the two rules: up to that size the offload model (a circuit per device) is built
    and may take 70% of the minute from the order models (where its start is within
    reach, :func:`_offload_model_reaches`), which pays only where the budget holds the
    schedule back. Beyond it no offload model runs and the order models keep
    their time; offload then costs the offloaded list schedules' share
    (:data:`OFFLOAD_STARTS_SHARE`) and reports the weaker bound that holds with offload,
    which pays where memory costs the fixed schedules more than
    :data:`PERIODIC_MIN_LOSS` (at S/2 on the benchmark, 16 x 32: 9.5% bubble with
    offload against 30.0% without; at S, where it does not bind hard, 16 x 64 ended at
    205.9 s with offload against 204.3 s without).
    """
    if offload is not None:
        return offload
    held_back = _held_back(fixed, best_fixed)
    if problem.stages * problem.microbatches <= OFFLOAD_AUTO_MAX_CELLS:
        return held_back
    return held_back and _memory_binds_hard(fixed, False, split_backward)


def _held_back(fixed: FixedSet, bar: Candidate | None) -> bool:
    """Does the budget hold the schedule back: is some schedule without offload faster
    than ``bar`` (the best that fits) but over budget? (Nothing fits: yes.)"""
    return bar is None or any(not c.fits and not c.schedule.offloads
                              and c.makespan < bar.makespan * (1 - 1e-9)
                              for c in fixed.candidates)


def _fused_faster(problem: Problem) -> bool:
    """Is a measured fused backward shorter than B + W on some stage, of the base
    problem or of a measured chunked cut (:class:`~optpipe.problem.ChunkProfile`)?"""
    figures = [(problem.backward_fused, problem.backward_input, problem.backward_weight)]
    figures += [(c.backward_fused, c.backward_input, c.backward_weight)
                for c in problem.chunk_profiles]
    return any(fused is not None and any(f < b + w - 1e-12 for f, b, w in zip(fused, b_in, b_w))
               for fused, b_in, b_w in figures)


def _relax_fused(b_in: Sequence[float], b_w: Sequence[float],
                 fused: Sequence[float] | None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """B and W shortened so that a fused BW maps onto a B', W' pair no longer than it."""
    b_in, b_w = list(b_in), list(b_w)
    for s, bw in enumerate(fused or ()):
        if bw < b_in[s] + b_w[s]:
            b_in[s] = min(b_in[s], bw)
            b_w[s] = max(0.0, bw - b_in[s])
    return tuple(b_in), tuple(b_w)


def _in_space(schedule: Schedule, split: bool, fused_faster: bool) -> bool:
    """Is ``schedule`` one the engines model with split (B, W) or fused (BW) backwards?

    A fused BW is the same as B then W at once unless the fused time is shorter, so
    fused schedules belong to the split space too exactly when it is not.
    """
    if split:
        return schedule.splits_backward or not fused_faster
    return not schedule.splits_backward


def _fitting_on(fixed: FixedSet, place: list[int], split: bool, fused_faster: bool,
                use_offload: bool) -> list[Candidate]:
    """Fitting schedules on placement ``place`` that the engines' space (split or fused,
    :func:`_in_space`) contains, offloading ones only if ``use_offload``; fastest first."""
    on = [c for c in fixed.candidates if c.fits and list(c.schedule.placement) == place
          and (use_offload or not c.schedule.offloads)
          and _in_space(c.schedule, split, fused_faster)]
    return sorted(on, key=lambda c: c.makespan)


def _hint_pool(fixed: FixedSet, split_backward: bool) -> list[Schedule]:
    """Fitting fixed schedules, fastest first (each engine run keeps its placement's)."""
    pool = [c for c in fixed.candidates if c.fits
            and (split_backward or not c.schedule.splits_backward)]
    pool.sort(key=lambda c: c.makespan)
    return [c.schedule for c in pool]


# ------------------------------------------------------------------- search
@dataclass
class _Space:
    """One placement searched: its stage -> device list and what is proven about it."""

    label: str
    placement: list[int]
    bound: float            # proven lower bound for schedules on this placement
    best_fixed: float       # best fitting start on it without offload (inf if none)
    split: bool = True      # backwards modelled as B and W (else fused BW)
    overrun: float = 0.0    # seconds a run on it may go past its limit (expected or seen)
    free_bound: float = 0.0  # its no-memory bound (what decides a proof attempt)
    # its memory bound without offload: what ranks placements with equal starts for the
    # order models (:func:`_room_first`), with offload allowed too, where ``bound`` is
    # the no-memory bound of every placement and would rank none ahead
    order_bound: float = 0.0
    # what holds with offload: the largest of its no-memory bound, the kept bytes' area
    # over its room (:func:`~.preprocess.offload_area_bound`) and the warm-up's with the
    # host link (:func:`~.preprocess.offload_warmup_bound`)
    offload_bound: float = 0.0

    @property
    def hinted(self) -> bool:
        """A fitting schedule without offload exists here to start a search from."""
        return math.isfinite(self.best_fixed)

    @property
    def search_bound(self) -> float:
        """The least makespan the order model can reach here (its proven bound, or its
        memory bound where ``bound`` is the no-memory bound because offload is allowed):
        what decides whether searching it can still beat the incumbent."""
        return max(self.bound, self.order_bound)


def _shapes(problem: Problem, split_backward: bool, allowed: tuple[str, ...] | None = None
            ) -> list[tuple[str, list[int], bool]]:
    """Placements searched, as (label, stage -> device, split backward): one stage per
    device, the V shape and interleaved 2 chunks (those ``allowed``, default all); each
    again with fused backwards (``.../fused``) when a measured fused backward is faster
    than B + W."""
    options = list(searched_placements(problem.devices).items())
    if allowed is not None:
        options = [(label, place) for label, place in options if label in allowed]
    modes = [(split_backward, "")] + ([(False, "/fused")] if split_backward
                                      and _fused_faster(problem) else [])
    return [(label + suffix, place, split) for split, suffix in modes
            for label, place in options]


def _spaces(problem: Problem, split_backward: bool, fixed: FixedSet,
            engine: str, use_offload: bool = False,
            allowed: tuple[str, ...] | None = None) -> list[_Space]:
    """Placements worth searching, most promising first.

    One stage per device always; also the V shape and interleaved 2 chunks (what ZB-V,
    zb-auto and interleaved 1F1B use) when some fixed schedule on them fits: one that
    does without offload is the hint a search there needs (``hinted``); one that
    offloads (pipeoffload on ZB-V) may be returned, so the placement's bound counts.
    Each starts with its no-memory lower bound; only CP-SAT searches the chunked ones
    (the MILP models one stage per device), but their bounds always count, because a
    fixed schedule on them may be returned.

    When a measured fused backward is faster than B + W, each placement is also searched
    with fused backwards (label ``.../fused``): the split model cannot express the
    saving, and fused schedules (1F1B-like) may then be the fastest.

    Without offload, each placement starts from its memory round-trip bound
    (:func:`~.preprocess.memory_bound`), which at tight budgets is above its no-memory
    bound (far above for one stage per device).
    """
    faster = _fused_faster(problem)
    out = []
    for label, place, split in _shapes(problem, split_backward, allowed):
        on = _fitting_on(fixed, place, split, faster, use_offload)
        if place != linear_placement(problem.devices) and not on:
            continue
        graph = task_graph(problem, split, place)
        free = lower_bound(graph)
        held = memory_bound(graph, free)
        with_offload = max(free, offload_area_bound(graph), offload_warmup_bound(graph)) \
            if use_offload else free
        # the start an order-model search has here: offloading schedules count for the
        # incumbent, but no order model can start from one
        start = min((c.makespan for c in on if not c.schedule.offloads), default=math.inf)
        out.append(_Space(label, place, with_offload if use_offload else held, start, split,
                          overrun=_expected_overrun(problem, place, engine),
                          free_bound=free, order_bound=held, offload_bound=with_offload))
    if not out:
        raise OptPipeError(f"no fixed schedule on the {' or '.join(allowed or ())} "
                           f"placement fits this budget, so the search has nothing to "
                           f"start from; allow one stage per device too (--placements "
                           f"linear,{','.join(allowed or ())}) or raise the budget")
    out.sort(key=lambda sp: (sp.best_fixed, sp.bound))
    return _room_first(out)


def _room_first(spaces: list[_Space]) -> list[_Space]:
    """``spaces`` (sorted by their best start) with, among those whose start is within
    :data:`CLOSE_STARTS` of the best, the one with the lowest bound moved to the front.

    Why: the first placement gets most of the time (:data:`FIRST_SPACE_SHARE`), and
    where the starts are about equal the bound says which has more room. Measured at
    budget S (search revision 10): the list schedules start interleaved chunks 0.8%
    ahead of ZB-V at 8 x 32, and searched first interleaved ended at 101.5 s (the V
    shape, second, 101.2 s) where the V shape given that time had proven 100.55 s.
    """
    if not spaces:
        return spaces
    close = [sp for sp in spaces if sp.best_fixed <= spaces[0].best_fixed * (1 + CLOSE_STARTS)]
    first = min(close, key=lambda sp: sp.order_bound)
    return [first] + [sp for sp in spaces if sp is not first]


def _search(problem: Problem, spaces: list[_Space], runs: list[EngineResult],
            fixed: FixedSet, best_fixed: Candidate | None, *, engine: str,
            deadline: float, gap: float, threads: int, use_offload: bool,
            split_backward: bool, levels: Sequence[float],
            progress: "_SearchProgress | None", notes: list[str],
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
    ``memory_binds`` (hard, :func:`_memory_binds_hard`), one stage per device's first
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
    pool = _hint_pool(fixed, split_backward)
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
            if limit < max(2.0 if sweep else 0.5, _build_seconds(problem)) and runs:
                continue                              # it could not finish in time
            hints = ([best_on[space.label]] if space.label in best_on else []) + \
                _hint_pool(fixed, space.split)
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
            sp.bound = _offload_bound(sp, lb_linear)
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


def _offload_model_reaches(problem: Problem, linear: _Space, fixed: FixedSet,
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
                [c.makespan for c in _fitting_on(fixed, linear.placement, linear.split,
                                                 _fused_faster(problem), True)])
    return start <= incumbent * (1 + OFFLOAD_MODEL_REACH)


def _cuts_pay(problem: Problem, space: _Space, use_offload: bool) -> bool:
    """Prefix cuts (:mod:`.prefix`) for one stage per device, without offload, when
    memory binds (its memory bound is above its no-memory bound) and the problem has
    more microbatches than the pieces: where CP-SAT's proofs stall. Not for the
    chunked placements: at S/2 their pieces up to 8 microbatches are proven in 6-15 s
    (4 x 16, 8 x 16) and shorten the V shape's proof at 4 x 16 1.6-3.5x, but it still
    takes 31-49 s once the answer is found, and from 8 stages or 32 microbatches on
    their chain is below the memory bound, so in the minute they cost time and close
    nothing (``scripts/bench_chunked_proofs.py``, docs/optimizer-log.md)."""
    return (space.label == "linear" and problem.microbatches > MAX_PIECE
            and _memory_lifts(space.bound, space.free_bound, use_offload))


def _memory_lifts(held: float, free: float, use_offload: bool) -> bool:
    """Without offload, memory lifts the bound (``held``) above the no-memory one
    (``free``): the pieces of the prefix cuts then see waits the bounds do not. One
    rule for the driver's cuts (:func:`_cuts_pay`) and the extended schedules' source
    (:func:`_add_extended`)."""
    return not use_offload and held > free * (1 + 1e-9)


def _prefix_cuts(problem: Problem, space: _Space, fixed: FixedSet, seconds: float,
                 threads: int, progress: "_SearchProgress | None",
                 known: PrefixCuts | None = None) -> PrefixCuts:
    """Solve the pieces for ``space``, hinted with the first microbatches of its best
    fitting schedules (:func:`~.prefix.truncated_hints`), beyond what ``known`` (of one
    stage per device, the only placement the cuts are built for) already holds."""
    on = _fitting_on(fixed, space.placement, space.split, _fused_faster(problem), False)
    return prefix_cuts(problem, space.placement, space.split, time_limit=seconds,
                       threads=threads,
                       hints=truncated_hints([c.schedule for c in on[:HINTS_PER_PIECE]]),
                       heartbeat=progress.emit if progress else None, known=known)


def _offload_bound(space: _Space, linear: float) -> float:
    """What holds on ``space`` when offload is allowed.

    The order models' proofs do not cover offload, which fixed schedules may use on any
    placement (pipeoffload builds on ZB-V too): the chunked placements keep their
    bounds that hold with offload (``offload_bound``: no-memory, the kept bytes' area,
    :func:`~.preprocess.offload_area_bound`, or the warm-up's,
    :func:`~.preprocess.offload_warmup_bound`), and one stage per device keeps
    ``linear`` (that, or the value its order model proved optimal at that bound). Not
    the offload model's bound: in that model an OFFLOAD that holds its device back
    (``wait``) comes right after its F, and one listed later, holding back a later
    action, may beat its optimum. Shared by the search's end and the live line, so both
    state one rule.
    """
    return max(linear, space.offload_bound) if space.label == "linear" \
        else space.offload_bound


def _placement_proofs(problem: Problem, spaces: list[_Space], runs: list[EngineResult],
                      fixed: FixedSet, use_offload: bool, gap: float
                      ) -> list[dict[str, Any]]:
    """Best schedule, proven bound and status on each placement searched.

    Why report it: the overall bound is the least over placements, so one open
    placement (the V shape at tight budgets) hides that another (one stage per device,
    the model the MILP also builds) was solved to optimality.
    """
    out = []
    faster = _fused_faster(problem)
    for sp in spaces:
        label = "linear+offload" if sp.label == "linear" and use_offload else sp.label
        best = min([_makespan_of(runs, sp.label), _makespan_of(runs, label)]
                   + [c.makespan for c in _fitting_on(fixed, sp.placement, sp.split, faster,
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


def _fused_relaxed_bound(problem: Problem, spaces: list[_Space]) -> float | None:
    """A lower bound valid for schedules that fuse some backwards, or None if not needed.

    Why: with a measured ``backward_fused`` shorter than B + W, a schedule that fuses a
    backward can beat every split schedule, so the split engines' bounds do not cover
    it. The relaxation shortens W to ``max(0, BW - B)`` (and B to ``BW`` if even that is
    shorter): any fused BW then maps onto an adjacent B', W' pair no longer than it, which
    releases memory no later and sends the gradient no later, so the relaxation's
    no-memory bound over the searched placements holds for every schedule.
    """
    if not _fused_faster(problem):
        return None
    b_in, b_w = _relax_fused(problem.backward_input, problem.backward_weight,
                             problem.backward_fused)
    chunks = []
    for c in problem.chunk_profiles:     # measured cuts are relaxed the same way
        c_in, c_w = _relax_fused(c.backward_input, c.backward_weight, c.backward_fused)
        chunks.append(replace(c, backward_input=c_in, backward_weight=c_w,
                              backward_fused=None))
    relaxed = replace(problem, backward_input=b_in, backward_weight=b_w,
                      backward_fused=None, chunk_profiles=tuple(chunks))
    return min(lower_bound(task_graph(relaxed, True, sp.placement)) for sp in spaces)


def _build_seconds(problem: Problem) -> float:
    """A generous estimate of building and hinting one order model, in seconds.

    Measured on 2 cores: 16 x 64 takes ~1 s to pick the hint and up to 3.4 s to build
    (the V shape); a run started with less time than that would overrun the deadline.
    """
    return 1.0 + 0.004 * problem.stages * problem.microbatches


def _expected_overrun(problem: Problem, placement: list[int], engine: str) -> float:
    """Seconds a first CP-SAT run on a chunked placement may run past its limit.

    Measured by hand on 2 cores, runs of 10 s: up to 1.1 s past the limit at 16 x 64
    (the V shape, whose model takes ~4 s to build and whose window steps are planned
    with that), 0.0-0.7 s elsewhere. With CP-SAT's transitive closure of precedences
    (off since :func:`~.cpsat.new_solver`) runs went 5-15 s past their limits
    (`scripts/bench_cpsat_params.py`) and this estimate was 8 times larger, which cost
    the user's time: a 20 s solve of llama2-70b on 16 stages ended after 12 s (by hand;
    19 s now, the same script). Later runs use the larger of this and the
    overrun measured (a run that stopped early measures nothing). None past
    :data:`~.cpsat.TIME_FULL_MAX_CELLS`: there the run is window steps from the start,
    which plan their own overrun against the deadline (holding this back left 1-1.7 s
    of the minute unused at 8 x 64 and 16 x 64, search revision 17's runs).
    """
    from optpipe.optimizer.cpsat import windows_from_the_start

    chunks = len(placement) // problem.devices
    if engine != "cpsat" or chunks == 1 or windows_from_the_start(problem):
        return 0.0
    return OVERRUN_PER_CHUNK_CELL * chunks * problem.stages * problem.microbatches


def _makespan_of(runs: list[EngineResult], label: str) -> float:
    """Best objective the runs found on one placement (inf if none)."""
    return min((r.objective for r in runs if r.extra.get("space") == label
                and r.objective is not None), default=math.inf)


# -------------------------------------------------------------------- engines
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


# ------------------------------------------------------------ choose, stamp
def _choose(problem: Problem, runs: list[EngineResult], best_fixed: Candidate | None,
            wall: float, bound: float | None, gap: float) -> SolveResult:
    """The best valid schedule among the engines' and the fixed ones, with its status.

    ``bound`` is the proven lower bound over everything searched (see :func:`_search`);
    the status is ``optimal`` when the returned schedule is within ``gap`` of it.
    """
    best: SolveResult | None = None
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
        best.message = "; ".join(notes)
    return best


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


# -------------------------------------------------------------------- progress
class _SearchProgress:
    """What the live line shows of the whole search, whichever engine run reports.

    Why not forward the engines' reports: each run counts its own elapsed time, knows
    only its own incumbent (not the fixed and periodic schedules already in hand) and
    its own placement's bound, while the answer's bound is the least over placements.
    So this keeps the solve's clock, the best makespan so far and each placement's best
    bound, and reports the bound that holds for the answer: with offload, the order
    models' bounds do not hold (see :func:`_search`), and with a faster fused backward
    the fused relaxation caps it (:func:`_fused_relaxed_bound`).
    """

    def __init__(self, sink: ProgressFn, t0: float, spaces: list[_Space],
                 incumbent: float | None, use_offload: bool, cap: float | None) -> None:
        self.sink, self.t0, self.spaces = sink, t0, spaces
        self.best = incumbent
        self.use_offload, self.cap = use_offload, cap
        self.live: dict[str, float] = {}
        self.linear_start = next((sp.bound for sp in spaces if sp.label == "linear"), None)

    def run(self, label: str) -> ProgressFn:
        """The progress function for one engine run on placement ``label``."""
        self.emit()          # a run starts: show where the search stands

        def report(_elapsed: float, best: float | None, bound: float | None,
                   _gap: float | None) -> None:
            if best is not None:
                self.best = best if self.best is None else min(self.best, best)
            if bound is not None:
                self.live[label] = max(self.live.get(label, -math.inf), bound)
            self.emit()
        return report

    def bound(self) -> float:
        if self.use_offload:
            linear = -math.inf if self.linear_start is None else \
                max(self.linear_start, self.live.get("linear+offload", -math.inf))
            found = min(_offload_bound(sp, linear) for sp in self.spaces)
        else:
            found = min(max(sp.bound, self.live.get(sp.label, -math.inf))
                        for sp in self.spaces)
        return found if self.cap is None else min(found, self.cap)

    def emit(self) -> None:
        bound = self.bound()
        self.sink(time.monotonic() - self.t0, self.best, bound,
                  relative_gap(self.best, bound))


def _progress_sink(progress: bool | ProgressFn | None) -> ProgressFn | None:
    if callable(progress):
        return progress
    if not progress:
        return None
    return _LiveLine()


class _LiveLine:
    """One line on stderr, rewritten in place on a terminal, throttled otherwise.

    Shows after the first second only, so quick solves print nothing.
    """

    def __init__(self, delay: float = 1.0, every: float = 10.0) -> None:
        self.delay, self.every = delay, every
        self.tty = sys.stderr.isatty()
        self.last_print = -math.inf
        self.shown = False
        self.best: float | None = None
        self.bound: float | None = None

    def __call__(self, elapsed: float, best: float | None, bound: float | None,
                 gap: float | None) -> None:
        # the search's own view (_SearchProgress): kept for the next throttled print
        self.best = best if best is not None else self.best
        self.bound = bound if bound is not None else self.bound
        if elapsed < self.delay:
            return
        if not self.tty and elapsed - self.last_print < self.every:
            return
        self.last_print = elapsed
        gap = relative_gap(self.best, self.bound)
        text = (f"solving {elapsed:6.1f}s  incumbent "
                f"{format_seconds(self.best) if self.best is not None else '-':>10}  bound "
                f"{format_seconds(self.bound) if self.bound is not None else '-':>10}  gap "
                f"{f'{gap:.2%}' if gap is not None else '-':>7}")
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + text)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()
