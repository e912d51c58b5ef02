"""The independent plan validator catches every kind of bad plan and accepts good ones."""

from __future__ import annotations

import pytest

from optpipe.memory.trace import Buffer, Trace
from optpipe.memory.validate import PlanError, plan_violations, validate_plan


def trace(*items: tuple[int, float, float]) -> Trace:
    return Trace([Buffer(f"b{k}", size, start, end) for k, (size, start, end) in
                  enumerate(items)])


def test_sound_plan_passes():
    t = trace((4, 0, 3), (4, 3, 9), (4, 0, 9), (4, 9, 21), (4, 0, 21))
    validate_plan(t, {"b0": 0, "b1": 0, "b2": 4, "b3": 0, "b4": 8}, 12)


def test_touching_lifetimes_may_share_addresses():
    t = trace((8, 0, 5), (8, 5, 9))
    assert plan_violations(t, {"b0": 0, "b1": 0}, 8) == []


def test_overlap_in_time_and_address_is_named():
    t = trace((8, 0, 5), (8, 4, 9))
    with pytest.raises(PlanError, match="'b1'.*'b0'|'b0'.*'b1'"):
        validate_plan(t, {"b0": 0, "b1": 4}, 16)


def test_overlap_with_a_buffer_that_is_not_the_nearest_neighbour():
    # b2 [0, 30) spans b0 and b1 below it; the clash with b0 must be found too
    t = trace((10, 0, 9), (10, 0, 9), (30, 1, 2))
    problems = plan_violations(t, {"b0": 0, "b1": 10, "b2": 0}, 30)
    assert problems and "b2" in problems[0]


def test_out_of_arena_missing_negative_and_misaligned():
    t = trace((8, 0, 5), (8, 6, 9))
    assert "leaves the arena" in plan_violations(t, {"b0": 4, "b1": 0}, 8)[0]
    assert "no offset" in plan_violations(t, {"b0": 0}, 8)[0]
    assert ">= 0" in plan_violations(t, {"b0": -1, "b1": 0}, 8)[0]
    assert "aligned" in plan_violations(t, {"b0": 0, "b1": 3}, 16, alignment=4)[0]


def test_zero_size_and_zero_duration_buffers_never_clash():
    t = trace((0, 0, 5), (8, 2, 2), (8, 0, 5))
    assert plan_violations(t, {"b0": 0, "b1": 0, "b2": 0}, 8) == []
