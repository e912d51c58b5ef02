"""The list schedules (:mod:`optpipe.optimizer.listsched`) against the simulator.

Why these tests: the list scheduler keeps its own clock and memory count to decide
what each idle device runs; both must be the simulator's, or the driver would be
handed warm starts whose figures it does not expect (the simulator judges them, but a
scheduler that believes in a different memory count builds the wrong schedules).
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from optpipe.optimizer.warm_starts import add_list_schedules
from optpipe.generators import generate
from optpipe.generators import listsched as greedy
from optpipe.generators.listsched import Policy
from optpipe.generators.zbv import VARIANTS
from optpipe.optimizer.listsched import (ADMISSION_KEEP, RULES, admission_schedules,
                                          list_schedule, list_schedules)
from optpipe.optimizer.bounds import lower_bound
from optpipe.optimizer.preprocess import FixedSet, earliest_starts, task_graph
from optpipe.problem import uniform_problem
from optpipe.schedule import (Op, from_orders, interleaved_placement, linear_placement,
                              v_placement)
from optpipe.simulator import simulate
from test_optimizer_engine import random_problem

PLACEMENTS = {"linear": linear_placement, "v": v_placement,
              "interleaved": lambda d: interleaved_placement(d, 2)}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shape", sorted(PLACEMENTS))
def test_planned_times_and_memory_are_the_simulators(seed: int, shape: str) -> None:
    """Uneven random problems, tight to loose budgets, split and fused backwards: every
    list schedule fits in the simulator (the scheduler starts a forward only where its
    own count says it fits) and the simulator's makespan is the planned one."""
    rng = random.Random(seed)
    problem = random_problem(rng, rng.choice([3, 4, 5]), rng.choice([4, 6, 9]),
                             rng.choice([1.0, 2.0, 4.0]), rng.choice([0.0, 0.05]))
    place = PLACEMENTS[shape](problem.devices)
    for split in (True, False):
        made = list_schedules(problem, place, split)
        for schedule in made:
            result = simulate(problem, schedule)
            assert result.fits, schedule.name
            assert result.makespan == pytest.approx(
                schedule.provenance["planned_makespan"], abs=1e-9), schedule.name
            graph = task_graph(problem, split, place)
            assert result.makespan >= lower_bound(graph) - 1e-9
        if shape == "linear" or problem.budget[0] == float("inf"):
            assert made, "one stage per device never deadlocks"


def test_every_rule_keeps_fifo_and_covers_every_task() -> None:
    problem = uniform_problem(4, 6, forward=1.0, backward_input=1.0, backward_weight=1.0,
                              p2p=0.05, activation=1000, freed_by_b=500,
                              static=0).activation_budget(4)
    place = v_placement(4)
    for rule in RULES:
        schedule = list_schedule(problem, place, rule=rule)
        assert schedule is not None
        seen = [(a.op, a.stage, a.microbatch) for acts in schedule.actions for a in acts]
        assert len(seen) == len(set(seen)) == 3 * 8 * 6
        for acts in schedule.actions:
            last: dict = {}
            for a in acts:
                assert a.microbatch == last.get((a.op, a.stage), -1) + 1
                last[(a.op, a.stage)] = a.microbatch
    with pytest.raises(ValueError, match="unknown rule"):
        list_schedule(problem, place, rule="fastest")


def test_a_budget_nothing_can_run_in_gives_none_not_a_hang() -> None:
    """On the V shape device 0 holds the first and the last chunk: with room for one
    chunk's activation only, the first forward takes it and the last chunk, which
    would turn the microbatch around, can never run."""
    problem = uniform_problem(4, 4, forward=1.0, backward_input=1.0, backward_weight=1.0,
                              p2p=0.0, activation=1000, freed_by_b=500,
                              static=0).with_budget(500)
    assert list_schedule(problem, v_placement(4)) is None
    assert list_schedules(problem, v_placement(4)) == []


def test_driver_adds_only_fitting_list_schedules_as_its_own_warm_starts() -> None:
    problem = uniform_problem(4, 8, forward=1.0, backward_input=1.0, backward_weight=1.0,
                              p2p=0.05, activation=1000, freed_by_b=500,
                              static=0).activation_budget(2)
    fixed = FixedSet()
    add_list_schedules(problem, fixed, True, None)
    assert fixed.candidates
    labels = set()
    for c in fixed.candidates:
        assert c.fits and simulate(problem, c.schedule).fits
        assert c.schedule.provenance["source"] == "optimizer"
        labels.add(c.schedule.provenance["placement"])
    assert labels == {"v", "interleaved"}      # one stage per device has its own greedy ones
    assert any(c.name.startswith("admit-") for c in fixed.candidates)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", ["v", "interleaved"])
def test_admission_schedules_fit_in_the_simulator(seed: int, shape: str) -> None:
    """Uneven random problems: every order kept fits the budget in the simulator (the
    engine's memory decides which are kept, unsimulated), each once, at most
    :data:`ADMISSION_KEEP`."""
    rng = random.Random(seed)
    problem = random_problem(rng, rng.choice([3, 4, 5]), rng.choice([4, 6, 9]),
                             rng.choice([1.0, 2.0, 4.0]), rng.choice([0.0, 0.05]))
    made = admission_schedules(problem, PLACEMENTS[shape](problem.devices))
    assert len(made) <= ADMISSION_KEEP
    assert len({tuple(map(tuple, s.actions)) for s in made}) == len(made)
    for schedule in made:
        assert simulate(problem, schedule).fits, schedule.name
        assert schedule.provenance["source"] == "optimizer"
        assert schedule.provenance["reserve"] < 1


