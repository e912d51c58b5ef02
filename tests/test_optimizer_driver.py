"""``solve``: the driver's promises — never worse than a fixed schedule, always within
budget, infeasible budgets explained, cache reuse checked, progress reported."""

from __future__ import annotations

import importlib.util
import json

import pytest

from optpipe.errors import InfeasibleError, OptPipeError
from optpipe.optimizer import driver
from optpipe.optimizer.bounds import memory_bound
from optpipe.optimizer.driver import CACHED, solve
from optpipe.optimizer.preprocess import fixed_schedules, task_graph
from optpipe.problem import uniform_problem
from optpipe.simulator import simulate


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTPIPE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_public_import() -> None:
    from optpipe import solve as top
    from optpipe.optimizer import solve as sub
    assert top is sub is solve


def test_never_worse_than_fixed_and_within_budget() -> None:
    problem = uniform_problem(4, 6, p2p=0.05).activation_budget(4)
    result = solve(problem, time_limit=10, progress=False, offload=False)
    schedule, sim = result
    assert sim.fits
    best = min(c.makespan for c in fixed_schedules(problem).candidates if c.fits)
    assert sim.makespan <= best * (1 + 1e-9)
    prov = schedule.provenance
    for key in ("solver", "status", "objective", "bound", "gap", "wall_time", "time_limit",
                "problem_hash"):
        assert key in prov
    assert prov["problem_hash"] == problem.hash()
    assert simulate(problem, schedule).makespan == pytest.approx(sim.makespan)
    if result.status != "fallback":
        assert result.objective == pytest.approx(sim.makespan, rel=1e-6)


def test_per_placement_proofs_are_reported() -> None:
    """Each searched placement says its best, its bound and whether it is proven; the
    overall bound is the least of them, and each best is a real (simulated) schedule."""
    problem = uniform_problem(4, 8, p2p=0.05).activation_budget(4)
    result = solve(problem, time_limit=20, progress=False, offload=False)
    labels = [p["placement"] for p in result.placements]
    assert "linear" in labels and len(set(labels)) == len(labels)
    for proof in result.placements:
        assert proof["bound"] <= proof["best"] * (1 + 1e-9)
        assert proof["optimal"] == (proof["gap"] <= 1e-9)
        assert proof["best"] >= result.makespan * (1 - 1e-9)
    assert result.bound == pytest.approx(min(p["bound"] for p in result.placements))
    if result.status == "optimal":    # the V shape is proven optimal here within seconds
        assert any(p["optimal"] and p["best"] == pytest.approx(result.makespan)
                   for p in result.placements)
    assert result.schedule.provenance["placements"] == result.placements


def test_offload_beats_no_offload_at_tight_budget() -> None:
    """Same placement, same engine: allowing offload must pay off when memory binds.

    (At such budgets the V-shaped zb-auto can beat every one-stage-per-device schedule;
    the driver then returns it, so the engine-level claim is checked on the engine.)
    """
    from optpipe.optimizer.cpsat import solve_cpsat

    problem = uniform_problem(4, 6, activation=1000, d2h_bandwidth=2000,
                              h2d_bandwidth=2000).activation_budget(2)
    without = solve_cpsat(problem, time_limit=10, offload=False)
    with_ = solve_cpsat(problem, warm_start=without.schedule, time_limit=20, offload=True)
    assert with_.schedule.offloads
    assert simulate(problem, with_.schedule).fits
    assert with_.objective < without.objective * 0.95
    # and the driver, allowed to offload, is never worse than when it is not
    a = solve(problem, offload=False, time_limit=5, progress=False, cache=False)
    b = solve(problem, offload=True, time_limit=8, progress=False, cache=False)
    assert a.sim.fits and b.sim.fits
    assert b.sim.makespan <= a.sim.makespan * (1 + 1e-9)


