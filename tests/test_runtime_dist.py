"""The runtime on real gloo processes (2 and 4): correctness and failures that must not hang.

Each test starts its processes once (:func:`optpipe.runtime.launch.run_workers`, fork
server, so a start costs well under a second) and runs every case inside them.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from optpipe.errors import OptPipeError
from optpipe.runtime.launch import run_workers
from optpipe.runtime.verify import verify_worker


@pytest.mark.parametrize("world", [2, 4])
def test_every_schedule_on_real_processes(world):
    results = run_workers(verify_worker, world, 4, timeout=120)
    assert len(results) == world
    by_case: dict[tuple[str, str], list[dict]] = {}
    for rank, reports in enumerate(results):
        for r in reports:
            assert r["rank"] == rank
            where = f"rank {rank}: {r['model']} {r['schedule']}"
            assert r["grad_diff"] < 1e-10, where
            assert r["loss_diff"] < 1e-10, where
            assert r["leftover"] == {}, where
            assert r["offload_moved"] and r["offload_emptied"], where
            by_case.setdefault((r["model"], r["schedule"]), []).append(r)
    names = {schedule for _, schedule in by_case}
    assert {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "zb-auto",
            "pipeoffload", "1f1b+offload", "zb-h1+offloadx0.5", "1f1b+offload-wait",
            "offloaded-list-interleaved(tight)", "offloaded-list-v(tight)"} <= names
    for case, reports in by_case.items():
        assert len(reports) == world
        assert all(r["params"] > 0 for r in reports), case      # every rank holds stages
        # every rank sees the same measured step (records are gathered)
        assert len({round(r["makespan"], 12) for r in reports}) == 1, case


def _mlp_runner(rank: int, schedule_name: str = "1f1b", devices: int = 2,
                timeout: float = 30.0):
    from optpipe.generators import generate
    from optpipe.problem import uniform_problem
    from optpipe.runtime import OptPipeRunner, mlp_batch, mlp_model, mse_loss

    model = mlp_model(depth=4).double()
    x, y = mlp_batch(8, dtype=torch.float64)
    schedule = generate(schedule_name, uniform_problem(devices, 4))
    return OptPipeRunner(model, schedule, mse_loss, timeout=timeout), x, y


def hang_then_die(rank: int, world: int) -> list[str]:
    """Rank 1 stops answering after one step, then exits; rank 0 must fail cleanly."""
    runner, x, y = _mlp_runner(rank, timeout=1.5)
    runner.step(x, y)
    if rank == 1:
        time.sleep(4.0)
        os._exit(0)
    errors = []
    for _ in range(2):    # first while rank 1 hangs, then once it is gone
        try:
            runner.step(x, y)
            errors.append("no error")
        except OptPipeError as exc:
            errors.append(str(exc))
        time.sleep(3.0)
    return errors


def test_a_hung_or_dead_peer_becomes_an_error_naming_rank_and_action():
    started = time.monotonic()
    results = run_workers(hang_then_die, 2, timeout=60, return_errors=True)
    assert time.monotonic() - started < 30
    hung, dead = results[0]
    assert "rank 0:" in hung and "from rank 1" in hung, hung
    assert "(stage 0, mb 0)" in hung and "timeout 1.5s" in hung, hung
    assert "rank 1" in dead, dead
    assert results[1] is None                                   # it exited on purpose


def different_schedules(rank: int, world: int) -> str:
    _mlp_runner(rank, "1f1b" if rank == 0 else "gpipe")
    return "constructed"


def wrong_world(rank: int, world: int) -> str:
    _mlp_runner(rank, devices=4)
    return "constructed"


def test_ranks_with_different_schedules_or_world_fail_at_construction():
    results = run_workers(different_schedules, 2, timeout=60, return_errors=True)
    for rank, result in enumerate(results):
        assert isinstance(result, OptPipeError), result
        assert f"rank {rank}: ranks [1] run a different schedule" in str(result)
    results = run_workers(wrong_world, 2, timeout=60, return_errors=True)
    for result in results:
        assert isinstance(result, OptPipeError)
        assert "is for 4 devices but the process group has 2 ranks" in str(result)


def test_torchrun_env_launch():
    """The runner under torchrun's env:// rendezvous (the multi-machine path), gloo."""
    import subprocess
    import sys
    from pathlib import Path

    from optpipe.runtime.launch import free_port

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(free_port()), "-m", "optpipe.runtime.train_example",
               "--schedule", "zb-v", "--layers", "4", "--microbatches", "4", "--steps", "2"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    errors = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("W"))
    assert done.returncode == 0, done.stdout[-1000:] + errors[-3000:]
    assert "step 1: loss" in done.stdout and "(zb-v, 2 ranks, gloo)" in done.stdout
