"""``optpipe profile`` and ``optpipe run``: measure a real model, run a schedule on it.

``optpipe profile --model tiny-gpt --stages 4 --microbatches 8 -o problem.toml`` builds
the reference GPT from a model preset, measures each stage (F, B, W times, kept bytes,
bytes freed by B and W, static bytes, host-link bandwidth, p2p latency) and writes a
problem file every other command accepts.

``optpipe run --model tiny-gpt --schedule 1f1b --stages 4 --steps 3`` starts one
process per device on this machine (gloo on CPU, NCCL with a GPU per device), trains a
few steps with the schedule, and prints the measured step time and peak memory next
to the simulator's prediction on the profiled problem (``--problem FILE`` to reuse a
profile). ``--gantt FILE`` draws the measured step. A chunked schedule (interleaved,
V) is predicted on the model measured in the schedule's cut, with the partition the
runner uses for it: the problem file's ``[[chunked]]`` profile of that placement
(``optpipe profile`` writes the V shape's and interleaved 2 chunks'), or a profile
taken now. Only a file without one splits each device's figures evenly, and the
output says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from optpipe.errors import OptPipeError
from optpipe.units import format_bytes, format_seconds, parse_budget_flag, parse_seconds


def register(subparsers: Any) -> None:
    """Add the ``profile`` and ``run`` subcommands to the ``optpipe`` parser."""
    from optpipe.cli_common import add_schedule_args

    p = subparsers.add_parser(
        "profile", help="measure a real model's stages into a problem file",
        description="Build the reference GPT from a model preset, measure every stage with "
                    "the runtime and write a problem file (TOML) the optimizer accepts.")
    _model_args(p)
    p.add_argument("--repeats", type=int, default=3, help="recorded profiling steps (default 3)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="problem file to write (default: print the TOML)")
    p.add_argument("--no-chunks", action="store_true",
                   help="measure only one stage per device, not also the V-shape and "
                        "interleaved cuts (the optimizer then splits each device's figures "
                        "evenly for those placements, which misjudges uneven models)")
    p.set_defaults(func=_profile)

    p = subparsers.add_parser(
        "run", help="run a schedule on real processes; measured vs simulated",
        description="Train the reference GPT with a schedule on one process per device and "
                    "compare the measured step time and peak memory with the simulator's "
                    "prediction on the profiled problem.")
    _model_args(p, from_files=True)
    add_schedule_args(p, positional=True)
    p.add_argument("--problem", metavar="FILE",
                   help="a profiled problem file to predict with (default: profile now)")
    p.add_argument("--steps", type=int, default=3, help="recorded training steps (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="unrecorded first steps (default 1)")
    p.add_argument("--single-process", action="store_true",
                   help="run every stage in this process (debugging, one GPU)")
    p.add_argument("--timeout", metavar="TIME", default="300s",
                   help="longest wait for a peer before failing (default 300s)")
    p.add_argument("--gantt", metavar="FILE", help="draw the measured step (PNG, SVG or PDF)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run)


#: ``--stages`` and ``--microbatches`` when neither they nor a file give them.
DEFAULT_STAGES, DEFAULT_MICROBATCHES = 4, 8


def _model_args(p: argparse.ArgumentParser, from_files: bool = False) -> None:
    """The model and pipeline options; ``from_files`` (``run``): ``--stages`` and
    ``--microbatches`` default to a schedule or problem file's (see :func:`_fill_pipeline`)."""
    group = p.add_argument_group("model and pipeline")
    group.add_argument("--model", default="tiny-gpt",
                       help="model preset name or .toml path (default tiny-gpt)")
    group.add_argument("--layers", type=int, help="override the preset's layer count")
    files = ", or the schedule (else problem) file's" if from_files else ""
    group.add_argument("--stages", type=int, default=None if from_files else DEFAULT_STAGES,
                       help=f"pipeline stages = devices = processes (default "
                            f"{DEFAULT_STAGES}{files})")
    group.add_argument("--microbatches", type=int,
                       default=None if from_files else DEFAULT_MICROBATCHES,
                       help=f"microbatches per step (default {DEFAULT_MICROBATCHES}{files})")
    group.add_argument("--micro-batch-size", type=int, default=1,
                       help="sequences per microbatch (default 1)")
    group.add_argument("--seq-len", type=int, help="sequence length (default: the preset's)")
    group.add_argument("--dtype", default="float32", help="float32 (default), float64, bfloat16")
    group.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    group.add_argument("--partition",
                       help="blocks per stage, e.g. 2,2,2,2 (default: balanced); for a "
                            "chunked schedule one count per schedule stage")
    group.add_argument("--optimizer", default="adam",
                       help="adam (default), adamw, sgd, momentum or none: sets static bytes")
    group.add_argument("--mem", metavar="BYTES", help="budget per device for the problem file")
    group.add_argument("--p2p", metavar="TIME", default="auto",
                       help="p2p latency for the problem: 'auto' measures a gloo ping-pong of "
                            "one boundary tensor (default), or e.g. 0.1ms")
    group.add_argument("--threads", type=int,
                       help="torch threads per process (default: CPU cores / stages)")
    group.add_argument("--seed", type=int, default=0, help="model and data seed (default 0)")
    group.add_argument("--profile-processes", type=int, default=1, metavar="N",
                       help="profile as a pipeline of N gloo ranks, one per device (N = "
                            "devices): stage times under load, for ranks that share CPU "
                            "cores (default 1: a plain profile in one process)")


