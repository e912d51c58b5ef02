"""Offload-aware list schedules (:mod:`optpipe.optimizer.offload_list`).

Why these tests: the greedy admits each forward and reload on its own count of the
simulator's memory and times, so the schedules it returns are only as good as that
count — if it drifts from the simulator (a release counted a moment early, a wait that
holds back what was already timed) the schedule goes over budget. So: on uneven random
problems, every placement, split and fused, every variant, the planned step equals the
simulated one and every device stays within its budget; and where the host link is slow
next to compute (the 8-stage preset at 40 GB) they are faster than the plans fitted by
offloading, which is why the driver runs them.
"""

from __future__ import annotations

import itertools
import random

import pytest

from optpipe.costmodel import default_problem
from optpipe.optimizer.driver import solve
from optpipe.optimizer.offload_list import (VARIANTS, RandomizedSearch,
                                            offload_list_schedule, offload_list_schedules)
from optpipe.optimizer.offload_starts import offloaded_list_schedules
from optpipe.optimizer.bounds import lower_bound
from optpipe.optimizer.preprocess import earliest_starts, task_graph
from optpipe.schedule import Op
from optpipe.simulator import simulate
from test_listsched import PLACEMENTS
from test_optimizer_engine import random_problem


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shape", sorted(PLACEMENTS))
def test_the_planned_step_is_the_simulated_one_and_fits(seed: int, shape: str) -> None:
    rng = random.Random(seed)
    problem = random_problem(rng, rng.choice([3, 4]), rng.choice([4, 6, 8]),
                             rng.choice([1.0, 1.5, 2.0]), rng.choice([0.0, 0.05]))
    place = PLACEMENTS[shape](problem.devices)
    for split in (True, False):
        bound = lower_bound(task_graph(problem, split, place))
        for (eager_w, reserve, away), queue_aware, deferred in itertools.product(
                VARIANTS, (False, True), (False, True)):
            schedule = offload_list_schedule(problem, place, split, eager_w=eager_w,
                                             reserve=reserve, away=away,
                                             queue_aware=queue_aware, deferred=deferred)
            if schedule is None:
                continue
            result = simulate(problem, schedule)
            assert result.fits, (schedule.name, result.peak_memory, result.budget)
            assert result.makespan == pytest.approx(
                schedule.provenance["planned_makespan"], abs=1e-9), schedule.name
            assert result.makespan >= bound - 1e-9
            assert schedule.provenance["source"] == "optimizer"


def test_a_slow_host_link_is_used_better_than_by_fitted_plans() -> None:
    """8 H100s at 40 GB, 16 microbatches: a chunk's copy takes about twice its forward.
    The offload-aware schedules offload, fit, and beat every plan fitted by offloading
    (the driver's other offloaded starts) on both chunked placements."""
    problem = default_problem(8, 16, budget="40GB")
    for shape in ("interleaved", "v"):
        place = PLACEMENTS[shape](8)
        made = offload_list_schedules(problem, place)
        assert made
        results = [simulate(problem, s) for s in made]
        assert all(r.fits for r in results)
        assert all(any(a.op is Op.OFFLOAD for acts in s.actions for a in acts) for s in made)
        fitted = [simulate(problem, s).makespan
                  for s in offloaded_list_schedules(problem, place)]
        assert min(r.makespan for r in results) < min(fitted, default=float("inf"))


def test_an_activation_goes_out_only_when_it_can_come_back_in_time() -> None:
    """With ``queue_aware`` an activation is sent to the host only when, behind the
    copies already queued on the device-to-host channel, it can still go out and come
    back within its path to its own backward (``away`` times the two copies): on the
    8-stage preset at 40 GB, where the link is slower than the forwards, the channel's
    queue grows in the warm-up, and the rule by the path alone sends out activations
    whose backward then waits for their reload."""
    problem = default_problem(8, 16, budget="40GB")
    place = PLACEMENTS["interleaved"](8)
    graph = task_graph(problem, True, place)
    es = earliest_starts(graph)
    split = graph.problem

    def late(queue_aware: bool) -> int:
        """How many OFFLOADs start later after their forward than the rule allows."""
        schedule = offload_list_schedule(problem, place, queue_aware=queue_aware)
        assert schedule is not None
        result = simulate(problem, schedule)
        assert result.fits
        count = 0
        for rec in result.records:
            if rec.action.op is Op.OFFLOAD:
                s, m = rec.action.stage, rec.action.microbatch
                path = es[(Op.B, s, 0)] - es[(Op.F, s, 0)] - graph.duration[(Op.F, s, 0)]
                copies = split.offload_time(s) + split.reload_time(s)
                count += rec.start - result.record(Op.F, s, m).end > path - copies + 1e-9
        return count

    assert late(True) == 0
    assert late(False) > 0


