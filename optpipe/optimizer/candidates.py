"""The schedules in hand: which fit, on which placement and backward mode, which is the
bar to beat.

Why a module of its own: the driver (:mod:`.driver`), the warm starts it builds
(:mod:`.warm_starts`) and the placements it searches (:mod:`.spaces`) all ask the same
questions of the candidate set (:class:`~.preprocess.FixedSet`: the fixed schedules and
the optimizer's own warm starts, each simulated): the fastest that fits, the fitting
ones on one placement that an engine's space contains, whether memory or the budget
holds the schedule back. One answer each, so the three agree.
"""

from __future__ import annotations

from typing import Sequence

from optpipe.optimizer.preprocess import Candidate, FixedSet, best_fitting
from optpipe.problem import Problem
from optpipe.schedule import Schedule
from optpipe.simulator import simulate

#: Periodic blocks and extended schedules are built only when the budget costs the
#: fixed schedules more than this share of makespan (:func:`memory_binds_hard`).
PERIODIC_MIN_LOSS = 0.05


def bar_to_beat(fixed: FixedSet, use_offload: bool, split_backward: bool) -> Candidate | None:
    """The bar to beat: the best fixed schedule the caller allows (no offloading ones if
    offload is off; fused-backward ones only when B and W may not be split)."""
    return best_fitting(fixed.candidates, split_backward=split_backward, offload=use_offload)


def memory_binds_hard(fixed: FixedSet, use_offload: bool, split_backward: bool) -> bool:
    """Is the best fitting fixed schedule more than :data:`PERIODIC_MIN_LOSS` slower
    than the fastest one that does not fit? Then memory, not the pipeline's shape, sets
    the pace, and the steady-state constructions (periodic blocks, extensions) pay."""
    unfit = [c for c in fixed.candidates if not c.fits and not c.schedule.offloads]
    bar = bar_to_beat(fixed, use_offload, split_backward)     # offloaders count only if allowed
    return bool(unfit) and (bar is None or bar.makespan >
                            min(c.makespan for c in unfit) * (1 + PERIODIC_MIN_LOSS))


def add_fitting(problem: Problem, fixed: FixedSet, schedules: Sequence[Schedule],
                label: str) -> None:
    """Simulate the optimizer's own ``schedules`` on ``label``'s placement and add
    those that fit to the candidates (each stamped with its placement)."""
    for schedule in schedules:
        result = simulate(problem, schedule)
        if result.fits:
            schedule.provenance["placement"] = label
            fixed.candidates.append(Candidate(schedule.name, schedule, result))


def best_listed(fixed: FixedSet, label: str | None = None) -> Candidate | None:
    """The fastest offload-aware list schedule (:mod:`.offload_list`) in hand (on
    ``label``'s placement when given)."""
    return best_fitting([c for c in fixed.candidates if "offload_list" in c.schedule.provenance
                         and (label is None or c.schedule.provenance["placement"] == label)])


def fastest_in_hand(fixed: FixedSet, split_backward: bool) -> float | None:
    """The makespan of the best fitting schedule in hand, offloading ones included."""
    best = bar_to_beat(fixed, True, split_backward)
    return None if best is None else best.makespan


def budget_holds_back(fixed: FixedSet, bar: Candidate | None) -> bool:
    """Does the budget hold the schedule back: is some schedule without offload faster
    than ``bar`` (the best that fits) but over budget? (Nothing fits: yes.)"""
    return bar is None or any(not c.fits and not c.schedule.offloads
                              and c.makespan < bar.makespan * (1 - 1e-9)
                              for c in fixed.candidates)


def fused_is_faster(problem: Problem) -> bool:
    """Is a measured fused backward shorter than B + W on some stage, of the base
    problem or of a measured chunked cut (:class:`~optpipe.problem.ChunkProfile`)?"""
    figures = [(problem.backward_fused, problem.backward_input, problem.backward_weight)]
    figures += [(c.backward_fused, c.backward_input, c.backward_weight)
                for c in problem.chunk_profiles]
    return any(fused is not None and any(f < b + w - 1e-12 for f, b, w in zip(fused, b_in, b_w))
               for fused, b_in, b_w in figures)


def in_engine_space(schedule: Schedule, split: bool, fused_faster: bool) -> bool:
    """Is ``schedule`` one the engines model with split (B, W) or fused (BW) backwards?

    A fused BW is the same as B then W at once unless the fused time is shorter, so
    fused schedules belong to the split space too exactly when it is not.
    """
    if split:
        return schedule.splits_backward or not fused_faster
    return not schedule.splits_backward


def fitting_on(fixed: FixedSet, place: list[int], split: bool, fused_faster: bool,
               use_offload: bool) -> list[Candidate]:
    """Fitting schedules on placement ``place`` that the engines' space (split or fused,
    :func:`in_engine_space`) contains, offloading ones only if ``use_offload``; fastest first."""
    on = [c for c in fixed.candidates if c.fits and list(c.schedule.placement) == place
          and (use_offload or not c.schedule.offloads)
          and in_engine_space(c.schedule, split, fused_faster)]
    return sorted(on, key=lambda c: c.makespan)


def hint_pool(fixed: FixedSet, split_backward: bool) -> list[Schedule]:
    """Fitting fixed schedules, fastest first (each engine run keeps its placement's)."""
    pool = [c for c in fixed.candidates if c.fits
            and (split_backward or not c.schedule.splits_backward)]
    pool.sort(key=lambda c: c.makespan)
    return [c.schedule for c in pool]