# ------------------------------------------------------------------- helpers
def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise OptPipeError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


def _config(args: argparse.Namespace) -> Any:
    from optpipe.runtime.model_gpt import GPTConfig

    overrides: dict[str, Any] = {}
    if args.layers is not None:
        overrides["layers"] = args.layers
    if args.seq_len is not None:
        overrides["seq_len"] = args.seq_len
    return GPTConfig.from_preset(args.model, **overrides)


def _partition(args: argparse.Namespace) -> list[int] | str | None:
    if not args.partition:
        return None
    if args.partition in ("compute", "params"):
        return args.partition
    try:
        return [int(x) for x in args.partition.split(",")]
    except ValueError:
        raise OptPipeError(f"--partition {args.partition!r} is not a list of block counts "
                           f"like 2,2,2,2") from None


def _device(args: argparse.Namespace) -> str:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        raise OptPipeError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise OptPipeError("--device cuda but torch sees no GPU; use --device cpu")
    return device


def _threads(args: argparse.Namespace, processes: int) -> int:
    return args.threads or max(1, (os.cpu_count() or 1) // max(1, processes))


def _p2p(args: argparse.Namespace, boundary: int, device: str) -> float:
    if args.p2p != "auto":
        return parse_seconds(args.p2p, "--p2p")
    if args.stages < 2 or device != "cpu":
        return 0.0
    from optpipe.runtime.profile import measure_p2p

    return measure_p2p(boundary)


_FROM_ARGS = object()
#: Generators whose schedule may put several stages on a device.
CHUNKED_GENERATORS = ("zb-auto", "zb-v", "interleaved-1f1b")


def profile_from_args(args: argparse.Namespace, placement: list[int] | None = None,
                      partition: Any = _FROM_ARGS, p2p: float | None = None,
                      chunks: bool = False) -> Any:
    """Profile the model the options describe; the problem (base: one stage per device).

    ``placement`` (a chunked schedule's): profile the model cut into the schedule's
    stages, with the partition the runner uses for it, into the chunked problem
    (``profile_model(placement=...)``). ``partition`` overrides ``--partition``;
    ``p2p`` (seconds) skips measuring the latency again. ``chunks``: also measure the
    model cut for the V shape and interleaved 2 chunks into the base problem's
    ``chunk_profiles`` (:func:`_chunk_profiles`).
    """
    from optpipe.runtime.measure import parse_dtype
    from optpipe.runtime.profile import profile_gpt

    _positive(args, "stages", "microbatches", "micro_batch_size", "layers", "seq_len",
              "profile_processes")
    config = _config(args)
    device = _device(args)
    parse_dtype(args.dtype)
    budget = parse_budget_flag(args.mem, "--mem") if args.mem else float("inf")
    processes = args.profile_processes
    problem = profile_gpt(config, len(placement) if placement else args.stages,
                          args.microbatches,
                          micro_batch_size=args.micro_batch_size, dtype=args.dtype,
                          device=device, optimizer=args.optimizer,
                          partition=_partition(args) if partition is _FROM_ARGS else partition,
                          repeats=getattr(args, "repeats", 3),
                          budget=budget, seed=args.seed, processes=processes,
                          threads=_threads(args, max(processes, args.stages)),
                          name=f"{Path(args.model).stem}-profiled", placement=placement)
    if p2p is None:
        p2p = _p2p(args, problem.meta["boundary_bytes"], device)
    meta = {**problem.meta, "model": args.model, "dtype": args.dtype,
            "micro_batch_size": args.micro_batch_size, "seq_len": config.seq_len,
            "layers": config.layers}
    problem = replace(problem, p2p=p2p, meta=meta)
    if chunks and placement is None:
        problem = replace(problem, chunk_profiles=_chunk_profiles(args, problem))
    return problem


def _chunk_profiles(args: argparse.Namespace, base: Any) -> tuple:
    """The model measured in the cuts of the chunked placements the optimizer searches.

    Why: they regroup the model (the V shape puts the output head next to the
    embedding), so an even split of the one-stage-per-device profile misjudges them; a
    schedule solved on that went over its budget on a GPU (docs/gpu.md). Each cut uses
    the partition the runner uses for it. A model with too few blocks for a cut skips it
    (the optimizer then splits evenly there, as before).
    """
    from optpipe.problem import ChunkProfile
    from optpipe.schedule import searched_placements

    profiles = []
    for name, placement in searched_placements(base.devices).items():
        if name == "linear":         # the base problem itself
            continue
        try:
            chunked = profile_from_args(args, placement=placement, partition=None,
                                        p2p=base.p2p)
        except OptPipeError:         # fewer blocks than the cut has stages
            continue
        profiles.append(ChunkProfile.from_problem(chunked))
    return tuple(profiles)


# ------------------------------------------------------------------ commands
def _profile(args: argparse.Namespace) -> int:
    from optpipe.problem import problem_to_toml

    problem = profile_from_args(args, chunks=not args.no_chunks)
    text = (f"# measured by `optpipe profile` on {problem.meta['device']}: model "
            f"{args.model}, {args.dtype}, micro-batch size {args.micro_batch_size}, "
            f"partition {problem.meta['partition']}\n" + problem_to_toml(problem))
    if args.output:
        Path(args.output).write_text(text)
        fused = ("" if problem.backward_fused is None
                 else f"BW {_ms(problem.backward_fused)}, ")
        print(f"wrote {args.output}  (F {_ms(problem.forward)}, B {_ms(problem.backward_input)}, "
              f"W {_ms(problem.backward_weight)}, {fused}activation "
              f"{', '.join(format_bytes(a) for a in problem.activation)} per microbatch)")
        print(_cuts_line(problem, args))
    else:
        sys.stdout.write(text)
    return 0


def _cuts_line(problem: Any, args: argparse.Namespace) -> str:
    """Which chunked cuts the file holds, and why any is missing: without one, the
    optimizer splits each device's figures evenly for that placement (an estimate)."""
    if args.no_chunks:
        return ("chunked cuts: not measured (--no-chunks); chunked placements will be "
                "judged on an even split of each device's figures")
    from optpipe.schedule import v_placement

    measured = [("V shape" if list(c.placement) == v_placement(problem.devices) else
                 "interleaved x2") for c in problem.chunk_profiles]
    if len(measured) == 2:
        return "chunked cuts: V shape and interleaved x2 measured ([[chunked]])"
    if problem.devices < 2:
        return "chunked cuts: none (one device)"
    return (f"chunked cuts: {', '.join(measured) or 'none'} measured; the model has too few "
            f"blocks for {2 * problem.devices} stages, so chunked placements will be judged "
            f"on an even split of each device's figures (use --layers to deepen it)")


def _ms(values: Any) -> str:
    return "/".join(f"{v * 1e3:.2f}" for v in values) + " ms"


def _fill_pipeline(args: argparse.Namespace) -> None:
    """``--stages`` and ``--microbatches`` not given: the schedule file's (devices and
    microbatches), else the problem file's, else 4 and 8.

    Why: a schedule file fixes both, so ``optpipe run --schedule optpipe-schedule.json``
    (32 microbatches from ``optpipe solve``) should run it as it is, not fail against
    a default of 8 microbatches the user never asked for.
    """
    from optpipe.cli_common import schedule_source
    from optpipe.generators import GENERATORS
    from optpipe.problem import load_problem
    from optpipe.schedule import load_schedule

    if args.stages is not None and args.microbatches is not None:
        return
    given: tuple[int, int] | None = None
    source = schedule_source(args)
    if source is not None and source not in GENERATORS:
        try:
            schedule = load_schedule(source)
            given = (schedule.devices, schedule.microbatches)
        except OptPipeError:
            pass                     # reported with the usual message when it is used
    if given is None and args.problem:
        problem = load_problem(args.problem)
        given = (problem.devices, problem.microbatches)
    stages, microbatches = given or (DEFAULT_STAGES, DEFAULT_MICROBATCHES)
    args.stages = stages if args.stages is None else args.stages
    args.microbatches = microbatches if args.microbatches is None else args.microbatches


def _run(args: argparse.Namespace) -> int:
    from optpipe.cli_common import schedule_from_args, schedule_source
    from optpipe.problem import load_problem
    from optpipe.runtime.measure import RunSpec, compare, is_chunked, measure_schedule

    _fill_pipeline(args)
    _positive(args, "stages", "microbatches", "micro_batch_size", "steps", "layers", "seq_len")
    if args.warmup < 0:
        raise OptPipeError(f"--warmup must not be negative, got {args.warmup}")
    config = _config(args)
    device = _device(args)
    partition = _partition(args)
    if args.problem:
        problem = load_problem(args.problem)
        if problem.stages != args.stages or problem.chunks != 1:
            raise OptPipeError(f"problem file {args.problem!r} has {problem.stages} stages but "
                               f"--stages is {args.stages}; profile again or fix --stages")
        if problem.microbatches != args.microbatches:
            problem = replace(problem, microbatches=args.microbatches)
        schedule = schedule_from_args(args, problem)
        measured = problem.chunk_profile(schedule.placement) if is_chunked(schedule) else None
        if measured is not None and measured.partition is not None and partition is None:
            partition = list(measured.partition)     # run the cut that was measured
    else:
        # the base profile (one stage per device) generates the schedule; a --partition
        # with one count per chunk of a chunked schedule applies to the chunk profile only
        per_device = not isinstance(partition, list) or len(partition) == args.stages
        # a schedule that may use chunks is generated on measured chunks (zb-auto
        # chooses among placements by them)
        chunks = partition is None and schedule_source(args) in CHUNKED_GENERATORS
        base = profile_from_args(args, partition=partition if per_device else None,
                                 chunks=chunks)
        schedule = schedule_from_args(args, base)
        if is_chunked(schedule) and base.chunk_profile(schedule.placement) is not None:
            problem = base.split(list(schedule.placement))   # measured just now
        elif is_chunked(schedule):
            # every chunk measured: the model cut into the schedule's stages exactly as
            # the runner will cut it, instead of an even split of the base profile
            problem = profile_from_args(args, placement=list(schedule.placement),
                                        partition=partition, p2p=base.p2p)
        elif not per_device:
            raise OptPipeError(f"--partition {args.partition} lists {len(partition)} stages "
                               f"but schedule '{schedule.name}' has {schedule.stages}; give "
                               f"one block count per stage")
        else:
            problem = base
        partition = problem.meta["partition"]       # the profiled cut, for the runner
    timeout = parse_seconds(args.timeout, "--timeout")
    spec = RunSpec(config=asdict(config), schedule=schedule.to_dict(),
                   micro_batch_size=args.micro_batch_size, steps=args.steps,
                   warmup=args.warmup, dtype=args.dtype, seed=args.seed,
                   optimizer=args.optimizer, partition=partition, timeout=timeout,
                   device=device)
    run = measure_schedule(spec, single_process=args.single_process,
                           threads=_threads(args, 1 if args.single_process else args.stages))
    figures = compare(run, schedule, problem)
    if args.gantt:
        from optpipe.viz.gantt import plot_gantt

        from dataclasses import replace

        # the run's static bytes include the optimizer state, as the table's peaks do
        record = replace(run.records[-1], static=list(run.static))
        result = record.to_sim_result(schedule, problem)
        plot_gantt(result, args.gantt, title=f"{schedule.name}: measured step "
                                             f"({run.backend}, {run.processes} processes)")
    if args.json:
        json.dump(figures, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        _print(figures, schedule, problem, args)
        if args.gantt:
            print(f"wrote {args.gantt}")
    return 0


def _print(figures: dict[str, Any], schedule: Any, problem: Any,
           args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=100)
    plural = "es" if figures["processes"] > 1 else ""
    console.print(f"{schedule.name} on {args.model}: {schedule.devices} devices, "
                  f"{schedule.stages} stages, {schedule.microbatches} microbatches; "
                  f"{figures['backend']}, {figures['processes']} process{plural}")
    table = Table(title="measured vs planned")
    table.add_column("")
    table.add_column("measured", justify="right")
    table.add_column("simulated (profiled problem)", justify="right")
    table.add_column("difference", justify="right")
    table.add_row("step time", format_seconds(figures["measured_step"]),
                  format_seconds(figures["simulated_step"]), f"{figures['error']:+.1%}")
    table.add_row("bubble rate", f"{figures['measured_bubble']:.1%}",
                  f"{figures['simulated_bubble']:.1%}", "")
    for d, (m, s) in enumerate(zip(figures["measured_peak"], figures["simulated_peak"])):
        table.add_row(f"device {d} peak", format_bytes(m), format_bytes(s),
                      f"{m / s - 1:+.1%}" if s else "")
    console.print(table)
    if figures["prediction"] == "per-chunk profile":
        console.print(f"predicted per chunk: the model profiled in the schedule's "
                      f"{schedule.stages} stages (placement {list(schedule.placement)}), "
                      f"as the runner cuts it")
    elif figures["prediction"] == "even split":
        console.print(f"note: chunk times are an even split: the problem has one stage per "
                      f"device, so each of the schedule's {schedule.stages} chunks is "
                      f"predicted with 1/{schedule.stages // schedule.devices} of its "
                      f"device's times and bytes (Problem.split), not measured per chunk; "
                      f"run without --problem to profile every chunk")
    losses = ", ".join(f"{x:.4f}" for x in figures["losses"] if x is not None)
    console.print(f"losses per step: {losses}")
    console.print(f"wall time in step() (slowest rank, median): "
                  f"{format_seconds(figures['measured_wall'])}")
