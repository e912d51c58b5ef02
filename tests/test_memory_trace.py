"""Allocation traces: the file formats, and traces of simulated schedules that match the
simulator's memory accounting exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optpipe import costmodel
from optpipe.errors import OptPipeError
from optpipe.generators import generate
from optpipe.memory.trace import (Buffer, load_trace, read_minimalloc_csv,
                                  trace_from_json, traces_from_simulation)
from optpipe.problem import uniform_problem
from optpipe.schedule import from_orders
from optpipe.simulator import simulate

MINIMALLOC_EXAMPLE = """id,lower,upper,size
b1,0,3,4
b2,3,9,4
b3,0,9,4
b4,9,21,4
b5,0,21,4
"""


def test_minimalloc_csv_is_read_half_open():
    trace = read_minimalloc_csv(MINIMALLOC_EXAMPLE)
    assert [b.id for b in trace] == ["b1", "b2", "b3", "b4", "b5"]
    assert trace.buffers[1] == Buffer("b2", 4, 3, 9)
    # b1 ends at 3 where b2 starts: never both live, so the peak is 3 buffers of 4
    assert trace.peak_live() == 12
    assert not trace.buffers[0].overlaps(trace.buffers[1])


def test_csv_and_json_files_round_trip(tmp_path: Path):
    trace = read_minimalloc_csv(MINIMALLOC_EXAMPLE)
    trace.save(tmp_path / "t.csv")
    trace.save(tmp_path / "t.json")
    for name in ("t.csv", "t.json"):
        again = load_trace(tmp_path / name)
        assert [(b.id, b.size, b.start, b.end) for b in again] == \
            [(b.id, b.size, b.start, b.end) for b in trace]


def test_generic_json_list_with_tags():
    trace = trace_from_json([{"id": "x", "size": 10, "start": 0.5, "end": 1.5,
                              "tags": {"stage": 1, "microbatch": 3, "kind": "act_b"}},
                             {"size": 5, "start": 1.0, "end": 2.0}])
    assert trace.buffers[0].tags["microbatch"] == 3
    assert trace.buffers[1].id == "1"
    assert trace.peak_live() == 15


@pytest.mark.parametrize("bad, message", [
    ([{"size": 1, "start": 0}], "lacks end"),
    ([{"id": "a", "size": 1, "start": 2, "end": 1}], "must not precede"),
    ([{"id": "a", "size": 1, "start": 0, "end": 1}, {"id": "a", "size": 1, "start": 0,
                                                      "end": 1}], "appears twice"),
    ([{"id": "a", "size": "big", "start": 0, "end": 1}], "not an integer"),
    ({"format": "other", "buffers": []}, "format"),
])
def test_bad_json_traces_get_one_clear_line(bad, message):
    with pytest.raises(OptPipeError, match=message):
        trace_from_json(bad)


def test_bad_files_are_reported(tmp_path: Path):
    with pytest.raises(OptPipeError, match="does not exist"):
        load_trace(tmp_path / "none.csv")
    (tmp_path / "bad.csv").write_text("a,b,c\n1,2,3\n")
    with pytest.raises(OptPipeError, match="id,lower,upper,size"):
        load_trace(tmp_path / "bad.csv")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(OptPipeError, match="neither MiniMalloc CSV"):
        load_trace(tmp_path / "bad.json")


# ------------------------------------------------------------ simulated traces
def _check_matches_simulator(problem, schedule, per_layer=True):
    result = simulate(problem, schedule)
    traces = traces_from_simulation(result, per_layer=per_layer)
    assert len(traces) == schedule.devices
    for d, trace in enumerate(traces):
        assert trace.peak_live() == result.peak_memory[d] - result.problem.static[d]
        # the live bytes equal the simulator's curve at every point it reports
        live = dict(trace.live_profile())
        level = 0
        for when, total in result.memory_timeline[d][1:]:
            level = live.get(when, level)
            assert level == total - result.problem.static[d]
    return traces


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "gpipe",
                                  "zb-h2"])
def test_schedule_traces_match_simulated_peaks(name):
    problem = costmodel.build_problem("gpt3-1.3b", "h100-80gb", stages=4, microbatches=8)
    traces = _check_matches_simulator(problem, generate(name, problem))
    # per-layer tensors: many distinct buffers per microbatch
    assert len(traces[1]) > 8 * 2 * 6


def test_offload_schedule_trace_matches_the_simulator():
    problem = costmodel.build_problem("gpt3-1.3b", "h100-80gb", stages=4, microbatches=8)
    problem = problem.activation_budget(1.5)
    schedule = generate("pipeoffload", problem)
    assert schedule.offloads
    traces = _check_matches_simulator(problem, schedule)
    kinds = {b.tags["kind"] for t in traces for b in t}
    assert "offloaded" in kinds and any(k.startswith("reloaded") for k in kinds)


def test_reload_issued_before_the_offload_ends_overlaps_correctly():
    # one stage; the offload is slow, so the reload is issued (at F(1)'s end) while
    # the offload still runs: both copies are live for a while.
    problem = uniform_problem(1, 2, forward=1e-3, backward_input=1e-3, backward_weight=1e-3,
                              activation=10**9, freed_by_b=4 * 10**8, d2h_bandwidth=1e11,
                              h2d_bandwidth=1e12)
    orders = [[("F", 0, 0), ("OFFLOAD", 0, 0), ("F", 0, 1), ("RELOAD", 0, 0), ("B", 0, 0),
               ("B", 0, 1), ("W", 0, 0), ("W", 0, 1)]]
    schedule = from_orders("hand", [0], 2, orders)
    result = simulate(problem, schedule)
    off, rel = result.record("OFFLOAD", 0, 0), result.record("RELOAD", 0, 0)
    assert rel.issue < off.end
    traces = _check_matches_simulator(problem, schedule, per_layer=False)
    sizes = {b.tags["kind"]: b.size for b in traces[0] if b.tags["microbatch"] == 0}
    assert sizes["offloaded"] == 10**9
    assert sizes["reloaded_b"] == 4 * 10**8 and sizes["reloaded_w"] == 6 * 10**8


def test_per_layer_tensors_add_up_to_the_problem_bytes():
    problem = costmodel.build_problem("gpt3-1.3b", "h100-80gb", stages=2, microbatches=2)
    result = simulate(problem, generate("zb-h1", problem))
    per_layer = traces_from_simulation(result, per_layer=True)
    per_stage = traces_from_simulation(result, per_layer=False)
    for fine, coarse in zip(per_layer, per_stage):
        totals: dict = {}
        for b in fine:
            key = (b.tags["stage"], b.tags["microbatch"], b.tags["kind"])
            totals[key] = totals.get(key, 0) + b.size
        assert totals == {(b.tags["stage"], b.tags["microbatch"], b.tags["kind"]): b.size
                          for b in coarse}
        assert len({b.size for b in fine}) > len({b.size for b in coarse})


def test_problem_without_layers_gives_one_buffer_per_part():
    problem = uniform_problem(3, 4, activation=1000, freed_by_b=300)
    result = simulate(problem, generate("zb-h1", problem))
    traces = traces_from_simulation(result)
    assert all(len(t) == 4 * 2 for t in traces)
    assert {b.size for t in traces for b in t} == {300, 700}
    json.dumps(traces[0].to_json())  # tags are JSON-ready
