"""Measured against planned: train a model with a schedule and set it beside the simulator.

:func:`measure_schedule` starts one process per device (gloo on CPU, NCCL with a GPU
per rank; or everything in this process with ``single_process``), trains the reference
GPT for a few steps with the given schedule, records the last steps and returns them
with the losses and each device's static bytes. :func:`compare` puts the median
measured step beside the simulator's makespan on a (profiled) problem, and each
device's measured peak (static + kept activations, by the runtime's accounting) beside
the simulated peak. ``optpipe run`` is these two calls and a table.

A chunked schedule (interleaved, V: several model stages per device) is predicted on a
problem profiled per chunk (:func:`optpipe.runtime.profile.profile_model` with the
schedule's ``placement``, the partition the runner uses); :func:`prediction_basis`
says which kind of problem a prediction used, and :func:`compare` reports it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from optpipe.errors import OptPipeError
from optpipe.problem import Problem
from optpipe.runtime.record import StepRecord
from optpipe.schedule import Schedule, schedule_from_dict
from optpipe.simulator import SimResult, simulate

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
           "float16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise OptPipeError(f"unknown dtype {name!r}; choose one of {', '.join(_DTYPES)}") from None


@dataclass
class RunSpec:
    """Everything a worker needs to rebuild the same model, data and schedule."""

    config: dict[str, Any]
    schedule: dict[str, Any]
    micro_batch_size: int = 1
    steps: int = 3
    warmup: int = 1
    dtype: str = "float32"
    seed: int = 0
    optimizer: str = "adam"
    partition: list[int] | str | None = None
    timeout: float = 300.0
    device: str = "cpu"


@dataclass
class MeasuredRun:
    """The recorded steps of a run, its losses and every device's static bytes."""

    records: list[StepRecord]
    losses: list[float]
    static: list[int]
    backend: str
    processes: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def step_time(self) -> float:
        """Median over recorded steps of first start to last end (as the simulator's makespan)."""
        return statistics.median(r.makespan for r in self.records)

    @property
    def wall_time(self) -> float:
        """Median over recorded steps of the slowest rank's time inside ``step()``."""
        return statistics.median(r.step_time for r in self.records)

    def peak(self) -> list[int]:
        """Per device: static bytes + the largest kept-activation peak over the steps."""
        return [self.static[d] + max(r.peak_activation[d] for r in self.records)
                for d in range(len(self.static))]


def _optimizer(params: list[torch.nn.Parameter], name: str) -> Any:
    if name in ("adam", "adamw"):
        return (torch.optim.AdamW if name == "adamw" else torch.optim.Adam)(params, lr=1e-3)
    if name in ("sgd", "momentum"):
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9 if name == "momentum" else 0.0)
    return None


def _state_bytes(optimizer: Any, runner: Any, device: int) -> int:
    """Optimizer state of one device's parameters (a tied weight counts on each device)."""
    if optimizer is None:
        return 0
    params = {id(p): p for s, d in enumerate(runner.schedule.placement) if d == device
              for p in runner.plan.modules[s].parameters()}
    total = 0
    for p in params.values():
        for value in optimizer.state.get(p, {}).values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                total += value.numel() * value.element_size()
    return total


def train_worker(rank: int | None, world: int, spec: RunSpec) -> dict[str, Any]:
    """Train the GPT of ``spec`` with its schedule; rank 0 (or the only process) reports."""
    from optpipe.runtime.model_gpt import GPT, GPTConfig, gpt_batch, gpt_loss
    from optpipe.runtime.runner import OptPipeRunner

    schedule = schedule_from_dict(spec.schedule, origin="the run's schedule")
    config = GPTConfig(**spec.config)
    torch.manual_seed(spec.seed)
    device = torch.device(spec.device if rank is None or spec.device == "cpu"
                          else f"cuda:{rank}")
    model = GPT(config).to(parse_dtype(spec.dtype))
    runner = OptPipeRunner(model, schedule, gpt_loss, partition=spec.partition, device=device,
                           timeout=spec.timeout)
    params = list(runner.parameters())
    optimizer = _optimizer(params, spec.optimizer)
    x, y = gpt_batch(config, spec.micro_batch_size * schedule.microbatches, seed=spec.seed)
    records, losses = [], []
    for step in range(spec.warmup + spec.steps):
        recording = step >= spec.warmup
        loss = runner.step(x, y, record=recording)
        if optimizer is not None:
            optimizer.step()
        losses.append(loss)
        if recording:
            records.append(runner.last_record)
    static = {d: runner.static_bytes(d) + _state_bytes(optimizer, runner, d)
              for d in runner.local_devices}
    return {"rank": rank, "records": records if rank in (0, None) else None,
            "losses": losses, "static": static, "partition": runner.plan.partition}


