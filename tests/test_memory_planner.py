"""The planner: every plan valid, optimal where the optimum is known, close to the peak
of live bytes on pipeline traces, and at least as good as MiniMalloc's capacity on the
external instances it solves quickly."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from pathlib import Path

import pytest

from optpipe import costmodel
from optpipe.errors import OptPipeError
from optpipe.generators import generate
from optpipe.memory.planner import OnlineBestFit, plan
from optpipe.memory.trace import Buffer, Trace, load_trace, traces_from_schedule
from optpipe.memory.validate import plan_violations
from optpipe.problem import uniform_problem

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "minimalloc"


def trace(*items: tuple[int, float, float]) -> Trace:
    return Trace([Buffer(f"b{k}", size, start, end) for k, (size, start, end) in
                  enumerate(items)])


def brute_force_optimum(t: Trace) -> int:
    """Smallest arena over all placement orders, each buffer at its lowest free offset
    (every optimal layout can be compacted into one of these)."""
    best = None
    for order in itertools.permutations(t.buffers):
        placed: list[tuple[Buffer, int]] = []
        top = 0
        for b in order:
            busy = sorted((o, o + p.size) for p, o in placed if p.overlaps(b))
            at = 0
            for lo, hi in busy:
                if lo - at >= b.size:
                    break
                at = max(at, hi)
            placed.append((b, at))
            top = max(top, at + b.size)
        best = top if best is None else min(best, top)
    return best or 0


def random_trace(seed: int, n: int, horizon: int = 12) -> Trace:
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        start = rng.randrange(horizon)
        items.append((rng.choice([1, 2, 3, 5, 8]), start, start + rng.randint(1, 6)))
    return trace(*items)


def assert_valid(t: Trace, p) -> None:
    assert not plan_violations(t, p.offsets, p.arena_size, p.alignment)
    assert p.arena_size >= p.peak_live == t.peak_live()


def test_minimalloc_example_packs_into_its_capacity():
    t = trace((4, 0, 3), (4, 3, 9), (4, 0, 9), (4, 9, 21), (4, 0, 21))
    p = plan(t, time_limit=2)
    assert p.arena_size == 12 and p.optimal and p.fragmentation == 0.0
    assert_valid(t, p)


def test_disjoint_lifetimes_share_addresses():
    t = trace((100, 0, 1), (70, 1, 2), (100, 2, 3))
    p = plan(t, time_limit=1)
    assert p.arena_size == 100 and set(p.offsets.values()) == {0}


GREEDY_TRAP = ((4, 3, 7), (1, 0, 2), (2, 1, 3), (1, 5, 6), (2, 2, 6), (4, 0, 2), (1, 0, 4))


def test_branch_and_bound_beats_greedy_best_fit():
    # every greedy order needs 9; the peak of live bytes, 8, is reachable
    t = trace(*GREEDY_TRAP)
    assert brute_force_optimum(t) == 8 == t.peak_live()
    p = plan(t, time_limit=2, workers=1)
    assert p.arena_size == 8 and p.optimal and p.method == "branch-and-bound"
    assert p.details["greedy_units"] == 9
    assert_valid(t, p)


def test_cp_sat_model_proves_the_optimum_from_a_poor_start():
    from optpipe.memory import planner

    t = trace(*GREEDY_TRAP)
    items, inst = planner._items_of(t.buffers, lambda n: n, group=False)
    start = [sum(b.size for b in t.buffers[:k]) for k in range(len(t))]  # a tall stack
    import numpy as np

    size, offsets, proven = planner._cpsat(inst, inst.lower_bound(), 20,
                                           np.array(start), time_limit=10, workers=1)
    assert (size, proven) == (8, True)
    layout = {b.id: int(o) for b, o in zip(t.buffers, offsets)}
    assert not plan_violations(t, layout, 8)


def test_capacity_is_reported():
    t = trace(*GREEDY_TRAP)
    assert plan(t, time_limit=1, capacity=8).details["fits_capacity"]
    assert not plan(t, time_limit=1, capacity=7).details["fits_capacity"]


@pytest.mark.parametrize("seed", range(12))
def test_exact_mode_matches_brute_force_on_small_traces(seed):
    t = random_trace(seed, 6)
    p = plan(t, time_limit=5, exact=True, workers=1)
    assert_valid(t, p)
    assert p.arena_size == brute_force_optimum(t)
    assert p.optimal


@pytest.mark.parametrize("seed", range(6))
def test_default_mode_is_valid_and_near_optimal_on_random_traces(seed):
    t = random_trace(100 + seed, 60, horizon=40)
    p = plan(t, time_limit=1.0, workers=1)
    assert_valid(t, p)
    assert p.arena_size <= 1.25 * p.peak_live


def test_alignment_rounds_offsets_and_sizes():
    t = trace((1000, 0, 2), (10, 1, 3), (300, 2, 4))
    p = plan(t, alignment=256, time_limit=1)
    assert all(off % 256 == 0 for off in p.offsets.values())
    assert p.arena_size % 256 == 0
    assert not plan_violations(t, p.offsets, p.arena_size, alignment=256)


def test_zero_sized_and_instant_buffers_get_an_offset():
    t = trace((0, 0, 5), (8, 2, 2), (8, 0, 4))
    p = plan(t, time_limit=1)
    assert set(p.offsets) == {"b0", "b1", "b2"} and p.arena_size == 8


@pytest.mark.parametrize("name", ["C", "G"])
def test_minimalloc_challenging_instances(name):
    path = DATA / f"{name}.1048576.csv"
    if not path.exists():
        pytest.skip("MiniMalloc data not present")
    t = load_trace(path)
    p = plan(t, time_limit=20, workers=1)
    assert_valid(t, p)
    assert p.arena_size <= 1048576
    assert p.optimal  # both reach their peak of live bytes


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "interleaved-1f1b"])
def test_pipeline_traces_reach_the_peak_of_live_bytes(name):
    problem = costmodel.build_problem("gpt3-1.3b", "h100-80gb", stages=4, microbatches=8)
    for t in traces_from_schedule(problem, generate(name, problem)):
        p = plan(t, time_limit=5, workers=1)
        assert_valid(t, p)
        assert p.details["grouped"]
        assert p.arena_size <= 1.02 * p.peak_live


def test_buffers_one_by_one_fill_holes_whole_groups_cannot():
    # ZB-V's last device: whole microbatch parts leave holes that pieces of the
    # per-layer tensors fill; the grouped greedy misses the bound, the ungrouped hits it
    # the trace this case was found on: ZB-V on an even split of each device's figures
    # (the cost model's own V cut, since search revision 5, gives another trace)
    problem = replace(costmodel.build_problem("gpt3-6.7b", "h100-80gb", stages=8,
                                              microbatches=16), chunk_profiles=())
    t = traces_from_schedule(problem, generate("zb-v", problem))[7]
    p = plan(t, time_limit=5, workers=1)
    assert "ungrouped" in p.method and not p.details["grouped"]
    assert p.arena_size == p.peak_live and p.optimal
    assert p.details["greedy_units"] > p.peak_live  # the groups alone fell short
    assert_valid(t, p)


def test_periodic_plan_repeats_a_window():
    problem = uniform_problem(4, 80, activation=3000, freed_by_b=1000)
    traces = traces_from_schedule(problem, generate("1f1b", problem))
    t = traces[0]
    p = plan(t, time_limit=5, workers=1, periodic=True)
    assert p.method.startswith("periodic") and p.details["period"] >= 1
    assert_valid(t, p)
    assert p.arena_size == p.peak_live


def test_two_workers_give_a_valid_plan():
    t = random_trace(7, 40, horizon=30)
    p = plan(t, time_limit=1.0, workers=2)
    assert_valid(t, p)


def test_bad_arguments_are_user_errors():
    with pytest.raises(OptPipeError, match="alignment"):
        plan(trace((1, 0, 1)), alignment=0)
    with pytest.raises(OptPipeError, match="time limit"):
        plan(trace((1, 0, 1)), time_limit=0)


def test_plan_json_has_offsets_and_figures():
    t = trace((4, 0, 3), (4, 3, 9))
    data = plan(t, time_limit=1).to_json()
    assert data["offsets"] == {"b0": 0, "b1": 0} and data["arena_size"] == 4
    assert data["peak_live"] == 4 and data["fragmentation"] == 0.0


# ------------------------------------------------------------------ online fit
def test_online_best_fit_takes_the_smallest_gap_and_merges_on_free():
    fit = OnlineBestFit(capacity=100)
    a, b, c, d = (fit.allocate(s) for s in (10, 30, 20, 40))
    assert (a, b, c, d) == (0, 10, 40, 60)
    fit.free(b)                      # gap [10, 40)
    fit.free(d)                      # gap [60, 100)
    assert fit.allocate(25) == 10    # best fit: the 30-byte gap, not the 40-byte one
    assert fit.allocate(50) is None
    fit.free(a)
    fit.free(10)
    fit.free(c)
    assert fit.allocate(100) == 0 and fit.live == 100


def test_online_best_fit_alignment_and_reserve():
    fit = OnlineBestFit(alignment=64)
    fit.reserve(0, 100)
    assert fit.allocate(1) == 128
    with pytest.raises(OptPipeError):
        fit.reserve(50, 10)
    with pytest.raises(OptPipeError):
        fit.free(7)
