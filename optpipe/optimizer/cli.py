"""``optpipe solve``: find the fastest schedule within the budget and show how it compares.

Registered by :mod:`optpipe.cli` through :func:`register`. Problem options come from
:mod:`optpipe.cli_common` so that ``solve`` reads problems exactly like ``simulate``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from optpipe.errors import OptPipeError

DEFAULT_OUTPUT = "optpipe-schedule.json"
#: Seconds kept from --time-limit for writing the schedule and drawing the chart.
OUTPUT_RESERVE = 3.0
#: Seconds past --time-limit that pass without a note (:func:`_over_limit`).
LIMIT_SLACK = 0.5


def register(subparsers: Any) -> None:
    """Add the ``solve`` subcommand."""
    from optpipe.cli_common import add_problem_args

    p = subparsers.add_parser(
        "solve", help="find the fastest schedule that fits the memory budget",
        description="Optimize the order of F/B/W (and offload) work per device so that the "
                    "step is as short as possible within the per-device budget. Example: "
                    "optpipe solve --stages 8 --mem 80GB")
    add_problem_args(p)
    g = p.add_argument_group("solver")
    g.add_argument("--solver", choices=["auto", "cpsat", "highs", "gurobi"], default="auto",
                   help="engine (default auto = CP-SAT, the fastest in the benchmark)")
    off = g.add_mutually_exclusive_group()
    off.add_argument("--offload", dest="offload", action="store_true", default=None,
                     help="allow offloading activations to host memory")
    off.add_argument("--no-offload", dest="offload", action="store_false",
                     help="never offload (default: offload when the budget holds the "
                          "schedule back; beyond 256 stage x microbatch cells only when "
                          "it costs the fixed schedules more than 5%%)")
    g.add_argument("--offload-levels", default="1", metavar="LIST",
                   help="fractions of an activation an offload may move, e.g. 0.5,1 "
                        "(default 1)")
    g.add_argument("--fused-backward", action="store_true",
                   help="schedule fused backwards (BW) only, for runtimes that cannot "
                        "split B and W")
    g.add_argument("--placements", metavar="LIST",
                   help="stage placements the schedule may use, of linear (one stage per "
                        "device), v and interleaved (2 chunks per device); e.g. linear "
                        "for a runtime that runs one stage per device (default: all)")
    g.add_argument("--time-limit", type=float, default=60.0, metavar="SECONDS",
                   help="wall-clock limit for the whole command, start-up and chart "
                        "included (default 60); the fixed schedules compared against "
                        "are built whatever the limit, so a shorter one than they take "
                        "(a few seconds at 16 stages) is exceeded, with a note")
    g.add_argument("--gap", type=_gap, default=0.0,
                   help="stop when within this relative gap of the bound, as a fraction "
                        "or a percentage: 0.01 or 1%% (default 0: prove optimality)")
    g.add_argument("--threads", type=int, default=2, help="solver threads (default 2)")
    g.add_argument("--no-cache", action="store_true",
                   help="solve even when a cached schedule for this problem exists")
    o = p.add_argument_group("output")
    o.add_argument("-o", "--output", default=DEFAULT_OUTPUT, metavar="FILE",
                   help=f"schedule JSON (default {DEFAULT_OUTPUT})")
    o.add_argument("--gantt", metavar="FILE",
                   help="Gantt chart image (default: next to the schedule, .png)")
    o.add_argument("--no-gantt", action="store_true", help="do not draw the Gantt chart")
    o.add_argument("--json", action="store_true",
                   help="print the simulation as JSON (like simulate --json) plus status, "
                        "objective, bound and gap")
    o.add_argument("--quiet", action="store_true", help="no live progress line")
    p.set_defaults(func=run)


def _since_start() -> float:
    """Seconds the command has run so far, start-up included.

    Run as the ``optpipe`` command, that is since the process started (Linux /proc; 0
    elsewhere), because interpreter and import time are part of what the user waits
    for. Called from inside another program (tests, notebooks: ``optpipe.cli.main``),
    the process's age says nothing about this command, so it counts from ``main``.
    """
    from optpipe import cli
    if Path(sys.argv[0] if sys.argv else "").name not in ("optpipe", "cli.py"):
        return max(0.0, time.monotonic() - cli.ENTERED) if cli.ENTERED else 0.0
    try:
        import os
        ticks = os.sysconf("SC_CLK_TCK")
        start = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]) / ticks
        uptime = float(open("/proc/uptime").read().split()[0])
        return max(0.0, uptime - start)
    except (OSError, ValueError, IndexError):
        return 0.0


def _gap(text: str) -> float:
    """``--gap``: ``0.01`` or ``1%``; a fraction, so ``--gap 2`` (meant as 2%?) is refused
    rather than read as 200%, which would stop at the first schedule."""
    value = text.strip()
    try:
        gap = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a gap; write 0.01 or 1%") from None
    if gap < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a gap must not be negative")
    if gap >= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in [0, 1); for "
                                         f"{value.rstrip('%')} percent write "
                                         f"{value.rstrip('%')}%")
    return gap


def _levels(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise OptPipeError(f"--offload-levels {text!r} is not a list of fractions; "
                           f"write it like 0.5,1") from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise OptPipeError(f"--offload-levels {text!r}: every fraction must lie in (0, 1], "
                           f"e.g. 0.5,1")
    return values


def run(args: argparse.Namespace) -> int:
    """Solve, write the schedule (and chart), print the comparison or JSON."""
    from optpipe.cli_common import infeasible_remedy, problem_from_args
    from optpipe.errors import InfeasibleError
    from optpipe.optimizer.driver import solve

    if args.threads < 1:
        raise OptPipeError(f"--threads must be at least 1, got {args.threads}")
    problem = problem_from_args(args)
    # --time-limit bounds the whole command: start-up so far and writing the outputs
    # (chart included) come out of it
    limit = args.time_limit - _since_start() - (OUTPUT_RESERVE if not args.no_gantt else 0.5)
    if limit < 1.0:
        limit = min(1.0, args.time_limit)
    try:
        result = solve(problem, solver=args.solver, offload=args.offload,
                       split_backward=not args.fused_backward, time_limit=limit,
                       gap=args.gap, threads=args.threads, cache=not args.no_cache,
                       progress=not (args.quiet or args.json),
                       offload_levels=_levels(args.offload_levels),
                       placements=args.placements.split(",") if args.placements else None)
    except InfeasibleError as exc:
        raise InfeasibleError(f"{exc}; {infeasible_remedy(problem, args)}",
                              exc.min_budget, exc.min_budget_offload) from None
    out = Path(args.output)
    result.schedule.save(out)
    chart = None
    if not args.no_gantt:
        chart = Path(args.gantt) if args.gantt else out.with_suffix(".png")
        try:
            from optpipe.viz.gantt import plot_gantt
            plot_gantt(result.sim, chart)
        except ImportError as exc:
            print(f"note: no Gantt chart ({exc})", file=sys.stderr)
            chart = None
    if args.json:
        data = result.sim.to_json(actions=True)
        data.update(status=result.status, objective=result.objective, bound=result.bound,
                    gap=result.gap, solver=result.engine, wall_time=result.wall_time,
                    placements=result.placements)
        json.dump(data, sys.stdout, indent=1, default=_json_default)
        sys.stdout.write("\n")
    else:
        _print_table(result, problem)
        _print_summary(result, out, chart)
    over = _over_limit(result, problem, args.time_limit, _since_start())
    if over:
        print(over, file=sys.stderr)
    return 0


def _over_limit(result: Any, problem: Any, limit: float, took: float) -> str:
    """A note when the command ran past ``--time-limit`` (by more than
    :data:`LIMIT_SLACK`), saying why, or "".

    Why a note and not a shorter run: what runs whatever the limit is what the answer
    must be checked against — every fixed schedule, simulated, for the comparison and the
    never-worse rule (2-4 s at 16 x 64 on 2 cores, ``scripts/bench_presearch.py``) — plus
    the first warm starts of each kind (what the command takes in all:
    ``scripts/bench_time_limit.py``); a user who gave a short limit should know that it
    bought little or no search."""
    if took <= limit + LIMIT_SLACK:
        return ""
    warm = getattr(result, "warm_start_time", None)
    if warm is None:
        return f"note: took {took:.1f} s, over --time-limit {limit:g} s"
    searched = max(0.0, result.wall_time - warm)
    return (f"note: took {took:.1f} s, over --time-limit {limit:g} s: the fixed schedules "
            f"and the first warm starts are built whatever the limit ({warm:.1f} s for "
            f"{problem.stages} x {problem.microbatches} here), and the search had "
            f"{searched:.1f} s; give a longer limit for a search")


def _json_default(value: Any) -> Any:
    if hasattr(value, "value"):
        return value.value
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _fixed_rows(result: Any) -> list[tuple[str, Any, str]]:
    """Rows for every registered generator, and for our own fallback if it was used."""
    try:
        from optpipe.generators import GENERATORS
        names = list(GENERATORS)
    except ImportError:
        names = []
    from optpipe.schedule import placement_name

    by_name = {c.name: c for c in result.fixed}
    allowed = result.schedule.provenance.get("allowed_placements")
    rows = []
    for name in names:
        c = by_name.get(name)
        note = "" if c else "not applicable"
        if c and allowed and placement_name(c.schedule.placement,
                                            c.schedule.devices) not in allowed:
            note = "placement not allowed (--placements)"
        rows.append((name, c.result if c else None, note))
    if result.status == "fallback" and result.schedule.name not in names:
        rows.append((result.schedule.name, result.sim, "fallback"))
    return rows


def _print_table(result: Any, problem: Any) -> None:
    rows = _fixed_rows(result)
    if result.status != "fallback":
        rows.append(("optpipe", result.sim, _note(result)))
    try:
        from optpipe.cli_common import print_comparison
    except ImportError:  # pragma: no cover - the lead's module is part of the package
        print_comparison = None
    if print_comparison is not None:
        print_comparison(rows, problem, solver_info={"status": result.status,
                                                     "bound": result.bound,
                                                     "gap": result.gap})
        return
    for name, sim, note in rows:  # pragma: no cover
        if sim is None:
            print(f"{name:18} -  {note}")
        else:
            print(f"{name:18} {sim.makespan:.6g}s  bubble {sim.bubble_rate:.1%}  "
                  f"fits {sim.fits}  {note}")


def _note(result: Any) -> str:
    from optpipe.units import format_seconds
    # no engine ran (a schedule met the bound, or none could beat it): only the status
    parts = ([] if result.engine in ("bound", "-") else [result.engine]) + [result.status]
    if result.bound is not None:
        parts.append(f"bound {format_seconds(result.bound)}")
    if result.gap is not None:
        parts.append(f"gap {result.gap:.2%}")
    return " ".join(parts)


def _engine_label(engine: str) -> str:
    """The engine as the user reads it: ``bound`` is the driver's name for "a schedule
    met the lower bound before any engine ran" and ``-`` for "no engine ran because
    none could win", which say nothing as a solver's name."""
    if engine == "bound":
        return "none (a schedule met the lower bound)"
    if engine == "-":
        return "none (no engine's model could beat the best schedule in hand)"
    return engine


