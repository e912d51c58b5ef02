"""The arena: planned views share one tensor as planned, unplanned requests fall back to
best fit in the spare bytes or to tensors of their own, and deviations are caught."""

from __future__ import annotations

import pytest
import torch

from optpipe.errors import OptPipeError
from optpipe.memory.arena import Arena
from optpipe.memory.planner import Plan, plan
from optpipe.memory.trace import Buffer, Trace
from optpipe.memory.validate import PlanError


@pytest.fixture()
def arena_plan():
    t = Trace([Buffer("a", 1024, 0, 2), Buffer("b", 2048, 1, 3), Buffer("c", 1024, 2, 4)])
    return plan(t, alignment=256, time_limit=1)


def test_planned_buffers_are_views_at_their_offsets(arena_plan):
    arena = Arena(arena_plan, spare=0)
    assert arena.storage.numel() == arena_plan.arena_size == 3072
    base = arena.storage.data_ptr()
    a = arena.tensor("a", [256], torch.float32)
    b = arena.tensor("b", [16, 32], torch.float32)
    assert a.data_ptr() - base == arena_plan.offsets["a"]
    assert b.data_ptr() - base == arena_plan.offsets["b"]
    a.fill_(1.0)
    b.fill_(2.0)
    assert float(a.sum()) == 256.0 and float(b.sum()) == 2.0 * 512  # no overlap
    arena.release("a")
    c = arena.tensor("c", [256], torch.float32)  # reuses a's bytes, as planned
    assert c.data_ptr() == a.data_ptr()
    stats = arena.stats()
    assert stats.planned_live == 3072 and stats.peak_live == 3072
    assert stats.reserved == 3072 and stats.fragmentation == 0.0


def test_running_out_of_plan_order_is_caught(arena_plan):
    arena = Arena(arena_plan)
    arena.tensor("a")
    with pytest.raises(PlanError, match="does not follow"):
        arena.tensor("c")  # c was planned over a, which is still live
    with pytest.raises(PlanError, match="already live"):
        arena.tensor("a")


def test_wrong_requests_are_user_errors(arena_plan):
    arena = Arena(arena_plan)
    with pytest.raises(OptPipeError, match="not in the plan"):
        arena.tensor("zzz")
    with pytest.raises(OptPipeError, match="planned for 1024 bytes"):
        arena.tensor("a", [1000], torch.float32)
    with pytest.raises(OptPipeError, match="not live"):
        arena.release("b")


def test_unplanned_requests_use_spare_bytes_then_go_outside(arena_plan):
    arena = Arena(arena_plan, spare=4096)
    x = arena.allocate([100], torch.float32)         # 400 bytes, in the spare region
    start = arena.storage.data_ptr() + arena_plan.arena_size
    assert start <= x.data_ptr() < start + 4096
    y = arena.allocate([2000], torch.float32)        # 8000 bytes: outside the arena
    assert not (start <= y.data_ptr() < start + 4096)
    stats = arena.stats()
    assert stats.unplanned_live == 400 and stats.outside_live == 8000
    assert stats.reserved == arena_plan.arena_size + 4096 + 8000
    arena.free(x)
    arena.free(y)
    z = arena.allocate([100], torch.float32)         # best fit reuses the freed bytes
    assert z.data_ptr() == x.data_ptr()
    assert arena.stats().outside_peak == 8000
    with pytest.raises(OptPipeError):
        arena.free(torch.zeros(3))


def test_misaligned_plans_are_refused_for_wide_dtypes():
    p = Plan(trace_name="t", offsets={"a": 3}, sizes={"a": 8}, arena_size=11, peak_live=8)
    arena = Arena(p)
    with pytest.raises(OptPipeError, match="alignment >= 8"):
        arena.tensor("a", [1], torch.float64)
    assert arena.tensor("a", [8]).data_ptr() == arena.storage.data_ptr() + 3
