"""The torch-csv export runs in PyTorch's own pipeline runtime with exact gradients.

Four real gloo processes load the CSV with
``_PipelineScheduleRuntime._load_csv(path, format="compute_only")`` and run one training
step of a float64 MLP; the gradients must equal a single-process reference.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from optpipe.export_torch import to_torch_csv, write_torch_csv  # noqa: E402
from optpipe.generators import generate  # noqa: E402
from optpipe.problem import uniform_problem  # noqa: E402
from optpipe.simulator import simulate  # noqa: E402

STAGES, MICROBATCHES, WIDTH, BATCH = 4, 8, 8, 16
SCHEDULES = ("1f1b", "zb-h1")


def _stage_module(index: int) -> "torch.nn.Module":
    torch.manual_seed(100 + index)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()).double()


def _data() -> tuple["torch.Tensor", "torch.Tensor"]:
    generator = torch.Generator().manual_seed(7)
    return (torch.randn(BATCH, WIDTH, generator=generator, dtype=torch.float64),
            torch.randn(BATCH, WIDTH, generator=generator, dtype=torch.float64))


def _loss(output: "torch.Tensor", target: "torch.Tensor") -> "torch.Tensor":
    return ((output - target) ** 2).sum()


def _worker(rank: int, world: int, store: str, csv_dir: str) -> None:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        inputs, targets = _data()
        for name in SCHEDULES:
            module = _stage_module(rank)
            stage = PipelineStage(module, rank, world, torch.device("cpu"))
            runtime = _PipelineScheduleRuntime([stage], MICROBATCHES, loss_fn=_loss)
            runtime._load_csv(os.path.join(csv_dir, f"{name}.csv"), format="compute_only")
            if rank == 0:
                runtime.step(inputs)
            elif rank == world - 1:
                runtime.step(target=targets)
            else:
                runtime.step()
            grads = {k: p.grad.clone() for k, p in module.named_parameters()}
            torch.save(grads, os.path.join(csv_dir, f"{name}.rank{rank}.pt"))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _reference_grads() -> list[dict[str, "torch.Tensor"]]:
    modules = [_stage_module(i) for i in range(STAGES)]
    inputs, targets = _data()
    for x, y in zip(inputs.chunk(MICROBATCHES), targets.chunk(MICROBATCHES)):
        out = x
        for m in modules:
            out = m(out)
        (_loss(out, y) / MICROBATCHES).backward()
    return [{k: p.grad for k, p in m.named_parameters()} for m in modules]


def test_csv_cells_follow_torch_naming():
    problem = uniform_problem(2, 2)
    text = to_torch_csv(generate("zb-h1", problem))
    cells = {c for row in text.splitlines() for c in row.split(",") if c}
    assert {"0F0", "0I0", "0W0", "1F1"} <= cells
    assert "B" not in "".join(c[1] for c in cells)  # split backward: no fused cells
    fused = to_torch_csv(generate("1f1b", problem))
    assert "0B0" in fused


def test_idle_cells_mark_bubbles():
    problem = uniform_problem(4, 4)
    schedule = generate("1f1b", problem)
    rows = [r.split(",") for r in to_torch_csv(schedule, simulate(problem, schedule)).splitlines()]
    assert rows[3][:3] == ["", "", ""]  # the last stage waits three slots for its first input


def test_pytorch_runtime_runs_exported_csv_with_exact_gradients(tmp_path: Path):
    problem = uniform_problem(STAGES, MICROBATCHES)
    for name in SCHEDULES:
        write_torch_csv(generate(name, problem), tmp_path / f"{name}.csv")
    mp.spawn(_worker, args=(STAGES, str(tmp_path / "store"), str(tmp_path)), nprocs=STAGES,
             join=True)
    reference = _reference_grads()
    for name in SCHEDULES:
        for rank in range(STAGES):
            grads = torch.load(tmp_path / f"{name}.rank{rank}.pt")
            for key, expected in reference[rank].items():
                diff = (grads[key] - expected).abs().max().item()
                assert diff < 1e-10, f"{name} rank {rank} {key}: max abs diff {diff}"
