"""Checking the runtime against plain PyTorch: pipelined gradients vs ``loss.backward()``.

:func:`verify_worker` builds a model, computes the non-pipelined reference (the whole
batch through the whole model, one ``backward``), then runs every requested schedule
with :class:`~optpipe.runtime.runner.OptPipeRunner` and reports per schedule the loss
difference, the largest gradient difference over this rank's parameters, whatever
saved activations were left after the step (there must be none) and, for schedules
with OFFLOAD, whether each offloaded microbatch really left the device (its storages
were empty when its RELOAD came). It runs in one process (``rank=None``) or as the
worker of :func:`optpipe.runtime.launch.run_workers`; the tests use both.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Sequence

import torch

from optpipe.problem import Problem, uniform_problem
from optpipe.schedule import Action, Op, Schedule

MODELS = ("gpt", "mlp")


def with_offload(schedule: Schedule, fraction: float = 1.0, wait: bool = False) -> Schedule:
    """``schedule`` with every non-last stage's activations offloaded after F.

    OFFLOAD follows each F at once and RELOAD comes right before the backward that
    needs it: the most memory a schedule can move, a hard case for ordering. ``wait``:
    each OFFLOAD holds its device back until the copy has ended.
    """
    last = schedule.stages - 1
    actions = []
    for acts in schedule.actions:
        out: list[Action] = []
        for a in acts:
            if a.op in (Op.B, Op.BW) and a.stage != last:
                out.append(Action(Op.RELOAD, a.stage, a.microbatch, fraction))
            out.append(a)
            if a.op is Op.F and a.stage != last:
                out.append(Action(Op.OFFLOAD, a.stage, a.microbatch, fraction, wait=wait))
        actions.append(out)
    tag = ("" if fraction == 1.0 else f"x{fraction:g}") + ("-wait" if wait else "")
    return Schedule(f"{schedule.name}+offload{tag}", schedule.stages, schedule.devices,
                    schedule.microbatches, list(schedule.placement), actions,
                    {**schedule.provenance, "offload": fraction}).validate()


def verification_schedules(devices: int, microbatches: int,
                   names: Sequence[str] | None = None) -> list[Schedule]:
    """Every generator's schedule plus offload variants, for a uniform problem."""
    from optpipe.generators import GENERATORS, applicable, generate

    problem = uniform_problem(devices, microbatches)
    schedules = []
    for name in names or GENERATORS:
        if applicable(name, problem) is True:
            schedules.append(generate(name, problem))
    if names is None:
        tight = problem.activation_budget(1.5)
        offloading = generate("pipeoffload", tight)
        if offloading.offloads:
            offloading.name = "pipeoffload(tight)"
            schedules.append(offloading)
        schedules.append(with_offload(generate("1f1b", problem)))
        schedules.append(with_offload(generate("zb-h1", problem), 0.5))
        schedules.append(with_offload(generate("1f1b", problem), wait=True))
        schedules += _offloaded_list_schedules(tight)
    return schedules


def _offloaded_list_schedules(tight: Problem) -> list[Schedule]:
    """The optimizer's offloaded list schedules on both chunked placements (what
    ``optpipe solve`` returns at tight budgets with offload: chunks *and* transfers),
    the first that offloads on each, named ``offloaded-list-<placement>(tight)``."""
    from optpipe.optimizer.offload_starts import offloaded_list_schedules
    from optpipe.schedule import interleaved_placement, v_placement

    out = []
    for label, place in (("interleaved", interleaved_placement(tight.devices, 2)),
                         ("v", v_placement(tight.devices))):
        made = [s for s in offloaded_list_schedules(tight, place) if s.offloads]
        if made:
            out.append(replace(made[0], name=f"offloaded-list-{label}(tight)"))
    return out


def build_case(kind: str, stages: int, batch: int, dtype: torch.dtype = torch.float64,
               seed: int = 0) -> tuple[torch.nn.Module, Any, torch.Tensor, torch.Tensor]:
    """A reference model with at least one block per stage, its loss and a batch."""
    if kind == "gpt":
        from optpipe.runtime.model_gpt import GPT, GPTConfig, gpt_batch, gpt_loss

        config = GPTConfig.from_preset("tiny-gpt", layers=max(4, stages), hidden=32,
                                       ffn_hidden=64, heads=2, vocab=64, seq_len=8)
        torch.manual_seed(seed)
        model = GPT(config).to(dtype)
        x, y = gpt_batch(config, batch, seed=seed)
        return model, gpt_loss, x, y
    if kind == "mlp":
        from optpipe.runtime.model_mlp import mlp_batch, mlp_model, mse_loss

        model = mlp_model(depth=max(4, stages), seed=seed).to(dtype)
        x, y = mlp_batch(batch, seed=seed, dtype=dtype)
        return model, mse_loss, x, y
    raise ValueError(f"unknown model kind {kind!r}; known: {MODELS}")


def verify_worker(rank: int | None, world: int, microbatches: int = 4,
                  models: Sequence[str] = MODELS, names: Sequence[str] | None = None,
                  timeout: float = 60.0, device: str = "cpu") -> list[dict[str, Any]]:
    """Run each schedule on each model and compare with the non-pipelined reference.

    ``device`` is where the pipeline runs (``cuda`` exercises the side-stream offload);
    the reference always runs on the CPU in float64.
    """
    from optpipe.runtime.runner import OptPipeRunner

    schedules = verification_schedules(world, microbatches, names)
    reports = []
    for kind in models:
        stages = max(s.stages for s in schedules)
        model, loss_fn, x, y = build_case(kind, stages, batch=2 * microbatches)
        reference = copy.deepcopy(model)
        ref_loss = loss_fn(reference(x), y)
        ref_loss.backward()
        ref_grads = {name: p.grad for name, p in reference.named_parameters()}
        for schedule in schedules:
            runner = OptPipeRunner(model, schedule, loss_fn, timeout=timeout, device=device)
            loss = runner.step(x, y, record=True)
            diff = max((p.grad.cpu() - ref_grads[name]).abs().max().item()
                       for name, p in runner.named_parameters())
            record = runner.last_record
            offloads = [a for a in record.actions if a.op == "OFFLOAD"
                        and (rank is None or a.device == rank)]
            reloads = {(a.stage, a.microbatch): a for a in record.actions if a.op == "RELOAD"}
            moved_all = all(a.moved > 0 for a in offloads)
            full = [a for a in offloads if a.fraction == 1.0]
            emptied = all(reloads[(a.stage, a.microbatch)].left == 0 for a in full)
            partial = [a for a in offloads if a.fraction < 1.0]
            kept_part = all(0 <= reloads[(a.stage, a.microbatch)].left for a in partial)
            reports.append({
                "rank": rank, "model": kind, "schedule": schedule.name,
                "loss_diff": abs(loss - ref_loss.item()), "grad_diff": diff,
                "params": sum(1 for _ in runner.parameters()),
                "leftover": dict(runner.leftover), "offloads": len(offloads),
                "offload_moved": moved_all, "offload_emptied": emptied and kept_part,
                "peak": record.peak_activation, "makespan": record.makespan,
            })
    return reports