def measure_schedule(spec: RunSpec, single_process: bool = False,
                     threads: int | None = None) -> MeasuredRun:
    """Run ``spec`` on real processes (or in this one) and collect what was measured."""
    schedule = schedule_from_dict(spec.schedule, origin="the run's schedule")
    if single_process:
        if threads:
            torch.set_num_threads(threads)
        results = [train_worker(None, 1, spec)]
        backend, processes = "none (one process)", 1
    else:
        from optpipe.runtime.launch import default_backend, run_workers

        backend = default_backend(schedule.devices)
        if spec.device.startswith("cuda") and backend != "nccl":
            raise OptPipeError(f"--device cuda needs one GPU per device ({schedule.devices}); "
                               f"this machine has {torch.cuda.device_count()}; use "
                               f"--single-process to run every stage on one GPU")
        if backend == "nccl" and spec.device == "cpu":
            backend = "gloo"
        results = run_workers(train_worker, schedule.devices, spec, backend=backend,
                              threads=threads, timeout=spec.timeout)
        processes = schedule.devices
    first = results[0]
    static = [0] * schedule.devices
    for result in results:
        for d, value in result["static"].items():
            static[d] = value
    return MeasuredRun(first["records"], first["losses"], static, backend, processes,
                       {"partition": first["partition"]})


def is_chunked(schedule: Schedule) -> bool:
    """Whether ``schedule`` puts other than one stage per device, in order (V, interleaved)."""
    return list(schedule.placement) != list(range(schedule.devices))


def prediction_basis(problem: Problem, schedule: Schedule) -> str:
    """What the simulator times ``schedule``'s stages with on ``problem``.

    ``"profile"``: one stage per device, each measured; ``"per-chunk profile"``: a chunked
    schedule on a problem whose every chunk was measured (``meta["per_chunk"]``, set by
    the profiler, or a base problem with a :class:`~optpipe.problem.ChunkProfile` of the
    schedule's placement); ``"even split"``: a chunked schedule on a base problem (or a
    :meth:`Problem.split` of one), so each chunk gets ``1/v`` of its device's figures.
    """
    if not is_chunked(schedule):
        return "profile"
    if problem.chunks > 1 and problem.meta.get("per_chunk"):
        return "per-chunk profile"
    if problem.chunks == 1 and problem.chunk_profile(schedule.placement) is not None:
        return "per-chunk profile"                # the base problem carries that cut
    return "even split"


def compare(run: MeasuredRun, schedule: Schedule, problem: Problem) -> dict[str, Any]:
    """Measured vs simulated figures of one schedule, as plain data.

    ``problem`` is the base problem or, for a chunked schedule, a per-chunk profile (or
    a split); ``"prediction"`` says which (:func:`prediction_basis`), ``"problem"``
    describes it (stages, devices, placement, partition).
    """
    sim: SimResult = simulate(problem, schedule)
    measured_peak = run.peak()
    return {
        "schedule": schedule.name,
        "prediction": prediction_basis(problem, schedule),
        "problem": {"stages": problem.stages, "devices": problem.devices,
                    "microbatches": problem.microbatches,
                    "placement": list(problem.meta.get("placement",
                                                       range(problem.stages))),
                    "partition": problem.meta.get("partition")},
        "partition": run.extra.get("partition"),
        "measured_step": run.step_time,
        "measured_wall": run.wall_time,
        "simulated_step": sim.makespan,
        "error": run.step_time / sim.makespan - 1.0 if sim.makespan > 0 else float("nan"),
        "measured_peak": measured_peak,
        "simulated_peak": list(sim.peak_memory),
        "measured_bubble": run.records[-1].to_sim_result(schedule, problem).bubble_rate,
        "simulated_bubble": sim.bubble_rate,
        "losses": run.losses,
        "backend": run.backend,
        "processes": run.processes,
    }
