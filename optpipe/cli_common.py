"""Options and output shared by every ``optpipe`` subcommand.

Every command that needs a problem takes it the same way: ``--problem FILE``, or presets
(``--model``, ``--hardware``, ``--stages``, ``--microbatches``, ...), with ``--mem`` as the
per-device budget either way. Every command that needs a schedule takes ``--schedule``
as a generator name or a schedule file. Keeping this in one module is what makes the
commands behave alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from optpipe.errors import OptPipeError
from optpipe.problem import Problem, load_problem, problem_from_dict
from optpipe.schedule import Schedule, load_schedule
from optpipe.simulator import SimResult
from optpipe.units import format_bytes, format_seconds, parse_budget_flag, parse_seconds


def add_problem_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--problem`` / preset options and ``--mem`` to a subcommand."""
    group = parser.add_argument_group("problem (a file, or presets)")
    describing: list[argparse.Action] = []

    def describe(*names: str, **options: Any) -> None:
        describing.append(group.add_argument(*names, **options))

    describe("--problem", metavar="FILE",
             help="problem file (.toml or .json); see the README for its schema")
    describe("--model", help="model preset (see `optpipe presets`), "
                            "default: the cost model's default")
    describe("--hardware", help="hardware preset, e.g. h100-80gb")
    describe("--stages", type=int, help="pipeline stages = devices (default 8)")
    describe("--microbatches", type=int, help="microbatches per step")
    describe("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    describe("--dp", type=int, default=1,
             help="data-parallel degree, for the sharded optimizer (default 1)")
    describe("--micro-batch-size", type=int, default=1,
             help="sequences per microbatch (default 1)")
    describe("--seq-len", type=int, help="sequence length (default: the model's)")
    describe("--recompute", action="store_true",
             help="full activation recomputation")
    describe("--sharded-optimizer", action="store_true",
             help="shard optimizer state over --dp ranks (ZeRO-1)")
    describe("--no-flash-attention", action="store_true",
             help="count the attention score matrices in activations")
    group.add_argument("--mem", metavar="BYTES",
                       help="memory budget per device, e.g. 80GB or 75GiB "
                            "(default: the hardware's memory, or the file's budget)")
    group.add_argument("--p2p", metavar="TIME", help="override the p2p latency, e.g. 0.1ms")
    # what problem_given compares with: the options that describe a problem, each at
    # its default (--mem and --p2p only adjust one)
    parser.set_defaults(problem_options={a.dest: a.default for a in describing})


def problem_from_args(args: argparse.Namespace) -> Problem:
    """The problem the options describe; every mistake is one :class:`OptPipeError` line."""
    budget = _budget_from_args(args)
    if getattr(args, "problem", None):
        preset_flags = [f for f in ("model", "hardware", "seq_len") if getattr(args, f, None)]
        if preset_flags:
            raise OptPipeError(f"--problem cannot be combined with --{preset_flags[0].replace('_', '-')}; "
                               f"choose a problem file or presets")
        problem = load_problem(args.problem)
        if args.stages is not None and args.stages != problem.stages:
            raise OptPipeError(f"--stages {args.stages} disagrees with the problem file's "
                               f"{problem.stages} stages; drop --stages")
        if args.microbatches is not None and args.microbatches != problem.microbatches:
            from dataclasses import replace
            problem = replace(problem, microbatches=args.microbatches)
    else:
        from optpipe import costmodel

        stages = args.stages if args.stages is not None else 8
        if stages < 1:
            raise OptPipeError(f"--stages must be at least 1, got {stages}")
        problem = costmodel.build_problem(
            args.model or costmodel.DEFAULT_MODEL,
            args.hardware or costmodel.DEFAULT_HARDWARE,
            stages=stages,
            microbatches=(args.microbatches if args.microbatches is not None
                          else costmodel.DEFAULT_MICROBATCHES),
            tp=args.tp, dp=args.dp, micro_batch_size=args.micro_batch_size,
            seq_len=args.seq_len,
            recompute=args.recompute, sharded_optimizer=args.sharded_optimizer,
            flash_attention=not args.no_flash_attention)
    return _adjusted(problem, budget, args)


def _budget_from_args(args: argparse.Namespace) -> float | None:
    """``--mem`` in bytes, or None when not given."""
    budget = parse_budget_flag(args.mem, "--mem") if getattr(args, "mem", None) else None
    if budget is not None and budget <= 0:
        raise OptPipeError("--mem must be positive, e.g. --mem 80GB")
    return budget


def _adjusted(problem: Problem, budget: float | None, args: argparse.Namespace) -> Problem:
    """``problem`` with ``--mem`` (parsed: ``budget``) and ``--p2p`` applied."""
    if budget is not None:
        problem = problem.with_budget(budget)
    if getattr(args, "p2p", None):
        from dataclasses import replace
        problem = replace(problem, p2p=parse_seconds(args.p2p, "--p2p"))
    return problem


