#!/usr/bin/env python3
"""Where a chunked placement's gap lies at budget S: the bound or the search.

Why this script: at 16 x 32, budget S, the V shape's answers stay 4-5% above its bound
(the warm-up bound, 105.75 s) and it was not known which side is weak. Two probes, one
run each, on the benchmark's problem (``bench_solver.bench_problem``: F = B = W = 1 s,
p2p 0.05 s):

* **relaxations** that keep the capacity (one task at a time, memory) of some devices
  only (``cpsat_order.build_order_model(..., capacity=)``): the others' tasks just pass the
  dependencies on, so each optimum is a lower bound for the whole problem. If a few
  devices already forced more than the bound, the bound would be the weak side;
* **warm-up windows**: from the schedule a minute's search on the placement returns
  (``cpsat.solve_cpsat``), one window step that frees every task starting in
  ``[0, end)`` with the rest pinned (``decompose._Stepper``), given a long limit. If
  it finds a shorter schedule, the minute's windows (6 s steps) left time in the
  warm-up, so the search is (at least partly) the weak side.

Nothing is asserted; the table goes to docs/optimizer-log.md between markers.

    python scripts/bench_relaxation.py                  # about 13 minutes
    python scripts/bench_relaxation.py --size 8x16 --keep 6,7:30 --windows 30:30 --no-write

``--keep``: ``device,device,...:seconds`` groups separated by ``/`` (``a-b`` is a range).
``--windows``: ``end:seconds`` pairs separated by ``/`` (end in seconds of the schedule).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_solver import bench_problem  # noqa: E402
from benchargs import budget_label, parse_size  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
START, END = "<!-- relaxation:start -->", "<!-- relaxation:end -->"
KEEP = "14-15:60/0,15:60/12-15:60/11-15:120/10-15:120/8-15:90"
WINDOWS = "30:60/45:120"


def _devices(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def setup(stages: int, microbatches: int, shape: str, budget: float = 1.0):
    """The problem (``budget`` times S microbatches' activations), its ticks on the
    placement, the best fitting start as a hint (the driver's: fixed and list
    schedules), and the placement's memory bound in ticks. Shared with
    ``bench_step_build.py``."""
    from optpipe.optimizer.bounds import lower_bound, memory_bounds
    from optpipe.optimizer.candidates import hint_pool
    from optpipe.optimizer.cpsat import _pick_hint
    from optpipe.optimizer.cpsat_model import make_ticks
    from optpipe.optimizer.preprocess import fixed_schedules
    from optpipe.optimizer.warm_starts import add_list_schedules
    from optpipe.schedule import searched_placements

    problem = bench_problem(stages, microbatches, stages * budget, False)
    place = searched_placements(stages)[shape]
    ticks = make_ticks(problem, True, False, (), place)
    fixed = fixed_schedules(problem)
    add_list_schedules(problem, fixed, True)
    pool = hint_pool(fixed, True)
    hint = _pick_hint(problem, ticks, False, (), pool)
    lower = int(math.ceil(max(memory_bounds(ticks.graph, lower_bound(ticks.graph))) - 1e-9))
    return problem, place, ticks, pool, hint, lower


def relaxation(problem, ticks, hint, lower: int, keep: list[int], seconds: float
               ) -> tuple[str, float, float, float]:
    """CP-SAT on the model with only ``keep``'s capacity: status, best, bound, time."""
    from optpipe.optimizer.cpsat import new_solver
    from optpipe.optimizer.cpsat_order import build_order_model

    builder, _ = build_order_model(problem, ticks, hint.makespan, lower, hint,
                                   capacity=keep)
    builder.add_hints()
    solver = new_solver(seconds, 2)
    began = time.monotonic()
    code = solver.solve(builder.model)
    took = time.monotonic() - began
    return (solver.status_name(code).lower(), solver.objective_value / ticks.scale,
            solver.best_objective_bound / ticks.scale, took)


def warmup_window(problem, ticks, start, lower: int, end: float, seconds: float
                  ) -> tuple[int, float | None, bool, float]:
    """One window step over ``[0, end)`` from ``start`` (a Hint): tasks freed, the
    makespan found (None: nothing), proven, time."""
    from optpipe.optimizer.decompose import WindowStats, _Stepper

    cut = int(end * ticks.scale)
    free = {k for seq in start.order for k in seq if start.times[k][0] < cut}
    stepper = _Stepper(problem, ticks, lower, time.monotonic() + seconds + 60, 2, seconds)
    began = time.monotonic()
    found = stepper.run(start, free, WindowStats(), frozen_before=0)
    took = time.monotonic() - began
    return (len(free), None if found is None else found.makespan / ticks.scale,
            stepper.proven, took)


def _groups(spec: str) -> list[tuple[str, float]]:
    """``"a:60/b:120/c"`` as [("a", 60.0), ("b", 120.0), ("c", 60.0)]: what to run, and
    its seconds (60 unless given)."""
    out = []
    for group in filter(None, spec.split("/")):
        what, _, text = group.partition(":")
        out.append((what, float(text or 60)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="16x32", help="SxM (default 16x32)")
    ap.add_argument("--placement", default="v", choices=("v", "interleaved"))
    ap.add_argument("--keep", default=KEEP, help="devices:seconds groups, '/'-separated")
    ap.add_argument("--windows", default=WINDOWS,
                    help="end:seconds pairs, '/'-separated ('' skips the search and windows)")
    ap.add_argument("--budget", type=float, default=1.0,
                    help="budget as a multiple of S microbatches' activations (default 1)")
    ap.add_argument("--search", type=float, default=60.0,
                    help="seconds of the search whose schedule the windows start from")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    from optpipe.optimizer.cpsat import solve_cpsat
    from optpipe.optimizer.cpsat_model import make_hint

    stages, microbatches = parse_size(args.size)
    problem, place, ticks, pool, hint, lower = setup(stages, microbatches, args.placement,
                                                     args.budget)
    label = budget_label(args.budget)
    where = f"{stages} x {microbatches}, {args.placement}, budget {label}"
    lines = [f"**Relaxations** ({where}; the placement's memory bound {lower / ticks.scale:g} s, "
             f"the start {hint.makespan / ticks.scale:g} s):", "",
             "| devices with capacity | status | best found | bound | time |",
             "|---|---|---|---|---|"]
    for devices, seconds in _groups(args.keep):
        status, best, bound, took = relaxation(problem, ticks, hint, lower,
                                               _devices(devices), seconds)
        row = (f"| {devices} | {status} | {best:g} s | {bound:g} s | "
               f"{took:.1f} s of {seconds:g} |")
        print(row, flush=True)
        lines.append(row)
    if not args.windows:
        publish("Measured with `python scripts/bench_relaxation.py` on 2 CPU cores, 2 "
                "solver threads, one run each.\n\n" + "\n".join(lines), DOC, START, END,
                write=not args.no_write)
        return 0
    searched = solve_cpsat(problem, warm_start=pool, time_limit=args.search,
                           placement=place, threads=2)
    start = make_hint(searched.schedule, ticks)
    lines += ["", f"**Warm-up windows** (from the schedule of a {args.search:g} s search on "
              f"the placement, {start.makespan / ticks.scale:g} s):", "",
              "| window | tasks freed | found | proven | time |", "|---|---|---|---|---|"]
    for end, seconds in _groups(args.windows):
        freed, found, proven, took = warmup_window(problem, ticks, start, lower,
                                                   float(end), seconds)
        row = (f"| [0, {float(end):g} s) | {freed} | "
               f"{'nothing shorter' if found is None else f'{found:g} s'} | "
               f"{'yes' if proven else 'no'} | {took:.1f} s of {seconds:g} |")
        print(row, flush=True)
        lines.append(row)
    text = ("Measured with `python scripts/bench_relaxation.py` on 2 CPU cores, 2 solver "
            "threads, one run each.\n\n" + "\n".join(lines))
    publish(text, DOC, START, END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
