"""Offloaded list schedules: warm starts that use host memory, on every placement.

Why: with offload allowed, the engines search one stage per device only (CP-SAT's
tight model, :mod:`.cpsat`), whose circuit per device found nothing faster than
pipeoffload within the minute from 4 x 16 on at S/2 on the benchmark (and is not built
beyond 256 cells), so the answer used to be pipeoffload's — built on four fixed
orders (ZB-H1, 1F1B, interleaved 1F1B, ZB-V) that were designed for one memory level.
Here the pipeline is planned as if the budget were looser (``factor`` times the room
above static memory): a memory-aware list schedule (:mod:`.listsched`) on each
placement keeps as many microbatches in flight as that room allows; pipeoffload's
fitting (:func:`~optpipe.generators.offload.fit_by_offloading`) then sends the
activations that are away long enough to host memory, and runs W's sooner, until the
real budget holds. The simulator judges every result, so a plan whose transfers do not
hide only costs the time it took.

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


def relaxed(problem: Problem, factor: float) -> Problem:
    """``problem`` with ``factor`` times the room above static memory on every device."""
    return problem.with_budget([static + factor * (budget - static)
                                for static, budget in zip(problem.static, problem.budget)])


def offloaded_list_schedules(problem: Problem, placement: Sequence[int],
                             split_backward: bool = True, factor: float = FACTORS[0], *,
                             deadline: float | None = None) -> list[Schedule]:
    """The list schedules of ``problem`` planned for ``factor`` times its room above
    static memory and fitted to its real budget by offloading: those that fit, each
    distinct plan once.

    ``deadline`` (``time.monotonic()``) stops the fits early: each simulates the
    schedule up to a few dozen times (about 0.1 s a fit at 8 x 32, 1 s at 16 x 32),
    while building the plans costs a fraction of one.
    """
    out: list[Schedule] = []
    # every rule and reserve, each distinct order once (list_schedules dedups)
    for plan in list_schedules(relaxed(problem, factor), placement, split_backward):
        if deadline is not None and time.monotonic() > deadline:
            return out
        fitted, result = fit_by_offloading(problem, plan)
        if not result.fits:
            continue
        name = f"{plan.name}-x{factor:g}"
        out.append(replace(fitted, name=name, provenance={
            "source": "optimizer", "name": name,
            "planned_for": f"{factor:g} x the room above static memory",
            "offloaded": fitted.provenance["offloaded"]}))
    return out
