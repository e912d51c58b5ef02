"""Profiling a real model into a :class:`~optpipe.problem.Problem` the optimizer accepts.

The measurement runs the model through :class:`~optpipe.runtime.runner.OptPipeRunner`
in one process, with a profiling schedule over ``stages`` logical devices: each stage
runs F for a few microbatches (each followed by an OFFLOAD), then RELOAD+B per
microbatch, then the W's. So every number comes from the same code paths a pipelined
step uses:

* F, B, W times: medians over microbatches and repeats of the recorded actions (host
  clock on CPU, CUDA events on a GPU). Stage 0's B is empty and its W is the whole
  backward — that is how the runtime runs stage 0 (see :mod:`optpipe.runtime.stage`).
* activation bytes per microbatch, bytes freed by B and by W: the runtime's accounting
  of saved tensors (:mod:`optpipe.runtime.activations`) at F, B and W.
* static bytes per device: parameters + gradients + optimizer state (Adam: two
  moments per parameter; SGD with momentum: one; none).
* host-link bandwidth: bytes moved by the profiled OFFLOAD/RELOAD actions over their
  time, i.e. what this runtime achieves including its per-storage overhead.
* p2p latency: given, or measured by a gloo ping-pong of one stage-boundary tensor
  between two processes (:func:`measure_p2p`).

On a GPU ``torch.cuda.max_memory_allocated`` of the profiling steps is kept in
``problem.meta`` next to the accounting, as a cross-check.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch
from torch import nn

from optpipe.errors import OptPipeError
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule

OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 0, "momentum": 1, "none": 0}


def profiling_schedule(stages: int, microbatches: int, offload: bool = True) -> Schedule:
    """One stage per logical device: F(+OFFLOAD) all, then (RELOAD+)B each, then W each."""
    actions = []
    for s in range(stages):
        acts: list[Action] = []
        for m in range(microbatches):
            acts.append(Action(Op.F, s, m))
            if offload:
                acts.append(Action(Op.OFFLOAD, s, m))
        for m in range(microbatches):
            if offload:
                acts.append(Action(Op.RELOAD, s, m))
            acts.append(Action(Op.B, s, m))
        acts.extend(Action(Op.W, s, m) for m in range(microbatches))
        actions.append(acts)
    return Schedule("profile", stages, stages, microbatches, list(range(stages)), actions,
                    {"source": "generator", "name": "profile"}).validate()


def static_bytes(modules: Sequence[nn.Module], optimizer: str) -> int:
    """Parameters + gradients + optimizer state of the given modules (each tensor once)."""
    if optimizer not in OPTIMIZER_STATES:
        raise OptPipeError(f"unknown optimizer {optimizer!r}; choose one of "
                           f"{', '.join(OPTIMIZER_STATES)}")
    params = {id(p): p for m in modules for p in m.parameters()}
    size = sum(p.numel() * p.element_size() for p in params.values())
    return size * (2 + OPTIMIZER_STATES[optimizer])


def profile_model(model: nn.Module, loss_fn: Callable[..., torch.Tensor],
                  inputs: torch.Tensor, targets: torch.Tensor, stages: int,
                  microbatches: int, *, partition: Sequence[int] | str | None = None,
                  device: torch.device | str | None = None, optimizer: str = "adam",
                  repeats: int = 3, budget: float | Sequence[float] = float("inf"),
                  p2p: float = 0.0, name: str = "profiled") -> Problem:
    """Measure ``model`` cut into ``stages`` stages; a base Problem (one stage per device).

    ``inputs``/``targets`` hold a few microbatches (batch first; their count is the
    profiling sample, e.g. 4); ``microbatches`` is what the Problem states for the step.
    """
    from optpipe.runtime.runner import OptPipeRunner

    sample = 4 if inputs.shape[0] % 4 == 0 and inputs.shape[0] >= 4 else inputs.shape[0]
    schedule = profiling_schedule(stages, sample)
    runner = OptPipeRunner(model, schedule, loss_fn, partition=partition, device=device,
                           process_group=None)
    runner.step(inputs, targets)                       # warm-up: allocator, caches
    records = []
    for _ in range(max(1, repeats)):
        runner.step(inputs, targets, record=True)
        records.append(runner.last_record)
    per = {op: [[] for _ in range(stages)] for op in ("F", "B", "W")}
    act: list[list[int]] = [[] for _ in range(stages)]
    freed_b: list[list[int]] = [[] for _ in range(stages)]
    moved = {"OFFLOAD": [0, 0.0], "RELOAD": [0, 0.0]}
    for record in records:
        for a in record.actions:
            if a.op in per:
                per[a.op][a.stage].append(a.end - a.start)
            if a.op == "F":
                act[a.stage].append(a.delta)
            elif a.op == "B":
                freed_b[a.stage].append(-a.delta)
            elif a.op in moved and a.moved:
                moved[a.op][0] += a.moved
                moved[a.op][1] += a.end - a.start
    activation = [max(v) if v else 0 for v in act]
    freed = [min(max(v) if v else 0, activation[s]) for s, v in enumerate(freed_b)]
    bandwidth = {op: (b / t if t > 0 and b > 0 else None) for op, (b, t) in moved.items()}
    fallback = measure_host_bandwidth(runner.device)
    cuda_peak = max(r.cuda_peak[0] for r in records) if runner.device.type == "cuda" else 0
    static = [static_bytes([runner.plan.modules[s]], optimizer) for s in range(stages)]
    budgets = [budget] * stages if isinstance(budget, (int, float)) else list(budget)
    return Problem(
        stages=stages, microbatches=microbatches,
        forward=tuple(statistics.median(v) for v in per["F"]),
        backward_input=tuple(statistics.median(v) for v in per["B"]),
        backward_weight=tuple(statistics.median(v) for v in per["W"]),
        activation=tuple(activation), freed_by_b=tuple(freed),
        freed_by_w=tuple(a - f for a, f in zip(activation, freed)),
        static=tuple(static), budget=tuple(float(b) for b in budgets), p2p=p2p,
        d2h_bandwidth=bandwidth["OFFLOAD"] or fallback[0],
        h2d_bandwidth=bandwidth["RELOAD"] or fallback[1],
        name=name,
        meta={"profiled": True, "partition": runner.plan.partition,
              "device": str(runner.device), "sample_microbatches": sample,
              "repeats": repeats, "optimizer": optimizer, "cuda_peak": cuda_peak,
              "boundary_bytes": boundary_bytes(
                  runner.plan.modules, inputs[:inputs.shape[0] // sample].to(runner.device))})


def boundary_bytes(modules: Sequence[nn.Module], microbatch: torch.Tensor) -> int:
    """Bytes of the largest stage-boundary tensor of one microbatch (what p2p moves).

    One no-grad pass in eval mode with the RNG state restored, so nothing the training
    run sees changes.
    """
    sizes = [0]
    modes = [(m, m.training) for module in modules for m in module.modules()]
    devices = [microbatch.device] if microbatch.device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            x = microbatch
            for module in modules[:-1]:
                module.eval()
                x = module(x)
                sizes.append(x.numel() * x.element_size())
    finally:
        for m, mode in modes:
            m.training = mode
    return max(sizes)


def measure_host_bandwidth(device: torch.device, nbytes: int = 32 << 20) -> tuple[float, float]:
    """(device-to-host, host-to-device) bytes/s of one large copy (pinned on CUDA)."""
    device = torch.device(device)
    if device.type == "cuda":
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        out = []
        for a, b in ((host, src), (src, host)):
            a.copy_(b, non_blocking=True)
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a.copy_(b, non_blocking=True)
            end.record()
            torch.cuda.synchronize(device)
            out.append(nbytes / (start.elapsed_time(end) / 1e3))
        return out[0], out[1]
    a = torch.empty(nbytes, dtype=torch.uint8)
    b = torch.empty(nbytes, dtype=torch.uint8)
    a.copy_(b)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        a.copy_(b)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best, nbytes / best


def _ping_pong(rank: int, world: int, nbytes: int, rounds: int) -> float:
    import torch.distributed as dist

    tensor = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)
    peer = 1 - rank
    times = []
    for i in range(rounds + 2):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(tensor, peer)
            dist.recv(tensor, peer)
        else:
            dist.recv(tensor, peer)
            dist.send(tensor, peer)
        if i >= 2:
            times.append((time.perf_counter() - t0) / 2)
    return statistics.median(times)


def measure_p2p(nbytes: int, rounds: int = 20) -> float:
    """One-way seconds to move ``nbytes`` between two gloo processes on this machine."""
    from optpipe.runtime.launch import run_workers

    return float(run_workers(_ping_pong, 2, nbytes, rounds, backend="gloo", threads=1)[0])


# ------------------------------------------------------------- the GPT, as the CLI runs it
def _gpt_profile(rank: Any, world: int, spec: dict[str, Any]) -> Problem:
    from optpipe.runtime.measure import parse_dtype
    from optpipe.runtime.model_gpt import GPT, GPTConfig, gpt_batch, gpt_loss

    config = GPTConfig(**spec["config"])
    torch.manual_seed(spec["seed"])
    model = GPT(config).to(parse_dtype(spec["dtype"]))
    x, y = gpt_batch(config, 4 * spec["micro_batch_size"], seed=spec["seed"])
    return profile_model(model, gpt_loss, x, y, spec["stages"], spec["microbatches"],
                         partition=spec["partition"], device=spec["device"],
                         optimizer=spec["optimizer"], repeats=spec["repeats"],
                         budget=spec["budget"], name=spec["name"])


def profile_gpt(config: Any, stages: int, microbatches: int, *, micro_batch_size: int = 1,
                dtype: str = "float32", device: str = "cpu", optimizer: str = "adam",
                partition: Sequence[int] | str | None = None, repeats: int = 3,
                budget: float = float("inf"), seed: int = 0, processes: int = 1,
                threads: int | None = None, name: str = "profiled") -> Problem:
    """Profile the reference GPT; with ``processes > 1``, under load.

    ``processes`` copies of the profile run at the same time, each in its own process,
    and each stage's times are the median over them: on a machine whose pipeline ranks
    share CPU cores (gloo on a small CPU box), that is how fast a stage runs while the
    other ranks compute too. On GPUs (one per rank) use 1.
    """
    from dataclasses import asdict, replace

    spec = {"config": asdict(config), "stages": stages, "microbatches": microbatches,
            "micro_batch_size": micro_batch_size, "dtype": dtype, "device": device,
            "optimizer": optimizer, "partition": partition, "repeats": repeats,
            "budget": budget, "seed": seed, "name": name}
    if processes <= 1:
        previous = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        try:
            return _gpt_profile(None, 1, spec)
        finally:
            torch.set_num_threads(previous)
    from optpipe.runtime.launch import run_workers

    problems = run_workers(_gpt_profile, processes, spec, backend="gloo", threads=threads)
    first = problems[0]

    def median(key: str) -> tuple[float, ...]:
        return tuple(statistics.median(getattr(p, key)[s] for p in problems)
                     for s in range(stages))

    return replace(first, forward=median("forward"), backward_input=median("backward_input"),
                   backward_weight=median("backward_weight"),
                   d2h_bandwidth=statistics.median(p.d2h_bandwidth for p in problems),
                   h2d_bandwidth=statistics.median(p.h2d_bandwidth for p in problems),
                   meta={**first.meta, "profile_processes": processes})
