#!/usr/bin/env python3
"""How long CP-SAT takes to prove a chunked placement's answer, with and without prefix cuts.

Why this script: at budget S/2 no cell of the benchmark is proven over all placements in
the minute (docs/optimizer.md, "The targets, where they stand"). At 16 microbatches the
answers may already be optimal, and what is missing is the proof; :mod:`optpipe.
optimizer.prefix` builds its cuts for one stage per device only (``driver._cuts_pay``:
the chunked placements' pieces were once too slow to prove). This measures, for one
placement (default the V shape) of the benchmark's problem
(``bench_solver.bench_problem``: F = B = W = 1 s, p2p 0.05 s):

1. a hint: the driver restricted to the placement for ``--hint-seconds``;
2. the prefix cuts on the placement (pieces up to ``--largest`` microbatches: 8 on the
   chunked placements, the driver's 16 on one stage per device, which is here for
   comparison; up to ``--cuts-seconds``): their chain bound, and how many pieces were
   proven exactly;
3. four proof attempts from the hint, each up to ``--seconds`` of CP-SAT on 2 threads:
   ``optimize`` (the full order model, minimizing the makespan) and ``probe`` (the same
   model with its horizon one tick below the hint: infeasible proves the hint optimal
   on the placement), each without and with the cuts.

With ``--in-minute N`` it also emulates, ``N`` times per case, a probe step inside the
benchmark's minute: the driver for ``--hint-seconds`` (over all placements for a chunked
case, as the table's cell; on one stage per device alone for ``linear``, as its
column), the cuts on the answer's placement, then the probe with the cuts for what is
left of the 60 s.

Every time is wall time on this machine; the cuts' own time is in its column, not in
the proofs'. Nothing is asserted; the table goes to docs/optimizer-log.md between
markers.

    python scripts/bench_chunked_proofs.py      # v:4x16 and linear:4x64, S/2: about 15 min
    python scripts/bench_chunked_proofs.py --sizes 8x16 --seconds 120 --no-write
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

DOC = ROOT / "docs" / "optimizer-log.md"
START, END = "<!-- chunked-proofs:start -->", "<!-- chunked-proofs:end -->"
PLACEMENTS = ("v", "interleaved", "linear")
#: The benchmark's time limit, for ``--in-minute``.
MINUTE = 60.0


def attempt(problem, schedule, seconds: float, cuts, probe: bool) -> tuple[str, float, float]:
    """One proof attempt from ``schedule``: (outcome, bound in seconds, wall seconds).

    ``probe``: the horizon is one tick below the hint, so INFEASIBLE proves it optimal
    on its placement and a schedule found would be a shorter one."""
    from ortools.sat.python import cp_model

    from optpipe.optimizer.cpsat import new_solver
    from optpipe.optimizer.cpsat_model import make_hint, make_ticks
    from optpipe.optimizer.cpsat_order import build_order_model

    t0 = time.monotonic()
    place = list(schedule.placement)
    ticks = make_ticks(problem, True, False, (1.0,),
                       None if place == list(range(problem.devices)) else place)
    hint = make_hint(schedule, ticks)
    horizon = hint.makespan - 1 if probe else hint.makespan
    builder, _ = build_order_model(problem, ticks, horizon, 0, hint, cuts=cuts)
    builder.add_hints()
    solver = new_solver(seconds, 2)
    code = solver.solve(builder.model)
    wall = time.monotonic() - t0
    if code == cp_model.INFEASIBLE:
        return "proven (infeasible below)", hint.makespan / ticks.scale, wall
    if probe and code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # any schedule inside the lowered horizon is shorter than the hint, and the
        # optimum inside it is the placement's (every shorter schedule is inside)
        return ("shorter schedule found, proven optimal" if code == cp_model.OPTIMAL
                else "shorter schedule found"), solver.objective_value / ticks.scale, wall
    if code == cp_model.OPTIMAL:
        return "proven optimal", solver.objective_value / ticks.scale, wall
    bound = solver.best_objective_bound / ticks.scale if code == cp_model.FEASIBLE \
        else float("nan")
    return "open at the limit", bound, wall


def rows(stages: int, microbatches: int, budget: float, placement: str,
         hint_seconds: float, cuts_seconds: float, largest: int,
         seconds: float) -> list[str]:
    """One size's row: the hint, the cuts, and the four attempts."""
    from optpipe.optimizer.driver import solve
    from optpipe.optimizer.prefix import prefix_cuts, truncated_hints

    problem = bench_problem(stages, microbatches, stages * budget, False)
    found = solve(problem, solver="cpsat", offload=False, placements=[placement],
                  time_limit=hint_seconds, cache=False, progress=False).schedule
    best = found.provenance["objective"]
    t0 = time.monotonic()
    cuts = prefix_cuts(problem, found.placement, True, time_limit=cuts_seconds,
                       hints=truncated_hints([found]), largest=largest)
    cut_time = time.monotonic() - t0
    pieces = len(cuts.reach) + len(cuts.whole)
    exact = len(cuts.exact)
    cells = []
    for probe in (False, True):
        for with_cuts in (None, cuts):
            outcome, value, wall = attempt(problem, found, seconds, with_cuts, probe)
            cells.append(f"{outcome}, {value:.2f} s, {wall:.1f} s")
            print(f"  {stages}x{microbatches} {'probe' if probe else 'optimize'} "
                  f"{'cuts' if with_cuts else 'plain'}: {cells[-1]}", flush=True)
    return [f"| {stages} x {microbatches} | {placement} | {best:.2f} s | "
            f"{cuts.makespan_bound(microbatches):.2f} s ({pieces} pieces, {exact} exact "
            f"wholes, {cut_time:.1f} s) | " + " | ".join(cells) + " |"]


