"""The simulator's rules, one by one, on hand-made schedules whose times are worked out here.

Every figure optpipe reports comes from the simulator, so each rule (dependencies, p2p
latency, memory moments, transfers, deadlock detection, validation, the definitions of
makespan, bubble rate and device span) gets a schedule small enough to check by hand.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from optpipe.errors import InvalidScheduleError
from optpipe.generators import generate
from optpipe.problem import Problem, uniform_problem
from optpipe.schedule import Action, Op, Schedule, from_orders, load_schedule, schedule_from_dict
from optpipe.simulator import simulate


def one_stage(forward: float = 1.0, b: float = 2.0, w: float = 3.0, activation: int = 1000,
              freed_by_b: int = 600, static: int = 50, d2h: float = 1000.0,
              h2d: float = 500.0, microbatches: int = 1) -> Problem:
    """One device, one stage: times and bytes chosen so every event lands on its own tick."""
    return Problem(stages=1, microbatches=microbatches, forward=(forward,),
                   backward_input=(b,), backward_weight=(w,), activation=(activation,),
                   freed_by_b=(freed_by_b,), freed_by_w=(activation - freed_by_b,),
                   static=(static,), budget=(float("inf"),), d2h_bandwidth=d2h,
                   h2d_bandwidth=h2d)


def schedule(placement: list[int], microbatches: int, orders: list[list[tuple]]) -> Schedule:
    """A schedule with transfers allowed (from_orders only takes (op, stage, mb))."""
    actions = [[Action(Op(op), s, m) for op, s, m in order] for order in orders]
    return Schedule(name="hand", stages=len(placement), devices=max(placement) + 1,
                    microbatches=microbatches, placement=placement, actions=actions)


# ----------------------------------------------------------------- deadlock
def test_cyclic_wait_is_reported_with_the_actions_involved():
    # device 0 wants microbatch 0's backward before sending microbatch 1 forward, while
    # device 1 wants microbatch 1's forward before it works on microbatch 0 at all
    problem = uniform_problem(2, 2)
    cyclic = from_orders("cyclic", [0, 1], 2, [
        [("F", 0, 0), ("BW", 0, 0), ("F", 0, 1), ("BW", 0, 1)],
        [("F", 1, 1), ("F", 1, 0), ("BW", 1, 0), ("BW", 1, 1)],
    ])
    with pytest.raises(InvalidScheduleError) as info:
        simulate(problem, cyclic)
    message = str(info.value)
    assert "cycle" in message
    assert "device 0 waits at BW(stage 0, mb 0) for BW(stage 1, mb 0)" in message
    assert "device 1 waits at F(stage 1, mb 1) for F(stage 0, mb 1)" in message


# ---------------------------------------------------------- timing and p2p
def test_dependencies_and_latency_across_devices_only():
    # V placement on two devices: stage 1 -> 2 stays on device 1, stage 2 -> 3 crosses
    base = uniform_problem(2, 1, forward=2.0, backward_input=4.0, backward_weight=6.0,
                           p2p=0.5)
    v = schedule([0, 1, 1, 0], 1, [
        [("F", 0, 0), ("F", 3, 0), ("B", 3, 0), ("W", 3, 0), ("B", 0, 0), ("W", 0, 0)],
        [("F", 1, 0), ("F", 2, 0), ("B", 2, 0), ("B", 1, 0), ("W", 2, 0), ("W", 1, 0)],
    ])
    result = simulate(base, v)
    start = {(r.action.op.value, r.action.stage): r.start for r in result.records}
    # split problem: every chunk costs half the base stage: F 1, B 2, W 3
    assert result.problem.stages == 4 and result.problem.forward == (1.0,) * 4
    assert start[("F", 1)] == 1.0 + 0.5          # crossed devices: latency
    assert start[("F", 2)] == 2.5                # same device: no latency
    assert start[("F", 3)] == 3.5 + 0.5          # crossed back
    assert start[("B", 3)] == 5.0                # last stage: right after its own F
    assert start[("B", 2)] == 7.0 + 0.5
    assert start[("B", 1)] == 9.5                # same device
    assert start[("B", 0)] == 11.5 + 0.5
    assert result.record("W", 0, 0).end == 17.0  # B(0) ends at 14, then W(0)
    assert result.makespan == 17.5               # device 1: W(2) [11.5,14.5], W(1) [14.5,17.5]


def test_interleaved_schedule_is_judged_on_the_split_problem():
    base = Problem(stages=2, microbatches=2, forward=(2.0, 4.0), backward_input=(2.0, 4.0),
                   backward_weight=(2.0, 4.0), activation=(1000, 2000),
                   freed_by_b=(500, 1000), freed_by_w=(500, 1000), static=(0, 0),
                   budget=(float("inf"),) * 2)
    result = simulate(base, generate("interleaved-1f1b", base, chunks=2))
    split = result.problem
    assert split.stages == 4 and split.devices == 2
    assert split.forward == (1.0, 2.0, 1.0, 2.0)      # device 1's stages are the slow ones
    assert split.activation == (500, 1000, 500, 1000)
    assert split.static == base.static and split.budget == base.budget


# ------------------------------------------------------------------ memory
def test_memory_moments_of_compute_actions():
    problem = one_stage()
    sched = schedule([0], 1, [[("F", 0, 0), ("B", 0, 0), ("W", 0, 0)]])
    result = simulate(problem, sched)
    # F allocates at its start, B frees freed_by_b at its end, W the rest at its end
    assert result.memory_timeline[0] == [(0.0, 1050), (3.0, 450), (6.0, 50)]
    assert result.peak_memory == [1050]
    fused = simulate(problem, schedule([0], 1, [[("F", 0, 0), ("BW", 0, 0)]]))
    assert fused.memory_timeline[0] == [(0.0, 1050), (6.0, 50)]


def test_offload_frees_at_its_end_and_reload_reserves_at_issue():
    problem = one_stage()          # offload 1 s (1000 B at 1000 B/s), reload 2 s
    sched = schedule([0], 1, [[("F", 0, 0), ("OFFLOAD", 0, 0), ("RELOAD", 0, 0),
                               ("B", 0, 0), ("W", 0, 0)]])
    result = simulate(problem, sched)
    offload, reload_ = result.record("OFFLOAD", 0, 0), result.record("RELOAD", 0, 0)
    assert (offload.issue, offload.start, offload.end, offload.lane) == (1.0, 1.0, 2.0, "d2h")
    # issued when the compute action before it (F) ends, starts when the offload is done
    assert (reload_.issue, reload_.start, reload_.end, reload_.lane) == (1.0, 2.0, 4.0, "h2d")
    assert result.record("B", 0, 0).start == 4.0            # B waits for its reload
    # reserved at issue (t=1) before the offload has freed anything (t=2)
    assert result.memory_timeline[0] == [(0.0, 1050), (1.0, 2050), (2.0, 1050),
                                         (6.0, 450), (9.0, 50)]
    assert result.peak_memory == [2050]


def test_offloaded_bytes_are_away_from_offload_end_to_reload_issue():
    problem = one_stage(d2h=4000.0, h2d=4000.0, microbatches=2)   # transfers of 0.25 s
    sched = schedule([0], 2, [[("F", 0, 0), ("OFFLOAD", 0, 0), ("F", 0, 1), ("BW", 0, 1),
                               ("RELOAD", 0, 0), ("BW", 0, 0)]])
    result = simulate(problem, sched)
    # F0 [0,1]; offload [1,1.25]; F1 [1,2]; BW1 [2,7]; reload issued at 7, [7,7.25];
    # BW0 [7.25,12.25]. At 7 BW1's release and the reload's reservation coincide:
    # releases first, so the level never rises above what it was.
    assert result.memory_timeline[0] == [(0.0, 1050), (1.0, 2050), (1.25, 1050),
                                         (7.0, 1050), (12.25, 50)]
    assert result.record("BW", 0, 0).start == result.record("RELOAD", 0, 0).end == 7.25
    kept = simulate(problem, schedule([0], 2, [[("F", 0, 0), ("F", 0, 1), ("BW", 0, 1),
                                                ("BW", 0, 0)]]))
    assert kept.memory_timeline[0] == [(0.0, 1050), (1.0, 2050), (7.0, 1050), (12.0, 50)]


def test_an_offload_marked_wait_holds_its_device_back():
    """F0 [0,1]; OFFLOAD(wait) [1,2]: F1 starts at 2, not 1, and the RELOAD listed after
    F1 is issued at F1's end; the level never holds two activations at once."""
    problem = one_stage(microbatches=2)        # offload 1 s, reload 2 s
    orders = [("F", 0, 0), ("OFFLOAD", 0, 0), ("F", 0, 1), ("OFFLOAD", 0, 1),
              ("RELOAD", 0, 0), ("B", 0, 0), ("W", 0, 0), ("RELOAD", 0, 1), ("B", 0, 1),
              ("W", 0, 1)]
    plain = schedule([0], 2, [orders])
    held = schedule([0], 2, [orders])
    held.actions[0] = [replace(a, wait=True) if a.op is Op.OFFLOAD else a
                       for a in held.actions[0]]
    free_run, waited = simulate(problem, plain), simulate(problem, held)
    assert free_run.record("F", 0, 1).start == 1.0
    assert max(free_run.peak_memory) == 2050
    assert waited.record("F", 0, 1).start == 2.0            # after OFFLOAD(0, 0) ended
    offload_1 = waited.record("OFFLOAD", 0, 1)
    assert (offload_1.start, offload_1.end) == (3.0, 4.0)
    reload_0 = waited.record("RELOAD", 0, 0)
    assert (reload_0.issue, reload_0.start, reload_0.end) == (4.0, 4.0, 6.0)   # held too
    assert waited.peak_memory == [1050]
    # the flag survives a file round trip and only an OFFLOAD may carry it
    again = schedule_from_dict(json.loads(json.dumps(held.to_dict())))
    assert [a.wait for a in again.actions[0]] == [a.wait for a in held.actions[0]]
    assert simulate(problem, again).makespan == waited.makespan
    bad = held.to_dict()
    bad["actions"][0][0] = ["F", 0, 0, 1.0, "wait"]
    with pytest.raises(InvalidScheduleError, match="only an OFFLOAD can hold"):
        schedule_from_dict(bad)
    bad["actions"][0][0] = ["F", 0, 0, 1.0, "later"]
    with pytest.raises(InvalidScheduleError, match="is not"):
        schedule_from_dict(bad)


