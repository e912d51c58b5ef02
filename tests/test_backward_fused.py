"""An optional measured fused-backward time (``Problem.backward_fused``), end to end.

A fused backward (BW) is timed as B + W unless the problem says otherwise; with
``backward_fused`` every consumer of durations (simulator, optimizer engines, profile,
``optpipe run``'s prediction) must use the measured figure, and problems without it must
stay exactly as they were (their content hash keys the bundled schedule library).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from optpipe.errors import OptPipeError
from optpipe.generators import generate
from optpipe.memory.accounting import duration
from optpipe.problem import (Problem, load_problem, problem_from_dict, problem_to_toml,
                             uniform_problem)
from optpipe.schedule import Action, Op, interleaved_placement, v_placement
from optpipe.simulator import simulate


def fused_problem(**kw) -> Problem:
    return problem_from_dict({
        "stages": 2, "microbatches": 4,
        "time": {"forward": ["2ms", "4ms"], "backward_input": ["3ms", "5ms"],
                 "backward_weight": ["1ms", "2ms"], "backward_fused": ["3.5ms", "6ms"],
                 **kw},
        "memory": {"activation": [100, 201], "freed_by_backward_input": 50}})


# ------------------------------------------------------------------ the Problem
def test_bw_time_is_the_measured_figure_or_b_plus_w():
    p = fused_problem()
    assert p.backward_fused == pytest.approx((3.5e-3, 6e-3))
    assert p.bw_time(0) == pytest.approx(3.5e-3) and p.bw_time(1) == pytest.approx(6e-3)
    q = replace(p, backward_fused=None)
    assert q.bw_time(1) == pytest.approx(5e-3 + 2e-3)
    assert duration(p, Action(Op.BW, 1, 0)) == p.bw_time(1)
    assert duration(q, Action(Op.BW, 1, 0)) == q.bw_time(1)
    # split B and W keep their own times
    assert duration(p, Action(Op.B, 1, 0)) == p.backward_input[1]
    assert duration(p, Action(Op.W, 1, 0)) == p.backward_weight[1]


def test_one_value_is_every_stage_and_uniform_problem_takes_it():
    p = problem_from_dict({"stages": 3, "microbatches": 2,
                           "time": {"forward": "1ms", "backward_input": "1ms",
                                    "backward_fused": "1.5ms"},
                           "memory": {"activation": 10}})
    assert p.backward_fused == pytest.approx((1.5e-3,) * 3)
    u = uniform_problem(3, 2, backward_fused=1.5)
    assert u.backward_fused == (1.5,) * 3 and u.bw_time(2) == 1.5
    assert uniform_problem(3, 2).backward_fused is None


def test_round_trips_through_toml_and_json(tmp_path):
    p = uniform_problem(4, 8, forward=1e-3, backward_input=2e-3, backward_weight=1e-3,
                        backward_fused=2.5e-3, p2p=1e-4, activation=1000, static=5,
                        budget=9000)
    text = problem_to_toml(p)
    assert 'backward_fused = ["2.5ms", "2.5ms", "2.5ms", "2.5ms"]' in text
    path = tmp_path / "p.toml"
    path.write_text(text)
    q = load_problem(path)
    assert q.backward_fused == pytest.approx(p.backward_fused)
    assert q.hash() == p.hash()
    path = tmp_path / "p.json"
    path.write_text(json.dumps(p.to_dict()))
    r = load_problem(path)
    assert r.backward_fused == p.backward_fused and r.hash() == p.hash()
    # a problem without it writes nothing about it, in either form
    plain = uniform_problem(4, 8)
    assert "backward_fused" not in problem_to_toml(plain)
    assert "backward_fused" not in plain.to_dict()
    path.write_text(json.dumps(plain.to_dict()))
    assert load_problem(path).backward_fused is None


def test_hash_unchanged_without_it_and_changed_with_it():
    # literal hashes computed before the field existed: the schedule library's keys
    from optpipe.costmodel import default_problem

    # without chunk profiles (the cost model adds them since search revision 5) the
    # headline problem keeps the hash it had; with them it has the library's new key
    assert replace(default_problem(), chunk_profiles=()).hash() == "9cec564573c99661"
    assert default_problem().hash() == "524876711370c80c"
    assert uniform_problem(4, 8).hash() == "5246119d2ca94133"
    plain = uniform_problem(4, 8, backward_input=2.0, backward_weight=1.0)
    fused = replace(plain, backward_fused=(2.5,) * 4)
    assert fused.hash() != plain.hash()
    assert replace(plain, backward_fused=(2.6,) * 4).hash() != fused.hash()
    assert fused.with_budget(1e9).backward_fused == fused.backward_fused
    assert fused.activation_budget(2).backward_fused == fused.backward_fused


def test_split_divides_it_like_the_other_times():
    p = fused_problem()
    q = p.split(interleaved_placement(2, 2))
    assert q.backward_fused == pytest.approx((1.75e-3, 3e-3, 1.75e-3, 3e-3))
    v = p.split(v_placement(2))
    assert v.backward_fused == pytest.approx((1.75e-3, 3e-3, 3e-3, 1.75e-3))
    assert replace(p, backward_fused=None).split(v_placement(2)).backward_fused is None


@pytest.mark.parametrize("value, message", [
    (["1ms", "2ms", "3ms"], "'backward_fused' lists 3 values but there are 2"),
    ("0ms", "'backward_fused' must be positive and finite"),
    (["1ms", "-1ms"], "backward_fused"),
    ("fast", "backward_fused"),
])
def test_bad_values_in_a_file_are_one_line(value, message):
    with pytest.raises(OptPipeError, match=message) as info:
        fused_problem(backward_fused=value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value, message", [
    ((1.0, 1.0, 1.0), "'backward_fused' has 3 entries but there are 2 stages"),
    ((1.0, 0.0), "must be positive and finite"),
    ((1.0, float("inf")), "must be positive and finite"),
    ((1.0, float("nan")), "must be positive and finite"),
    (1.0, "must list one time in seconds per stage"),
    ("1.0", "must list one time in seconds per stage"),
    ((1.0, "x"), "must list one time in seconds per stage"),
])
def test_bad_values_in_code_are_one_line(value, message):
    with pytest.raises(OptPipeError, match=message) as info:
        replace(uniform_problem(2, 2), backward_fused=value)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------ the simulator
def test_simulator_times_bw_with_it():
    p = uniform_problem(1, 1, forward=1.0, backward_input=2.0, backward_weight=3.0,
                        backward_fused=4.0)
    result = simulate(p, generate("gpipe", p))
    assert result.makespan == pytest.approx(5.0)
    bw = [r for r in result.records if r.action.op is Op.BW]
    assert [r.end - r.start for r in bw] == pytest.approx([4.0])
    assert simulate(replace(p, backward_fused=None), generate("gpipe", p)).makespan \
        == pytest.approx(6.0)


def test_1f1b_makespan_uses_it_and_split_schedules_do_not():
    S, M, F, B, W, BW = 4, 8, 1.0, 1.0, 1.0, 1.5
    p = uniform_problem(S, M, forward=F, backward_input=B, backward_weight=W,
                        backward_fused=BW)
    plain = replace(p, backward_fused=None)
    # 1F1B with equal stages and no p2p: (M + S - 1) * (F + BW)
    assert simulate(p, generate("1f1b", p)).makespan == pytest.approx((M + S - 1) * (F + BW))
    assert simulate(plain, generate("1f1b", plain)).makespan == \
        pytest.approx((M + S - 1) * (F + B + W))
    # schedules that split B and W are timed by B and W alone
    zb = generate("zb-h1", plain)
    assert simulate(p, zb).makespan == simulate(plain, zb).makespan
    # chunked fused schedules are judged on the split problem, fused time included
    inter = generate("interleaved-1f1b", p)
    result = simulate(p, inter)
    bw = [r for r in result.records if r.action.op is Op.BW]
    assert bw and all(r.end - r.start == pytest.approx(BW / 2) for r in bw)


# ------------------------------------------------------------------ the MILP engine
@pytest.mark.parametrize("offload", [False, True], ids=["plain", "offload"])
def test_fused_milp_objective_is_simulated_makespan(offload):
    """The MILP's fused-backward durations (incl. its offload rows) use bw_time."""
    from optpipe.optimizer.milp import solve_milp

    problem = uniform_problem(3, 4, backward_weight=0.5, backward_fused=1.25,
                              d2h_bandwidth=1e4, h2d_bandwidth=1e4).activation_budget(2)
    res = solve_milp(problem, time_limit=20.0, split_backward=False, offload=offload)
    sim = simulate(problem, res.schedule)
    assert sim.fits
    assert res.objective == pytest.approx(sim.makespan, rel=1e-6)
    assert not res.schedule.splits_backward
    assert bool(res.schedule.offloads) == offload    # here offloading pays
    # faster than any schedule could be with B + W: the fused time is really used
    slow = replace(problem, backward_fused=None)
    assert sim.makespan < simulate(slow, res.schedule).makespan