def test_offloads_listed_when_due_keep_their_times_and_free_a_forward_sooner() -> None:
    """With ``deferred`` an OFFLOAD is listed only when the compute after it would
    otherwise issue it late, so every copy still starts as soon as its forward has ended
    and the channel is free (listing it later changes no time), and a forward that does
    not fit can wait for a queued copy before the last one (the waited-for OFFLOAD is
    followed by others in the device's list): on the 8-stage preset at 40 GB, where the
    channel queues copies in the warm-up."""
    problem = default_problem(8, 16, budget="40GB")
    place = PLACEMENTS["interleaved"](8)
    for deferred in (False, True):
        schedule = offload_list_schedule(problem, place, deferred=deferred)
        assert schedule is not None
        assert schedule.provenance["offload_list"]["deferred"] is deferred
        result = simulate(problem, schedule)
        assert result.fits
        for d in range(problem.devices):
            channel_free = 0.0
            for rec in sorted((r for r in result.records if r.device == d
                               and r.action.op is Op.OFFLOAD), key=lambda r: r.start):
                forward = result.record(Op.F, rec.action.stage, rec.action.microbatch)
                assert rec.start == pytest.approx(max(forward.end, channel_free), abs=1e-9)
                channel_free = rec.end
        before_last = 0
        for acts in schedule.actions:
            for i, action in enumerate(acts):
                if action.op is Op.OFFLOAD and action.wait:
                    rest = itertools.takewhile(lambda a: not a.op.is_compute, acts[i + 1:])
                    before_last += sum(a.op is Op.OFFLOAD for a in rest)
        assert (before_last > 0) is deferred


def test_a_waiting_forward_leaves_room_for_the_next_reload_due(monkeypatch) -> None:
    """With the copies deferred, every copy that makes room could let a forward in
    before the reload a due backward waits for (``WAIT_KEEPS_RELOAD_ROOM`` off): on the
    8-stage preset at 40 GB, interleaved, device 0 then runs 44 forwards before its
    first backward, at 1.08 s; with the rule its first backward comes sooner, after
    fewer forwards (26, at 0.67 s)."""
    from optpipe.optimizer import offload_list

    problem = default_problem(8, 32, budget="40GB")
    place = PLACEMENTS["interleaved"](8)

    def first_backward(keep: bool) -> tuple[float, int]:
        monkeypatch.setattr(offload_list, "WAIT_KEEPS_RELOAD_ROOM", keep)
        schedule = offload_list_schedule(problem, place, deferred=True)
        assert schedule is not None
        result = simulate(problem, schedule)
        assert result.fits
        at = min(r.start for r in result.records if r.device == 0 and r.action.op is Op.B)
        return at, sum(1 for r in result.records
                       if r.device == 0 and r.action.op is Op.F and r.start < at)

    kept_at, kept_forwards = first_backward(True)
    taken_at, taken_forwards = first_backward(False)
    assert kept_at < taken_at
    assert kept_forwards < taken_forwards


def test_the_randomized_search_keeps_the_listing_rule_of_its_start() -> None:
    """A search started from a deferred run rebuilds that run first: its makespan is the
    start's (the listing rule comes from the start's provenance, not the default)."""
    problem = default_problem(8, 8, budget="40GB")
    place = PLACEMENTS["interleaved"](8)
    start = offload_list_schedule(problem, place, deferred=True)
    assert start is not None
    makespan = simulate(problem, start).makespan
    search = RandomizedSearch(problem, place, True, start.provenance["offload_list"], None)
    assert search.makespan == pytest.approx(makespan, abs=1e-12)


