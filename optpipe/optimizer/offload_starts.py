"""Offloaded plans: warm starts that use host memory, on every placement.

Why: with offload allowed, the engines search one stage per device only (CP-SAT's
tight model, :mod:`.cpsat_tight`), whose circuit per device found nothing faster than
pipeoffload within the minute from 4 x 16 on at S/2 on the benchmark (and is not built
beyond 256 cells), so the answer used to be pipeoffload's — built on four fixed
orders (ZB-H1, 1F1B, interleaved 1F1B, ZB-V) that were designed for one memory level.
Here the pipeline is planned as if the budget were looser (``factor`` times the room
above static memory): a memory-aware list schedule (:mod:`.listsched`) on each
placement keeps as many microbatches in flight as that room allows; pipeoffload's
fitting (:func:`~optpipe.generators.offload.fit_by_offloading`) then sends the
activations that are away long enough to host memory, and runs W's sooner, until the
real budget holds. The simulator judges every result, so a plan whose transfers do not
hide only costs the time it took. With time the search leaves over, the driver also
fits CP-SAT's plans for the looser budget (:func:`offloaded_searched_plan`: less idle
time in the plan, though less slack for the transfers) and plans for
:data:`FINER_FACTORS`.

Figures (the benchmark at budget S/2 with offload): docs/optimizer.md, "Offloaded list
schedules", from ``python scripts/bench_solver.py --offload yes --budgets 0.5``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

from optpipe.generators.offload import fit_by_offloading
from optpipe.optimizer.listsched import list_schedules
from optpipe.problem import Problem
from optpipe.schedule import Schedule

#: The looser budgets planned for, as multiples of the room above static memory, in
#: the order they are tried. On the benchmark at S/2 (by hand: every placement, rule and
#: reserve, fitted): 2.5 gave the fastest at 4 x 8 to 16 x 32 among 1.5, 2, 2.5, 3 and
#: 4; 2.25, tried after, beat it at 8 x 16 (53.2 s against 53.5 s) and 16 x 32 (106.1 s
#: against 108.5 s). The answer moves by a few percent between neighbouring factors
#: (what the plan keeps in flight changes which activations can be away), so several
#: are tried, the most often best first.
FACTORS = (2.25, 2.5, 2.0, 2.75, 3.0)

#: The looser budgets CP-SAT's plans (:func:`offloaded_searched_plan`) are made for, in
#: the order the driver tries them with time its search leaves over. Lower than the list
#: plans' best: a searched plan keeps the pipeline fuller for the same room, so it
#: needs less room to leave the transfers time (``python scripts/bench_offload_starts.py
#: --sizes 4x16,4x32,8x32 --factors 2.25 --searched 1.75,2,2.25,2.5,2.75,3``, 5 s each:
#: 4 x 32 98.45 s at 1.75, 98.5 s at 2, 98.8 s at 2.5, none fits at 2.25, 2.75 or 3;
#: 8 x 32 101.9 s at 2 against 103.6 s at 2.25; 4 x 8 the no-memory bound at 2.25).
SEARCHED_FACTORS = (2.25, 2.0, 1.75, 2.5)

#: CP-SAT's random seeds for those plans, in the order the driver tries them: its
#: default (1) first, the others once every factor has had one. Why: where the looser
#: budget leaves many optimal orders, the seed picks the one returned, and the fitting
#: keeps some of them whole and slows others (4 x 8 at S/2, V shape at 2.25 x, 5 s each,
#: by hand, 2026-12-04: seeds 0, 3, 4 and 5 fit at 25.65 s, the no-memory bound; seed 1 at 33.65
#: s; seed 2 at 25.9 s).
PLAN_SEEDS = (1, 0, 2, 3)

#: Factors between and below the list plans', tried with time the search leaves over, on the
#: placement whose offloaded start won (``warm_starts.refine_offloaded``).
#: ``python scripts/bench_offload_starts.py``: 2.125 gave 8 x 32 at S/2 102.1 s against
#: 102.4 s, 2.375 gave 16 x 32 106.0 s against 106.1 s: small gains, so only where the
#: time is free.
FINER_FACTORS = (2.125, 2.375, 1.75, 2.625)


def relaxed(problem: Problem, factor: float) -> Problem:
    """``problem`` with ``factor`` times the room above static memory on every device."""
    return problem.with_budget([static + factor * (budget - static)
                                for static, budget in zip(problem.static, problem.budget)])


def offloaded_list_schedules(problem: Problem, placement: Sequence[int],
                             split_backward: bool = True, factor: float = FACTORS[0], *,
                             deadline: float | None = None,
                             bar: float | None = None) -> list[Schedule]:
    """The list schedules of ``problem`` planned for ``factor`` times its room above
    static memory and fitted to its real budget by offloading: those that fit, each
    distinct plan once.

    ``deadline`` (``time.monotonic()``) stops the fits early: each simulates the
    schedule up to a few dozen times (about 0.1 s a fit at 8 x 32, 1 s at 16 x 32),
    while building the plans costs a fraction of one. ``bar`` (seconds): return only
    schedules faster than it, each faster than the one before, and give a fit up once
    it is slower (``fit_by_offloading``'s ``give_up_at``) — what the optimizer wants,
    and at budgets where the plans cannot fit (16 x 64 at S: none of 5 factors x 2
    placements) it cuts the 40-50 s the failing fits took per factor and placement.
    """
    out: list[Schedule] = []
    # every rule and reserve, each distinct order once (list_schedules dedups); past
    # the deadline none is fitted, so none more is planned
    for plan in list_schedules(relaxed(problem, factor), placement, split_backward, deadline):
        if deadline is not None and time.monotonic() > deadline:
            return out
        fitted = _fitted(problem, plan, factor, "a list schedule", bar)
        if fitted is not None:
            out.append(fitted[0])
            bar = None if bar is None else fitted[1]
    return out


def offloaded_searched_plan(problem: Problem, placement: Sequence[int],
                            split_backward: bool = True, factor: float = FACTORS[0], *,
                            time_limit: float, threads: int = 2,
                            bar: float | None = None, seed: int | None = None
                            ) -> list[Schedule]:
    """CP-SAT's order model (:func:`~.cpsat.solve_cpsat`) on ``problem`` with ``factor``
    times its room above static memory, hinted with the list schedules there, its answer
    fitted by offloading: ``[schedule]`` if it fits (and beats ``bar``), else ``[]``.
    ``seed``: CP-SAT's random seed (:data:`PLAN_SEEDS`).

    Why beside the list plans: a searched plan wastes less time than a greedy one, and
    where the link has time to spare the fitting keeps it (16 x 16 at S/2, interleaved:
    57.8 s, 0.09% above the no-memory bound, against the list plans' 59.8 s); where the
    link is the limit the tighter plan leaves transfers less room and fits slower (8 x
    32: 103.6 s against 102.4 s; both from ``scripts/bench_offload_starts.py``). The simulator decides, so such a
    plan costs only its search time.
    """
    from optpipe.optimizer.cpsat import NoHint, solve_cpsat

    loose = relaxed(problem, factor)
    # solve_cpsat keeps the fastest hint that fits (its _pick_hint simulates each)
    hints = list_schedules(loose, placement, split_backward)
    try:
        run = solve_cpsat(loose, warm_start=hints, time_limit=time_limit, threads=threads,
                          split_backward=split_backward, placement=list(placement),
                          seed=seed)
    except NoHint:          # even the looser budget holds no list plan on this placement
        return []
    if run.schedule is None:
        return []
    fitted = _fitted(problem, replace(run.schedule, name="cpsat"), factor,
                     "CP-SAT's order model", bar)
    if fitted is None:
        return []
    schedule = fitted[0]
    if seed is not None:
        schedule = replace(schedule, provenance={**schedule.provenance, "seed": seed})
    return [schedule]


def _fitted(problem: Problem, plan: Schedule, factor: float, planner: str,
            bar: float | None) -> tuple[Schedule, float] | None:
    """``plan`` fitted to ``problem`` by offloading, named and stamped as the
    optimizer's own, with its makespan; None when it does not fit or is not faster
    than ``bar``."""
    fitted, result = fit_by_offloading(problem, plan, give_up_at=bar)
    if not result.fits or (bar is not None and result.makespan >= bar * (1 - 1e-9)):
        return None
    name = f"{plan.name}-x{factor:g}"
    return replace(fitted, name=name, provenance={
        "source": "optimizer", "name": name, "planned_by": planner,
        "planned_for": f"{factor:g} x the room above static memory", "factor": factor,
        "offloaded": fitted.provenance["offloaded"],
        **({"held_back": fitted.provenance["held_back"]}
           if "held_back" in fitted.provenance else {})}), result.makespan