def test_holding_back_less_starts_the_v_shape_ahead_of_zb_v() -> None:
    """8 x 16 at budget S on the V shape: ZB-V holds every admitted microbatch's later
    chunk, so device 0 idles until the first comes back; the partial reserve fills that
    (56.4 s against 54.9 s when written; this checks only that it is ahead)."""
    problem = uniform_problem(8, 16, forward=1.0, backward_input=1.0, backward_weight=1.0,
                              p2p=0.05, activation=1000, freed_by_b=500,
                              static=0).activation_budget(8)
    zbv = simulate(problem, generate("zb-v", problem)).makespan
    made = admission_schedules(problem, v_placement(8))
    assert made and min(simulate(problem, s).makespan for s in made) < zbv - 1.0


def test_keeping_microbatch_0s_path_clear_starts_the_tips_backward_at_its_earliest() -> None:
    """8 x 16 at budget S on the V shape: with ``lookahead`` no device starts a forward
    that microbatch 0 would then wait for, so the tip's device (the warm-up bound's)
    runs its first backward at the earliest start its dependencies allow (with backwards
    first, as in ZB-V), where the greedy without it runs that backward later; never
    later than without it, and every such order fits in the simulator."""
    problem = uniform_problem(8, 16, forward=1.0, backward_input=1.0, backward_weight=1.0,
                              p2p=0.05, activation=1000, freed_by_b=500,
                              static=0).activation_budget(8)
    place = v_placement(8)
    split = problem.split(place)
    cap = tuple(float(b) for b in problem.budget)
    tip_backward = (Op.B, place.index(7) + 1, 0)       # the later chunk on device 7
    earliest = earliest_starts(task_graph(problem, True, place))[tip_backward]

    def first_backward(policy: Policy) -> float:
        schedule = from_orders("greedy", place, problem.microbatches,
                               greedy.list_schedule(split, place, policy).orders)
        sim = simulate(problem, schedule)
        assert sim.fits
        return next(r.start for r in sim.records if r.action.key == tip_backward)

    for variant in VARIANTS:
        policy = replace(variant, mem_cap=cap, reserve=0.2)
        plain, clear = first_backward(policy), first_backward(replace(policy, lookahead=True))
        assert earliest <= clear <= plain
        if variant.prefer == "B":     # "F" runs a ready forward before a ready backward
            assert clear == pytest.approx(earliest)
            assert plain > earliest + 0.5


def test_admission_schedules_include_the_lookahead_ones() -> None:
    """16 x 32 at budget S on the V shape: the fastest admission schedule keeps
    microbatch 0's path clear, and it is ahead of every one that does not (107.3 s
    against 111.35 s when written)."""
    problem = uniform_problem(16, 32, forward=1.0, backward_input=1.0,
                              backward_weight=1.0, p2p=0.05, activation=1000,
                              freed_by_b=500, static=0).activation_budget(16)
    made = admission_schedules(problem, v_placement(16))
    makespans = {s.name: simulate(problem, s).makespan for s in made}
    fastest = min(makespans, key=makespans.get)
    assert fastest.endswith("-look")
    assert all(makespans[fastest] < m - 1.0 for n, m in makespans.items()
               if not n.endswith("-look"))


@pytest.mark.parametrize("shape", ["v", "interleaved"])
def test_past_the_deadline_the_first_of_each_kind_is_still_made(shape: str) -> None:
    """A deadline already past (a short ``--time-limit`` after the fixed schedules) stops
    each kind after its first schedule, which is the first of the full set: under a short
    limit the chunked placements still get their list schedules, and the same ones."""
    problem = uniform_problem(4, 8, forward=1.0, backward_input=1.0, backward_weight=1.0,
                              p2p=0.05, activation=1000, freed_by_b=500,
                              static=0).activation_budget(2)
    place = PLACEMENTS[shape](problem.devices)
    every = list_schedules(problem, place)
    assert len(every) > 1, "else the deadline has nothing to stop"
    cut = list_schedules(problem, place, deadline=0.0)
    assert [s.actions for s in cut] == [every[0].actions]
    admitted = admission_schedules(problem, place, deadline=0.0)
    assert len(admission_schedules(problem, place)) > 1
    assert len(admitted) == 1
    assert simulate(problem, admitted[0]).fits


def test_nothing_more_is_built_once_a_schedule_in_hand_meets_the_floor() -> None:
    """4 x 8 at twice 1F1B's memory: a fixed schedule meets the no-memory bound of
    every placement, so it is optimal and no list schedule is built; with no floor known
    (None) they are, as before."""
    from optpipe.optimizer.spaces import least_bound, shape_bounds
    from optpipe.optimizer.preprocess import fixed_schedules
    from optpipe.optimizer.warm_starts import meets

    problem = uniform_problem(4, 8, forward=1.0, backward_input=1.0, backward_weight=1.0,
                              p2p=0.05, activation=1000, freed_by_b=500,
                              static=0).activation_budget(8)
    floor = least_bound(problem, shape_bounds(problem, True, False), True, False)
    fixed = fixed_schedules(problem)
    assert meets(fixed, floor, False, True), "the premise: a fixed schedule is optimal"
    before = len(fixed.candidates)
    add_list_schedules(problem, fixed, True, floor=floor)
    assert len(fixed.candidates) == before
    add_list_schedules(problem, fixed, True)
    assert len(fixed.candidates) > before
    assert not meets(fixed, None, False, True)
