#!/usr/bin/env python3
"""List schedules against the fixed schedules, placement by placement (no search).

Why this script: search revision 10 gives the engines list schedules
(``optimizer.listsched``) on the chunked placements as warm starts. This shows what they
start from: for the model presets (``optpipe solve --stages S --mem 80GB``'s problems)
and the benchmark's problems (``bench_solver.bench_problem``: F = B = W = 1 s, p2p
0.05 s) at budgets S/2, S and 2S, per placement, the fastest fitting fixed schedule (the
driver's set: every generator, capped 1F1B and the greedy list schedules on one stage
per device), the fastest fitting list schedule (every rule and reserve) and, since
search revision 16, the fastest admission schedule (``listsched.admission_schedules``:
ZB-V's greedy holding back part of the later chunks' bytes), each with its gap to the
placement's lower bound (``bounds.lower_bound`` and ``memory_bound``), and the
seconds each family took (building and simulating). Nothing is asserted; the table goes
to docs/optimizer.md between markers.

``--shares SxM`` adds a second table: at budget S, per chunked placement, the best
simulated makespan of ZB-V's greedy over its eight variants at each share of the
later-chunk bytes held back at admission (1.0 is ZB-V's rule; "stalls" when every
variant does).

    python scripts/bench_listsched.py                    # about a minute
    python scripts/bench_listsched.py --sizes 8x32 --presets "" --no-write
    python scripts/bench_listsched.py --presets "" --sizes "" --shares 16x32
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_solver import bench_problem  # noqa: E402
from benchargs import parse_size  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer.md"
START, END = "<!-- listsched:start -->", "<!-- listsched:end -->"
SHARES_START, SHARES_END = "<!-- listsched-shares:start -->", "<!-- listsched-shares:end -->"
SHARES = (1.0, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)
BUDGETS = (("S/2", 0.5), ("S", 1.0), ("2S", 2.0))


def _cell(makespan: float | None, bound: float) -> str:
    if makespan is None:
        return "none fits"
    return f"{makespan:.4g} s ({max(0.0, 100 * (1 - bound / makespan)):.1f}%)"


def row(label: str, problem) -> list[str]:
    """One line per placement: best fixed, best list schedule, their gaps, seconds."""
    from optpipe.optimizer.bounds import lower_bound, memory_bound
    from optpipe.optimizer.cpsat_model import make_ticks
    from optpipe.optimizer.listsched import admission_schedules, list_schedules
    from optpipe.optimizer.preprocess import fixed_schedules
    from optpipe.schedule import placement_name, searched_placements
    from optpipe.simulator import simulate

    fixed = fixed_schedules(problem).candidates      # the driver's: generators + its own
    lines = []
    for name, place in searched_placements(problem.devices).items():
        ticks = make_ticks(problem, True, False, (1.0,), place)
        bound = memory_bound(ticks.graph, lower_bound(ticks.graph)) / ticks.scale
        on = [c.makespan for c in fixed if c.fits and not c.schedule.offloads
              and placement_name(c.schedule.placement, c.schedule.devices) == name]
        t0 = time.monotonic()
        made = [simulate(problem, s) for s in list_schedules(problem, place)]
        seconds = time.monotonic() - t0
        fits = [r.makespan for r in made if r.fits]
        t0 = time.monotonic()
        admitted = [] if name == "linear" else [
            simulate(problem, s) for s in admission_schedules(problem, place)]
        admit_seconds = time.monotonic() - t0
        best_admitted = min((r.makespan for r in admitted if r.fits), default=None)
        best_fixed, best_list = min(on, default=None), min(fits, default=None)
        lines.append(f"| {label} | {name} | {_cell(best_fixed, bound)} | "
                     f"{_cell(best_list, bound)} | {seconds:.1f} s | "
                     + ("— | —" if name == "linear" else
                        f"{_cell(best_admitted, bound)} | {admit_seconds:.1f} s") + " |")
        print(lines[-1], flush=True)
    return lines


def share_rows(stages: int, microbatches: int) -> list[str]:
    """Per chunked placement at budget S: ZB-V's greedy, best of its variants, by share."""
    from dataclasses import replace

    from optpipe.generators import listsched as greedy
    from optpipe.generators.zbv import VARIANTS
    from optpipe.schedule import from_orders, searched_placements
    from optpipe.simulator import simulate

    problem = bench_problem(stages, microbatches, stages, False)
    cap = tuple(float(problem.budget[d] - problem.static[d]) for d in range(stages))
    lines = []
    for name, place in searched_placements(stages).items():
        if name == "linear":
            continue
        cells = []
        for share in SHARES:
            best = None
            for variant in VARIANTS:
                try:
                    run = greedy.list_schedule(problem.split(place), place,
                                               replace(variant, mem_cap=cap, reserve=share))
                except greedy.Stalled:
                    continue
                result = simulate(problem, from_orders("x", place, microbatches, run.orders))
                if result.fits and (best is None or result.makespan < best):
                    best = result.makespan
            cells.append("stalls" if best is None else f"{best:.4g} s")
        lines.append(f"| {stages}×{microbatches} at S | {name} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    return lines


def main() -> int:
    from optpipe.cli_common import add_problem_args, problem_from_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="4,8,16",
                    help="stage counts of `optpipe solve --stages S --mem 80GB`")
    ap.add_argument("--sizes", default="8x32,16x32,16x64", help="benchmark SxM")
    ap.add_argument("--shares", default="", help="SxM, ...: the share table (see above)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.shares:
        rows = ["| problem | placement | " + " | ".join(f"share {x:g}" for x in SHARES) + " |",
                "|---|---|" + "---|" * len(SHARES)]
        for spec in args.shares.split(","):
            rows += share_rows(*parse_size(spec))
        publish("Measured with `python scripts/bench_listsched.py --presets \"\" --sizes \"\" "
                f"--shares {args.shares}` (best fitting makespan of ZB-V's eight variants; "
                "F = B = W = 1 s, p2p 0.05 s).\n\n" + "\n".join(rows), DOC,
                SHARES_START, SHARES_END, write=not args.no_write)
        if not (args.presets or args.sizes):
            return 0
    lines = ["| problem | placement | best fixed (gap) | best list schedule (gap) | "
             "list schedules took | best admission schedule (gap) | they took |",
             "|---|---|---|---|---|---|---|"]
    for stages in [int(x) for x in args.presets.split(",") if x]:
        parser = argparse.ArgumentParser()
        add_problem_args(parser)
        problem = problem_from_args(parser.parse_args(["--stages", str(stages),
                                                       "--mem", "80GB"]))
        lines += row(f"preset, --stages {stages} --mem 80GB", problem)
    for spec in [x for x in args.sizes.split(",") if x]:
        stages, microbatches = parse_size(spec)
        for label, k in BUDGETS:
            lines += row(f"{stages}×{microbatches} at {label}",
                         bench_problem(stages, microbatches, stages * k, False))
    text = ("Measured with `python scripts/bench_listsched.py` on 2 CPU cores (no "
            "search; fixed: every generator, capped 1F1B and the greedy schedules on one "
            "stage per device; gap to the placement's lower bound; presets: the problems of "
            "`optpipe solve --stages S --mem 80GB`; the others: F = B = W = 1 s, p2p "
            "0.05 s, no offload).\n\n" + "\n".join(lines))
    publish(text, DOC, START, END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
