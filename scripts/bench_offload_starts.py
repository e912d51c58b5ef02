#!/usr/bin/env python3
"""Offloaded list schedules against pipeoffload at budget S/2, factor by factor.

Why this script: search revision 11 gives the driver, when offload is allowed, list
schedules planned for a looser budget and fitted to the real one by offloading
(``optimizer.offload_starts``). This shows how the looser budget (``factor`` times the
room above static memory) decides what comes out, and so where ``FACTORS`` comes from:
for the benchmark's problems (``bench_solver.bench_problem``: F = B = W = 1 s, p2p
0.05 s, one activation moved in half an F) at budget S/2, per factor the fastest
fitting fitted schedule over the chunked placements (every rule and reserve), beside
pipeoffload and the no-memory lower bound; then CP-SAT's plans for the driver's
``SEARCHED_FACTORS`` (``offloaded_searched_plan``, ``--seconds`` each, on every
placement: what the driver tries with time its search leaves over); then the best overall with
its placement, and the seconds the row took. Nothing is asserted but fit; the table
goes to docs/optimizer.md between markers.

    python scripts/bench_offload_starts.py                 # about twelve minutes
    python scripts/bench_offload_starts.py --sizes 8x16 --factors 2,2.5 --no-write
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchargs import parse_size  # noqa: E402
from bench_solver import bench_problem  # noqa: E402
from docblock import publish  # noqa: E402

from optpipe.optimizer.offload_starts import SEARCHED_FACTORS  # noqa: E402

DOC = ROOT / "docs" / "optimizer.md"
START, END = "<!-- offload-starts:start -->", "<!-- offload-starts:end -->"


def row(stages: int, microbatches: int, factors: list[float], placements: list[str],
        searched: list[float], seconds_each: float) -> str:
    from optpipe.generators import generate
    from optpipe.optimizer.offload_starts import (offloaded_list_schedules,
                                                  offloaded_searched_plan)
    from optpipe.optimizer.bounds import lower_bound
    from optpipe.optimizer.preprocess import task_graph
    from optpipe.schedule import searched_placements
    from optpipe.simulator import simulate

    problem = bench_problem(stages, microbatches, stages / 2, False)
    # with offload the no-memory bound holds; the least over the placements searched
    bound = min(lower_bound(task_graph(problem, True, place))
                for place in searched_placements(stages).values())
    po = simulate(problem, generate("pipeoffload", problem)).makespan
    t0 = time.monotonic()
    cells, best = [], (float("inf"), "")
    searched_plan = partial(offloaded_searched_plan, time_limit=seconds_each)
    tries = [(factor, offloaded_list_schedules) for factor in factors] + \
        [(factor, searched_plan) for factor in searched]
    for factor, make in tries:
        here = float("inf")
        for name in placements:
            place = searched_placements(stages)[name]
            for schedule in make(problem, place, True, factor):
                result = simulate(problem, schedule)
                assert result.fits, schedule.name           # the module's promise
                here = min(here, result.makespan)
                if result.makespan < best[0] - 1e-9:
                    best = (result.makespan, f"{name}, {schedule.name}")
        cells.append("-" if here == float("inf") else f"{here:.4g}")
    seconds = time.monotonic() - t0

    def gap(x: float) -> str:
        return f"{100 * (1 - bound / x):.1f}%"

    line = (f"| {stages}×{microbatches} | {bound:.4g} | {po:.4g} ({gap(po)}) | "
            + " | ".join(cells) + f" | {best[0]:.4g} ({gap(best[0])}) {best[1]} | "
            f"{seconds:.0f} s |")
    print(line, flush=True)
    return line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4x8,4x16,8x16,4x32,8x32,16x16,16x32",
                    help="benchmark SxM, budget S/2")
    ap.add_argument("--factors", default="1.5,1.75,2,2.125,2.25,2.375,2.5,2.625,2.75,3,4")
    ap.add_argument("--searched", default=",".join(f"{f:g}" for f in sorted(SEARCHED_FACTORS)),
                    help="factors for CP-SAT's plans ('' for none; default: the "
                         "driver's SEARCHED_FACTORS)")
    ap.add_argument("--seconds", type=float, default=5.0,
                    help="CP-SAT's time per plan and placement")
    ap.add_argument("--placements", default="interleaved,v",
                    help="of linear, v, interleaved (one stage per device never gave "
                         "the fastest on the benchmark)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    factors = [float(x) for x in args.factors.split(",")]
    searched = [float(x) for x in args.searched.split(",") if x]
    placements = [x for x in args.placements.split(",") if x]
    columns = [f"x{f:g}" for f in factors] + [f"CP-SAT x{f:g}" for f in searched]
    lines = ["| problem | no-memory bound | pipeoffload (gap) | "
             + " | ".join(columns) + " | best (gap), placement, plan | took |",
             "|---|---|---|" + "---|" * len(columns) + "---|---|"]
    for spec in [x for x in args.sizes.split(",") if x]:
        stages, microbatches = parse_size(spec)
        lines.append(row(stages, microbatches, factors, placements, searched,
                         args.seconds))
    text = ("Measured with `python scripts/bench_offload_starts.py` on 2 CPU cores "
            "(budget S/2, F = B = W = 1 s, p2p 0.05 s, one activation moved in "
            "half an F; makespans in seconds; x<factor>: the fastest fitted list schedule "
            f"planned for that many times the room, over {', '.join(placements)}; "
            f"CP-SAT x<factor>: CP-SAT's plan for that room ({args.seconds:g} s on 2 "
            "workers per placement), fitted; gap to "
            "the least no-memory bound over the three placements, which is what holds with offload).\n\n"
            + "\n".join(lines))
    publish(text, DOC, START, END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