def in_minute(stages: int, microbatches: int, budget: float, placement: str,
              hint_seconds: float, largest: int, runs: int) -> list[str]:
    """``runs`` emulations of a probe step within the minute (see the module doc)."""
    from optpipe.optimizer.driver import solve
    from optpipe.optimizer.prefix import prefix_cuts, truncated_hints

    problem = bench_problem(stages, microbatches, stages * budget, False)
    out = []
    for run in range(1, runs + 1):
        t0 = time.monotonic()
        found = solve(problem, solver="cpsat", offload=False, time_limit=hint_seconds,
                      placements=["linear"] if placement == "linear" else None,
                      cache=False, progress=False).schedule
        cuts = prefix_cuts(problem, found.placement, True, time_limit=15,
                           hints=truncated_hints([found]), largest=largest)
        left = MINUTE - (time.monotonic() - t0)
        outcome, _, wall = attempt(problem, found, max(0.1, left), cuts, True)
        out.append(f"| {stages} x {microbatches} | {placement} | {run} | "
                   f"{found.provenance['objective']:.2f} s | {left:.1f} s | {outcome} | "
                   f"{time.monotonic() - t0:.1f} s |")
        print(out[-1], flush=True)
    return out


def main() -> None:
    from optpipe.optimizer.prefix import MAX_PIECE

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="v:4x16,linear:4x64",
                    help="[PLACEMENT:]SxM, ... (default v:4x16,linear:4x64); the "
                         "placement is v, interleaved, or linear (one stage per device, "
                         "whose cuts the driver already builds: for comparison), and "
                         "--placement when not given")
    ap.add_argument("--budget", type=float, default=0.5,
                    help="budget as a multiple of S microbatches' activations (default 0.5)")
    ap.add_argument("--placement", default="v", choices=PLACEMENTS)
    ap.add_argument("--hint-seconds", type=float, default=20.0)
    ap.add_argument("--cuts-seconds", type=float, default=30.0)
    ap.add_argument("--largest", type=int, default=None,
                    help="largest piece (default 8 on the chunked placements, "
                         f"{MAX_PIECE} on linear: the driver's)")
    ap.add_argument("--seconds", type=float, default=150.0,
                    help="limit of each proof attempt (default 150)")
    ap.add_argument("--in-minute", type=int, default=0, metavar="N",
                    help="also emulate a probe step in the minute N times per case")
    ap.add_argument("--no-proofs", action="store_true",
                    help="skip the four proof attempts (with --in-minute)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    cases = []
    for case in args.sizes.split(","):
        placement, _, size = case.rpartition(":")
        placement = placement or args.placement
        if placement not in PLACEMENTS:
            sys.exit(f"unknown placement {placement!r} in --sizes; choose one of "
                     f"{', '.join(PLACEMENTS)}")
        stages, microbatches = parse_size(size)
        cases.append((stages, microbatches, placement,
                      args.largest or (MAX_PIECE if placement == "linear" else 8)))
    table: list[str] = []
    if not args.no_proofs:
        table += ["| size | placement | hint (driver, placement only) | cuts' chain bound | "
                  "optimize | optimize + cuts | probe | probe + cuts |",
                  "|---|---|---|---|---|---|---|---|"]
        for stages, microbatches, placement, largest in cases:
            table += rows(stages, microbatches, args.budget, placement, args.hint_seconds,
                          args.cuts_seconds, largest, args.seconds)
    if args.in_minute:
        table += (["", ""] if table else []) + ["A probe step in the minute:", "",
                  "| size | placement | run | answer after the driver | left for the probe "
                  "| probe + cuts | total |", "|---|---|---|---|---|---|---|"]
        for stages, microbatches, placement, largest in cases:
            table += in_minute(stages, microbatches, args.budget, placement,
                               args.hint_seconds, largest, args.in_minute)
    caption = (f"Measured with `python scripts/bench_chunked_proofs.py --sizes {args.sizes} "
               f"--budget {args.budget:g} --seconds {args.seconds:g}"
               + (f" --hint-seconds {args.hint_seconds:g} --in-minute {args.in_minute}"
                  if args.in_minute else "") + (" --no-proofs" if args.no_proofs else "")
               + "` "
               f"({time.strftime('%Y-%m-%d')}, 2 cores, 2 solver threads; each cell: "
               "outcome, the answer or bound, wall time).")
    publish(caption + "\n\n" + "\n".join(table), DOC, START, END, write=not args.no_write)


if __name__ == "__main__":
    main()
