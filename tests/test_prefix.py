"""Prefix cuts: bounds from fewer microbatches. They must never exceed a proven
optimum (on random uneven problems, every placement), must not cut the optimum off when
they go into the model, and must add to the memory bound where memory binds."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from optpipe.optimizer.cpsat import solve_cpsat, solve_reach
from optpipe.optimizer.extend import first_microbatches
from optpipe.optimizer.prefix import PrefixCuts, ladder, prefix_cuts
from optpipe.optimizer.bounds import memory_bound
from optpipe.optimizer.preprocess import fixed_schedules, task_graph
from optpipe.problem import Problem, uniform_problem
from optpipe.schedule import Op, linear_placement, v_placement
from optpipe.simulator import simulate
from test_optimizer_preprocess import placement_hints, random_problem


def test_chain_of_pieces() -> None:
    cuts = PrefixCuts(reach={2: 5.0, 3: 6.0}, whole={1: 4.0, 2: 7.0})
    # 5 microbatches: reach[3] + whole[2] = 13, reach[2] + reach[2] + whole[1] = 14
    assert cuts.makespan_bound(5) == pytest.approx(14.0)
    assert cuts.makespan_bound(2) == pytest.approx(7.0)
    assert PrefixCuts().makespan_bound(4) == 0.0


def test_first_microbatches_is_a_valid_smaller_schedule() -> None:
    problem = random_problem(3)
    for c in fixed_schedules(problem).candidates:
        if not c.fits or c.schedule.offloads:
            continue
        smaller = first_microbatches(c.schedule, 2)
        result = simulate(replace(problem, microbatches=2), smaller)
        assert result.fits and result.makespan <= c.makespan + 1e-9


def _half_budget(microbatches: int) -> Problem:
    """4 uniform stages (F = B = W = 1 s, p2p 0.05 s) with room for 2 activations (half
    of 1F1B's memory): memory binds hard."""
    return uniform_problem(4, microbatches, forward=1.0, backward_input=1.0,
                           backward_weight=1.0, p2p=0.05, activation=2, freed_by_b=1,
                           static=0).activation_budget(2)


def _hints(place, split):
    def hints(smaller):
        return placement_hints(smaller, place, split, None)
    return hints


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("shape", ["linear", "v"])
def test_cuts_never_exceed_the_optimum(seed: int, shape: str) -> None:
    problem = random_problem(seed)
    place = linear_placement(problem.devices) if shape == "linear" else \
        v_placement(problem.devices)
    hints = placement_hints(problem, place, True, None)
    if not hints:
        pytest.skip("no fitting schedule on this placement to start from")
    plain = solve_cpsat(problem, warm_start=hints, time_limit=20, placement=place,
                        decompose=False)
    assert plain.status == "optimal"
    cuts = prefix_cuts(problem, place, True, time_limit=20, hints=_hints(place, True))
    assert cuts.makespan_bound(problem.microbatches) <= plain.objective + 1e-6
    # the least reach of F(0, M-1) is no later than where the optimum starts it
    reach = solve_reach(problem, warm_start=hints, time_limit=20, placement=place)
    records = simulate(problem, plain.schedule).records
    start = {r.action.key: r.start for r in records}
    last = start[(Op.F, 0, problem.microbatches - 1)]
    assert reach is not None and reach.seconds <= last + 1e-6
    # every window of n microbatches in the optimum takes at least whole[n], from its
    # first forward until its last microbatch is done
    done: dict[int, float] = {}
    for r in records:
        done[r.action.key[2]] = max(done.get(r.action.key[2], 0.0), r.end)
    for n, whole in cuts.whole.items():
        for i in range(problem.microbatches - n + 1):
            assert done[i + n - 1] - start[(Op.F, 0, i)] >= whole - 1e-6
    # and in the model they cut off no optimum
    cut = solve_cpsat(problem, warm_start=hints, time_limit=20, placement=place,
                      decompose=False, cuts=cuts)
    assert cut.status == "optimal"
    assert cut.objective == pytest.approx(plain.objective)


def test_cuts_add_to_the_memory_bound_where_memory_binds() -> None:
    """4 stages, 20 microbatches, half of 1F1B's memory: the pieces' chain is above the
    memory round-trip bound (which misses the waits inside the round trip)."""
    problem = _half_budget(20)
    place = linear_placement(4)
    cuts = prefix_cuts(problem, place, True, time_limit=20, hints=_hints(place, True))
    assert cuts.makespan_bound(20) > memory_bound(task_graph(problem)) + 1e-6
    run = solve_cpsat(problem, warm_start=placement_hints(problem, place, True, None),
                      time_limit=30, cuts=cuts)
    assert run.bound >= cuts.makespan_bound(20) - 1e-6
    assert run.objective >= cuts.makespan_bound(20) - 1e-6


def test_driver_starts_one_stage_per_device_from_its_cuts() -> None:
    """Restricted to one stage per device where memory binds, the driver computes the
    cuts before the run: the run's lower bound is above the memory bound."""
    from optpipe.optimizer.driver import solve

    problem = _half_budget(20)
    res = solve(problem, offload=False, placements=["linear"], time_limit=20, cache=False,
                progress=False)
    linear = [r for r in res.runs if r.extra.get("space") == "linear"]
    assert linear and linear[0].extra["lower_bound"] > memory_bound(task_graph(problem)) + 1e-6
    assert res.bound <= res.sim.makespan + 1e-6 and res.sim.fits


def test_pieces_already_proven_are_not_solved_again(monkeypatch) -> None:
    """The extended schedules prove the optimum of half the microbatches; the cuts take
    it (``known``) instead of solving that piece again, and keep its value."""
    import optpipe.optimizer.cpsat as cpsat

    problem = _half_budget(20)
    place = linear_placement(4)
    sixteen = replace(problem, microbatches=16)
    run = solve_cpsat(sixteen, warm_start=placement_hints(sixteen, place, True, None),
                      time_limit=30)
    assert run.status == "optimal"
    known = PrefixCuts()
    known.record_whole(16, run.bound, True)
    known.record_whole(16, run.bound - 1.0, False)       # a weaker bound changes nothing
    assert known.whole == {16: run.bound} and known.exact == {16}

    solved: list[int] = []
    real = cpsat.solve_cpsat

    def counting(smaller, **kwargs):
        solved.append(smaller.microbatches)
        return real(smaller, **kwargs)
    monkeypatch.setattr(cpsat, "solve_cpsat", counting)
    cuts = prefix_cuts(problem, place, True, time_limit=10, hints=_hints(place, True),
                       known=known)
    assert 16 not in solved and solved          # the other pieces were solved
    assert cuts.whole[16] == pytest.approx(run.bound) and 16 in cuts.exact


def test_exact_reach_pieces_are_not_solved_again(monkeypatch) -> None:
    """What one call proved exactly, ``reach`` pieces included, a second call given it
    as ``known`` keeps and does not solve again (the extended schedules' source solves
    the small pieces first, and the driver's cuts then take them); ``merge`` keeps the
    best bound of each piece and its exactness."""
    import optpipe.optimizer.cpsat as cpsat

    problem = _half_budget(6)
    place = linear_placement(4)
    first = prefix_cuts(problem, place, True, time_limit=30, hints=_hints(place, True))
    assert first.exact_reach == set(first.reach) == {1, 2, 3, 4, 5}
    assert first.exact == set(first.whole) == {1, 2, 3, 4, 5}

    solved: list[int] = []
    real_whole, real_reach = cpsat.solve_cpsat, cpsat.solve_reach

    def whole(smaller, **kwargs):
        solved.append(smaller.microbatches)
        return real_whole(smaller, **kwargs)

    def reach(smaller, **kwargs):
        solved.append(smaller.microbatches)
        return real_reach(smaller, **kwargs)
    monkeypatch.setattr(cpsat, "solve_cpsat", whole)
    monkeypatch.setattr(cpsat, "solve_reach", reach)
    again = prefix_cuts(problem, place, True, time_limit=30, hints=_hints(place, True),
                        known=first)
    assert solved == []
    assert again.reach == first.reach and again.whole == first.whole

    merged = PrefixCuts()
    merged.record_reach(2, first.reach[2] - 1.0, False)
    merged.merge(first)
    merged.record_reach(2, first.reach[2] - 2.0, False)   # a weaker bound changes nothing
    assert merged.reach == first.reach and merged.exact_reach == first.exact_reach


def test_the_proof_runs_setting_changes_no_proven_piece(monkeypatch) -> None:
    """The pieces run without CP-SAT's disjunctive precedences
    (``cpsat.PROOF_DISJUNCTIVE_PRECEDENCES``, a propagation option: it may change how
    fast a proof ends, never what it proves); with it on they prove the same values,
    every piece exactly, and the searches that are not proofs keep CP-SAT's default."""
    import optpipe.optimizer.cpsat as cpsat

    assert cpsat.new_solver(1, 1, proof=True).parameters.\
        use_precedences_in_disjunctive_constraint == cpsat.PROOF_DISJUNCTIVE_PRECEDENCES
    assert cpsat.new_solver(1, 1).parameters.use_precedences_in_disjunctive_constraint
    problem = _half_budget(7)
    place = linear_placement(4)
    found = []
    for setting in (False, True):
        monkeypatch.setattr(cpsat, "PROOF_DISJUNCTIVE_PRECEDENCES", setting)
        cuts = prefix_cuts(problem, place, True, time_limit=60, hints=_hints(place, True))
        assert cuts.exact == set(cuts.whole) and cuts.exact_reach == set(cuts.reach)
        found.append((cuts.whole, cuts.reach))
    assert found[0] == found[1]


def test_the_largest_piece_can_be_smaller() -> None:
    """``largest`` caps the pieces (the chunked placements' are slower to prove): on the
    V shape at 4 x 6, pieces up to 3 are solved and proven, none larger, and their
    chain still bounds the whole problem's optimum from below."""
    problem = _half_budget(6)
    place = v_placement(4)
    cuts = prefix_cuts(problem, place, True, time_limit=20, hints=_hints(place, True),
                       largest=3)
    assert cuts.whole and max(cuts.whole) == 3 and max(cuts.reach) == 3
    assert cuts.exact == {1, 2, 3}
    plain = solve_cpsat(problem, warm_start=placement_hints(problem, place, True, None),
                        time_limit=20, placement=place, decompose=False)
    assert plain.status == "optimal"
    assert 0 < cuts.makespan_bound(6) <= plain.objective + 1e-6


def test_the_ladder_halves_down_to_the_largest_piece() -> None:
    assert ladder(64, 16) == [32]
    assert ladder(128, 16) == [32, 64]
    assert ladder(63, 16) == [31, 32]
    assert ladder(100, 16) == [25, 50]
    assert ladder(33, 16) == [17]
    assert ladder(32, 16) == [] and ladder(16, 16) == []


def test_ladder_pieces_proven_with_the_smaller_cuts_stay_valid() -> None:
    """4 x 12 at half of 1F1B's memory, pieces up to 3 and the ladder's 6: ``reach[6]``
    and ``whole[6]``, proven with the smaller pieces' cuts in their models, equal what
    CP-SAT proves for them without cuts; the chain (two links now instead of four)
    rises above the small pieces' and stays below the whole problem's optimum."""
    problem = _half_budget(12)
    place = linear_placement(4)
    small = prefix_cuts(problem, place, True, time_limit=60, hints=_hints(place, True),
                        largest=3)
    assert max(small.whole) == 6 and max(small.reach) == 6 and 6 in small.exact
    for n in (6, 7):
        piece = replace(problem, microbatches=n)
        hints = placement_hints(piece, place, True, None)
        if n == 6:
            alone = solve_cpsat(piece, warm_start=hints, time_limit=30, decompose=False)
            assert alone.status == "optimal"
            assert small.whole[6] == pytest.approx(alone.objective)
        else:
            alone_reach = solve_reach(piece, warm_start=hints, time_limit=30)
            assert small.reach[6] == pytest.approx(alone_reach.seconds)
    without = PrefixCuts(reach={d: r for d, r in small.reach.items() if d <= 3},
                         whole={n: w for n, w in small.whole.items() if n <= 3})
    plain = solve_cpsat(problem, warm_start=placement_hints(problem, place, True, None),
                        time_limit=60, decompose=False)
    assert plain.status == "optimal"
    assert without.makespan_bound(12) < small.makespan_bound(12) <= plain.objective + 1e-6


@pytest.fixture(scope="module")
def optimum_and_cuts():
    """4 x 12 at half of 1F1B's memory: the problem, its fitting fixed schedules, its
    proven optimum and its prefix cuts (solved once for the gap probe's tests)."""
    problem = _half_budget(12)
    place = linear_placement(4)
    hints = placement_hints(problem, place, True, None)
    best = solve_cpsat(problem, warm_start=hints, time_limit=30, decompose=False)
    assert best.status == "optimal"
    cuts = prefix_cuts(problem, place, True, time_limit=20, hints=_hints(place, True))
    return problem, hints, best, cuts


def _slower(problem: Problem, hints, optimum: float):
    """A fitting schedule more than 2% slower than the optimum (outside the probe's
    reach from the optimum's own bound)."""
    slow = [h for h in hints if simulate(problem, h).makespan > optimum * 1.02]
    assert slow, "every fixed schedule is within 2% of the optimum"
    return slow[0]


@pytest.mark.parametrize("minimizes", [False, True])
def test_gap_probe_refutes_below_the_optimum_and_finds_below_a_slower_hint(
        optimum_and_cuts, monkeypatch: pytest.MonkeyPatch, minimizes: bool) -> None:
    """The gap probe (``cpsat._gap_probe``) asks for a schedule ``PROBE_GAP`` shorter
    than its hint: from the optimum it must be refuted (its bound is then one tick past
    the probe's horizon, within the gap of the optimum), and from a slower hint it must
    return a schedule the simulator times within the horizon. Without the objective
    (``PROBE_MINIMIZES`` False, the driver's) a schedule found is FEASIBLE, never
    OPTIMAL: CP-SAT's word for any solution of a model without one would make the
    caller take it for the optimum."""
    from optpipe.optimizer import cpsat
    from optpipe.optimizer.cpsat_model import make_hint, make_ticks

    monkeypatch.setattr(cpsat, "PROBE_MINIMIZES", minimizes)
    problem, hints, best, cuts = optimum_and_cuts
    ticks = make_ticks(problem, True, False, (1.0,))
    optimum = make_hint(best.schedule, ticks)
    below = int(optimum.makespan * 0.99)          # a bound 1% under: the probe applies
    deadline = cpsat.time.monotonic() + 30
    out = cpsat._gap_probe(problem, ticks, optimum, below, cuts, cpsat.PROBE_GAP,
                           deadline, 2)
    assert out is not None and out.status == "INFEASIBLE" and out.found is None
    assert out.horizon == int(math.ceil(optimum.makespan * (1 - cpsat.PROBE_GAP))) - 1
    assert (out.horizon + 1) / ticks.scale >= best.objective * (1 - cpsat.PROBE_GAP) - 1e-9
    # the hint already within the gap of the bound, or too far from it: no probe
    assert cpsat._gap_probe(problem, ticks, optimum, optimum.makespan - 1, cuts,
                            cpsat.PROBE_GAP, deadline, 2) is None
    slow = make_hint(_slower(problem, hints, best.objective), ticks)
    assert cpsat._gap_probe(problem, ticks, slow, optimum.makespan, cuts, cpsat.PROBE_GAP,
                            deadline, 2) is None
    monkeypatch.setattr(cpsat, "PROBE_WITHIN", 1.0)
    out = cpsat._gap_probe(problem, ticks, slow, optimum.makespan, cuts, cpsat.PROBE_GAP,
                           deadline, 2)
    assert out is not None and out.found is not None
    assert out.status in (("FEASIBLE", "OPTIMAL") if minimizes else ("FEASIBLE",))
    sim = simulate(problem, out.found.schedule)
    assert sim.fits and sim.makespan <= out.horizon / ticks.scale + 1e-9
    assert out.bound <= optimum.makespan


def test_solve_with_a_gap_probe_agrees_with_the_simulator(
        optimum_and_cuts, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``solve_cpsat``: a probe that finds a shorter schedule hands it on as
    the answer, with the probe's figures in the run's ``extra`` and the simulator's
    makespan equal to the objective, never below the bound."""
    from optpipe.optimizer import cpsat

    problem, hints, best, cuts = optimum_and_cuts
    monkeypatch.setattr(cpsat, "PROBE_WITHIN", 1.0)
    slow = _slower(problem, hints, best.objective)
    run = solve_cpsat(problem, warm_start=[slow], time_limit=30, decompose=False,
                      cuts=cuts)
    assert run.extra["gap_probe_status"] in ("FEASIBLE", "OPTIMAL")
    assert run.extra["gap_probe_horizon"] < simulate(problem, slow).makespan
    sim = simulate(problem, run.schedule)
    assert sim.fits and sim.makespan == pytest.approx(run.objective, rel=1e-9)
    assert run.bound <= best.objective + 1e-9 <= run.objective + 1e-9


def test_probe_descent_from_a_slower_hint_ends_within_the_gap(optimum_and_cuts) -> None:
    """The descent by probes (:func:`~optpipe.optimizer.descent.probe_descent`) from a
    hint more than 2% above the optimum: every schedule it finds is one the simulator
    times as the model does, its proven bound never passes the optimum, and on this
    small problem it ends within the gap asked for."""
    from optpipe.optimizer import cpsat
    from optpipe.optimizer.cpsat_model import make_hint, make_ticks
    from optpipe.optimizer.descent import probe_descent
    from optpipe.optimizer.result import relative_gap

    problem, hints, best, cuts = optimum_and_cuts
    ticks = make_ticks(problem, True, False, (1.0,))
    slow = make_hint(_slower(problem, hints, best.objective), ticks)
    lower = int(math.ceil(cuts.makespan_bound(problem.microbatches) * ticks.scale - 1e-6))
    found, proven, stats = probe_descent(problem, ticks, slow, lower=lower, cuts=cuts,
                                         gap=cpsat.PROBE_GAP,
                                         deadline=cpsat.time.monotonic() + 60, threads=2)
    probes = stats.record(ticks.scale)
    assert probes and probes[0][1] == "found"
    sim = simulate(problem, found.schedule)
    assert sim.fits and sim.makespan == pytest.approx(found.makespan / ticks.scale)
    assert lower <= proven <= best.objective * ticks.scale + 1e-6
    assert relative_gap(found.makespan, proven) <= cpsat.PROBE_GAP + 1e-9
    # every refutation's horizon lies under the optimum
    for horizon, outcome, _ in probes:
        if outcome == "refuted":
            assert horizon < best.objective


@pytest.mark.parametrize("decompose", [None, False, True])
def test_search_then_probe_agrees_with_the_simulator(
        optimum_and_cuts, monkeypatch: pytest.MonkeyPatch, decompose) -> None:
    """Past ``WINDOWLESS_MAX_CELLS_WITH_CUTS`` (lowered here so that a small problem
    is past it), one stage per device with the cuts searches and then probes, unless
    the caller forces the windows (``decompose=True``): the answer is the simulator's
    makespan, the bound at most the optimum."""
    from optpipe.optimizer import cpsat

    problem, hints, best, cuts = optimum_and_cuts
    monkeypatch.setattr(cpsat, "WINDOWLESS_MAX_CELLS_WITH_CUTS", 0)
    slow = _slower(problem, hints, best.objective)
    run = solve_cpsat(problem, warm_start=[slow], time_limit=30, cuts=cuts,
                      decompose=decompose)
    assert (run.extra.get("search") == "search then probe") == (decompose is not True)
    sim = simulate(problem, run.schedule)
    assert sim.fits and sim.makespan == pytest.approx(run.objective, rel=1e-9)
    assert run.bound <= best.objective + 1e-9 <= run.objective + 1e-9
    if decompose is not True:
        assert run.extra["searched_makespan"] >= run.objective - 1e-9
        if "gap_probe_status" in run.extra:          # a refutation: under the optimum
            assert run.extra["gap_probe_status"] == "INFEASIBLE"
            assert run.extra["gap_probe_horizon"] < best.objective
    # the cuts' model without cuts is not past the rule: the windows' path as before
    plain = solve_cpsat(problem, warm_start=[slow], time_limit=5)
    assert "search" not in plain.extra


def test_stop_on_stall_stops_a_search_that_would_run_on() -> None:
    """:func:`~optpipe.optimizer.descent.stop_on_stall` stops CP-SAT once its last
    better schedule is older than the stall: here it is (a time long past), so a
    search of 8 x 32 at half of 1F1B's memory, not proven within minutes, returns long
    before its limit with the schedule it had."""
    from optpipe.optimizer import cpsat
    from optpipe.optimizer.cpsat_model import make_hint, make_ticks
    from optpipe.optimizer.cpsat_order import build_order_model
    from optpipe.optimizer.descent import stop_on_stall

    problem = uniform_problem(8, 32, forward=1.0, backward_input=1.0, backward_weight=1.0,
                              p2p=0.05, activation=2, freed_by_b=1,
                              static=0).activation_budget(4)
    place = linear_placement(8)
    ticks = make_ticks(problem, True, False, (1.0,))
    hint = make_hint(placement_hints(problem, place, True, None)[0], ticks)
    builder, _ = build_order_model(problem, ticks, hint.makespan, 0, hint)
    builder.add_hints()
    solver = cpsat.new_solver(600, 2)
    long_ago = cpsat.time.monotonic() - 3600
    done = stop_on_stall(solver, lambda: long_ago, 1.0)
    try:
        code = solver.solve(builder.model)
    finally:
        done.set()
    assert solver.status_name(code) in ("FEASIBLE", "UNKNOWN")
    assert solver.wall_time < 300          # stopped, far from its limit of 600 s
