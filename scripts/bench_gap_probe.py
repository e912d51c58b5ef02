#!/usr/bin/env python3
"""How fast CP-SAT refutes "a schedule within the gap of the answer", against the driver.

Why this script: at budget S/2 on one stage per device the full model minimizing from
the answer neither proved nor moved its bound in the minute (4 x 64, 8 x 64), while the
question the target asks, "is there a schedule of at most 99.5% of the answer?", is
the same order model with its horizon there, which CP-SAT refutes much sooner
(``cpsat._gap_probe``, docs/optimizer.md "Prefix cuts": *The gap probe*). For each case
of the benchmark's problem (``bench_solver.bench_problem``: F = B = W = 1 s, p2p
0.05 s, budget S/2) it measures:

1. the driver on one stage per device for ``--seconds`` (its answer, bound and gap,
   and the probe it ran itself, if any);
2. the prefix cuts on that answer's placement for ``--cuts-seconds`` (pieces up to 16
   and the ladder above, as the driver builds them, but with their own time);
3. for each gap ``g`` of the case, the probe: the order model with the cuts, hinted
   with the answer, its horizon at ``ceil((1 - g) x answer) - 1`` tick, up to
   ``--probe-seconds`` of CP-SAT on 2 threads; and with ``--small-pieces`` the same
   probe once more with only the pieces up to 16 (the chain the driver has where its
   ladder does not finish, 16 x 64).

``--driver-runs N`` runs step 1 N times (the cell's spread: how many runs end within
0.5%; the probes start from the first run's answer). ``--probe-threads 2,1`` probes at
the first gap once per worker count (the refutation is one worker's work, measured by
hand: whether the other core is free during it).

Every time is wall time on this machine. Nothing is asserted; the table goes to
docs/optimizer-log.md between markers.

    python scripts/bench_gap_probe.py                 # 4x64 (0.5%, 0.3%), 8x64, 16x64: ~12 min
    python scripts/bench_gap_probe.py --cases 4x64 --no-write
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
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
MARKERS = "<!-- gap-probe:start -->", "<!-- gap-probe:end -->"
#: Where a run with ``--driver-runs`` above 1 goes: a measurement of its own (the
#: driver's spread), beside the single run's table rather than over it.
SPREAD_MARKERS = "<!-- gap-probe-spread:start -->", "<!-- gap-probe-spread:end -->"
DEFAULT_CASES = "4x64:0.005/0.003,8x64,16x64"
#: The largest piece the driver solves before its ladder (``prefix.MAX_PIECE``).
SMALL = 16
#: The driver's CP-SAT workers on this benchmark (2 cores): the probe's default.
DRIVER_THREADS = 2


def parse_case(text: str) -> tuple[int, int, list[float]]:
    """``SxM`` or ``SxM:g1/g2``: the size and the gaps to probe (default 0.5%)."""
    size, _, gaps = text.partition(":")
    stages, microbatches = (int(x) for x in size.lower().split("x"))
    return stages, microbatches, [float(g) for g in gaps.split("/")] if gaps else [0.005]


def refute(problem, answer, cuts, gap: float, seconds: float,
           threads: int = DRIVER_THREADS, seed: int | None = None,
           minimize: bool | None = None) -> tuple[float, str, float]:
    """The probe as the driver runs it, from ``answer`` with ``cuts`` (CP-SAT seed
    ``seed``, its default when None; with the makespan objective or without it,
    ``minimize``, the driver's ``cpsat.PROBE_MINIMIZES`` when None): its horizon in
    seconds, CP-SAT's status name and the wall time, model building included."""
    from optpipe.optimizer.cpsat import (PROBE_MINIMIZES, new_solver, probe_horizon,
                                         probe_status_name)
    from optpipe.optimizer.cpsat_model import make_hint, make_ticks
    from optpipe.optimizer.cpsat_order import build_order_model

    t0 = time.monotonic()
    ticks = make_ticks(problem, True, False, (1.0,), None)
    hint = make_hint(answer, ticks)
    horizon = probe_horizon(hint.makespan, gap)
    builder, _ = build_order_model(problem, ticks, horizon, 0, hint, cuts=cuts)
    minimize = PROBE_MINIMIZES if minimize is None else minimize
    if not minimize:
        builder.model.clear_objective()
    builder.add_hints()
    solver = new_solver(seconds, threads, proof=True)
    if seed is not None:
        solver.parameters.random_seed = seed
    code = solver.solve(builder.model)
    return (horizon / ticks.scale, probe_status_name(solver, code, minimize),
            time.monotonic() - t0)


def probe(problem, answer, cuts, gap: float, seconds: float,
          threads: int = DRIVER_THREADS) -> str:
    """One probe from ``answer`` with ``cuts``: its horizon, outcome and wall time."""
    horizon, status, wall = refute(problem, answer, cuts, gap, seconds, threads)
    workers = ("" if threads == DRIVER_THREADS
               else f" ({threads} worker{'s' if threads > 1 else ''})")
    return f"{gap:.1%} below{workers}: {horizon:.2f} s {status.lower()} in {wall:.1f} s"


def driver_run(problem, seconds: float):
    """The driver on one stage per device: the result and its line for the table."""
    from optpipe.optimizer.driver import solve

    result = solve(problem, solver="cpsat", offload=False, placements=["linear"],
                   time_limit=seconds, cache=False, progress=False)
    inside = next((r for r in result.schedule.provenance.get("runs", [])
                   if "gap_probe_status" in r), None)
    text = (f"{result.objective:.2f} s, bound {result.bound:.2f} s, gap {result.gap:.2%}"
            + (f"; its probe {inside['gap_probe_horizon']:.2f} s "
               f"{inside['gap_probe_status'].lower()} in {inside['gap_probe_seconds']:.1f} s"
               if inside else "; no probe"))
    return result, text


def row(stages: int, microbatches: int, gaps: list[float], seconds: float,
        cuts_seconds: float, probe_seconds: float, small_pieces: bool,
        driver_runs: int = 1, probe_threads: tuple[int, ...] = (DRIVER_THREADS,)) -> str:
    """The case's line of the table."""
    from optpipe.optimizer.cpsat import PROBE_GAP
    from optpipe.optimizer.prefix import PrefixCuts, prefix_cuts, truncated_hints

    problem = bench_problem(stages, microbatches, stages * 0.5, False)
    texts, within, answer = [], 0, None
    for run in range(driver_runs):
        result, text = driver_run(problem, seconds)
        answer = answer or result.schedule
        within += result.gap is not None and result.gap <= PROBE_GAP + 1e-9
        texts.append(text if driver_runs == 1 else f"run {run + 1}: {text}")
        print(f"  {stages}x{microbatches} driver: {texts[-1]}", flush=True)
    driver = "; ".join(texts) + (f" (**{within} of {driver_runs} within {PROBE_GAP:.1%}**)"
                                 if driver_runs > 1 else "")
    t0 = time.monotonic()
    cuts = prefix_cuts(problem, answer.placement, True, time_limit=cuts_seconds,
                       hints=truncated_hints([answer]), largest=SMALL)
    chain = f"{cuts.makespan_bound(microbatches):.2f} s ({time.monotonic() - t0:.0f} s)"
    print(f"  {stages}x{microbatches} cuts: {chain}", flush=True)
    probes = [probe(problem, answer, cuts, gap, probe_seconds) for gap in gaps]
    probes += [probe(problem, answer, cuts, gaps[0], probe_seconds, threads)
               for threads in probe_threads if threads != DRIVER_THREADS]
    if small_pieces:
        small = PrefixCuts(reach={n: v for n, v in cuts.reach.items() if n <= SMALL},
                           whole={n: v for n, v in cuts.whole.items() if n <= SMALL})
        probes.append(f"pieces up to {SMALL} only (chain "
                      f"{small.makespan_bound(microbatches):.2f} s), "
                      + probe(problem, answer, small, gaps[0], probe_seconds))
    for text in probes:
        print(f"  {stages}x{microbatches} probe {text}", flush=True)
    return (f"| {stages} x {microbatches} | {driver} | {chain} | " + "; ".join(probes)
            + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=DEFAULT_CASES,
                    help=f"comma list of SxM[:g1/g2] (default {DEFAULT_CASES})")
    ap.add_argument("--seconds", type=float, default=60.0, help="the driver's time limit")
    ap.add_argument("--cuts-seconds", type=float, default=60.0)
    ap.add_argument("--probe-seconds", type=float, default=60.0)
    ap.add_argument("--small-pieces", default="16x64",
                    help="comma list of SxM that also probe with the pieces up to 16 only")
    ap.add_argument("--driver-runs", type=int, default=1,
                    help="run the driver this many times per case (default 1)")
    ap.add_argument("--probe-threads", default="2",
                    help="comma list of CP-SAT worker counts for the first gap's probe "
                         "(default 2, the driver's)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    if args.driver_runs < 1:
        ap.error("--driver-runs must be at least 1")
    try:
        probe_threads = tuple(int(t) for t in args.probe_threads.split(",") if t.strip())
    except ValueError:
        ap.error(f"--probe-threads takes worker counts like 2,1, got {args.probe_threads!r}")
    if not probe_threads or min(probe_threads) < 1:
        ap.error("--probe-threads: each worker count must be at least 1")
    small = {s.strip().lower() for s in args.small_pieces.split(",") if s.strip()}
    lines = ["| size | the driver (one stage per device) | prefix cuts' chain (their time) "
             "| probes from the driver's answer |", "|---|---|---|---|"]
    for text in args.cases.split(","):
        stages, microbatches, gaps = parse_case(text.strip())
        lines.append(row(stages, microbatches, gaps, args.seconds, args.cuts_seconds,
                         args.probe_seconds, f"{stages}x{microbatches}" in small,
                         args.driver_runs, probe_threads))
    command = shlex.join(["scripts/bench_gap_probe.py"] + sys.argv[1:])
    caption = (f"Measured with `python {command}` "
               f"({time.strftime('%Y-%m-%d')}, 2 cores, 2 solver threads; budget S/2, "
               f"F = B = W = 1 s, p2p 0.05 s; driver {args.seconds:g} s, cuts "
               f"{args.cuts_seconds:g} s, each probe up to {args.probe_seconds:g} s).")
    publish(caption + "\n\n" + "\n".join(lines), DOC,
            *(SPREAD_MARKERS if args.driver_runs > 1 else MARKERS), write=not args.no_write)


if __name__ == "__main__":
    main()