# ------------------------------------------------------------- definitions
def test_makespan_bubble_rate_and_device_span():
    problem = uniform_problem(2, 1, forward=1.0, backward_input=2.0, backward_weight=0.0,
                              p2p=0.5)
    result = simulate(problem, generate("1f1b", problem))
    # F0 [0,1]  F1 [1.5,2.5]  BW1 [2.5,4.5]  BW0 [5,7]
    assert result.makespan == 7.0
    assert result.device_busy == [3.0, 3.0]
    assert result.device_span == [7.0, 3.0]
    assert result.bubble_rate == pytest.approx(1 - 6.0 / (2 * 7.0))
    assert result.device_bubble_rate == pytest.approx([1 - 3 / 7, 0.0])
    assert result.device_idle == [4.0, 4.0]


def test_budget_check_names_device_peak_and_budget():
    problem = uniform_problem(2, 4, activation=1000).with_budget([10**6, 1500])
    result = simulate(problem, generate("gpipe", problem))
    assert not result.fits and result.over_budget() == [1]
    with pytest.raises(Exception, match="device 1"):
        simulate(problem, generate("gpipe", problem), check_budget=True)


# -------------------------------------------------------------- validation
def valid_dict() -> dict:
    return {"format": "optpipe-schedule", "version": 1, "name": "t", "stages": 2,
            "devices": 2, "microbatches": 1, "placement": [0, 1],
            "actions": [[["F", 0, 0], ["B", 0, 0], ["W", 0, 0]],
                        [["F", 1, 0], ["B", 1, 0], ["W", 1, 0]]]}