def test_infeasible_budget_names_min_budgets() -> None:
    problem = uniform_problem(3, 4, activation=1000, static=200).with_budget(1100)
    with pytest.raises(InfeasibleError) as info:
        solve(problem, time_limit=5, progress=False)
    assert info.value.min_budget == [1200, 1200, 1200]
    assert info.value.min_budget_offload == [1200, 1200, 1200]
    assert "1.17 KiB" in str(info.value)            # 1200 bytes, named per device
    # the minimum is exact: at that budget a schedule exists
    result = solve(problem.with_budget(1200), time_limit=5, progress=False)
    assert result.sim.fits


@pytest.mark.parametrize("budget", [0.5, 1, 2])
def test_the_floor_known_before_the_warm_starts_is_below_the_reported_bound(
        budget: float) -> None:
    """The driver stops building warm starts once one meets ``spaces.least_bound``; that
    is sound only if it is never above the bound the driver reports."""
    from optpipe.optimizer.spaces import least_bound, shape_bounds

    problem = uniform_problem(4, 8, p2p=0.05).activation_budget(budget * 4)
    for offload in (False, True):
        floor = least_bound(problem, shape_bounds(problem, True, offload), True, offload)
        result = solve(problem, time_limit=5, progress=False, offload=offload, cache=False)
        assert floor is not None and result.bound is not None
        assert floor <= result.bound + 1e-9 <= result.sim.makespan + 2e-9


def test_cache_hit_is_revalidated(private_cache) -> None:
    problem = uniform_problem(3, 4, p2p=0.1).activation_budget(2)
    first = solve(problem, time_limit=10, progress=False, offload=False)
    assert first.status == "optimal"
    files = list(private_cache.glob("*.json"))
    assert len(files) == 1
    second = solve(problem, time_limit=10, progress=False, offload=False)
    assert second.status == CACHED
    assert second.sim.makespan == pytest.approx(first.sim.makespan)
    # the time before the search is the solve's, not the cache's
    assert 0 < first.warm_start_time <= first.wall_time
    assert first.schedule.provenance["warm_start_time"] == round(first.warm_start_time, 3)
    assert second.warm_start_time is None
    # a tampered entry (over budget) is not used
    data = json.loads(files[0].read_text())
    data["provenance"]["problem_hash"] = "0" * 16
    files[0].write_text(json.dumps(data))
    third = solve(problem, time_limit=10, progress=False, offload=False)
    assert third.status != CACHED
    forced = solve(problem, time_limit=10, progress=False, offload=False, cache=False)
    assert forced.status != CACHED


def test_cache_resolves_unproven_entries_of_an_older_search(private_cache) -> None:
    """A time-limited answer from an older search may be beaten now: solved again. A
    proven optimum stays valid whatever the search."""
    from dataclasses import replace

    from optpipe.optimizer import cache as cache_mod
    from optpipe.optimizer.preprocess import sequential_schedule

    problem = uniform_problem(3, 4, p2p=0.1).activation_budget(2)
    base = sequential_schedule(problem)
    key = "k"
    cases = [({"status": "feasible", "search_revision": 1}, False),
             ({"status": "feasible"}, False),                         # before revisions
             ({"status": "feasible", "search_revision": cache_mod.SEARCH_REVISION}, True),
             ({"status": "optimal", "gap": 0.0}, True)]
    for extra, accepted in cases:
        prov = {"problem_hash": problem.hash(), "time_limit": 100.0, **extra}
        cache_mod.store(replace(base, provenance=prov), key, private_cache)
        hit = cache_mod.lookup(problem, key, time_limit=60, gap=0.0)
        assert (hit is not None) == accepted, extra


def test_progress_callback_runs() -> None:
    calls = []
    problem = uniform_problem(3, 4).activation_budget(2)
    solve(problem, time_limit=5, cache=False, offload=False,
          progress=lambda *args: calls.append(args))
    assert calls
    elapsed, best, bound, gap = calls[-1]
    assert elapsed >= 0 and best is not None and bound <= best + 1e-9


