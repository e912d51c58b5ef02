#!/usr/bin/env python3
"""The no-wait waves (``optimizer.waves``) against the other starts on one stage per device.

Why this script: search revision 39 adds the waves to the driver's starts and, where
they lead one stage per device and the extension's source is large, builds no extended
schedules (``warm_starts.waves_lead``). This shows what they start from: for the
benchmark's problems (``bench_solver.bench_problem``: F = B = W = 1 s, p2p 0.05 s; with
``--hetero`` also the first and last stages 30% and 60% slower) at budgets S/2, S and
2S, the waves' makespan, the fastest fitting other start on
one stage per device (every generator, capped 1F1B and the greedy list schedules:
``preprocess.fixed_schedules`` without the waves), the placement's lower bound
(``bounds.lower_bound`` and ``memory_bound``), and the milliseconds the waves took
(building and simulating); and on the V shape (not used by the driver) the waves
against the fastest fitting other start there without offload (the fixed schedules,
list and admission schedules). Every makespan is the simulator's. Nothing is asserted; the
table goes to docs/optimizer-log.md between markers.

    python scripts/bench_waves.py                 # about a minute
    python scripts/bench_waves.py --sizes 16x64 --hetero --no-write
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_solver import bench_problem  # noqa: E402
from benchargs import budget_label, parse_size  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
MARKERS = "<!-- waves:start -->", "<!-- waves:end -->"
SIZES = "4x16,4x32,4x64,8x16,8x32,8x64,16x16,16x32,16x64"
BUDGETS = (0.5, 1.0, 2.0)


def _cell(makespan: float | None, fits: bool = True) -> str:
    if makespan is None:
        return "none"
    return f"{makespan:.2f} s" + ("" if fits else " (over)")


def row(stages: int, microbatches: int, k: float, hetero: bool) -> str:
    """One line: the waves, the best other linear start, the bound."""
    from optpipe.optimizer.bounds import lower_bound, memory_bound
    from optpipe.optimizer.preprocess import fixed_schedules, task_graph
    from optpipe.optimizer.waves import WAVES, wave_schedule
    from optpipe.schedule import linear_placement, v_placement
    from optpipe.simulator import simulate

    problem = bench_problem(stages, microbatches, stages * k, hetero)
    t0 = time.perf_counter()
    linear = wave_schedule(problem)
    linear_sim = simulate(problem, linear) if linear is not None else None
    ms = 1000 * (time.perf_counter() - t0)
    place = linear_placement(problem.devices)
    fixed = fixed_schedules(problem).candidates
    others = [c for c in fixed
              if c.fits and list(c.schedule.placement) == place
              and not c.name.startswith(WAVES) and not c.schedule.offloads]
    best = min(others, key=lambda c: c.makespan) if others else None
    v_waves = wave_schedule(problem, v_placement(stages))
    v_sim = simulate(problem, v_waves) if v_waves is not None else None
    v_best = best_v_start(problem, fixed)
    graph = task_graph(problem, True)
    bound = memory_bound(graph, lower_bound(graph))
    waves = linear_sim.makespan if linear_sim is not None and linear_sim.fits else None
    above = f"{100 * (waves / bound - 1):.1f}%" if waves is not None else "-"
    lead = ("**waves**" if waves is not None and (best is None or waves < best.makespan)
            else best.name if best is not None else "-")
    return (f"| {stages} x {microbatches} | {budget_label(k)} | {'yes' if hetero else 'no'} "
            f"| {_cell(linear_sim.makespan if linear_sim else None, bool(linear_sim and linear_sim.fits))} "
            f"| {_cell(best.makespan if best else None)} ({best.name if best else '-'}) "
            f"| {lead} | {bound:.2f} s | {above} | {ms:.0f} "
            f"| {_cell(v_sim.makespan if v_sim else None, bool(v_sim and v_sim.fits))} "
            f"| {_cell(v_best)} |")


def best_v_start(problem, fixed) -> float | None:
    """The fastest fitting start on the V shape without offload: the fixed schedules
    there (``fixed``: the problem's candidates) and the list and admission schedules
    (``listsched.warm_start_kinds``)."""
    from optpipe.optimizer.listsched import warm_start_kinds
    from optpipe.optimizer.waves import WAVES
    from optpipe.schedule import v_placement
    from optpipe.simulator import simulate

    place = v_placement(problem.devices)
    spans = [c.makespan for c in fixed
             if c.fits and c.schedule.placement == place and not c.schedule.offloads
             and not c.name.startswith(WAVES)]
    for kind in warm_start_kinds(problem, place, True):
        for schedule in kind:
            sim = simulate(problem, schedule)
            if sim.fits:
                spans.append(sim.makespan)
    return min(spans, default=None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default=SIZES, help=f"comma list of SxM (default {SIZES})")
    ap.add_argument("--hetero", action="store_true",
                    help="also the uneven stages (first 1.3x, last 1.6x)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes:
        ap.error("--sizes: give at least one SxM, e.g. 16x64")
    lines = ["| size | budget | uneven stages | waves | best other start "
             "(one stage per device) | leads | lower bound | waves above the bound "
             "| waves ms | V shape: waves | V shape: best other start |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for hetero in (False, True) if args.hetero else (False,):
        for stages, microbatches in sizes:
            for k in BUDGETS:
                line = row(stages, microbatches, k, hetero)
                print(line, flush=True)
                lines.append(line)
    command = shlex.join(["scripts/bench_waves.py"] + sys.argv[1:])
    caption = (f"Measured with `python {command}` ({time.strftime('%Y-%m-%d')}, 2 cores; "
               f"F = B = W = 1 s, p2p 0.05 s, one stage per device but in the last two "
               f"columns (the V shape); every makespan the "
               f"simulator's; the lower bound is the placement's memory bound, "
               f"not the optimum).")
    publish(caption + "\n\n" + "\n".join(lines), DOC, *MARKERS, write=not args.no_write)


if __name__ == "__main__":
    main()
