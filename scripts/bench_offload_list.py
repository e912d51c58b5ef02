"""Offload-aware list schedules in the driver: presets solved with and without them.

Search revision 29 starts the offloaded search from offload-aware list schedules
(:mod:`optpipe.optimizer.offload_list`) before the plans fitted by offloading. With
``offload_list.VARIANTS`` emptied the driver searches as revision 28 did, so each
preset is solved both ways with ``optpipe solve``'s defaults (offload decided
automatically, the cache off), and the table gives the answer, its gap, the schedule
it came from, and the best offload-aware list schedule alone (all variants, the
placements the driver would use, simulated).

    python scripts/bench_offload_list.py               # writes docs/optimizer-log.md
    python scripts/bench_offload_list.py --no-write --cases 8stage-40GB
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_offload_reach import PRESETS as REACH_PRESETS  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
START, END = "<!-- offload-list:start -->", "<!-- offload-list:end -->"
#: label -> (model, hardware, stages, budget; None: the hardware's), as on the CLI
PRESETS = {**REACH_PRESETS, "16stage-40GB": ("gpt-14.6b", "h100-80gb", 16, "40GB")}


def problem_of(label: str):
    """The problem ``optpipe solve`` builds for a preset."""
    from optpipe import costmodel
    from optpipe.units import parse_bytes

    model, hardware, stages, mem = PRESETS[label]
    problem = costmodel.build_problem(model, hardware, stages=stages,
                                      microbatches=costmodel.DEFAULT_MICROBATCHES)
    return problem if mem is None else problem.with_budget(parse_bytes(mem, "--mem"))


def alone(problem) -> str:
    """The best offload-aware list schedule over every variant and placement."""
    from optpipe.optimizer.offload_list import offload_list_schedules
    from optpipe.schedule import interleaved_placement, linear_placement, v_placement
    from optpipe.simulator import simulate

    t0 = time.monotonic()
    best = None
    D = problem.devices
    for place in (interleaved_placement(D, 2), v_placement(D), linear_placement(D)):
        for schedule in offload_list_schedules(problem, place):
            result = simulate(problem, schedule)
            if result.fits and (best is None or result.makespan < best[0]):
                best = (result.makespan, schedule.name)
    if best is None:
        return "none fits"
    return f"{best[0]:.4g} s ({best[1]}, {time.monotonic() - t0:.0f} s for all)"


def row(label: str, on: bool, seconds: float, saved: tuple) -> str:
    from optpipe.optimizer import driver, offload_list

    problem = problem_of(label)
    offload_list.VARIANTS = saved if on else ()
    t0 = time.monotonic()
    result = driver.solve(problem, time_limit=seconds, cache=False, progress=False)
    wall = time.monotonic() - t0
    offload_list.VARIANTS = saved
    line = (f"| {label} | {'yes (revision 29)' if on else 'no (revision 28)'} | "
            f"{result.sim.makespan:.4g} s | {(result.gap or 0.0):.2%} | "
            f"{result.schedule.provenance.get('warm_start', result.schedule.name)} | {alone(problem) if on else ''} | {wall:.0f} s |")
    print(line, flush=True)
    return line


def main() -> None:
    from optpipe.optimizer import offload_list

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(PRESETS),
                    help=f"comma-separated, of {', '.join(PRESETS)}")
    ap.add_argument("--seconds", type=float, default=60.0, help="time limit per solve")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    saved = offload_list.VARIANTS
    table = ["| problem | offload-aware list schedules | answer | gap | from | "
             "best of them alone | wall |", "|---|---|---|---|---|---|---|"]
    for label in args.cases.split(","):
        if label not in PRESETS:
            raise SystemExit(f"unknown case {label!r}; known: {', '.join(PRESETS)}")
        for on in (False, True):
            table.append(row(label, on, args.seconds, saved))
    caption = (f"Measured with `python scripts/bench_offload_list.py --seconds "
               f"{args.seconds:g}` ({time.strftime('%Y-%m-%d')}, 2 cores, 2 solver threads, "
               "one run each; presets as `optpipe solve --model M --hardware H --stages S "
               "--mem X --no-cache`).")
    publish(caption + "\n\n" + "\n".join(table), DOC, START, END, write=not args.no_write)


if __name__ == "__main__":
    main()
