#!/usr/bin/env python3
"""CP-SAT's precedences in its no-overlap constraints, on and off, in the proof runs.

Why this script: the runs whose job is a bound (the prefix cuts' pieces, a full model
with the cuts and no windows, the gap probe: ``cpsat.new_solver(proof=True)``) search
little and propagate much, and at 8 x 64, budget S/2, one worker of the probe managed
about 110 conflicts a second (CP-SAT's log, by hand). Its propagator of the
precedences between a device's intervals (``use_precedences_in_disjunctive_constraint``)
reads the thousands of precedences of the order model at every node;
``cpsat.PROOF_DISJUNCTIVE_PRECEDENCES`` switches it off in those runs. For each case of
the benchmark's problem (``bench_solver.bench_problem``: F = B = W = 1 s, p2p 0.05 s,
budget S/2, one stage per device) it runs the driver once (the current setting),
recording the call of its full model with the cuts (hints, cuts, time limit), and then
for each setting measures:

1. the prefix cuts as the driver builds them (pieces up to 16 microbatches, then the
   ladder), given ``--cuts-seconds``: wall time and the chain's bound (the same bound
   both ways when every piece is proven: a check that the setting changes only speed);
2. the driver's full model with the cuts, from the driver's own hints, cuts and time
   limit (``solve_cpsat``; at 8 x 64 the gap probe runs inside it first);
3. where the driver's answer is not proven optimal, the gap probe 0.5% below it
   (``cpsat.PROBE_GAP``) with the cuts of step 1, on 2 workers, once per seed in
   ``--seeds``, up to ``--probe-seconds`` each: CP-SAT's refutation times are
   heavy-tailed across seeds, so one run says little.

Every time is wall time on this machine. Nothing is asserted; the table goes to
docs/optimizer-log.md between markers.

    python scripts/bench_disjunctive.py                # 4x64, 8x64, 16x32, seeds 1-3: ~20 min
    python scripts/bench_disjunctive.py --cases 8x64 --seeds 1 --no-write
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_gap_probe import SMALL, driver_run, refute  # noqa: E402
from bench_solver import bench_problem  # noqa: E402
from docblock import publish  # noqa: E402

from optpipe.optimizer import cpsat  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
MARKERS = "<!-- disjunctive:start -->", "<!-- disjunctive:end -->"
#: (label, value of ``use_precedences_in_disjunctive_constraint`` in the proof runs)
SETTINGS = (("on (CP-SAT's default)", True), ("off", False))


def cuts_for(problem, answer, seconds: float):
    """The prefix cuts on the answer's placement, timed: (cuts, their line)."""
    from optpipe.optimizer.prefix import prefix_cuts, truncated_hints

    t0 = time.monotonic()
    cuts = prefix_cuts(problem, answer.placement, True, time_limit=seconds,
                       hints=truncated_hints([answer]), largest=SMALL)
    wall = time.monotonic() - t0
    proven = len(cuts.exact) + len(cuts.exact_reach)
    return cuts, (f"{wall:.1f} s, chain {cuts.makespan_bound(problem.microbatches):.2f} s "
                  f"({proven} of {len(cuts.whole) + len(cuts.reach)} pieces exact)")


def probe_seconds(problem, answer, cuts, seed: int, seconds: float) -> str:
    """The gap probe from ``answer`` with ``cuts`` and CP-SAT seed ``seed``: its
    outcome and wall time (model building included)."""
    _, status, wall = refute(problem, answer, cuts, cpsat.PROBE_GAP, seconds, seed=seed)
    return f"{wall:.1f} s" if status == "INFEASIBLE" else f"{status.lower()} after {wall:.0f} s"


def driver_with_its_full_model(problem):
    """The driver's run and the call of its full model with the cuts (engine hints,
    cuts, time limit; None where it made none), recorded as the driver made it."""
    from optpipe.optimizer import driver

    calls = []
    real = driver._run_engine

    def recording(engine, problem, hints, time_limit, *args, cuts=None, **kwargs):
        if cuts is not None and not calls:
            calls.append((list(hints), cuts.copy(), time_limit, kwargs.get("decompose")))
        return real(engine, problem, hints, time_limit, *args, cuts=cuts, **kwargs)
    driver._run_engine = recording
    try:
        result, text = driver_run(problem, 60.0)
    finally:
        driver._run_engine = real
    return result, text, calls[0] if calls else None


def full_model(problem, call) -> str:
    """The driver's full model with its cuts, as it called it: outcome and wall time."""
    hints, cuts, limit, decompose = call
    t0 = time.monotonic()
    run = cpsat.solve_cpsat(problem, warm_start=hints, time_limit=limit, cuts=cuts,
                            decompose=decompose)
    wall = time.monotonic() - t0
    return (f"{run.status} {run.objective:.2f} s (bound {run.bound:.2f} s) in {wall:.1f} s "
            f"of {limit:.1f} s")


def rows_for(stages: int, microbatches: int, seeds: list[int], cuts_seconds: float,
             seconds: float) -> list[str]:
    """The case's lines of the table, one per setting."""
    problem = bench_problem(stages, microbatches, stages * 0.5, False)
    result, text, call = driver_with_its_full_model(problem)
    print(f"  {stages}x{microbatches} driver: {text}", flush=True)
    answer = result.schedule
    out = []
    saved = cpsat.PROOF_DISJUNCTIVE_PRECEDENCES
    try:
        for label, value in SETTINGS:
            cpsat.PROOF_DISJUNCTIVE_PRECEDENCES = value
            cuts, cut_text = cuts_for(problem, answer, cuts_seconds)
            print(f"  {stages}x{microbatches} {label}: cuts {cut_text}", flush=True)
            full = full_model(problem, call) if call else "none (windows)"
            print(f"  {stages}x{microbatches} {label}: full model {full}", flush=True)
            probes = []
            for seed in seeds if result.status != "optimal" else ():
                probes.append(f"seed {seed}: "
                              + probe_seconds(problem, answer, cuts, seed, seconds))
                print(f"  {stages}x{microbatches} {label}: probe {probes[-1]}", flush=True)
            out.append(f"| {stages} x {microbatches} | {label} | {cut_text} | {full} | "
                       + ("; ".join(probes) or "(answer proven optimal)") + " |")
    finally:
        cpsat.PROOF_DISJUNCTIVE_PRECEDENCES = saved
    return [f"| {stages} x {microbatches} | the driver (current setting) | {text} | | |"] + out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="4x64,8x64,16x32", help="SxM,... (default %(default)s)")
    ap.add_argument("--seeds", default="1,2,3", help="CP-SAT seeds of the probes")
    ap.add_argument("--cuts-seconds", type=float, default=90.0)
    ap.add_argument("--probe-seconds", type=float, default=70.0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    rows = ["| case | precedences in no-overlap (proof runs) | prefix cuts | "
            "the driver's full model with cuts, from its hints | "
            "gap probe 0.5% below the answer (refuted in) |", "|---|---|---|---|---|"]
    for case in args.cases.split(","):
        stages, microbatches = (int(x) for x in case.lower().split("x"))
        rows += rows_for(stages, microbatches, seeds, args.cuts_seconds,
                         args.probe_seconds)
    text = (f"Measured with `{shlex.join(['python', 'scripts/bench_disjunctive.py'] + sys.argv[1:])}` "
            f"on {time.strftime('%Y-%m-%d')}, 2 CPU cores, 2 solver threads (budget S/2, one "
            f"stage per device, F = B = W = 1 s, p2p 0.05 s).\n\n" + "\n".join(rows))
    publish(text, DOC, *MARKERS, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