def problem_given(args: argparse.Namespace) -> bool:
    """Did the command line describe a problem (a file or any preset option)? A command
    without the problem options (:func:`add_problem_args`) describes its problem its own
    way: always."""
    options = getattr(args, "problem_options", None)
    if options is None:
        return True
    return any(getattr(args, dest) != default for dest, default in options.items())


def problem_and_schedule(args: argparse.Namespace) -> tuple[Problem, Schedule]:
    """The problem and the schedule the options describe.

    A schedule file written by ``optpipe solve`` (or ``solve()``) carries the problem it
    was solved for (``provenance["problem"]``). Without problem options that problem is
    the one used, ``--mem`` and ``--p2p`` still adjusting it: why, so that ``optpipe
    gantt optpipe-schedule.json`` after ``optpipe solve --stages 16 --mem 80GB`` draws
    the schedule on its own problem instead of failing on the default 8 stages. Any
    problem option replaces it, and the schedule is checked against that problem.
    """
    source = schedule_source(args)
    if source is None or source in _generator_names():
        problem = problem_from_args(args)
        return problem, schedule_from_args(args, problem)
    schedule = _load_schedule_file(source)
    record = schedule.provenance.get("problem")
    if problem_given(args) or not isinstance(record, dict):
        problem = problem_from_args(args)
        return problem, _checked(schedule, problem, args)
    try:
        problem = problem_from_dict(record, name=f"{source} (its problem)")
    except OptPipeError as exc:
        raise OptPipeError(f"schedule file {source!r} carries a problem that is not "
                           f"valid ({exc}); give the problem with --problem FILE or "
                           f"presets") from None
    problem = _adjusted(problem, _budget_from_args(args), args)
    return problem, _checked(schedule, problem, args)


def add_schedule_args(parser: argparse.ArgumentParser, default: str | None = "1f1b",
                      positional: bool = False) -> None:
    """Add ``--schedule NAME|FILE`` (and ``--chunks`` for chunked generators);
    ``positional``: also an optional ``FILE`` argument, the same as ``--schedule FILE``
    (so ``optpipe gantt optpipe-schedule.json`` reads as it should)."""
    if positional:
        parser.add_argument("schedule_file", nargs="?", metavar="FILE",
                            help="a schedule JSON file (the same as --schedule FILE); one "
                                 "written by `optpipe solve` brings its own problem")
    parser.add_argument("--schedule", default=None, metavar="NAME|FILE",
                        help="a generator name (gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, "
                             "zb-v, zb-auto, pipeoffload) or a schedule JSON file"
                             + (f" (default {default})" if default else ""))
    parser.set_defaults(schedule_default=default)
    parser.add_argument("--chunks", type=int, default=None,
                        help="model chunks per device for interleaved-1f1b (default 2)")


def schedule_source(args: argparse.Namespace) -> str | None:
    """The schedule the options name: the positional FILE, ``--schedule``, or the
    command's default (None when it has none)."""
    given = getattr(args, "schedule_file", None)
    if given is not None and args.schedule is not None:
        raise OptPipeError(f"give the schedule once: {given!r} or --schedule "
                           f"{args.schedule!r}, not both")
    return given or args.schedule or getattr(args, "schedule_default", None)


def _generator_names() -> Sequence[str]:
    from optpipe.generators import GENERATORS

    return list(GENERATORS)


def _load_schedule_file(name: str | None) -> Schedule:
    if name is None:
        raise OptPipeError("no schedule given: name one with --schedule NAME|FILE")
    if Path(name).suffix.lower() == ".json" or Path(name).exists():
        return load_schedule(name)
    raise OptPipeError(f"schedule {name!r} is neither a schedule file nor a known schedule; "
                       f"known: {', '.join(_generator_names())}")


def schedule_from_args(args: argparse.Namespace, problem: Problem) -> Schedule:
    """Generate the named schedule for ``problem``, or load and check a schedule file."""
    from optpipe.generators import GENERATORS, generate

    name = schedule_source(args)
    if name in GENERATORS:
        options: dict[str, Any] = {}
        if getattr(args, "chunks", None):
            if name != "interleaved-1f1b":
                raise OptPipeError(f"--chunks applies to interleaved-1f1b only, not {name}")
            options["chunks"] = args.chunks
        return generate(name, problem, **options)
    return _checked(_load_schedule_file(name), problem, args)


def _checked(schedule: Schedule, problem: Problem, args: argparse.Namespace) -> Schedule:
    """``schedule`` (from a file), checked to be made for ``problem``'s pipeline; when
    it is not and no problem option was given, the error says which ones to give."""
    try:
        schedule.check_fits(problem.stages, problem.devices, problem.microbatches)
    except OptPipeError as exc:
        if problem_given(args) or "problem" in schedule.provenance:
            raise
        raise OptPipeError(f"{exc}. The file carries no problem of its own (files from "
                           f"`optpipe solve` or `optpipe export` do): give the one it was "
                           f"made for with --problem FILE or presets such as --stages "
                           f"{schedule.devices} --microbatches {schedule.microbatches}"
                           ) from None
    return schedule


