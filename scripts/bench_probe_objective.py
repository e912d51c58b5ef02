#!/usr/bin/env python3
"""The gap probe with and without the makespan objective, across CP-SAT seeds.

Why this script: the gap probe (``cpsat._gap_probe``) asks one question, "is there a
schedule of at most 99.5% of the answer?", yet it ran the order model with its
objective, so CP-SAT's workers also minimized inside the horizon. Its refutation time
is heavy-tailed across seeds (``scripts/bench_disjunctive.py``), and since the probe
must fit in what the minute leaves (about 45 s at 8 x 64), the tail decides whether
the cell ends within 0.5%. ``cpsat.PROBE_MINIMIZES`` chooses; this script measures
both. For each case of the benchmark's problem (``bench_solver.bench_problem``: F = B
= W = 1 s, p2p 0.05 s, budget S/2, one stage per device) it runs the driver once,
keeping its answer and the prefix cuts of its full model (pieces and ladder, as the
driver built them), and then probes 0.5% below that answer (``cpsat.PROBE_GAP``) on 2
workers, once per seed in ``--seeds`` and setting, up to ``--probe-seconds`` each.

Every time is wall time on this machine, model building included. Nothing is
asserted; the table goes to docs/optimizer-log.md between markers.

    python scripts/bench_probe_objective.py               # 4x64, 8x64, seeds 1-5: ~10 min
    python scripts/bench_probe_objective.py --cases 8x64 --seeds 1,2 --no-write
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_disjunctive import driver_with_its_full_model  # noqa: E402
from bench_gap_probe import refute  # noqa: E402
from bench_solver import bench_problem  # noqa: E402
from benchargs import parse_size  # noqa: E402
from docblock import publish  # noqa: E402

from optpipe.optimizer import cpsat  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
MARKERS = "<!-- probe-objective:start -->", "<!-- probe-objective:end -->"
#: (label, whether the probe minimizes the makespan inside its horizon)
SETTINGS = (("with the objective", True), ("without (feasibility)", False))


def probe_times(problem, answer, cuts, minimize: bool, seeds: list[int],
                seconds: float, label: str) -> str:
    """One cell: each seed's outcome, and the median of the refuted ones' times."""
    parts, refuted = [], []
    for seed in seeds:
        _, status, wall = refute(problem, answer, cuts, cpsat.PROBE_GAP, seconds,
                                 seed=seed, minimize=minimize)
        if status == "INFEASIBLE":
            refuted.append(wall)
            parts.append(f"{wall:.1f}")
        else:
            parts.append(f"{status.lower()} after {wall:.0f}")
        print(f"  {label}: seed {seed} {parts[-1]} s", flush=True)
    median = (f"; median {statistics.median(refuted):.1f} s" if len(refuted) == len(seeds)
              else f"; {len(refuted)} of {len(seeds)} refuted")
    return ", ".join(parts) + " s" + median


def rows_for(stages: int, microbatches: int, seeds: list[int], seconds: float) -> list[str]:
    """The case's line of the table."""
    problem = bench_problem(stages, microbatches, stages * 0.5, False)
    result, text, call = driver_with_its_full_model(problem)
    print(f"  {stages}x{microbatches} driver: {text}", flush=True)
    if call is None or result.status == "optimal":
        return [f"| {stages} x {microbatches} | {text} | no probe: "
                f"{'proven' if call else 'no full model with cuts'} | |"]
    cuts = call[1]
    cells = [probe_times(problem, result.schedule, cuts, minimize, seeds, seconds,
                         f"{stages}x{microbatches} {label}")
             for label, minimize in SETTINGS]
    return [f"| {stages} x {microbatches} | {text} | " + " | ".join(cells) + " |"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="4x64,8x64", help="SxM,... (default %(default)s)")
    ap.add_argument("--seeds", default="1,2,3,4,5", help="CP-SAT seeds of the probes")
    ap.add_argument("--probe-seconds", type=float, default=70.0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    rows = ["| case | the driver's answer | " + " | ".join(
        f"probe 0.5% below it, {label} (refuted in, per seed)" for label, _ in SETTINGS)
        + " |", "|---|---|---|---|"]
    for case in args.cases.split(","):
        rows += rows_for(*parse_size(case), seeds, args.probe_seconds)
    text = (f"Measured with `{shlex.join(['python', 'scripts/bench_probe_objective.py'] + sys.argv[1:])}` "
            f"on {time.strftime('%Y-%m-%d')}, 2 CPU cores, 2 solver threads (budget S/2, one "
            f"stage per device, F = B = W = 1 s, p2p 0.05 s; the driver's probe: "
            f"{'with' if cpsat.PROBE_MINIMIZES else 'without'} the objective).\n\n"
            + "\n".join(rows))
    publish(text, DOC, *MARKERS, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
