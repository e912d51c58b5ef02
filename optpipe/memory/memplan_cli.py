"""``optpipe memplan``: how much memory a schedule's buffers need, three ways.

For each device (or for one trace file) it reports

* the peak of live bytes — a lower bound no allocator can beat;
* what PyTorch's caching allocator would reserve for the same allocations (its model in
  :mod:`optpipe.memory.caching_allocator`, with and without expandable segments) and
  the resulting fragmentation;
* the arena the planner (:mod:`optpipe.memory.planner`) fits every buffer into, and its
  fragmentation.

Input is ``--trace FILE`` (MiniMalloc CSV or optpipe JSON) or ``--schedule NAME|FILE``
with the usual problem options, whose simulated run gives one trace per device.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from optpipe.errors import OptPipeError
from optpipe.memory.caching_allocator import AllocatorStats, replay
from optpipe.memory.planner import Plan, default_workers, plan
from optpipe.memory.trace import Trace, load_trace, traces_from_simulation
from optpipe.units import format_bytes, format_seconds, parse_bytes


def register(subparsers: Any) -> None:
    """Add the ``memplan`` subcommand to the ``optpipe`` parser."""
    from optpipe.cli_common import add_problem_args, add_schedule_args

    p = subparsers.add_parser(
        "memplan", help="plan activation memory; compare with PyTorch's caching allocator",
        description="Lay out every buffer of an allocation trace (a file, or a simulated "
                    "schedule: one trace per device) in one arena of minimal size, and "
                    "compare it with the peak of live bytes and with what PyTorch's "
                    "caching allocator would reserve.")
    source = p.add_argument_group("input (one of)")
    source.add_argument("--trace", metavar="FILE",
                        help="allocation trace: MiniMalloc CSV (id,lower,upper,size) or "
                             "optpipe JSON")
    add_schedule_args(p, default=None, positional=True)
    add_problem_args(p)
    p.add_argument("--per-stage", action="store_true",
                   help="one buffer per stage and microbatch part, instead of per-layer "
                        "tensors when the problem knows its layers")
    p.add_argument("--capacity", metavar="BYTES",
                   help="device memory for the caching-allocator model and a limit the "
                        "plan must fit, e.g. 80GB or 1048576")
    p.add_argument("--exact", action="store_true",
                   help="also try to prove the arena minimal (CP-SAT); for small traces")
    p.add_argument("--time-limit", type=float, default=10.0, metavar="SECONDS",
                   help="planning time per trace (default 10)")
    p.add_argument("--workers", type=int, default=None,
                   help=f"parallel search processes (default {default_workers()})")
    p.add_argument("--alignment", type=int, default=1, metavar="BYTES",
                   help="round sizes and offsets to this many bytes (default 1; use 256 "
                        "for an arena of device tensors)")
    p.add_argument("--device", type=int, default=None,
                   help="only this device of a schedule")
    p.add_argument("--plot", metavar="FILE", help="draw the plan (offset x time), PNG or SVG")
    p.add_argument("--save-trace", metavar="FILE",
                   help="write the trace(s): .json, or .csv (MiniMalloc; one device only)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


# -------------------------------------------------------------------- inputs
def _traces(args: argparse.Namespace) -> tuple[list[Trace], str]:
    from optpipe.cli_common import schedule_source

    named = schedule_source(args)
    if args.trace and named:
        raise OptPipeError("give either --trace FILE or --schedule NAME|FILE, not both")
    if args.trace:
        return [load_trace(args.trace)], f"trace {args.trace}"
    if not named:
        raise OptPipeError("memplan needs --trace FILE or --schedule NAME|FILE "
                           "(e.g. --schedule 1f1b --model gpt3-1.3b)")
    from optpipe.cli_common import problem_and_schedule
    from optpipe.simulator import simulate

    problem, schedule = problem_and_schedule(args)
    result = simulate(problem, schedule)
    traces = traces_from_simulation(result, per_layer=not args.per_stage)
    if args.device is not None:
        if not 0 <= args.device < len(traces):
            raise OptPipeError(f"--device {args.device} does not exist; the schedule has "
                               f"devices 0..{len(traces) - 1}")
        traces = [traces[args.device]]
    return traces, f"schedule {schedule.name} on {problem.name}"


# -------------------------------------------------------------------- report
def _device_row(trace: Trace, pl: Plan, cache: AllocatorStats,
                expandable: AllocatorStats) -> dict[str, Any]:
    return {
        "trace": trace.name, "buffers": len(trace), "peak_live": pl.peak_live,
        "planned_peak": pl.arena_size, "planned_fragmentation": pl.fragmentation,
        "plan_method": pl.method, "plan_optimal": pl.optimal, "plan_time": pl.wall_time,
        "caching_reserved": cache.peak_reserved, "caching_allocated": cache.peak_allocated,
        "caching_fragmentation": cache.fragmentation, "caching_oom": cache.oom,
        "expandable_reserved": expandable.peak_reserved,
        "expandable_fragmentation": expandable.fragmentation,
        "fits_capacity": pl.details.get("fits_capacity"),
        "offsets": dict(pl.offsets),
    }


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Worst device's bytes; fragmentation of the bytes summed over devices."""
    live = sum(r["peak_live"] for r in rows)
    planned = sum(r["planned_peak"] for r in rows)
    reserved = sum(r["caching_reserved"] for r in rows)
    allocated = sum(r["caching_allocated"] for r in rows)
    offsets: dict[str, int] = {}
    for r in rows:
        offsets.update(r["offsets"])
    return {
        "peak_live": max(r["peak_live"] for r in rows),
        "planned_peak": max(r["planned_peak"] for r in rows),
        "caching_reserved": max(r["caching_reserved"] for r in rows),
        "expandable_reserved": max(r["expandable_reserved"] for r in rows),
        "caching_fragmentation": 1.0 - allocated / reserved if reserved else 0.0,
        "planned_fragmentation": 1.0 - live / planned if planned else 0.0,
        "offsets": offsets,
    }