def test_greedy_fused_schedule_uses_it():
    from optpipe.optimizer.milp_prep import greedy_schedule

    p = uniform_problem(3, 4, backward_weight=0.5, backward_fused=1.0)
    schedule = greedy_schedule(p, split_backward=False)
    assert not schedule.splits_backward
    assert simulate(p, schedule).makespan < \
        simulate(replace(p, backward_fused=None), schedule).makespan


# ------------------------------------------------------------------ profile and run
def test_profile_of_tiny_gpt_writes_backward_fused(tmp_path, capsys):
    from optpipe.cli import main

    out = tmp_path / "problem.toml"
    assert main(["profile", "--model", "tiny-gpt", "--stages", "2", "--microbatches", "4",
                 "--p2p", "0ms", "--repeats", "1", "-o", str(out)]) == 0
    assert "BW " in capsys.readouterr().out
    assert "backward_fused = [" in out.read_text()
    problem = load_problem(out)
    assert problem.backward_fused is not None and len(problem.backward_fused) == 2
    assert all(t > 0 for t in problem.backward_fused)
    # the prediction of a fused schedule (what `optpipe run` compares against) uses it
    one_f_one_b = generate("1f1b", problem)
    result = simulate(problem, one_f_one_b)
    for r in result.records:
        if r.action.op is Op.BW:
            assert r.end - r.start == pytest.approx(problem.backward_fused[r.action.stage])