def test_a_deadline_stops_between_variants(monkeypatch) -> None:
    """No time, no variant; one variant is built with its copies listed at once, then
    deferred (``DEFERRED_VARIANTS``), or only as the module's default without them."""
    from optpipe.optimizer import offload_list

    problem = default_problem(8, 8, budget="40GB")
    place = PLACEMENTS["v"](8)
    assert offload_list_schedules(problem, place, deadline=0.0) == []
    both = offload_list_schedules(problem, place, variants=VARIANTS[:1])
    assert [s.provenance["offload_list"] for s in both] == [{
        "eager_w": False, "reserve": 0, "away": 1.0, "lead": 1.0, "queue_aware": True,
        "deferred": deferred, "jitter": 0.0, "seed": 0, "perturbed": False}
        for deferred in (False, True)]
    monkeypatch.setattr(offload_list, "DEFERRED_VARIANTS", False)
    one = offload_list_schedules(problem, place, variants=VARIANTS[:1])
    assert [s.provenance["offload_list"]["deferred"] for s in one] == [False]


def test_the_driver_hands_them_on_with_offload_only() -> None:
    """With offload the driver's answer on the 40 GB preset is no slower than the
    offload-aware schedule it starts from; without offload none is among its starts."""
    problem = default_problem(8, 8, budget="40GB")
    start = min(simulate(problem, s).makespan
                for s in offload_list_schedules(problem, PLACEMENTS["interleaved"](8),
                                                variants=VARIANTS[:1]))
    with_offload = solve(problem, offload=True, time_limit=8, cache=False)
    assert with_offload.sim.fits
    assert with_offload.sim.makespan <= start + 1e-9
    without = solve(problem, offload=False, time_limit=4, cache=False)
    assert not without.schedule.offloads


def test_randomized_runs_only_return_what_fits_and_beats_the_bar() -> None:
    """The randomized runs the driver makes with time to spare: whatever they return
    fits and was simulated faster than the bar; none without time."""
    import time

    from optpipe.optimizer.offload_list import randomized

    problem = default_problem(8, 8, budget="40GB")
    place = PLACEMENTS["interleaved"](8)
    start = offload_list_schedules(problem, place, variants=VARIANTS[:1])[0]
    bar = simulate(problem, start).makespan
    found, runs = randomized(problem, place, True, start.provenance["offload_list"],
                             deadline=time.monotonic() + 2.0, bar=bar)
    assert runs >= 1
    if found is not None:
        result = simulate(problem, found)
        assert result.fits and result.makespan < bar
    assert randomized(problem, place, True, start.provenance["offload_list"],
                      deadline=0.0, bar=bar) == (None, 0)


def _searched(seed: int, calls: int, seconds: float, stall: int | None = None
              ) -> tuple[RandomizedSearch, list[float]]:
    """A :class:`RandomizedSearch` on 8 x 8 at 40 GB (interleaved chunks, from the
    first variant) called ``calls`` times for ``seconds``, and its best before and
    after each call; every call's schedule checked on the way: it fits, beats what the
    search held when called and is its new best, and the greedy's planned step (with
    perturbed priorities too) is the simulated one."""
    import time

    problem = default_problem(8, 8, budget="40GB")
    place = PLACEMENTS["interleaved"](8)
    start = offload_list_schedules(problem, place, variants=VARIANTS[:1])[0]
    search = RandomizedSearch(problem, place, True, start.provenance["offload_list"],
                              simulate(problem, start).makespan, seed=seed)
    if stall is not None:
        search.STALL = stall
    held = [search.makespan]
    for _ in range(calls):
        found = search.run(time.monotonic() + seconds)
        if found is not None:
            result = simulate(problem, found)
            assert result.fits and result.makespan < held[-1]
            assert result.makespan == pytest.approx(search.makespan, abs=1e-12)
            assert result.makespan == pytest.approx(
                found.provenance["planned_makespan"], abs=1e-9)
        held.append(search.makespan)
    return search, held


def test_the_randomized_search_keeps_its_best_in_both_w_policies() -> None:
    """:class:`RandomizedSearch` from call to call (:func:`_searched`): its best never
    gets worse; and the W policy the start did not use has a basin of its own that
    runs (its first runs are slower than the start, so one basin would never keep
    them: on 16 stages at 40 GB two basins reach 1.992 s, one 2.086 s, in 15 s)."""
    search, held = _searched(seed=3, calls=6, seconds=0.5)
    assert held == sorted(held, reverse=True)
    assert search.runs >= 6
    assert all(best < float("inf") for _, _, best in search.basins.values())


