"""scripts/gpu_check.py: the helpers its figures rest on, and the script itself on a GPU.

The overlap figures (exposed copy time) and the prefetch variant are computed here on
the CPU, so the numbers in docs/gpu.md come from checked code; the whole script runs
only where torch sees a CUDA device.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from optpipe.generators import generate
from optpipe.problem import uniform_problem
from optpipe.runtime import OptPipeRunner
from optpipe.runtime.record import MeasuredAction, StepRecord
from optpipe.runtime.verify import build_case, with_offload
from optpipe.schedule import Op

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_check = _load()


def _record(spans):
    record = StepRecord("x", 1, 1, 1)
    for lane, start, end in spans:
        record.actions.append(MeasuredAction(0, "F" if lane == "compute" else "OFFLOAD",
                                             0, 0, start, end, lane=lane))
    return record


def test_exposed_copy_time_is_copy_wall_time_without_compute():
    # compute [0, 4) and [6, 8); copies [3, 7) on d2h and [5, 10) on h2d
    figures = gpu_check.copy_figures(_record([
        ("compute", 0, 4), ("compute", 6, 8), ("d2h", 3, 7), ("h2d", 5, 10)]))
    assert figures["compute"] == 6
    assert figures["copy"] == 4 + 5
    assert figures["copy_wall"] == 7            # [3, 10)
    assert figures["exposed"] == 7 - (1 + 2)    # under compute: [3, 4) and [6, 8)


def test_no_copies_nothing_exposed():
    figures = gpu_check.copy_figures(_record([("compute", 0, 1)]))
    assert figures["copy"] == figures["copy_wall"] == figures["exposed"] == 0


def test_prefetch_moves_each_reload_earlier_and_keeps_the_gradients():
    torch.set_num_threads(1)
    base = with_offload(generate("1f1b", uniform_problem(4, 4)))
    early = gpu_check.prefetched(base)
    for plain, moved in zip(base.actions, early.actions):
        assert sorted(map(str, plain)) == sorted(map(str, moved))   # same actions
        for k, a in enumerate(moved):
            if a.op is Op.RELOAD:
                back = plain.index(a) - k
                assert back >= 0
                offload = next(i for i, b in enumerate(moved) if b.op is Op.OFFLOAD
                               and (b.stage, b.microbatch) == (a.stage, a.microbatch))
                assert offload < k                 # never before its own OFFLOAD
    assert any(p != m for p, m in zip(base.actions, early.actions))
    model, loss_fn, x, y = build_case("gpt", 4, batch=8)
    reference = OptPipeRunner(model, base, loss_fn)
    loss = reference.step(x, y)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    runner = OptPipeRunner(model, early, loss_fn)
    assert abs(runner.step(x, y) - loss) < 1e-10
    assert runner.leftover == {}
    assert max((p.grad - grads[n]).abs().max().item()
               for n, p in model.named_parameters()) < 1e-10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_check_passes_on_a_gpu():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "all correctness checks passed" in done.stdout
