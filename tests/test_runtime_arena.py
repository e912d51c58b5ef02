"""Kept activations in one planned arena per device: OptPipeRunner(..., arena=True).

Gradients equal the plain runner's (float64), the arena is the size the simulator
predicts for the measured problem, offload releases and retakes arena slots, and
storages the plan does not foresee fall back without error.
"""

from __future__ import annotations

import pytest
import torch

from optpipe.generators import generate
from optpipe.problem import uniform_problem
from optpipe.runtime import OptPipeRunner
from optpipe.runtime.launch import run_workers
from optpipe.runtime.verify import build_case, with_offload
from optpipe.simulator import simulate


@pytest.fixture(autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _schedule(name: str, devices: int = 4, microbatches: int = 4):
    problem = uniform_problem(devices, microbatches)
    if name == "pipeoffload(tight)":
        schedule = generate("pipeoffload", problem.activation_budget(1.5))
        assert schedule.offloads
        return schedule
    if name == "1f1b+offload":
        return with_offload(generate("1f1b", problem))
    if name == "zb-h1+offloadx0.5":
        return with_offload(generate("zb-h1", problem), 0.5)
    return generate(name, problem)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _compare(kind: str, name: str, steps: int = 3):
    schedule = _schedule(name)
    model, loss_fn, x, y = build_case(kind, schedule.stages, batch=8)  # chunked: 2/device
    plain = OptPipeRunner(model, schedule, loss_fn)
    loss_plain = plain.step(x, y)
    reference = _grads(model)
    runner = OptPipeRunner(model, schedule, loss_fn, arena=True)
    for _ in range(steps):
        loss = runner.step(x, y)
        assert runner.leftover == {}
        assert abs(loss - loss_plain) < 1e-10
        diff = max((p.grad - reference[n]).abs().max().item()
                   for n, p in model.named_parameters())
        assert diff < 1e-10, (kind, name)
    assert runner.arena_store is not None
    return runner, schedule


@pytest.mark.parametrize("kind", ["gpt", "mlp"])
@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "1f1b+offload", "pipeoffload(tight)"])
def test_gradients_equal_and_arena_is_the_simulated_peak(kind, name):
    runner, schedule = _compare(kind, name)
    store = runner.arena_store
    assert store.planned_entries > 0
    assert store.unplanned_entries == 0 and store.fallback_buffers == 0
    problem = runner.arena_problem
    sim = simulate(problem, schedule)
    for device, stats in runner.arena_stats().items():
        plan = runner.arena_plans[device]
        assert stats.arena_bytes == stats.reserved == plan.arena_size    # one tensor
        assert stats.outside_peak == 0 and stats.unplanned_requests == 0
        assert stats.live == 0                                           # all released
        assert 0 < stats.peak_live <= plan.arena_size
        if plan.optimal:
            assert plan.arena_size == sim.peak_memory[device] - problem.static[device]
    if "offload" not in name:
        # without transfers the run follows the plan's lifetimes exactly
        for device, stats in runner.arena_stats().items():
            assert stats.peak_live == runner.arena_plans[device].arena_size


def test_offload_gives_back_and_retakes_its_slot():
    runner, schedule = _compare("gpt", "1f1b+offload", steps=2)
    model, loss_fn, x, y = build_case("gpt", 4, batch=8)
    plain = OptPipeRunner(model, _schedule("1f1b"), loss_fn, arena=True)
    plain.step(x, y)
    plain.step(x, y)
    for device in range(3):      # offloading never needs a larger arena ...
        assert (runner.arena_plans[device].arena_size
                <= plain.arena_plans[device].arena_size)
    # ... and device 0, which keeps 4 microbatches under plain 1F1B, now needs 2 slots
    # (the accounting's overlap of an OFFLOAD's end with the next RELOAD's issue)
    assert 2 * runner.arena_plans[0].arena_size == plain.arena_plans[0].arena_size
    runner.step(x, y, record=True)
    record = runner.last_record
    for a in record.actions:
        if a.op == "RELOAD":
            assert a.left == 0 and a.moved > 0     # the arena slot was really given back


