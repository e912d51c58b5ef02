"""Extended schedules: a window of each device's order repeated. The results must be
valid schedules of the larger problem (the simulator's word), keep the source's steady
state, and reach the driver as warm starts where memory binds."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from optpipe.generators import generate
from optpipe.optimizer.driver import solve
from optpipe.optimizer.extend import extended_schedules, extensions, repeat_window
from optpipe.optimizer.prefix import PrefixCuts
from optpipe.optimizer.preprocess import fixed_schedules
from optpipe.problem import uniform_problem
from optpipe.schedule import Op, linear_placement, v_placement
from optpipe.simulator import simulate
from test_optimizer_preprocess import random_problem


def _uniform(stages: int, microbatches: int, budget: float):
    return uniform_problem(stages, microbatches, forward=1.0, backward_input=1.0,
                           backward_weight=1.0, p2p=0.05, activation=2, freed_by_b=1,
                           static=0).activation_budget(budget)


def _fixed_on(place):
    """Hints for a half problem: its fitting fixed schedules on ``place``, fastest first."""
    def hints(half):
        return [c.schedule for c in sorted(fixed_schedules(half).candidates,
                                           key=lambda c: c.makespan)
                if c.fits and c.schedule.placement == place]
    return hints


def test_repeating_1f1b_steady_state_gives_1f1b() -> None:
    """1F1B's steady state is one microbatch long: repeating it reproduces 1F1B."""
    small, large = _uniform(4, 8, 4), _uniform(4, 16, 4)
    source = generate("1f1b", small)
    out = extensions(large, source, keep=1)
    assert out, "some window of 1F1B extends"
    schedule, result = out[0]
    assert schedule.microbatches == 16 and result.fits
    assert result.makespan == pytest.approx(simulate(large, generate("1f1b", large)).makespan)
    assert schedule.provenance["extended_from"] == "1f1b"


def test_window_holds_each_task_type_group_times() -> None:
    source = generate("zb-h1", _uniform(4, 8, 4))
    extended = repeat_window(source, group=2, copies=3, first=4)
    assert extended is not None and extended.microbatches == 14
    for device, acts in enumerate(extended.actions):
        kinds = Counter((a.op, a.stage) for a in acts)
        assert set(kinds.values()) == {14}, f"device {device}: every task once per microbatch"
        for op in (Op.F, Op.B, Op.W):          # FIFO per op type survives the shift
            order = [a.microbatch for a in acts if a.op is op]
            assert order == sorted(order)


def test_no_window_no_schedule() -> None:
    source = generate("1f1b", _uniform(4, 8, 4))
    assert repeat_window(source, group=5, copies=1, first=0) is None   # > M - first
    assert repeat_window(source, group=2, copies=1, first=7) is None   # past the end


@pytest.mark.parametrize("seed", range(12))
def test_extensions_are_valid_and_fit_on_random_problems(seed: int) -> None:
    """Uneven stages, p2p lag, tight budgets, every placement the source has: whatever
    comes back simulates, fits, and has the larger problem's microbatches."""
    small = random_problem(seed)
    large = replace(small, microbatches=small.microbatches + 4)
    for candidate in fixed_schedules(small).candidates:
        if not candidate.fits or candidate.schedule.offloads:
            continue
        for schedule, result in extensions(large, candidate.schedule, keep=3):
            assert schedule.microbatches == large.microbatches
            again = simulate(large, schedule)
            assert again.fits and again.makespan == pytest.approx(result.makespan)


def test_extended_schedules_solve_half_then_repeat() -> None:
    """4 stages, 32 microbatches, half of 1F1B's memory: the 16-microbatch optimum
    (pairs of forwards, 5.1 s per microbatch) repeated is the 32-microbatch optimum,
    164.4 s (proven by CP-SAT, docs/optimizer.md), where the best fixed schedule on one
    stage per device takes longer."""
    problem = _uniform(4, 32, 2)
    place = linear_placement(4)

    hints = _fixed_on(place)
    proven = PrefixCuts()
    out = extended_schedules(problem, place, True, time_limit=8, hints=hints, proven=proven)
    assert out
    # the half's optimum is kept for the prefix cuts (docs/optimizer.md: 82.8 s)
    assert proven.whole == {16: pytest.approx(82.8)} and proven.exact == {16}
    schedule, result = out[0]
    assert result.fits and schedule.name.startswith("extended-k")
    assert result.makespan == pytest.approx(164.4)
    assert result.makespan < min(c.makespan for c in fixed_schedules(problem).candidates
                                 if c.fits and c.schedule.placement == place
                                 and not c.schedule.offloads)


def test_the_source_is_proven_with_its_prefix_cuts() -> None:
    """4 stages, 40 microbatches, half of 1F1B's memory, ``cuts_share``: the pieces of
    the 20-microbatch source (up to 16) are solved first and go into its model, which
    then proves the source's optimum; ``proven`` keeps all of it for the driver's cuts,
    and the extension still fits."""
    problem = _uniform(4, 40, 2)
    place = linear_placement(4)

    hints = _fixed_on(place)
    proven = PrefixCuts()
    out = extended_schedules(problem, place, True, time_limit=30, hints=hints,
                             proven=proven, cuts_share=0.5)
    assert out and all(result.fits for _, result in out)
    assert 20 in proven.exact and max(proven.whole) == 20
    assert set(range(1, 17)) <= proven.exact
    assert proven.reach and max(proven.reach) <= 16
    # the source's optimum is a bound on any 20 microbatches: the chain over 40 is below
    # the extension's makespan
    assert proven.makespan_bound(40) <= min(r.makespan for _, r in out) + 1e-6


def test_driver_uses_extensions_on_one_stage_per_device() -> None:
    problem = _uniform(4, 32, 2)
    res = solve(problem, offload=False, placements=["linear"], time_limit=12, cache=False,
                progress=False)
    names = [c.name for c in res.fixed]
    assert any(n.startswith("extended-linear-k") for n in names)
    assert res.sim.fits and res.sim.makespan <= 164.4 + 1e-6
    # unrestricted, the V blocks win and one stage per device cannot: none are built
    free = solve(problem, offload=False, time_limit=6, cache=False, progress=False)
    assert not any(c.name.startswith("extended") for c in free.fixed)
    assert free.schedule.placement == v_placement(4) or free.sim.makespan < 164.4


def test_driver_proves_the_source_with_its_cuts_first(monkeypatch) -> None:
    """4 x 40 at half of 1F1B's memory, one stage per device: memory binds hard and the
    cuts pay, so the 20-microbatch source is searched with its pieces' cuts in its model
    and proven, and the driver's own cuts do not solve those pieces again."""
    import optpipe.optimizer.cpsat as cpsat

    calls: list[tuple[int, bool, str]] = []
    real = cpsat.solve_cpsat

    def recording(smaller, **kwargs):
        run = real(smaller, **kwargs)
        calls.append((smaller.microbatches, kwargs.get("cuts") is not None, run.status))
        return run
    monkeypatch.setattr(cpsat, "solve_cpsat", recording)
    problem = _uniform(4, 40, 2)
    res = solve(problem, offload=False, placements=["linear"], time_limit=30, cache=False,
                progress=False)
    assert (20, True, "optimal") in calls
    assert [n for n, _, _ in calls].count(20) == 1     # not again among the driver's cuts
    assert res.sim.fits and res.bound <= res.sim.makespan + 1e-6
