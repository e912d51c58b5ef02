#!/usr/bin/env python3
"""The chunked placements' search: full model alone, microbatch windows, time windows.

Why this script: search revision 9 packs the V shape and interleaved chunks by *time*
windows (``decompose.time_window_search``) after the full model has had a tenth of the
time. This measures that choice on the benchmark's problems
(``bench_solver.bench_problem``: F = B = W = 1 s, p2p 0.05 s) on the V shape, with CP-SAT
alone (``solve_cpsat``) hinted with the fitting fixed schedules, one run each:

* ``full``: the full model for the whole time (``decompose=False``);
* ``microbatch``: 40% full model, then windows of consecutive microbatches
  (``decompose=True``, what revision 8 did where memory binds the round trip);
* ``time``: what ``solve_cpsat`` now does by itself (``decompose=None``);
* with ``--widths 16,32,48``: the time windows at other widths (tasks per device);
* with ``--full-shares 0.4``: the time windows after another share for the full model.

Each cell: makespan, and the gap to the placement's lower bound (the memory bounds;
the runs' own bounds are no higher on these cells). Nothing is asserted; the table goes
to docs/optimizer.md between markers.

    python scripts/bench_windows.py               # 15 runs of 60 s, about 16 minutes
    python scripts/bench_windows.py --sizes 8x16 --half-sizes "" --time-limit 20 --no-write
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_solver import bench_problem  # noqa: E402
from benchargs import parse_size  # noqa: E402
from docblock import publish  # noqa: E402

from optpipe.optimizer import cpsat, decompose  # noqa: E402

DOC = ROOT / "docs" / "optimizer.md"
START, END = "<!-- windows:start -->", "<!-- windows:end -->"
MODES = {"full": False, "microbatch": True, "time": None}


def run(stages: int, microbatches: int, budget: float, mode: str, seconds: float,
        width: float | None = None, share: float | None = None) -> str:
    """One solve on the V shape; its makespan and its gap to the memory bounds."""
    from optpipe.optimizer.bounds import lower_bound, memory_bound
    from optpipe.optimizer.candidates import hint_pool
    from optpipe.optimizer.cpsat import solve_cpsat
    from optpipe.optimizer.cpsat_model import make_ticks
    from optpipe.optimizer.preprocess import fixed_schedules
    from optpipe.schedule import v_placement
    from optpipe.simulator import simulate

    problem = bench_problem(stages, microbatches, stages * budget, False)
    place = v_placement(stages)
    ticks = make_ticks(problem, True, False, (1.0,), place)
    bound = memory_bound(ticks.graph, lower_bound(ticks.graph)) / ticks.scale
    saved = decompose.TIME_WINDOW_TASKS, cpsat.TIME_FULL_SHARE
    try:
        if width is not None:
            decompose.TIME_WINDOW_TASKS = width
        if share is not None:
            cpsat.TIME_FULL_SHARE = share
        result = solve_cpsat(problem, warm_start=hint_pool(fixed_schedules(problem), True),
                             time_limit=seconds, placement=place, decompose=MODES[mode])
    finally:
        decompose.TIME_WINDOW_TASKS, cpsat.TIME_FULL_SHARE = saved
    sim = simulate(problem, result.schedule)
    assert sim.fits and math.isclose(sim.makespan, result.objective, rel_tol=1e-6)
    bound = max(bound, result.bound)
    proven = " optimal" if result.status == "optimal" else ""
    return f"{sim.makespan:.2f} s ({100 * (1 - bound / sim.makespan):.2f}%{proven})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8x16,8x32,8x64,16x32", help="SxM at budget S")
    ap.add_argument("--half-sizes", default="8x32", help="SxM at budget S/2")
    ap.add_argument("--modes", default="full,microbatch,time")
    ap.add_argument("--widths", default="", help="also time windows of these widths")
    ap.add_argument("--full-shares", default="", help="also time windows after these "
                    "shares of the time for the full model")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    def sizes(spec: str) -> list[tuple[int, int]]:
        return [parse_size(s) for s in spec.split(",") if s]

    columns = [(mode, None, None) for mode in args.modes.split(",") if mode] + \
        [("time", float(w), None) for w in args.widths.split(",") if w] + \
        [("time", None, float(x)) for x in args.full_shares.split(",") if x]
    header = [f"time, {width:g} tasks" if width is not None else
              f"time after {share:g} full" if share is not None else mode
              for mode, width, share in columns]
    rows = ["| V shape | " + " | ".join(header) + " |", "|---|" + "---|" * len(columns)]
    for budget, label, spec in ((1.0, "S", args.sizes), (0.5, "S/2", args.half_sizes)):
        for stages, microbatches in sizes(spec):
            found = []
            for (mode, width, share), name in zip(columns, header):
                found.append(run(stages, microbatches, budget, mode, args.time_limit,
                                 width, share))
                print(f"{stages} x {microbatches} at {label}, {name}: {found[-1]}",
                      flush=True)
            rows.append(f"| {stages} x {microbatches} at {label} | " + " | ".join(found) + " |")
    text = (f"Measured with `python scripts/bench_windows.py` on 2 CPU cores, 2 solver "
            f"threads, {args.time_limit:g} s per run, one run each; CP-SAT alone on the V "
            f"shape, hinted with the fitting fixed schedules (F = B = W = 1 s, p2p 0.05 s). "
            f"Makespan (gap to the lower bound).\n\n" + "\n".join(rows))
    publish(text, DOC, START, END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