@pytest.mark.parametrize("offload, budget, placements",
                         [(False, 2, None), (True, 1.5, ["linear", "v"])])
def test_progress_shows_the_whole_search(offload: bool, budget: float,
                                         placements: list[str] | None) -> None:
    """The live line sees the solve, not one engine run: one clock, the best schedule
    so far from the first report on (the fixed schedules' best at least: reports
    start while the warm starts are built, with no bound yet), and, once the search
    reports, a bound over every placement that never passes the answer's. Without
    offload the answer is proven optimal (a higher bound would be false); with offload
    the offload model's bound on one stage per device (21.6 s here) does not hold for
    the V shape and must not show (the answer's bound is 13.95 s). (With offload at
    budget 2 no engine runs any more: an offloaded list schedule is ahead of what every
    engine's model can reach.)"""
    from optpipe.generators import GENERATORS
    from optpipe.schedule import placement_name

    calls = []
    problem = uniform_problem(4, 4, p2p=0.05).activation_budget(budget)
    result = solve(problem, time_limit=20, cache=False, offload=offload,
                   progress=lambda *args: calls.append(args), placements=placements)
    if not offload:
        assert result.status == "optimal"
    assert len(calls) >= 2
    times = [c[0] for c in calls]
    assert times == sorted(times)
    generated = [c.makespan for c in result.fixed if c.name in GENERATORS
                 and c.fits and (offload or not c.schedule.offloads)
                 and (placements is None or placement_name(
                     c.schedule.placement, problem.devices) in placements)]
    assert calls[0][1] is not None and calls[0][1] <= min(generated) + 1e-9
    incumbents = [c[1] for c in calls]
    assert all(a >= b - 1e-9 for a, b in zip(incumbents, incumbents[1:]))
    assert incumbents[-1] <= result.sim.makespan + 1e-9
    bounds = [c[2] for c in calls]
    known = next(i for i, bound in enumerate(bounds) if bound is not None)
    assert all(bound is not None for bound in bounds[known:])    # once known, kept
    for _, best, bound, gap in calls[known:]:
        assert bound <= result.bound + 1e-9
        assert gap == pytest.approx(max(0.0, (best - bound) / best))


def test_status_names_a_bound_that_comes_from_a_refuted_gap_probe() -> None:
    """The answer's bound from a refuted gap probe is said so in the status message;
    where the answer's bound is lower (another placement's), the probe is not named."""
    from optpipe.optimizer.result import FEASIBLE, EngineResult

    problem = uniform_problem(3, 4).activation_budget(2)
    fitting = next(c for c in fixed_schedules(problem).candidates
                   if c.fits and not c.schedule.offloads)
    makespan = fitting.makespan
    horizon = round(makespan * 0.995, 3)

    def run() -> EngineResult:
        return EngineResult(schedule=fitting.schedule, status=FEASIBLE, objective=makespan,
                            bound=horizon + 0.001, gap=None, wall_time=1.0, engine="cpsat",
                            extra={"gap_probe_status": "INFEASIBLE",
                                   "gap_probe_horizon": horizon, "gap_probe_seconds": 23.0})
    chosen = driver._choose(problem, [run()], None, 1.0, horizon + 0.001, 0.0)
    assert "bound from a gap probe" in chosen.message and "23 s" in chosen.message
    lower = driver._choose(problem, [run()], None, 1.0, horizon * 0.9, 0.0)
    assert "gap probe" not in lower.message