def _placement_note(proof: dict[str, Any]) -> str:
    """``linear: optimal 104.4s`` or ``v: 103.8s, bound 99.85s (gap 3.9%)``."""
    from optpipe.units import format_seconds
    best = format_seconds(proof["best"])
    if proof["optimal"]:
        return f"{proof['placement']}: optimal {best}"
    return (f"{proof['placement']}: {best}, bound {format_seconds(proof['bound'])} "
            f"(gap {proof['gap']:.2%})")


def _print_summary(result: Any, out: Path, chart: Path | None) -> None:
    from optpipe.units import format_seconds
    sim = result.sim
    lines = [f"status     {result.status}" + (f" ({result.message})" if result.message else ""),
             f"makespan   {format_seconds(sim.makespan)}  (bubble {sim.bubble_rate:.2%})"]
    if result.bound is not None:
        gap = f", gap {result.gap:.2%}" if result.gap is not None else ""
        lines.append(f"bound      {format_seconds(result.bound)}{gap}")
    if len(getattr(result, "placements", [])) > 1:
        lines.append("placements " + "; ".join(_placement_note(p) for p in result.placements))
    lines.append(f"solver     {_engine_label(result.engine)}, {result.wall_time:.1f}s")
    lines.append(f"wrote      {out}" + (f", {chart}" if chart else ""))
    print("\n".join(lines))
