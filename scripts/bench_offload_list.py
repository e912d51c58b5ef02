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

``--detail`` measures the pieces instead, without the driver (also on the benchmark's
uniform problems at S/2, ``bench-SxM``): the best list plan for 2 and 3 x the room on
interleaved chunks and its fit by offloading (what the fitted plans get), the best
offload-aware variant per chunked placement, and ``--grasp-seconds`` of randomized runs
from it (:func:`optpipe.optimizer.offload_list.randomized`):

    python scripts/bench_offload_list.py --detail --cases 8stage-40GB,4stage-80GB,16stage-40GB,bench-4x8,bench-8x16,bench-8x32
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_offload_reach import PRESETS as REACH_PRESETS  # noqa: E402
from benchargs import parse_size  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
START, END = "<!-- offload-list:start -->", "<!-- offload-list:end -->"
DETAIL = "<!-- offload-list-detail:start -->", "<!-- offload-list-detail:end -->"
#: label -> (model, hardware, stages, budget; None: the hardware's), as on the CLI
PRESETS = {**REACH_PRESETS, "16stage-40GB": ("gpt-14.6b", "h100-80gb", 16, "40GB")}


def problem_of(label: str):
    """The problem ``optpipe solve`` builds for a preset, or the benchmark's uniform
    problem at S/2 (``bench-SxM``)."""
    from optpipe import costmodel
    from optpipe.units import parse_bytes

    if label.startswith("bench-"):
        from bench_solver import bench_problem

        stages, microbatches = parse_size(label[len("bench-"):])
        return bench_problem(stages, microbatches, stages / 2, False)
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


def detail(label: str, grasp_seconds: float) -> str:
    """One ``--detail`` row (module docstring)."""
    from optpipe.generators.offload import fit_by_offloading
    from optpipe.optimizer.listsched import list_schedules
    from optpipe.optimizer.offload_list import offload_list_schedules, randomized
    from optpipe.optimizer.offload_starts import relaxed
    from optpipe.schedule import interleaved_placement, v_placement
    from optpipe.simulator import simulate

    problem = problem_of(label)
    D = problem.devices
    cells = [label]
    for factor in (2.0, 3.0):
        plans = list_schedules(relaxed(problem, factor), interleaved_placement(D, 2))
        planned = min(simulate(relaxed(problem, factor), s).makespan for s in plans)
        fitted = [r.makespan for r in (fit_by_offloading(problem, s)[1] for s in plans)
                  if r.fits]
        cells.append(f"{planned:.4g} → {min(fitted):.4g} s" if fitted
                     else f"{planned:.4g} s → none fits")
    for place in (interleaved_placement(D, 2), v_placement(D)):
        made = [(simulate(problem, s), s) for s in offload_list_schedules(problem, place)]
        made = sorted(((r.makespan, i, s) for i, (r, s) in enumerate(made) if r.fits))
        if not made:
            cells.append("none fits")
            continue
        best, _, schedule = made[0]
        found, runs = randomized(problem, place, True, schedule.provenance["offload_list"],
                                 deadline=time.monotonic() + grasp_seconds, bar=best)
        after = simulate(problem, found).makespan if found else best
        cells.append(f"{best:.4g} s ({schedule.name}) → {after:.4g} s ({runs} runs)")
    line = "| " + " | ".join(cells) + " |"
    print(line, flush=True)
    return line


def main() -> None:
    from optpipe.optimizer import offload_list

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(PRESETS),
                    help=f"comma-separated, of {', '.join(PRESETS)} (and bench-SxM with "
                         "--detail)")
    ap.add_argument("--seconds", type=float, default=60.0, help="time limit per solve")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--detail", action="store_true",
                    help="measure the pieces without the driver (module docstring)")
    ap.add_argument("--grasp-seconds", type=float, default=20.0,
                    help="randomized runs per placement with --detail")
    args = ap.parse_args()
    if args.detail:
        table = ["| problem | interleaved plan for 2 x the room → fitted | the same, 3 x | "
                 "offload-aware, interleaved: best variant → randomized | the same, V shape |",
                 "|---|---|---|---|---|"]
        table += [detail(label, args.grasp_seconds) for label in args.cases.split(",")]
        caption = (f"Measured with `python scripts/bench_offload_list.py --detail --cases "
                   f"{args.cases} --grasp-seconds {args.grasp_seconds:g}` "
                   f"({time.strftime('%Y-%m-%d')}, 2 cores, one run each; makespans "
                   "simulated; bench-SxM: the benchmark's uniform problem at S/2).")
        publish(caption + "\n\n" + "\n".join(table), DOC, *DETAIL,
                write=not args.no_write)
        return
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