def test_live_line_keeps_its_clock_between_reports(capsys: pytest.CaptureFixture) -> None:
    """Between an engine's reports (a proof or a gap probe can be silent for 20-40 s)
    the live line is shown again with the time advanced and the last figures; after
    ``close`` nothing more is written."""
    import time

    from optpipe.optimizer.progress import LiveLine

    line = LiveLine(delay=0.0, every=0.05)
    line(2.0, 10.0, 9.0, 0.1)
    line.start()
    time.sleep(0.6)
    line.close()
    shown = [row for row in capsys.readouterr().err.splitlines() if row.startswith("solving")]
    assert len(shown) >= 3, shown
    elapsed = [float(row.split()[1].rstrip("s")) for row in shown]
    assert elapsed == sorted(elapsed) and elapsed[-1] > elapsed[0]
    assert all("10.000 s" in row and "9.000 s" in row for row in shown)
    time.sleep(0.2)
    assert "solving" not in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("gurobipy") is not None,
                    reason="gurobipy is installed")
def test_gurobi_missing_is_one_clear_error() -> None:
    problem = uniform_problem(3, 4).activation_budget(2)
    with pytest.raises(OptPipeError, match="gurobipy"):
        solve(problem, solver="gurobi", time_limit=5, progress=False)


def test_bad_options_are_clear_errors() -> None:
    problem = uniform_problem(3, 4)
    with pytest.raises(OptPipeError, match="solver"):
        solve(problem, solver="cplex", progress=False)
    with pytest.raises(OptPipeError, match="time limit"):
        solve(problem, time_limit=0, progress=False)
    with pytest.raises(OptPipeError, match="base problem"):
        solve(problem.split([0, 1, 2, 2, 1, 0]), progress=False)


@pytest.mark.skipif(importlib.util.find_spec("gurobipy") is None,
                    reason="gurobipy is not installed")
def test_gurobi_size_limited_license_is_one_clear_error() -> None:
    """With the pip (size-limited) license a real model is too large: say so plainly."""
    problem = uniform_problem(8, 16, p2p=0.05).activation_budget(4)
    try:
        result = solve(problem, solver="gurobi", time_limit=5, progress=False, cache=False,
                       offload=False)
    except OptPipeError as exc:
        assert "license" in str(exc) and ("highs" in str(exc) or "cpsat" in str(exc))
    else:  # a full license: then the answer must simply be valid
        assert result.sim.fits


def test_periodic_blocks_start_the_search_when_memory_binds_hard() -> None:
    """At half of 1F1B's memory the fixed schedules that fit idle badly: periodic blocks
    join the candidates, and the answer is at least as fast as the best of them."""
    problem = uniform_problem(4, 16, p2p=0.05, activation=1000).activation_budget(2)
    result = solve(problem, time_limit=10, progress=False, offload=False, cache=False)
    periodic = [c for c in result.fixed if c.name.startswith("periodic-")]
    assert periodic and all(c.fits for c in periodic)
    assert result.sim.fits
    assert result.sim.makespan <= min(c.makespan for c in periodic) * (1 + 1e-9)
    # one stage per device cannot beat the V block, and its memory round-trip bound says
    # so before any search; it is still given its proof attempt (reported per placement)
    linear_bound = memory_bound(task_graph(problem))
    assert linear_bound > result.sim.makespan
    linear = next(p for p in result.placements if p["placement"] == "linear")
    assert linear["bound"] >= linear_bound - 1e-9
    assert [r for r in result.runs if r.extra.get("space") == "linear"]
    # at 1F1B's memory the fixed schedules are close to unconstrained: no blocks
    loose = solve(problem.activation_budget(4), time_limit=5, progress=False,
                  offload=False, cache=False)
    assert not [c for c in loose.fixed if c.name.startswith("periodic-")]


def test_no_proof_attempt_for_one_stage_per_device_where_it_cannot_win_at_budget_s() -> None:
    """Where memory does not bind hard, one stage per device is not given its proof
    attempt once its memory bound is no better than a fitting start on another
    placement: that time goes to the chunked search (search revision 13). Its bound is
    still reported, and still counted."""
    problem = uniform_problem(4, 16, p2p=0.05, activation=1000).activation_budget(4)
    result = solve(problem, time_limit=10, progress=False, offload=False, cache=False)
    linear_bound = memory_bound(task_graph(problem))
    chunked = [c.makespan for c in result.fixed
               if c.fits and list(c.schedule.placement) != list(range(4))]
    assert not any(c.name.startswith("periodic-") for c in result.fixed)  # binds softly
    assert min(chunked) <= linear_bound            # so it cannot win
    assert not [r for r in result.runs if r.extra.get("space") == "linear"]
    assert [r for r in result.runs if r.extra.get("space") != "linear"]
    linear = next(p for p in result.placements if p["placement"] == "linear")
    assert linear["bound"] >= linear_bound - 1e-9
    assert result.sim.fits and result.sim.makespan <= min(chunked) + 1e-9


