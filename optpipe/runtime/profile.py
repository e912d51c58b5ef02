"""Profiling a real model into a :class:`~optpipe.problem.Problem` the optimizer accepts.

The measurement runs the model through :class:`~optpipe.runtime.runner.OptPipeRunner`
in one process, with a profiling schedule over ``stages`` logical devices (or the
devices of a chunked schedule's placement, below): each stage runs F for a few
microbatches (each followed by an OFFLOAD), then RELOAD+B per microbatch, then the W's.
So every number comes from the same code paths a pipelined step uses:

* F, B, W times: medians over microbatches and repeats of the recorded actions (host
  clock on CPU, CUDA events on a GPU). Stage 0's B is empty and its W is the whole
  backward — that is how the runtime runs stage 0 (see :mod:`optpipe.runtime.stage`).
* fused backward (BW) time, ``backward_fused``: the same, from a second runner on the
  same stage modules whose schedule runs F then one fused BW (a plain autograd
  backward, as any fused-backward schedule runs it) per microbatch; its steps alternate
  with the split profile's, so both see the same machine.
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

Chunked schedules (interleaved 1F1B, ZB-V: ``schedule.placement`` puts several model
stages on one device) are profiled per chunk: ``placement=schedule.placement`` cuts the
model into ``len(placement)`` stages with exactly the partition
:class:`~optpipe.runtime.runner.OptPipeRunner` uses for that schedule, measures every
stage as above and returns the chunked problem directly (one problem stage per model
stage, static bytes and budget per device, ``meta["placement"]``), the same form as
:meth:`Problem.split <optpipe.problem.Problem.split>` gives but with each chunk's own
figures instead of an even share of its device's.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch
from torch import nn

from optpipe.errors import OptPipeError
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule, check_placement

OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 0, "momentum": 1, "none": 0}


def profiling_schedule(stages: int, microbatches: int, offload: bool = True,
                       fused: bool = False, placement: Sequence[int] | None = None
                       ) -> Schedule:
    """Per stage: F(+OFFLOAD) all, then (RELOAD+)B each, then W each.

    One stage per logical device, or with ``placement`` (a chunked schedule's: device of
    each of the ``stages`` stages) each device runs its stages' F's in stage order and
    their B's and W's in reverse order, which no dependency can block; a device count
    equal to the schedule's lets a profile under load run on as many processes as the
    pipeline has ranks. ``fused``: F all, then one fused BW each (no transfers), to time
    the fused backward.
    """
    placement = list(range(stages)) if placement is None else list(placement)
    if len(placement) != stages:
        raise OptPipeError(f"placement {placement} does not have {stages} stages")
    devices = max(placement) + 1
    actions = []
    for d in range(devices):
        mine = [s for s in range(stages) if placement[s] == d]
        acts: list[Action] = []
        if fused:
            for s in mine:
                acts.extend(Action(Op.F, s, m) for m in range(microbatches))
            for s in reversed(mine):
                acts.extend(Action(Op.BW, s, m) for m in range(microbatches))
            actions.append(acts)
            continue
        for s in mine:
            for m in range(microbatches):
                acts.append(Action(Op.F, s, m))
                if offload:
                    acts.append(Action(Op.OFFLOAD, s, m))
        for s in reversed(mine):
            for m in range(microbatches):
                if offload:
                    acts.append(Action(Op.RELOAD, s, m))
                acts.append(Action(Op.B, s, m))
        for s in reversed(mine):
            acts.extend(Action(Op.W, s, m) for m in range(microbatches))
        actions.append(acts)
    name = "profile-fused" if fused else "profile"
    return Schedule(name, stages, devices, microbatches, placement, actions,
                    {"source": "generator", "name": name}).validate()


def static_bytes(modules: Sequence[nn.Module], optimizer: str) -> int:
    """Parameters + gradients + optimizer state of the given modules (each tensor once)."""
    if optimizer not in OPTIMIZER_STATES:
        raise OptPipeError(f"unknown optimizer {optimizer!r}; choose one of "
                           f"{', '.join(OPTIMIZER_STATES)}")
    params = {id(p): p for m in modules for p in m.parameters()}
    size = sum(p.numel() * p.element_size() for p in params.values())
    return size * (2 + OPTIMIZER_STATES[optimizer])


def chunked_problem(problem: Problem, placement: Sequence[int],
                    static: Sequence[int], budget: float | Sequence[float] = float("inf")
                    ) -> Problem:
    """Regroup a problem measured with one stage per logical device onto ``placement``.

    ``problem`` has ``len(placement)`` stages, each measured as its own part of the model;
    the result keeps every per-stage figure (times, bytes) and has ``max(placement) + 1``
    devices with the given per-device ``static`` bytes and ``budget``, and
    ``meta["placement"]``: the form :meth:`Problem.split` gives, with measured chunks. A
    linear placement gives the base problem back with the new static bytes and budget
    (as ``split`` returns the problem itself).
    """
    from dataclasses import replace

    placement = check_placement(placement)
    if len(placement) != problem.stages or problem.chunks != 1:
        raise OptPipeError(f"placement {placement} needs a problem with {len(placement)} "
                           f"stages on as many devices; got {problem.stages} stages on "
                           f"{problem.devices} devices")
    devices = max(placement) + 1
    budgets = ([budget] * devices if isinstance(budget, (int, float)) else list(budget))
    meta = dict(problem.meta)
    if placement != list(range(devices)):
        meta.update(placement=placement, per_chunk=True)
    return replace(problem, devices=devices, static=tuple(int(s) for s in static),
                   budget=tuple(float(b) for b in budgets), meta=meta)


def profile_model(model: nn.Module, loss_fn: Callable[..., torch.Tensor],
                  inputs: torch.Tensor, targets: torch.Tensor, stages: int,
                  microbatches: int, *, partition: Sequence[int] | str | None = None,
                  device: torch.device | str | None = None, optimizer: str = "adam",
                  repeats: int = 3, budget: float | Sequence[float] = float("inf"),
                  p2p: float = 0.0, name: str = "profiled",
                  placement: Sequence[int] | None = None) -> Problem:
    """Measure ``model`` cut into ``stages`` stages; a base Problem (one stage per device).

    ``inputs``/``targets`` hold a few microbatches (batch first; their count is the
    profiling sample, e.g. 4); ``microbatches`` is what the Problem states for the step.

    ``placement`` (a chunked schedule's ``placement``; ``stages`` must be its length):
    the model is cut into those stages with the partition the runner uses for such a
    schedule (``split_model(model, len(placement), partition)``), each stage is measured
    alone, and the result is the chunked problem: ``len(placement)`` stages on
    ``max(placement) + 1`` devices, static bytes per device over all its stages (each
    tensor once, as the runner counts them), ``budget`` per device and
    ``meta["placement"]`` (see :func:`chunked_problem`).
    """
    from optpipe.runtime.runner import OptPipeRunner

    if placement is not None:
        placement = check_placement(placement)
        if len(placement) != stages:
            raise OptPipeError(f"placement {placement} has {len(placement)} stages but "
                               f"the profile is asked for {stages}")

    sample = 4 if inputs.shape[0] % 4 == 0 and inputs.shape[0] >= 4 else inputs.shape[0]
    schedule = profiling_schedule(stages, sample, placement=placement)
    runner = OptPipeRunner(model, schedule, loss_fn, partition=partition, device=device,
                           process_group=None)
    # the fused backward, run by the runtime's own BW path on the same stage modules
    fused_runner = OptPipeRunner(model, profiling_schedule(stages, sample, fused=True,
                                                           placement=placement),
                                 loss_fn, partition=runner.plan.partition,
                                 device=runner.device, process_group=None)
    runner.step(inputs, targets)                       # warm-up: allocator, caches
    fused_runner.step(inputs, targets)
    records = []
    fused_times: list[list[float]] = [[] for _ in range(stages)]
    for _ in range(max(1, repeats)):                   # alternate: same machine state
        runner.step(inputs, targets, record=True)
        records.append(runner.last_record)
        fused_runner.step(inputs, targets, record=True)
        for a in fused_runner.last_record.actions:
            if a.op == "BW":
                fused_times[a.stage].append(a.end - a.start)
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
    if placement is not None:      # per device, set by chunked_problem below
        budgets = [float("inf")] * stages
    else:
        budgets = [budget] * stages if isinstance(budget, (int, float)) else list(budget)
    fused = tuple(statistics.median(v) for v in fused_times)
    problem = Problem(
        stages=stages, microbatches=microbatches,
        forward=tuple(statistics.median(v) for v in per["F"]),
        backward_input=tuple(statistics.median(v) for v in per["B"]),
        backward_weight=tuple(statistics.median(v) for v in per["W"]),
        backward_fused=fused if all(t > 0 for t in fused) else None,   # None: B + W
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
    if placement is None:
        return problem
    # static bytes per device: all its stages' modules, a tensor held by two of them
    # (tied embeddings on the V's first device) once, as the runner's static_bytes counts
    devices = max(placement) + 1
    static = [static_bytes([runner.plan.modules[s] for s in range(stages)
                            if placement[s] == d], optimizer) for d in range(devices)]
    return chunked_problem(problem, placement, static, budget)


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
                         budget=spec["budget"], name=spec["name"],
                         placement=spec.get("placement"))


def profile_gpt(config: Any, stages: int, microbatches: int, *, micro_batch_size: int = 1,
                dtype: str = "float32", device: str = "cpu", optimizer: str = "adam",
                partition: Sequence[int] | str | None = None, repeats: int = 3,
                budget: float = float("inf"), seed: int = 0, processes: int = 1,
                threads: int | None = None, name: str = "profiled",
                placement: Sequence[int] | None = None) -> Problem:
    """Profile the reference GPT; with ``processes > 1``, under load.

    ``processes`` > 1 runs the profiling schedule as one pipeline of that many gloo
    ranks, one per device (so it must equal the device count), and every rank reports
    the same record: each stage is timed while the other ranks compute too, which is
    how fast it runs on a machine whose pipeline ranks share CPU cores. On GPUs (one
    per rank) use 1.

    ``placement``: profile per chunk for a chunked schedule with that placement
    (``stages`` is then ``len(placement)``; see :func:`profile_model`). With
    ``placement=None`` and ``stages`` given, the base problem as before.
    """
    from dataclasses import asdict, replace

    if placement is not None:
        placement = check_placement(placement)
        if stages != len(placement):
            raise OptPipeError(f"placement {placement} has {len(placement)} stages but "
                               f"the profile is asked for {stages}")
    devices = len(set(placement)) if placement is not None else stages
    if processes > 1 and processes != devices:
        raise OptPipeError(f"profiling under load runs one rank per device: "
                           f"{processes} processes for {devices} devices; use "
                           f"{devices} (or 1 for a plain profile)")
    spec = {"config": asdict(config), "stages": stages, "microbatches": microbatches,
            "micro_batch_size": micro_batch_size, "dtype": dtype, "device": device,
            "optimizer": optimizer, "partition": partition, "repeats": repeats,
            "budget": budget, "seed": seed, "name": name, "placement": placement}
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
                     for s in range(first.stages))

    return replace(first, forward=median("forward"), backward_input=median("backward_input"),
                   backward_weight=median("backward_weight"),
                   backward_fused=(median("backward_fused") if all(
                       p.backward_fused is not None for p in problems) else None),
                   d2h_bandwidth=statistics.median(p.d2h_bandwidth for p in problems),
                   h2d_bandwidth=statistics.median(p.h2d_bandwidth for p in problems),
                   meta={**first.meta, "profile_processes": processes})
