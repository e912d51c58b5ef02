"""No-wait waves: every microbatch's forward and backward path reserved free of waiting.

The construction's promises are checked on its reserved times (disjoint on every
device, each path exactly the no-wait one, memory within budget at every forward with
the shared accounting), and the schedule built from them on the simulator's word (valid,
within budget, no slower than reserved). Then the driver's use: where the waves lead
one stage per device with a large source, no extended schedules are built.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from optpipe.memory.accounting import memory_delta
from optpipe.optimizer import warm_starts
from optpipe.optimizer.preprocess import fixed_schedules
from optpipe.optimizer.waves import WAVES, reserve, wave_schedule
from optpipe.problem import uniform_problem
from optpipe.schedule import Action, Op, linear_placement, searched_placements, v_placement
from optpipe.simulator import simulate
from test_optimizer_preprocess import random_problem


def _uniform(stages: int, microbatches: int, budget: float, *, uneven: bool = False):
    p = uniform_problem(stages, microbatches, forward=1.0, backward_input=1.0,
                        backward_weight=1.0, p2p=0.05, activation=2, freed_by_b=1,
                        static=0)
    if uneven:
        slow = [1.0] * stages
        slow[0], slow[-1] = 1.3, 1.6
        p = replace(p, forward=tuple(slow), backward_input=tuple(slow),
                    backward_weight=tuple(slow))
    return p.activation_budget(budget)


def _times(problem, place=None):
    """``(op, stage, microbatch) -> (device, start, end)`` of the reserved intervals."""
    reserved = reserve(problem, place)
    assert reserved is not None
    return reserved, {(op, s, mb): (d, start, end)
                      for d, device in enumerate(reserved)
                      for start, end, (op, s, mb) in device}


PLACEMENTS = {"linear": linear_placement, "v": v_placement}
CASES = [(4, 8, 2), (8, 16, 4), (8, 16, 8), (16, 32, 8), (6, 10, 16)]


@pytest.mark.parametrize("shape", sorted(PLACEMENTS))
@pytest.mark.parametrize("stages,microbatches,budget", CASES)
def test_reserved_paths_never_wait_and_never_overlap(shape, stages, microbatches,
                                                     budget) -> None:
    problem = _uniform(stages, microbatches, budget)
    place = PLACEMENTS[shape](stages)
    reserved, at = _times(problem, place)
    for device in reserved:
        assert len(device) == 3 * microbatches * len(place) // stages
        for (_, e0, _), (s1, _, _) in zip(device, device[1:]):
            assert e0 <= s1 + 1e-9                       # one action at a time
    last = len(place) - 1
    for mb in range(microbatches):
        for s in range(last):                            # both waves: no wait
            lag = problem.p2p if place[s] != place[s + 1] else 0.0
            assert at["F", s + 1, mb][1] == pytest.approx(at["F", s, mb][2] + lag)
            assert at["B", s, mb][1] == pytest.approx(at["B", s + 1, mb][2] + lag)
        assert at["B", last, mb][1] == pytest.approx(at["F", last, mb][2])
        for s in range(len(place)):
            assert at["W", s, mb][1] >= at["B", s, mb][2] - 1e-9
            assert at["F", s, mb][0] == place[s]
        if mb:                                           # microbatches in order
            assert at["F", 0, mb][1] > at["F", 0, mb - 1][1]


@pytest.mark.parametrize("shape", sorted(PLACEMENTS))
@pytest.mark.parametrize("stages,microbatches,budget", [(4, 8, 2), (8, 16, 4), (16, 32, 8)])
def test_reserved_memory_fits_by_the_shared_accounting(shape, stages, microbatches,
                                                       budget) -> None:
    problem = _uniform(stages, microbatches, budget)
    place = PLACEMENTS[shape](stages)
    judged = problem if shape == "linear" else problem.split(place)
    _, at = _times(problem, place)
    for d in range(stages):
        events = []
        for (op, s, mb), (dev, start, end) in at.items():
            if dev == d:
                moment, delta = memory_delta(judged, Action(Op(op), s, mb))
                events.append((start if moment == "start" else end, delta))
        kept = judged.static[d]
        for _, delta in sorted(events):                  # at equal times releases first
            kept += delta
            assert kept <= judged.budget[d]


@pytest.mark.parametrize("shape", sorted(PLACEMENTS))
@pytest.mark.parametrize("stages,microbatches,budget,uneven",
                         [(4, 8, 2, False), (8, 16, 4, False), (16, 32, 8, False),
                          (8, 16, 8, True), (4, 12, 4, True)])
def test_schedule_is_valid_fits_and_no_slower_than_reserved(shape, stages, microbatches,
                                                             budget, uneven) -> None:
    problem = _uniform(stages, microbatches, budget, uneven=uneven)
    place = PLACEMENTS[shape](stages)
    schedule = wave_schedule(problem, place)
    assert schedule is not None
    assert schedule.name == (WAVES if shape == "linear" else f"{WAVES}-{shape}")
    assert schedule.placement == place
    sim = simulate(problem, schedule)
    assert sim.fits
    _, at = _times(problem, place)
    assert sim.makespan <= max(end for _, _, end in at.values()) + 1e-9
    for record in sim.records:                           # ASAP: never later than reserved
        key = (record.action.op.value, record.action.stage, record.action.microbatch)
        assert record.start <= at[key][1] + 1e-9


def test_random_problems_give_valid_fitting_schedules() -> None:
    for seed in range(6):
        problem = random_problem(seed)
        for place in searched_placements(problem.devices).values():
            schedule = wave_schedule(problem, place)
            if schedule is not None:
                assert simulate(problem, schedule).fits, (seed, place)


def test_none_on_a_split_problem_an_uneven_placement_or_below_one_activation() -> None:
    base = _uniform(8, 8, 4)
    assert wave_schedule(base.split(v_placement(8))) is None
    assert wave_schedule(base, [0, 1, 2, 3, 4, 5, 6, 7, 0]) is None
    tight = _uniform(4, 8, 2).with_budget(1)             # an activation is 2 bytes
    assert wave_schedule(tight) is None


def test_the_waves_lead_at_16x64_half_budget_and_no_extension_is_built() -> None:
    """The cell whose extension was a lottery (docs/optimizer-log.md): the waves lead
    one stage per device there, so :func:`~.warm_starts.add_extended` adds nothing;
    with uneven stages they do not lead, and the extension runs as before."""
    problem = _uniform(16, 64, 8)
    fixed = fixed_schedules(problem)
    assert warm_starts.waves_lead(problem, fixed, True, False)
    before = len(fixed.candidates)
    warm_starts.add_extended(problem, fixed, True, False, 5.0, 2, None)
    assert len(fixed.candidates) == before
    uneven = _uniform(16, 64, 8, uneven=True)
    assert not warm_starts.waves_lead(uneven, fixed_schedules(uneven), True, False)
    small = _uniform(8, 32, 4)                           # a small source: extended
    assert not warm_starts.waves_lead(small, fixed_schedules(small), True, False)
    assert warm_starts.waves_lead_linear(small, fixed_schedules(small), True, False)


def test_no_periodic_blocks_on_one_stage_per_device_where_the_waves_lead() -> None:
    problem = _uniform(8, 16, 4)
    fixed = fixed_schedules(problem)
    warm_starts.add_periodic(problem, fixed, True, False, 2.0, 2, ("linear",))
    assert not any(c.name.startswith("periodic") for c in fixed.candidates)
    uneven = _uniform(8, 16, 4, uneven=True)             # the waves far behind: built
    fixed = fixed_schedules(uneven)
    warm_starts.add_periodic(uneven, fixed, True, False, 2.0, 2, ("linear",))
    assert any(c.name.startswith("periodic-linear") for c in fixed.candidates)