def test_the_first_chunked_placement_keeps_the_time_the_others_would_not_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At budget S on 8 x 32 the interleaved chunks start no better than the best
    fitting start (their own, 0.5% ahead of the V shape's, whose lower memory bound
    puts it first), so after the V shape's run they wait for the second sweep, where
    the V shape comes first again: the V shape gets the whole search in one run, not
    70% and then a restart (search revision 14). (8 x 16 until search revision 16,
    whose admission schedules start the V shape ahead there; the starts that keep
    microbatch 0's path clear, search revision 20, do so at 8 x 32 too, so they are
    left out here to keep the V shape's start behind.)"""
    from optpipe.optimizer import listsched
    from optpipe.schedule import searched_placements

    monkeypatch.setattr(listsched, "LOOKAHEADS", (False,))
    problem = uniform_problem(8, 32, p2p=0.05, activation=1000,
                              freed_by_b=500).activation_budget(8)
    result = solve(problem, time_limit=15, progress=False, offload=False, cache=False)
    shapes = searched_placements(8)

    def start_on(shape: str) -> float:
        return min(c.makespan for c in result.fixed
                   if c.fits and list(c.schedule.placement) == shapes[shape])
    best_start = min(c.makespan for c in result.fixed if c.fits)
    assert start_on("interleaved") <= best_start + 1e-9 < start_on("v")
    chunked = [r for r in result.runs if r.extra.get("space") != "linear"]
    assert [r.extra["space"] for r in chunked][:1] == ["v"]
    assert [r.extra["space"] for r in chunked].count("v") == 1     # no restart
    # the leftovers reach interleaved chunks only if the V shape ended early, proven
    assert len(chunked) == 1 or chunked[0].status == "optimal"
    assert result.sim.fits and result.sim.makespan <= best_start + 1e-9


def test_a_chunked_answer_on_an_even_split_says_it_is_an_estimate() -> None:
    """Uneven stages and no measured cut of the answer's placement: the figures are an
    even split of each device's, and the result says so; with the cut, or with
    identical stages (where the even split is exact), it does not."""
    from dataclasses import replace

    from optpipe.problem import ChunkProfile
    from optpipe.schedule import v_placement

    base = uniform_problem(4, 8, p2p=0.05)
    slow = (1.3, 1.0, 1.0, 1.6)
    uneven = replace(base, forward=slow, backward_input=slow,
                     backward_weight=slow).activation_budget(4)
    result = solve(uneven, time_limit=10, progress=False, cache=False, offload=False)
    assert list(result.schedule.placement) == v_placement(4)
    assert "even split" in result.message and "estimates" in result.message
    half = tuple(x / 2 for x in slow)
    cut = ChunkProfile(placement=tuple(v_placement(4)),
                       forward=tuple(half[d] for d in v_placement(4)),
                       backward_input=tuple(half[d] for d in v_placement(4)),
                       backward_weight=tuple(half[d] for d in v_placement(4)),
                       activation=(500,) * 8, freed_by_b=(250,) * 8, freed_by_w=(250,) * 8,
                       static=uneven.static)
    measured = replace(uneven, chunk_profiles=(cut,))
    result = solve(measured, time_limit=10, progress=False, cache=False, offload=False)
    assert "even split" not in result.message
    result = solve(base.activation_budget(4), time_limit=10, progress=False, cache=False,
                   offload=False)
    assert "even split" not in result.message


def test_placements_restrict_the_answer_and_its_bound(private_cache) -> None:
    """``placements`` limits what may be returned and what the bound covers; the fixed
    schedules on other placements stay in the comparison, and the restricted solve has
    its own cache entry."""
    from optpipe.schedule import linear_placement, placement_name, v_placement

    problem = uniform_problem(4, 8, p2p=0.05).activation_budget(2)
    free = solve(problem, time_limit=10, progress=False, offload=False, cache=False)
    assert placement_name(free.schedule.placement, 4) != "linear"   # V blocks win here
    only = solve(problem, time_limit=10, progress=False, offload=False,
                 placements=["linear"])
    assert list(only.schedule.placement) == linear_placement(4)
    assert only.sim.fits and only.schedule.provenance["allowed_placements"] == ["linear"]
    assert [p["placement"] for p in only.placements] == ["linear"]
    # the bound is one stage per device's: above the V answer, below its own answer
    assert free.sim.makespan < only.bound <= only.sim.makespan * (1 + 1e-9)
    best_linear = min(c.makespan for c in fixed_schedules(problem).candidates
                      if c.fits and not c.schedule.offloads
                      and list(c.schedule.placement) == linear_placement(4))
    assert only.sim.makespan <= best_linear * (1 + 1e-9)
    assert any(list(c.schedule.placement) == v_placement(4) for c in only.fixed)
    assert len(list(private_cache.glob("*only-linear*.json"))) == 1
    again = solve(problem, time_limit=10, progress=False, offload=False,
                  placements=["linear"])
    assert again.status == CACHED
    assert list(again.schedule.placement) == linear_placement(4)
    v_only = solve(problem, time_limit=10, progress=False, offload=False, cache=False,
                   placements=["v"])
    assert list(v_only.schedule.placement) == v_placement(4) and v_only.sim.fits
    # all three named is the unrestricted solve (same cache key, no provenance entry)
    every = solve(problem, time_limit=10, progress=False, offload=False,
                  placements=["interleaved", "V", "linear"])
    assert "allowed_placements" not in every.schedule.provenance


def test_bad_placements_are_clear_errors() -> None:
    problem = uniform_problem(4, 8)
    with pytest.raises(OptPipeError, match="unknown placement zigzag; choose from"):
        solve(problem, progress=False, placements=["linear", "zigzag"])
    with pytest.raises(OptPipeError, match="only placement is linear"):
        solve(uniform_problem(1, 4), progress=False, placements=["v"])


def test_extensions_get_the_larger_share_only_where_their_source_is_large() -> None:
    """The share follows the *source's* size (half the microbatches): 16 x 64 (a 512-cell
    source) gets the larger share, 8 x 64 and 16 x 32 (256-cell sources) do not."""
    from optpipe.optimizer import warm_starts

    def share(stages: int, microbatches: int) -> float:
        return warm_starts.extend_share(uniform_problem(stages, microbatches))
    assert share(16, 64) == warm_starts.EXTEND_SHARE_LARGE
    assert share(32, 32) == warm_starts.EXTEND_SHARE_LARGE
    assert share(8, 64) == share(16, 32) == share(4, 64) == warm_starts.EXTEND_SHARE
    assert warm_starts.EXTEND_SHARE < warm_starts.EXTEND_SHARE_LARGE < 1


def test_chunked_extensions_start_the_search_where_memory_binds_softly() -> None:
    """At budget S on 4 x 64 memory binds, but not hard (no periodic blocks): the V
    shape, which the search takes first, is searched on 32 microbatches and its steady
    state repeated (``warm_starts.add_chunked_extended``); those schedules fit, are on the V shape,
    and the answer is at least as fast. At 2S a fixed schedule meets its placement's
    bound: none are built."""
    from optpipe.schedule import searched_placements

    problem = uniform_problem(4, 64, p2p=0.05, activation=1000,
                              freed_by_b=500).activation_budget(4)
    result = solve(problem, time_limit=15, progress=False, offload=False, cache=False)
    assert not any(c.name.startswith("periodic-") for c in result.fixed)
    extended = [c for c in result.fixed if c.name.startswith("extended-")]
    assert extended
    for c in extended:
        assert c.fits and c.schedule.microbatches == 64
        assert list(c.schedule.placement) == searched_placements(4)["v"]
        assert c.name.startswith("extended-v-k")
        assert simulate(problem, c.schedule).makespan == pytest.approx(c.makespan)
    assert result.sim.fits and result.sim.makespan <= min(c.makespan for c in extended) + 1e-9
    loose = solve(problem.activation_budget(8), time_limit=5, progress=False, offload=False,
                  cache=False)
    assert not any(c.name.startswith("extended-") for c in loose.fixed)


def test_no_chunked_extensions_where_interleaved_chunks_go_first(monkeypatch) -> None:
    """The 8-stage preset with 64 microbatches at 64 GB: memory binds softly and the
    search takes interleaved chunks first, whose CP-SAT schedules hold no window to
    repeat; the extensions' search on half the microbatches is not even started (it
    cost the search 17 s there before the rule)."""
    from optpipe.cli import build_parser
    from optpipe.cli_common import problem_from_args
    from optpipe.optimizer import extend, warm_starts
    from optpipe.optimizer.candidates import memory_binds_hard
    from optpipe.optimizer.spaces import placement_spaces
    from optpipe.schedule import searched_placements

    args = build_parser().parse_args(["solve", "--stages", "8", "--microbatches", "64",
                                      "--mem", "64GB"])
    problem = problem_from_args(args)
    fixed = fixed_schedules(problem)
    assert not memory_binds_hard(fixed, False, True)
    warm_starts.add_list_schedules(problem, fixed, True)
    first = [sp for sp in placement_spaces(problem, True, fixed, "cpsat")
             if sp.label != "linear"][0]
    assert first.placement == searched_placements(8)["interleaved"]
    assert first.best_fixed > first.bound

    def must_not_run(*args, **kwargs):
        raise AssertionError("extended_schedules ran for interleaved chunks")
    monkeypatch.setattr(extend, "extended_schedules", must_not_run)
    before = len(fixed.candidates)
    warm_starts.add_chunked_extended(problem, fixed, True, 18.0, 2, None)
    assert len(fixed.candidates) == before


@pytest.mark.parametrize("stages, offload, built", [(8, True, True), (4, True, False),
                                                     (4, False, True)])
def test_chunked_extensions_with_offload_only_where_no_offload_model_runs(
        monkeypatch, stages: int, offload: bool, built: bool) -> None:
    """With offload allowed the V shape's extensions are started only beyond
    ``OFFLOAD_MAX_CELLS`` (8 x 64 at S), where no offload model is built and the order
    models search as without offload; at 4 x 64 (256 cells) the offload model needs the
    time. Which problems start them is what is checked (the search is stubbed out to
    record its calls), so the solves are short."""
    from optpipe.optimizer import driver, extend

    calls = []

    def record(problem, placement, *args, **kwargs):
        calls.append(problem.microbatches)
        return []
    monkeypatch.setattr(extend, "extended_schedules", record)
    problem = uniform_problem(stages, 64, p2p=0.05, activation=1000,
                              freed_by_b=500).activation_budget(stages)
    assert (stages * 64 > driver.OFFLOAD_MAX_CELLS) == (stages == 8)
    result = solve(problem, time_limit=3, progress=False, offload=offload, cache=False)
    assert result.sim.fits
    assert calls == ([64] if built else [])


def test_offloaded_starts_run_where_the_budget_holds_the_fixed_schedules_back() -> None:
    """8 x 16 at 1F1B's memory with offload: ZB-H2 (55.4 s) does not fit and every
    fitting fixed schedule is slower, so offloading can pay, and the offloaded list
    schedules reach the no-memory bound (51.85 s). The admission schedules start the V
    shape at 54.9 s, ahead of ZB-H2: the decision must be taken on the fixed schedules
    (before the driver's own starts join them), or those offloaded starts are skipped
    and the answer is the order model's 52.55 s (search revision 16's first table run)."""
    problem = uniform_problem(8, 16, forward=1.0, backward_input=1.0, backward_weight=1.0,
                              p2p=0.05, activation=1000, freed_by_b=500,
                              static=0).activation_budget(8)
    result = solve(problem, time_limit=30, progress=False, offload=True, cache=False)
    admitted = [c for c in result.fixed if c.name.startswith("admit-")]
    h2 = next(c for c in result.fixed if c.name == "zb-h2")
    assert not h2.fits and admitted and min(c.makespan for c in admitted) < h2.makespan
    assert result.schedule.offloads and result.sim.fits
    assert result.sim.makespan == pytest.approx(51.85, abs=1e-6)


def test_the_offload_model_is_skipped_where_its_start_is_far_behind() -> None:
    """4 x 8 at half of 1F1B's memory with a slow host link (4 s per transfer): one
    stage per device's best start (its order model's optimum, 42.0 s) is a third behind
    the V shape's 31.3 s, and the offload model, hinted with it, cannot close that in
    the time (it returned 42.0 s in 5.9 s before the rule). Its time goes to the order
    models (interleaved chunks are searched too), and the message says why."""
    problem = uniform_problem(4, 8, forward=1.0, backward_input=1.0, backward_weight=1.0,
                              p2p=0.05, activation=1000, freed_by_b=500, static=0,
                              d2h_bandwidth=250, h2d_bandwidth=250).activation_budget(2)
    result = solve(problem, offload=True, time_limit=10, progress=False, cache=False)
    spaces = [run["space"] for run in result.schedule.provenance["runs"]]
    assert "linear+offload" not in spaces and "interleaved" in spaces
    assert "offload model skipped: one stage per device's best start" in result.message
    assert result.sim.fits
    v = min(run["objective"] for run in result.schedule.provenance["runs"]
            if run["space"] == "v")
    assert result.sim.makespan <= v * (1 + 1e-9)
    assert result.sim.makespan <= 42.0 / (1 + driver.OFFLOAD_MODEL_REACH)


def test_solving_again_never_returns_slower_than_the_stale_cache_entry(private_cache) -> None:
    """An entry :func:`~optpipe.optimizer.cache.lookup` does not accept (an older search's,
    not proven) is solved again, but from it: it joins the warm starts as ``cached``, and
    the answer is never slower. ``cache=False`` leaves it out (a fresh measurement)."""
    from dataclasses import replace

    from optpipe.optimizer import cache as cache_mod

    problem = uniform_problem(8, 16, forward=1.0, backward_input=1.0, backward_weight=1.0,
                              p2p=0.05, activation=1000, freed_by_b=500,
                              static=0).activation_budget(4)
    good = solve(problem, time_limit=10, progress=False, offload=False, cache=False)
    key = cache_mod.cache_key(problem, solver="auto", split_backward=True, offload=False,
                              levels=(1.0,))
    stale = {**good.schedule.provenance, "status": "feasible", "search_revision": 1}
    cache_mod.store(replace(good.schedule, provenance=stale), key)
    assert cache_mod.lookup(problem, key, time_limit=1, gap=0.0) is None
    again = solve(problem, time_limit=1, progress=False, offload=False)
    cached = [c for c in again.fixed if c.name == "cached"]
    assert cached and cached[0].makespan == pytest.approx(good.sim.makespan)
    assert again.sim.fits and again.sim.makespan <= good.sim.makespan * (1 + 1e-9)
    fresh = solve(problem, time_limit=1, progress=False, offload=False, cache=False)
    assert not [c for c in fresh.fixed if c.name == "cached"]