def _print_text(source: str, rows: list[dict[str, Any]], capacity: int | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"memory plan: {source}")
    for column in ("trace", "buffers", "peak live", "caching reserved",
                   "caching frag.", "expandable reserved", "planned arena", "plan frag.",
                   "plan"):
        table.add_column(column, justify="left" if column in ("trace", "plan") else "right")
    for r in rows:
        note = r["plan_method"] + (" (optimal)" if r["plan_optimal"] else "") + \
            f", {format_seconds(r['plan_time'])}"
        if r["caching_oom"]:
            note += f"; caching allocator out of memory at {r['caching_oom']}"
        if r["fits_capacity"] is False:
            note += "; DOES NOT FIT --capacity"
        table.add_row(r["trace"], str(r["buffers"]), format_bytes(r["peak_live"]),
                      format_bytes(r["caching_reserved"]),
                      f"{r['caching_fragmentation']:.2%}",
                      format_bytes(r["expandable_reserved"]),
                      format_bytes(r["planned_peak"]), f"{r['planned_fragmentation']:.2%}",
                      note)
    Console(file=sys.stdout, width=200).print(table)
    print("peak live = lower bound for any allocator; frag. = 1 - allocated (caching) or "
          "live (plan) / reserved")
    if capacity is not None:
        print(f"capacity {format_bytes(capacity)}")


# ---------------------------------------------------------------------- plot
def draw_plans(traces: list[Trace], plans: list[Plan], path: str | Path) -> None:
    """One panel per trace: each buffer a rectangle, time across, offset up; the planned
    arena and the peak of live bytes as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise OptPipeError(f"--plot {str(path)!r}: use a .png, .svg or .pdf file name")
    fig, axes = plt.subplots(len(traces), 1, figsize=(10, 2.2 + 1.8 * len(traces)),
                             squeeze=False)
    cmap = plt.get_cmap("tab20")
    for ax, trace, pl in zip(axes[:, 0], traces, plans):
        scale = 2.0 ** 20 if pl.arena_size >= 2 ** 20 else 1.0
        polys, colors = [], []
        for b in trace.buffers:
            if b.size <= 0 or b.end <= b.start:
                continue
            lo, hi = pl.offsets[b.id] / scale, (pl.offsets[b.id] + b.size) / scale
            polys.append([(b.start, lo), (b.end, lo), (b.end, hi), (b.start, hi)])
            key = b.tags.get("microbatch", b.tags.get("stage", len(polys)))
            colors.append(cmap(key % 20 if isinstance(key, int) else len(polys) % 20))
        ax.add_collection(PolyCollection(polys, facecolors=colors, edgecolors="black",
                                         linewidths=0.15))
        t0 = min((b.start for b in trace.buffers), default=0.0)
        t1 = max((b.end for b in trace.buffers), default=1.0)
        ax.axhline(pl.arena_size / scale, color="red", linewidth=1,
                   label=f"arena {format_bytes(pl.arena_size)}")
        ax.axhline(pl.peak_live / scale, color="black", linestyle="--", linewidth=0.8,
                   label=f"peak live {format_bytes(pl.peak_live)}")
        ax.set_xlim(t0, t1 if t1 > t0 else t0 + 1)
        ax.set_ylim(0, max(pl.arena_size / scale, 1e-9) * 1.3)  # headroom for the legend
        ax.set_ylabel("offset (MiB)" if scale > 1 else "offset (bytes)")
        ax.set_title(trace.name, fontsize=9)
        ax.legend(loc="upper right", fontsize=7, ncol=2)
    axes[-1, 0].set_xlabel("time")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ----------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    """The ``memplan`` command; exit 0, or 1 when a plan does not fit ``--capacity``."""
    capacity = parse_bytes(args.capacity, "--capacity") if args.capacity else None
    if capacity is not None and capacity <= 0:
        raise OptPipeError("--capacity must be positive, e.g. --capacity 80GB")
    if args.time_limit <= 0:
        raise OptPipeError(f"--time-limit must be positive, got {args.time_limit}")
    if args.alignment < 1:
        raise OptPipeError(f"--alignment must be at least 1, got {args.alignment}")
    workers = default_workers() if args.workers is None else args.workers
    if workers < 1:
        raise OptPipeError(f"--workers must be at least 1, got {workers}")
    traces, source = _traces(args)
    if args.save_trace:
        out = Path(args.save_trace)
        if out.suffix.lower() == ".csv":
            if len(traces) != 1:
                raise OptPipeError("a MiniMalloc CSV holds one trace; add --device N")
            traces[0].save(out)
        else:
            out.write_text(json.dumps([t.to_json() for t in traces] if len(traces) > 1
                                      else traces[0].to_json(), indent=1) + "\n")
    rows, plans = [], []
    for trace in traces:
        pl = plan(trace, time_limit=args.time_limit, exact=args.exact,
                  alignment=args.alignment, workers=workers, capacity=capacity)
        cache = replay(trace, capacity=capacity)
        expandable = replay(trace, capacity=capacity, expandable_segments=True)
        rows.append(_device_row(trace, pl, cache, expandable))
        plans.append(pl)
    if args.plot:
        draw_plans(traces, plans, args.plot)
    if args.json:
        data = {"source": source, **_summary(rows), "capacity": capacity, "devices": rows}
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        _print_text(source, rows, capacity)
        if args.plot:
            print(f"plot written to {args.plot}")
    return 1 if any(r["fits_capacity"] is False for r in rows) else 0
