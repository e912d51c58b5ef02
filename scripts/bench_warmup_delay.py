"""Where an offload preset's warm-up loses against its bound: per device, the first
backward's start in the solved schedule against its earliest start without memory.

``bounds.offload_warmup_bound`` takes each device's earliest first backward as given
(the no-memory earliest start of its stages' first backwards) and charges only the
idle its own host link forces before it. This script solves a preset as ``optpipe
solve`` does (offload decided automatically, the cache off) and prints, per device, how
late its first backward really starts, how long it idles before it, and microbatch 0's
forwards on the devices it crosses twice (the interleaved chunks), so that the next
bound or list rule can be judged against what the schedules do::

    python scripts/bench_warmup_delay.py                  # writes docs/optimizer-log.md
    python scripts/bench_warmup_delay.py --case 16stage-40GB --seconds 60 --no-write
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_offload_list import PRESETS, problem_of  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
MARKERS = "<!-- warmup-delay:start -->", "<!-- warmup-delay:end -->"


def measure(label: str, seconds: float) -> list[str]:
    """The preset solved for ``seconds``, and the table's lines."""
    from optpipe.optimizer import driver
    from optpipe.optimizer.bounds import lower_bound, offload_warmup_bound
    from optpipe.optimizer.preprocess import earliest_starts, task_graph
    from optpipe.schedule import Op
    from optpipe.simulator import simulate

    problem = problem_of(label)
    result = driver.solve(problem, time_limit=seconds, cache=False, progress=False)
    schedule = result.schedule
    graph = task_graph(problem, True, list(schedule.placement))
    es = earliest_starts(graph)
    sim = simulate(problem, schedule)
    lines = [f"{label}, {seconds:g} s: answer {sim.makespan:.3f} s "
             f"({schedule.provenance.get('placement')}), bound {result.bound:.3f} s; on "
             f"its placement the warm-up bound {offload_warmup_bound(graph):.3f} s, the "
             f"no-memory bound {lower_bound(graph):.3f} s.", "",
             "| device | first B | its earliest | idle before it | work | idle in all "
             "| microbatch 0's forwards here: start (earliest) |",
             "|---|---|---|---|---|---|---|"]
    compute = (Op.F, Op.B, Op.W, Op.BW)
    for d in range(problem.devices):
        records = [r for r in sim.records if r.device == d and r.action.op in compute]
        first_b = min(r.start for r in records if r.action.op in (Op.B, Op.BW))
        earliest = min(es[(op, s, 0)] for s in graph.stages_on(d)
                       for op in (Op.B, Op.BW) if (op, s, 0) in es)
        busy = sum(r.end - r.start for r in records if r.start < first_b)
        work = sum(graph.duration[k] for k in graph.device_keys(d))
        forwards = sorted((r.action.stage, r.start) for r in records
                          if r.action.op is Op.F and r.action.microbatch == 0)
        shown = ", ".join(f"F({s}, 0) {start:.3f} ({es[(Op.F, s, 0)]:.3f})"
                          for s, start in forwards)
        lines.append(f"| {d} | {first_b:.3f} s | {earliest:.3f} s | "
                     f"{first_b - busy - min(r.start for r in records):.3f} s | "
                     f"{work:.3f} s | {sim.makespan - work:.3f} s | {shown} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="8stage-40GB", help=f"one of {', '.join(PRESETS)}")
    ap.add_argument("--seconds", type=float, default=30.0, help="time limit of the solve")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    if args.case not in PRESETS:
        raise SystemExit(f"unknown case {args.case!r}; known: {', '.join(PRESETS)}")
    lines = measure(args.case, args.seconds)
    flags = (f" --case {args.case}" if args.case != "8stage-40GB" else "") + (
        f" --seconds {args.seconds:g}" if args.seconds != 30 else "")
    caption = (f"Measured with `python scripts/bench_warmup_delay.py{flags}` "
               f"({time.strftime('%Y-%m-%d')}, 2 cores, 2 solver threads, one run; times "
               "from the schedule's simulation, earliest starts without memory).")
    publish(caption + "\n\n" + "\n".join(lines), DOC, *MARKERS, write=not args.no_write)


if __name__ == "__main__":
    main()