@pytest.mark.parametrize("name", ["zb-h1+offloadx0.5", "interleaved-1f1b"])
def test_unplanned_storages_fall_back(name):
    """A partial offload (bytes split off whole storages) and a chunked schedule."""
    model, loss_fn, x, y = build_case("mlp", 4, batch=8)
    schedule = _schedule(name) if "offload" in name else generate(name, uniform_problem(2, 4))
    plain = OptPipeRunner(model, schedule, loss_fn)
    plain.step(x, y)
    reference = _grads(model)
    runner = OptPipeRunner(model, schedule, loss_fn, arena=True, arena_spare=1 << 12)
    for _ in range(3):
        runner.step(x, y)
        assert runner.leftover == {}
    diff = max((p.grad - reference[n]).abs().max().item() for n, p in model.named_parameters())
    assert diff < 1e-10
    if "offload" in name:
        assert runner.arena_store.unplanned_entries > 0
        stats = runner.arena_stats()
        assert sum(s.unplanned_requests for s in stats.values()) > 0
        assert all(s.live == 0 for s in stats.values())


def test_a_too_small_plan_falls_back_to_online():
    """Plans whose buffers are smaller than the measured storages: every storage is
    placed online (spare bytes, else outside) and the gradients are unchanged."""
    from optpipe.memory.planner import plan
    from optpipe.memory.trace import traces_from_schedule

    model, loss_fn, x, y = build_case("mlp", 4, batch=8)
    schedule = _schedule("1f1b")
    plain = OptPipeRunner(model, schedule, loss_fn)
    plain.step(x, y)
    reference = _grads(model)
    traces = traces_from_schedule(uniform_problem(4, 4, activation=64), schedule,
                                  per_layer=False)
    plans = {d: plan(t, alignment=256) for d, t in enumerate(traces)}
    runner = OptPipeRunner(model, schedule, loss_fn, arena=plans, arena_spare=512)
    for _ in range(2):
        runner.step(x, y)
    diff = max((p.grad - reference[n]).abs().max().item() for n, p in model.named_parameters())
    assert diff < 1e-10
    stats = runner.arena_stats()
    assert runner.arena_store.planned_entries == 0
    assert sum(s.unplanned_requests for s in stats.values()) > 0
    assert any(s.outside_peak > 0 for s in stats.values())      # spare was too small
    assert all(s.live == 0 for s in stats.values())


def _arena_worker(rank: int, world: int, name: str) -> dict:
    model, loss_fn, x, y = build_case("gpt", world, batch=8)
    schedule = _schedule(name, devices=world)
    runner = OptPipeRunner(model, schedule, loss_fn, arena=True)
    for _ in range(3):
        loss = runner.step(x, y)
    grads = {n: p.grad.clone() for n, p in runner.named_parameters()}
    stats = runner.arena_stats()[rank]
    return {"loss": loss, "grads": grads, "leftover": runner.leftover,
            "arena": runner.arena_plans[rank].arena_size, "reserved": stats.reserved,
            "planned": runner.arena_store.planned_entries,
            "unplanned": runner.arena_store.unplanned_entries}


def test_two_gloo_processes():
    name = "zb-h1"
    results = run_workers(_arena_worker, 2, name, timeout=120)
    model, loss_fn, x, y = build_case("gpt", 2, batch=8)
    plain = OptPipeRunner(model, _schedule(name, devices=2), loss_fn)
    loss = plain.step(x, y)
    reference = dict(plain.named_parameters())
    for r in results:
        assert r["leftover"] == {} and abs(r["loss"] - loss) < 1e-10
        assert r["planned"] > 0 and r["unplanned"] == 0
        assert r["reserved"] == r["arena"]
        for n, g in r["grads"].items():
            assert (g - reference[n].grad).abs().max().item() < 1e-10, n