@pytest.mark.parametrize("change, expected", [
    (lambda d: d["actions"].__setitem__(1, []), "stage 1, microbatch 0 has no F"),
    (lambda d: d["actions"][0].__setitem__(slice(0, 2), [["B", 0, 0], ["F", 0, 0]]),
     "comes before its F"),
    (lambda d: d["actions"][1].__setitem__(slice(1, 3), [["W", 1, 0], ["B", 1, 0]]),
     "comes before its B"),
    (lambda d: d["actions"][0].insert(1, ["RELOAD", 0, 0]), "an OFFLOAD is missing on device 0"),
    (lambda d: d["actions"][0].__setitem__(slice(1, 1), [["RELOAD", 0, 0], ["OFFLOAD", 0, 0]]),
     "comes before an OFFLOAD"),
    (lambda d: d["actions"][0].pop(0), "its F is missing on device 0"),
    (lambda d: d["actions"][1].pop(2), "stage 1, microbatch 0 has no W (and no fused BW)"),
    (lambda d: d["actions"][0].append(["BW", 0, 0]),
     "stage 0, microbatch 0 has both a fused BW and a split B/W"),
    (lambda d: d["actions"][0].insert(1, ["OFFLOAD", 0, 0]),
     "its activations were offloaded and not reloaded before it"),
    (lambda d: d["actions"][0].append(["OFFLOAD", 0, 0]), "comes after the backward"),
    (lambda d: d["actions"][0].append(["F", 0, 0]), "duplicated"),
    (lambda d: d["actions"][0].__setitem__(1, ["B", 0, 0, 1.0, "wait"]),
     "only an OFFLOAD can hold its device back"),
    (lambda d: d["actions"][1].pop(1), "its B is missing on device 1"),
    (lambda d: d["actions"][0].append(["F", 7, 0]), "unknown stage"),
    (lambda d: d["actions"][0].append(["F", 1, 0]), "a stage would run on two devices"),
    (lambda d: d["actions"][0].append(["F", 0, 3]), "unknown microbatch"),
    (lambda d: d["actions"][0].append(["X", 0, 0]), "unknown op 'X'"),
    (lambda d: d.__setitem__("version", 9), "format version 9"),
])
def test_validation_errors_name_the_problem(change, expected):
    data = valid_dict()
    schedule_from_dict(data)                      # the unchanged data is valid
    change(data)
    with pytest.raises(InvalidScheduleError, match=re.escape(expected)):
        schedule_from_dict(data, origin="test schedule")


def test_corrupt_and_missing_files(tmp_path: Path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "optpipe-schedule", "actions": [')
    with pytest.raises(InvalidScheduleError, match="not valid JSON"):
        load_schedule(broken)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"hello": 1}))
    with pytest.raises(InvalidScheduleError, match="not an optpipe schedule"):
        load_schedule(wrong)
    with pytest.raises(Exception, match="does not exist"):
        load_schedule(tmp_path / "absent.json")


def test_schedule_round_trips_through_json(tmp_path: Path):
    problem = uniform_problem(3, 4, p2p=0.1)
    original = generate("zb-h1", problem)
    path = tmp_path / "zb.json"
    original.save(path)
    loaded = load_schedule(path)
    assert loaded.actions == original.actions and loaded.provenance == original.provenance
    assert simulate(problem, loaded).makespan == simulate(problem, original).makespan


def test_schedule_for_another_pipeline_is_rejected():
    with pytest.raises(Exception, match="microbatches"):
        simulate(uniform_problem(2, 3), generate("1f1b", uniform_problem(2, 4)))
    with pytest.raises(Exception, match="devices"):
        simulate(uniform_problem(3, 4), generate("1f1b", uniform_problem(2, 4)))