def test_four_basins_keep_each_its_offload_rule(monkeypatch) -> None:
    """``BASINS = 4`` (a strategy the benchmark measures, not the default): one basin
    per W policy and offload rule, each run in turn, and a basin's runs keep its rule
    (no switch in its fresh draws); the best still never gets worse."""
    monkeypatch.setattr(RandomizedSearch, "BASINS", 4)
    search, held = _searched(seed=2, calls=4, seconds=0.5)
    assert held == sorted(held, reverse=True)
    assert len(search.basins) == 4 and search.runs >= 8
    for (eager, rule), (params, _, best) in search.basins.items():
        assert params["eager_w"] == eager and params["queue_aware"] == rule
        assert best < float("inf")


def test_a_stalled_basin_restarts_and_the_best_is_kept() -> None:
    """A basin that has not improved for ``STALL`` runs restarts from a fresh draw near
    its start, which may be slower than the best so far: the search still reports
    (and returns only schedules that beat) its best, which never gets worse."""
    search, held = _searched(seed=1, calls=4, seconds=0.3, stall=2)
    assert search.restarts >= 1
    assert held == sorted(held, reverse=True)
    assert search.makespan <= min(best for _, _, best in search.basins.values())


def test_the_driver_searches_every_placement_within_reach(monkeypatch) -> None:
    """The driver's randomized runs go round every placement whose best offload-aware
    schedule is within ``RANDOMIZED_REACH`` of the best one's (the optimum of 8 x 16 at
    S/2 is on the V shape, which starts behind interleaved chunks), each placement's
    best joining the candidates; with no reach only the leader's placement; none once
    a bound is met."""
    import time

    from optpipe.optimizer import warm_starts
    from optpipe.optimizer.candidates import add_fitting, best_listed
    from optpipe.optimizer.preprocess import FixedSet

    problem = default_problem(8, 8, budget="40GB")
    fixed = FixedSet()
    for label in ("interleaved", "v"):
        add_fitting(problem, fixed, offload_list_schedules(
            problem, PLACEMENTS[label](8), variants=VARIANTS[:2]), label)
    leader = best_listed(fixed)
    monkeypatch.setattr(warm_starts, "RANDOMIZED_REACH", 1.0)
    searches: dict = {}
    runs = warm_starts.add_randomized(problem, fixed, time.monotonic() + 5.0, searches)
    assert set(searches) == {"interleaved", "v"}
    assert runs == sum(search.runs for search in searches.values())
    assert all(search.runs >= 1 for search in searches.values())
    for label, search in searches.items():
        assert best_listed(fixed, label).makespan == pytest.approx(search.makespan)
    monkeypatch.setattr(warm_starts, "RANDOMIZED_REACH", 0.0)
    alone: dict = {}
    warm_starts.add_randomized(problem, fixed, time.monotonic() + 1.0, alone)
    assert set(alone) == {best_listed(fixed).schedule.provenance["placement"]}
    assert warm_starts.add_randomized(problem, fixed, time.monotonic() + 5.0, {},
                                       bound=leader.makespan) == 0


def test_the_offload_rule_switch_leaves_every_other_draw_as_it_was(monkeypatch) -> None:
    """The fresh draws' switch between the offload rules (``QUEUE_FLIP``) draws from a
    random stream of its own: whatever it draws, every other draw is the same, draw for
    draw — so where the rule changes nothing (a host link fast enough that no copies
    queue: the benchmark's) the search runs exactly as it did before the rule came
    (16 x 32 at S/2 proven optimal in 28 s, where one shared stream ended at 0.14%)."""
    from optpipe.optimizer import offload_list

    monkeypatch.setattr(offload_list, "QUEUE_FLIP", 0.5)
    problem = default_problem(8, 8, budget="40GB")
    place = PLACEMENTS["interleaved"](8)
    start = offload_list_schedules(problem, place, variants=VARIANTS[:1])[0]
    around = start.provenance["offload_list"]
    drawn = []
    for switch_seed in (None, 12345):
        search = RandomizedSearch(problem, place, True, around, 1.0, seed=5)
        if switch_seed is not None:
            search.switch = random.Random(switch_seed)
        drawn.append([search._fresh(search.origins[search.first]) for _ in range(8)])
    rules = [[params["queue_aware"] for params, _ in draws] for draws in drawn]
    assert rules[0] != rules[1]                  # the two switch streams differ...
    for (one, one_scale), (other, other_scale) in zip(*drawn):
        assert one_scale == other_scale         # ...and nothing else does
        assert {**one, "queue_aware": None} == {**other, "queue_aware": None}
