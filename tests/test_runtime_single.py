"""The runtime in one process holding every stage: correctness, offload, accounting, errors.

Every test compares with plain PyTorch (one ``loss.backward()`` over the whole batch) in
float64; no mocks. The distributed runs are in test_runtime_dist.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from optpipe.errors import InvalidScheduleError, OptPipeError
from optpipe.generators import generate
from optpipe.problem import uniform_problem
from optpipe.runtime import (GPT, GPTConfig, OptPipeRunner, balanced_partition, gpt_batch,
                             mlp_batch, mlp_model, mse_loss, split_model)
from optpipe.runtime.verify import build_case, verify_worker, with_offload
from optpipe.schedule import Action, Op, Schedule, from_orders
from optpipe.simulator import simulate


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one intra-op thread is fastest and keeps timings stable."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _check(reports):
    assert reports
    for r in reports:
        where = f"{r['model']} {r['schedule']}"
        assert r["grad_diff"] < 1e-10, where
        assert r["loss_diff"] < 1e-10, where
        assert r["leftover"] == {}, where
        assert r["offload_moved"] and r["offload_emptied"], where


@pytest.mark.parametrize("devices", [2, 4])
def test_every_schedule_matches_plain_backward(devices):
    reports = verify_worker(None, devices, microbatches=4)
    _check(reports)
    names = {r["schedule"] for r in reports}
    assert {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "zb-auto",
            "pipeoffload", "1f1b+offload", "zb-h1+offloadx0.5", "1f1b+offload-wait"} <= names
    if devices == 4:  # with 2 devices PipeOffload's 1F1B fits without offloading
        assert "pipeoffload(tight)" in names
    assert any(r["offloads"] for r in reports)


def test_offload_empties_device_and_keeps_results():
    model, loss_fn, x, y = build_case("gpt", 4, batch=8)
    base = generate("1f1b", uniform_problem(4, 4))
    plain = OptPipeRunner(model, base, loss_fn)
    loss_plain = plain.step(x, y, record=True)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    peak_plain = plain.last_record.peak_activation

    runner = OptPipeRunner(model, with_offload(base), loss_fn)
    loss = runner.step(x, y, record=True)
    record = runner.last_record
    assert loss == loss_plain
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, grads[n]), n
    for a in record.actions:
        if a.op == "OFFLOAD":
            f = record.find("F", a.stage, a.microbatch)
            assert a.moved == f.delta > 0            # everything F kept went to host
            assert a.delta == -a.moved               # and left the device's account
            reload = record.find("RELOAD", a.stage, a.microbatch)
            assert reload.left == 0                  # storages really were empty
            assert reload.moved == a.moved and reload.delta == a.moved
    # each non-last stage keeps at most one microbatch at a time now
    for d in range(3):
        assert record.peak_activation[d] < peak_plain[d]
    assert runner.offloader.pool.in_use == 0 and runner.offloader.pool.allocated > 0


def test_an_offload_marked_wait_holds_the_device_back():
    """Every action after a waited OFFLOAD starts once its copy has ended, and each
    non-last stage then keeps at most one microbatch on device (1F1B keeps S - s)."""
    model, loss_fn, x, y = build_case("gpt", 4, batch=8)
    base = generate("1f1b", uniform_problem(4, 4))
    plain = OptPipeRunner(model, base, loss_fn)
    loss_plain = plain.step(x, y, record=True)
    runner = OptPipeRunner(model, with_offload(base, wait=True), loss_fn)
    assert runner.step(x, y, record=True) == loss_plain
    record = runner.last_record
    f_bytes = [record.find("F", s, 0).delta for s in range(4)]
    for d, acts in enumerate(runner.schedule.actions):
        for i, a in enumerate(acts):
            if a.wait:
                copy_ = record.find("OFFLOAD", a.stage, a.microbatch)
                following = acts[i + 1]
                after = record.find(following.op.value, following.stage,
                                    following.microbatch)
                assert after.start >= copy_.end, (d, str(a))
    for d in range(3):
        assert record.peak_activation[d] <= f_bytes[d]
    assert record.peak_activation[3] == plain.last_record.peak_activation[3]


def test_w_reuses_the_graph_and_never_recomputes_forward():
    model, loss_fn, x, y = build_case("mlp", 4, batch=8)
    calls = []
    for block in model:
        block.register_forward_hook(lambda *args: calls.append(1))
    schedule = generate("zb-h1", uniform_problem(4, 4))
    assert schedule.splits_backward
    runner = OptPipeRunner(model, schedule, loss_fn)
    runner.step(x, y)
    assert len(calls) == 4 * 4                      # one forward per block and microbatch


def test_accounting_follows_the_simulator_rules():
    """Measured bytes per action, fed to the simulator, give the measured peaks exactly."""
    model, loss_fn, x, y = build_case("gpt", 4, batch=8)
    problem = uniform_problem(4, 4)
    for name in ("1f1b", "zb-h1", "gpipe"):
        schedule = generate(name, problem)
        runner = OptPipeRunner(model, schedule, loss_fn)
        runner.step(x, y)            # the first step learns what W needs (free_after_b)
        runner.step(x, y, record=True)
        record = runner.last_record
        act = [record.find("F", s, 0).delta for s in range(4)]
        freed_b = [-(record.find("B", s, 0).delta if schedule.splits_backward else 0)
                   for s in range(4)]
        measured = uniform_problem(4, 4)
        from dataclasses import replace
        measured = replace(measured, activation=tuple(act), freed_by_b=tuple(freed_b),
                           freed_by_w=tuple(a - b for a, b in zip(act, freed_b)),
                           static=(0,) * 4)
        sim = simulate(measured, schedule)
        assert sim.peak_memory == record.peak_activation, name


def test_b_frees_what_w_does_not_read():
    model, loss_fn, x, y = build_case("gpt", 4, batch=8)
    schedule = generate("zb-h1", uniform_problem(4, 4))
    freed = {}
    for flag in (True, False):
        runner = OptPipeRunner(model, schedule, loss_fn, free_after_b=flag)
        runner.step(x, y)
        runner.step(x, y, record=True)
        record = runner.last_record
        freed[flag] = [-record.find("B", s, 1).delta for s in range(4)]
        kept = [record.find("F", s, 1).delta for s in range(4)]
        assert runner.leftover == {}
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        if flag:
            first = grads
        else:
            assert all(torch.equal(first[n], g) for n, g in grads.items())
    assert freed[False][1:3] == [0, 0]          # torch's split keeps the whole graph for W
    assert all(0 < f < k for f, k in zip(freed[True][1:3], kept[1:3]))
    assert freed[True][3] > freed[False][3] > 0  # the last stage frees its loss either way
    assert freed[True][0] == freed[False][0] == 0  # stage 0's B is empty


def test_record_becomes_a_sim_result_and_a_gantt(tmp_path):
    model, loss_fn, x, y = build_case("mlp", 4, batch=8)
    schedule = with_offload(generate("zb-h1", uniform_problem(2, 4)))
    runner = OptPipeRunner(model, schedule, loss_fn)
    runner.step(x, y, record=True)
    record = runner.last_record
    assert len(record.actions) == sum(len(a) for a in schedule.actions)
    assert all(a.end >= a.start >= 0 for a in record.actions)
    result = record.to_sim_result(schedule)
    assert result.makespan == pytest.approx(record.makespan)
    assert result.peak_memory == [s + p for s, p in zip(record.static, record.peak_activation)]
    assert {r.lane for r in result.records} == {"compute", "d2h", "h2d"}
    gantt = pytest.importorskip("optpipe.viz.gantt")
    gantt.plot_gantt(result, tmp_path / "measured.png")
    assert (tmp_path / "measured.png").stat().st_size > 0


def test_training_with_an_optimizer_matches_plain_training():
    model, loss_fn, x, y = build_case("gpt", 4, batch=8)
    reference = copy.deepcopy(model)
    runner = OptPipeRunner(model, generate("zb-v", uniform_problem(2, 4)), loss_fn)
    opt = torch.optim.SGD(list(runner.parameters()), lr=0.1)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(3):
        loss = runner.step(x, y)
        opt.step()
        opt_ref.zero_grad()
        ref = loss_fn(reference(x), y)
        ref.backward()
        opt_ref.step()
        assert abs(loss - ref.item()) < 1e-10
    for (n, p), q in zip(model.named_parameters(), reference.parameters()):
        assert (p - q).abs().max().item() < 1e-10, n


# ------------------------------------------------------------------ models
def test_gpt_from_preset_follows_the_protocol():
    config = GPTConfig.from_preset("tiny-gpt")
    assert (config.layers, config.hidden, config.heads, config.vocab) == (4, 64, 4, 256)
    model = GPT(config)
    assert model.post.lm_head.weight is model.pre.wte.weight       # tied, as nanoGPT
    x, y = gpt_batch(config, 2)
    assert model(x).shape == (2, config.seq_len, config.vocab)
    plan = split_model(model, 4)
    assert plan.partition == [1, 1, 1, 1]
    assert [id(p) for p, _ in plan.shared] == [id(model.pre.wte.weight)]
    assert plan.shared[0][1] == [0, 3]
    assert GPTConfig.from_preset({"layers": 2, "hidden": 8, "heads": 2}).layers == 2
    with pytest.raises(OptPipeError, match="rope"):
        GPTConfig.from_preset("tiny-gpt", position="rope")


def test_balanced_partition():
    assert balanced_partition([1] * 8, 4) == [2, 2, 2, 2]
    assert balanced_partition([1] * 8, 4, last_extra=2) == [2, 2, 3, 1]
    assert balanced_partition([5, 1, 1, 1, 1, 1], 2) == [1, 5]
    with pytest.raises(OptPipeError, match="fewer than the 4 stages"):
        balanced_partition([1, 1, 1], 4)


def test_sequential_and_custom_protocols():
    model = mlp_model(depth=6)
    assert split_model(model, 3).partition == [2, 2, 2]
    assert split_model(model, 3, [1, 2, 3]).partition == [1, 2, 3]

    class NotAPipeline(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(2, 2)

    with pytest.raises(OptPipeError, match="cannot split a NotAPipeline"):
        split_model(NotAPipeline(), 2)


# ------------------------------------------------------------------ errors
def _schedule(devices=2, microbatches=4, name="1f1b"):
    return generate(name, uniform_problem(devices, microbatches))


def test_bad_use_gives_one_clear_error():
    model = mlp_model(depth=4).double()
    x, y = mlp_batch(8, dtype=torch.float64)
    with pytest.raises(OptPipeError, match="partition \\[2, 2\\] has 2 stages but the schedule "
                                           "has 4"):
        OptPipeRunner(model, _schedule(4), mse_loss, partition=[2, 2])
    with pytest.raises(OptPipeError, match="covers 3 blocks but the model has 4"):
        OptPipeRunner(model, _schedule(2), mse_loss, partition=[1, 2])
    with pytest.raises(OptPipeError, match="positive integers"):
        OptPipeRunner(model, _schedule(2), mse_loss, partition=[4, 0])
    with pytest.raises(OptPipeError, match="is for 4 microbatches but the runner was asked "
                                           "for 8"):
        OptPipeRunner(model, _schedule(2), mse_loss, microbatches=8)
    with pytest.raises(OptPipeError, match="fewer than the 8 stages"):
        OptPipeRunner(model, _schedule(4, name="zb-v"), mse_loss)
    runner = OptPipeRunner(model, _schedule(2), mse_loss)
    with pytest.raises(OptPipeError, match="a batch of 6 cannot be split into 4 equal"):
        runner.step(x[:6], y[:6])
    with pytest.raises(OptPipeError, match="needs the targets"):
        runner.step(x, None)
    with pytest.raises(OptPipeError, match="needs loss_fn"):
        OptPipeRunner(model, _schedule(2), None).step(x, y)
    with pytest.raises(OptPipeError, match="process_group was given"):
        OptPipeRunner(model, _schedule(2), mse_loss, process_group=object())


def test_a_schedule_that_would_deadlock_is_rejected_before_running():
    # device 0 waits for B of stage 1 before F(0, 1) that device 1 needs first
    orders = [[("F", 0, 0), ("BW", 0, 0), ("F", 0, 1), ("BW", 0, 1)],
              [("F", 1, 1), ("BW", 1, 1), ("F", 1, 0), ("BW", 1, 0)]]
    schedule = from_orders("cyclic", [0, 1], 2, orders)
    with pytest.raises(InvalidScheduleError, match="wait on each other in a cycle"):
        OptPipeRunner(mlp_model(depth=2), schedule, mse_loss)


def test_partial_offload_moves_whole_storages():
    model, loss_fn, x, y = build_case("mlp", 2, batch=8)
    base = _schedule(2)
    actions = [list(acts) for acts in base.actions]
    i = actions[0].index(Action(Op.F, 0, 0))
    actions[0].insert(i + 1, Action(Op.OFFLOAD, 0, 0, 0.5))
    j = actions[0].index(Action(Op.BW, 0, 0))
    actions[0].insert(j, Action(Op.RELOAD, 0, 0, 0.5))
    schedule = Schedule("half", 2, 2, 4, [0, 1], actions).validate()
    runner = OptPipeRunner(model, schedule, loss_fn)
    runner.step(x, y, record=True)
    record = runner.last_record
    kept = record.find("F", 0, 0).delta
    moved = record.find("OFFLOAD", 0, 0).moved
    assert 0.5 * kept <= moved < kept
    assert record.find("RELOAD", 0, 0).left == kept - moved