def compare_all(problem: Problem, names: Sequence[str] | None = None
                ) -> list[tuple[str, SimResult | None, str]]:
    """Simulate every applicable fixed schedule: (name, result or None, note)."""
    from optpipe.generators import GENERATORS, applicable, generate
    from optpipe.simulator import simulate

    rows: list[tuple[str, SimResult | None, str]] = []
    for name in names or list(GENERATORS):
        reason = applicable(name, problem)
        if reason is not True:
            rows.append((name, None, str(reason)))
            continue
        try:
            result = simulate(problem, generate(name, problem))
        except OptPipeError as exc:
            rows.append((name, None, str(exc)))
            continue
        rows.append((name, result, ""))
    return rows


def _peaks(result: SimResult) -> str:
    gib = [p / 2**30 for p in result.peak_memory]
    return " ".join(f"{g:.1f}" for g in gib)


def print_comparison(rows: Sequence[tuple[str, SimResult | None, str]],
                     problem: Problem, title: str | None = None,
                     solver_info: dict[str, Any] | None = None, file: Any = None) -> None:
    """A table of schedules: makespan, bubble rate, peak memory per device, fits or not.

    "span bubble" is the idle share of the devices' own spans (1 − Σ busy / Σ span), the
    figure papers quote; "bubble" is over the makespan (see the README).

    ``solver_info`` (status, bound, gap) is shown on the row of a solved schedule.
    """
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, width=max(120, 104 + 7 * problem.devices))
    budget = problem.budget[0] if len(set(problem.budget)) == 1 else None
    caption = (f"budget {format_bytes(budget)} per device" if budget not in (None, float("inf"))
               else "budget per device varies" if budget is None else "no memory budget")
    table = Table(title=title or f"{problem.name}: {problem.stages} stages x "
                                 f"{problem.microbatches} microbatches, {caption}")
    table.add_column("schedule")
    table.add_column("makespan", justify="right")
    table.add_column("bubble", justify="right")
    table.add_column("span bubble", justify="right")
    table.add_column("peak memory per device (GiB)")
    table.add_column("fits", justify="center")
    table.add_column("note")
    best = min((r.makespan for _, r, _ in rows if r is not None and r.fits), default=None)
    for name, result, note in rows:
        if result is None:
            table.add_row(name, "-", "-", "-", "-", "-", note)
            continue
        if solver_info and result.schedule.provenance.get("source") == "solver":
            note = note or _solver_note(result.schedule.provenance)
        mark = "[green]yes[/]" if result.fits else "[red]no[/]"
        span = format_seconds(result.makespan)
        if best is not None and result.fits and result.makespan == best:
            span = f"[bold]{span}[/]"
        span_bubble = 1.0 - sum(result.device_busy) / max(sum(result.device_span), 1e-30)
        table.add_row(name, span, f"{result.bubble_rate:.1%}", f"{span_bubble:.1%}",
                      _peaks(result), mark, note)
    console.print(table)


def _solver_note(provenance: dict[str, Any]) -> str:
    parts = [str(provenance.get("solver", "")), str(provenance.get("status", ""))]
    if provenance.get("bound") is not None:
        parts.append(f"bound {format_seconds(float(provenance['bound']))}")
    if provenance.get("gap") is not None:
        parts.append(f"gap {float(provenance['gap']):.2%}")
    return " ".join(p for p in parts if p)


def comparison_json(rows: Sequence[tuple[str, SimResult | None, str]]) -> list[dict[str, Any]]:
    out = []
    for name, result, note in rows:
        item: dict[str, Any] = {"schedule": name, "note": note}
        if result is not None:
            item.update(result.to_json(actions=False))
            item["schedule"] = name
        out.append(item)
    return out


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=1, default=_json_default)
    sys.stdout.write("\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and value == float("inf"):
        return None
    if hasattr(value, "value"):
        return value.value
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def infeasible_remedy(problem: Problem, args: argparse.Namespace) -> str:
    """What the user can change when no schedule fits ``problem``'s budget, in the
    options they used: the optimizer's message says which device needs how much, and
    this says which knob lowers that need (static memory and activations answer to
    different ones)."""
    if getattr(args, "problem", None):
        return ("to fit, raise the budget (--mem, or the problem file's budget) or split "
                "the model over more stages")
    over = [d for d in range(problem.devices) if problem.static[d] >= problem.budget[d]]
    if over:
        d = over[0]
        return (f"device {d}'s static memory alone (weights, gradients and optimizer state, "
                f"{format_bytes(problem.static[d])}) is over its budget: split the model "
                f"further (more --stages, or --tp), shard the optimizer state "
                f"(--sharded-optimizer with --dp), or give each device more memory (--mem)")
    return ("to fit, shrink a microbatch's activations (--recompute, a smaller "
            "--micro-batch-size or --seq-len), split the model further (more --stages, or "
            "--tp), or give each device more memory (--mem)")
