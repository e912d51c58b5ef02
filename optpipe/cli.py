"""The ``optpipe`` command: solve, simulate, compare, gantt, export, profile, run, memplan.

Each subcommand lives beside the part it drives (``optimizer/cli.py``,
``runtime/cli.py``, ``memory/memplan_cli.py``) and registers itself here. A user mistake
raises :class:`~optpipe.errors.OptPipeError`; :func:`main` prints its one line and exits
with status 2, so no user ever sees a traceback for a bad input.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Sequence

from optpipe import __version__
from optpipe.cli_common import (add_problem_args, add_schedule_args, compare_all,
                                comparison_json, print_comparison, print_json,
                                problem_and_schedule, problem_from_args)
from optpipe.errors import OptPipeError
from optpipe.simulator import simulate
from optpipe.units import format_bytes, format_seconds

# Subcommands defined next to the parts they drive; each module has register(subparsers).
_PLUGINS = ("optpipe.optimizer.cli", "optpipe.runtime.cli", "optpipe.memory.memplan_cli")
_EXPORT_SUFFIX = {"json": "json", "chrome": "trace.json", "torch-csv": "csv"}


def _simulate(args: argparse.Namespace) -> int:
    problem, schedule = problem_and_schedule(args)
    result = simulate(problem, schedule)
    if args.json:
        print_json(result.to_json(actions=True))
        return 0
    print(f"schedule     {result.schedule.name} ({result.schedule.devices} devices, "
          f"{result.schedule.stages} stages, {result.schedule.microbatches} microbatches)")
    print(f"problem      {problem.name}")
    print(f"makespan     {format_seconds(result.makespan)}")
    print(f"bubble rate  {result.bubble_rate:.2%}")
    for d in range(result.schedule.devices):
        budget = result.budget[d]
        limit = format_bytes(budget) if budget != float("inf") else "no budget"
        flag = "" if result.peak_memory[d] <= budget else "  OVER BUDGET"
        print(f"device {d:<3}   span {format_seconds(result.device_span[d]):>11}  "
              f"idle {format_seconds(result.device_idle[d]):>11}  "
              f"peak {format_bytes(result.peak_memory[d]):>11} / {limit}{flag}")
    return 0 if result.fits or not args.strict else 1


def _compare(args: argparse.Namespace) -> int:
    problem = problem_from_args(args)
    names = args.schedules.split(",") if args.schedules else None
    rows = compare_all(problem, names)
    if args.json:
        print_json(comparison_json(rows))
    else:
        print_comparison(rows, problem)
    if args.gantt:
        from optpipe.viz.compare_plot import plot_comparison

        plot_comparison([r for _, r, _ in rows if r is not None], args.gantt)
        print(f"wrote {args.gantt}", file=sys.stderr)
    return 0


def _gantt(args: argparse.Namespace) -> int:
    from optpipe.viz.gantt import plot_gantt

    problem, schedule = problem_and_schedule(args)
    result = simulate(problem, schedule)
    out = args.output or f"{result.schedule.name}.png"
    plot_gantt(result, out, memory=not args.no_memory)
    print(f"wrote {out}  (makespan {format_seconds(result.makespan)}, "
          f"bubble {result.bubble_rate:.1%})")
    return 0


def _export(args: argparse.Namespace) -> int:
    problem, schedule = problem_and_schedule(args)
    fmt = args.format
    out = args.output or f"{schedule.name}.{_EXPORT_SUFFIX[fmt]}"
    if fmt == "json":
        # the problem goes with it, as with a solved schedule: `optpipe gantt FILE` then
        # needs no options
        schedule.provenance["problem"] = problem.to_record()
        schedule.save(out)
    elif fmt == "chrome":
        from optpipe.viz.chrome import write_chrome_trace

        write_chrome_trace(simulate(problem, schedule), out)
    else:
        from optpipe.export_torch import write_torch_csv

        if schedule.offloads:
            print("note: PyTorch's runtime has no offload; OFFLOAD/RELOAD are left out",
                  file=sys.stderr)
        write_torch_csv(schedule, out, simulate(problem, schedule) if args.idle_cells else None)
    print(f"wrote {out}")
    return 0


def _presets(args: argparse.Namespace) -> int:
    from optpipe import costmodel

    print("models:   " + ", ".join(costmodel.list_models()))
    print("hardware: " + ", ".join(costmodel.list_hardware()))
    print(f"defaults: --model {costmodel.DEFAULT_MODEL} --hardware {costmodel.DEFAULT_HARDWARE} "
          f"--microbatches {costmodel.DEFAULT_MICROBATCHES}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optpipe",
        description="Memory-aware optimal pipeline-parallel schedules: solve, simulate, "
                    "compare, draw and run them.")
    parser.add_argument("--version", action="version", version=f"optpipe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("simulate", help="simulate one schedule: makespan, bubbles, memory")
    add_problem_args(p)
    add_schedule_args(p, positional=True)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when the schedule exceeds the budget")
    p.set_defaults(func=_simulate)

    p = sub.add_parser("compare", help="table of every fixed schedule on one problem")
    add_problem_args(p)
    p.add_argument("--schedules", help="comma-separated subset, e.g. 1f1b,zb-h1")
    p.add_argument("--gantt", metavar="FILE", help="also draw them stacked on one time axis")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=_compare)

    p = sub.add_parser("gantt", help="draw a schedule's Gantt chart (PNG, SVG or PDF)")
    add_problem_args(p)
    add_schedule_args(p, positional=True)
    p.add_argument("-o", "--output", metavar="FILE", help="image file (default NAME.png)")
    p.add_argument("--no-memory", action="store_true", help="leave out the memory panel")
    p.set_defaults(func=_gantt)

    p = sub.add_parser("export", help="write a schedule as JSON, Chrome trace or torch CSV")
    add_problem_args(p)
    add_schedule_args(p, positional=True)
    p.add_argument("--format", choices=["json", "chrome", "torch-csv"], default="json")
    p.add_argument("-o", "--output", metavar="FILE")
    p.add_argument("--idle-cells", action="store_true",
                   help="torch-csv: mark simulated idle slots with empty cells")
    p.set_defaults(func=_export)

    p = sub.add_parser("presets", help="list model and hardware presets")
    p.set_defaults(func=_presets)

    for module_name in _PLUGINS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # a part not installed in this build
            if not exc.name or not module_name.startswith(exc.name):
                raise
            continue
        module.register(sub)
    return parser


#: When :func:`main` was last entered (``time.monotonic()``): commands with a time limit
#: count from here when they do not run as the ``optpipe`` process itself.
ENTERED: float | None = None


def main(argv: Sequence[str] | None = None) -> int:
    global ENTERED
    ENTERED = time.monotonic()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except OptPipeError as exc:
        print(f"optpipe: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("optpipe: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
