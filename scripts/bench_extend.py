#!/usr/bin/env python3
"""The chunked placements' extended schedules: a search on half the microbatches, its
steady state repeated.

Why this script: since search revision 15 the driver searches the V shape on half the
microbatches where memory binds but not hard, and repeats a window of that schedule
(``warm_starts.add_chunked_extended``, ``extend.extensions``). Where that pays decides its
limits: the half's size, the placement, the budget. This measures, on the benchmark's
problems (``bench_solver.bench_problem``: F = B = W = 1 s, p2p 0.05 s), what CP-SAT
alone reaches on the half in a given time (hinted as the driver hints it,
``warm_starts.chunked_source_hints``) and the fastest fitting extension of that schedule to
the full problem, against the full problem's memory bound on that placement. One run
each; nothing is asserted; the table goes to docs/optimizer-log.md between markers.

    python scripts/bench_extend.py                 # the default cases, about 3 minutes
    python scripts/bench_extend.py --cases 8x64:v:1:30 --no-write

A case is ``SxM:placement:budget:seconds`` (budget in multiples of S microbatches'
activations, as the benchmark's S = 1, S/2 = 0.5); M is the full problem's.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_solver import bench_problem  # noqa: E402
from benchargs import budget_label, parse_size  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
START, END = "<!-- extend:start -->", "<!-- extend:end -->"
CASES = ("8x64:v:1:30,8x64:v:1:15,8x64:interleaved:1:15,8x32:v:1:15,4x32:v:1:15,"
         "16x32:v:1:20,16x32:interleaved:1:20,8x64:v:0.5:15")


def run(stages: int, microbatches: int, shape: str, budget: float, seconds: float
        ) -> list[str]:
    """One case: the half's makespan and bound, the best extension and its gap."""
    from optpipe.optimizer.bounds import lower_bound, memory_bound
    from optpipe.optimizer.candidates import fused_is_faster
    from optpipe.optimizer.cpsat import solve_cpsat
    from optpipe.optimizer.cpsat_model import make_ticks
    from optpipe.optimizer.extend import extensions
    from optpipe.optimizer.warm_starts import chunked_source_hints
    from optpipe.schedule import searched_placements

    problem = bench_problem(stages, microbatches, stages * budget, False)
    half = replace(problem, microbatches=microbatches // 2)
    place = searched_placements(stages)[shape]
    hints = chunked_source_hints(shape, place, True, fused_is_faster(problem))(half)
    source = solve_cpsat(half, warm_start=hints, time_limit=seconds, placement=place,
                         threads=2)
    began = time.monotonic()
    found = extensions(problem, source.schedule, keep=1)
    took = time.monotonic() - began
    ticks = make_ticks(problem, True, False, (1.0,), place)
    bound = memory_bound(ticks.graph, lower_bound(ticks.graph)) / ticks.scale
    proven = " optimal" if source.status == "optimal" else ""
    if found:
        _, result = found[0]
        extended = (f"{result.makespan:.2f} s ({100 * (1 - bound / result.makespan):.2f}%), "
                    f"{took:.1f} s")
    else:
        extended = f"none fits ({took:.1f} s)"
    return [f"{source.objective:.2f} s{proven}", f"{source.bound:.2f} s", extended]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=CASES, help="SxM:placement:budget:seconds, ...")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    rows = ["| full problem | placement | budget | half searched | half: makespan | "
            "half: bound | best extension (gap to the full problem's bound), time |",
            "|---|---|---|---|---|---|---|"]
    for case in filter(None, args.cases.split(",")):
        try:
            size, shape, budget, seconds = case.split(":")
            budget, seconds = float(budget), float(seconds)
        except ValueError:
            raise SystemExit(f"error: {case!r} is not SxM:placement:budget:seconds, e.g. "
                             f"8x64:v:1:15") from None
        stages, microbatches = parse_size(size)
        cells = run(stages, microbatches, shape, budget, seconds)
        label = budget_label(budget)
        row = (f"| {stages} x {microbatches} | {shape} | {label} | "
               f"{stages} x {microbatches // 2}, {seconds:g} s | " + " | ".join(cells) + " |")
        print(row, flush=True)
        rows.append(row)
    text = ("Measured with `python scripts/bench_extend.py` on 2 CPU cores, 2 solver "
            "threads, one run each: CP-SAT alone on the half (hinted with its fitting "
            "fixed and list schedules on the placement), then the fastest fitting "
            "extension of its schedule (F = B = W = 1 s, p2p 0.05 s).\n\n" + "\n".join(rows))
    publish(text, DOC, START, END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