def test_run_predicts_1f1b_with_the_problems_fused_time(tmp_path, capsys):
    """`optpipe run` simulates on its problem (profiled, or --problem): BW at the fused
    time, so the 1F1B prediction is the fused one, not B + W."""
    from optpipe.cli import main

    problem = uniform_problem(2, 4, forward=1e-3, backward_input=2e-3, backward_weight=1e-3,
                              backward_fused=1.5e-3, name="fused")
    path = tmp_path / "fused.toml"
    path.write_text(problem_to_toml(problem))
    assert main(["run", "--layers", "2", "--stages", "2", "--microbatches", "4",
                 "--schedule", "1f1b", "--steps", "1", "--problem", str(path),
                 "--single-process", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    fused = simulate(problem, generate("1f1b", problem)).makespan
    plain = replace(problem, backward_fused=None)
    assert data["simulated_step"] == pytest.approx(fused)
    assert fused == pytest.approx((4 + 2 - 1) * (1e-3 + 1.5e-3))
    assert fused < simulate(plain, generate("1f1b", plain)).makespan
    assert data["measured_step"] > 0


def test_split_solve_bound_covers_faster_fused_backwards():
    """With BW faster than B + W, the split engines' bound does not cover fused
    schedules; the driver must report a bound that does (never above a fused optimum)."""
    from optpipe.optimizer import solve

    problem = uniform_problem(4, 8, backward_weight=0.5, backward_fused=1.1,
                              p2p=0.05).activation_budget(3)
    split = solve(problem, time_limit=10, cache=False, progress=False, offload=False)
    fused = solve(problem, time_limit=10, cache=False, progress=False, offload=False,
                  split_backward=False)
    assert split.bound is not None
    assert split.bound <= fused.makespan + 1e-9
    assert split.bound <= split.makespan + 1e-9
    assert "relaxation" in split.message
    # the fused model is searched too, so the split solve is no slower than the fused one
    assert any(p["placement"].endswith("/fused") for p in split.placements)
    assert split.makespan <= fused.makespan * (1 + 1e-9)
