#!/usr/bin/env python3
"""What makes a good source for the extended schedules at 16 x 64, budget S/2.

Why this script: with one stage per device at 16 x 64 and S/2, the driver's start for
its main run is an extension (``optpipe/optimizer/extend.py``) of a search on 16 x 32,
and whether the cell ends within 0.5% in the minute depends on that start
(docs/optimizer-log.md, the item "16 x 64 at S/2 undependable"). This script measures
the two things that item rests on:

* *the source search's path*: 16 x 32 searched by CP-SAT as ``extend.extended_schedules``
  searches it (one stage per device, hinted with the 16 x 16 optimum's extensions and
  the fixed schedules), for each ``--seconds`` and ``--seeds``; every schedule the
  microbatch windows find on the way (``decompose._report`` is wrapped to see them) and
  the final answer are each extended to 64 microbatches (``extend.extensions``), so the
  table shows how well a source extends against how short it is;
* *a long schedule's prefixes* (``--long-seconds`` > 0): the driver solves 16 x 64 for
  that long, and the first ``--prefixes`` microbatches of its answer
  (``extend.first_microbatches``) are extended back to 64.

Every makespan is the simulator's. Nothing is asserted; the tables go to
docs/optimizer-log.md between markers.

    python scripts/bench_extend_source.py                          # ~10 min
    python scripts/bench_extend_source.py --seconds 12.7 --seeds 1 --long-seconds 0 --no-write
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_solver import bench_problem  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
MARKERS = "<!-- extend-source:start -->", "<!-- extend-source:end -->"
#: The benchmark's problem: 16 stages, 64 microbatches, budget S/2 (8 microbatches' worth).
STAGES, MICROBATCHES, BUDGET = 16, 64, 8


def linear_hints(problem):
    """The fixed schedules on one stage per device that fit, fastest first (the hints
    ``warm_starts.add_extended`` gives the source search)."""
    from optpipe.optimizer.preprocess import fixed_schedules
    place = list(range(problem.devices))
    fitting = [c for c in fixed_schedules(problem).candidates
               if c.fits and list(c.schedule.placement) == place and not c.schedule.offloads]
    return [c.schedule for c in sorted(fitting, key=lambda c: c.makespan)]


def best_extension(target, source) -> float | None:
    """The shortest fitting extension of ``source`` to ``target``'s microbatches."""
    from optpipe.optimizer.extend import extensions
    found = extensions(target, source, keep=1)
    return found[0][1].makespan if found else None


def source_paths(seconds: list[float], seeds: list[int]) -> list[str]:
    """One row per (seconds, seed): the schedules the source search passed, each with its
    best extension, and its answer."""
    import optpipe.optimizer.decompose as decompose
    from optpipe.optimizer.cpsat import solve_cpsat
    from optpipe.optimizer.extend import extensions
    from optpipe.simulator import simulate

    full = bench_problem(STAGES, MICROBATCHES, BUDGET, False)
    half, quarter = (replace(full, microbatches=MICROBATCHES // k) for k in (2, 4))
    place = list(range(STAGES))
    inner = solve_cpsat(quarter, warm_start=linear_hints(quarter), time_limit=5.0,
                        placement=place)
    starts = [s for s, _ in extensions(half, inner.schedule)] + linear_hints(half)
    print(f"  16 x {quarter.microbatches}: {inner.objective:.2f} s ({inner.status}); "
          f"16 x {half.microbatches} hints from {simulate(half, starts[0]).makespan:.2f} s",
          flush=True)
    seen = []
    report = decompose._report

    def noting(progress, t0, best, ticks, bound):
        seen.append(best.schedule)
        return report(progress, t0, best, ticks, bound)
    rows = []
    decompose._report = noting
    try:
        for limit in seconds:
            for seed in seeds:
                seen.clear()
                t0 = time.monotonic()
                run = solve_cpsat(half, warm_start=starts, time_limit=limit, placement=place,
                                  seed=seed)
                wall = time.monotonic() - t0
                path = [(simulate(half, s).makespan, best_extension(full, s)) for s in seen]
                answer = (run.objective, best_extension(full, run.schedule))
                passed = ", ".join(f"{m:.2f} → {_s(e)}" for m, e in path) or "none"
                row = (f"| {limit:g} s | {seed} | {passed} | {answer[0]:.2f} → "
                       f"{_s(answer[1])} | {wall:.1f} s |")
                print(row, flush=True)
                rows.append(row)
    finally:
        decompose._report = report
    return rows


def prefix_rows(long_seconds: float, prefixes: list[int]) -> tuple[str, list[str]]:
    """The driver's answer at 16 x 64 after ``long_seconds``, and one row per prefix."""
    from optpipe.optimizer.driver import solve
    from optpipe.optimizer.extend import first_microbatches
    from optpipe.simulator import simulate

    full = bench_problem(STAGES, MICROBATCHES, BUDGET, False)
    result = solve(full, solver="cpsat", offload=False, placements=["linear"],
                   time_limit=long_seconds, cache=False, progress=False)
    head = (f"the driver given {long_seconds:g} s: {result.objective:.2f} s, bound "
            f"{result.bound:.2f} s")
    print(f"  {head}", flush=True)
    rows = []
    for m in prefixes:
        prefix = first_microbatches(result.schedule, m)
        own = simulate(replace(full, microbatches=m), prefix).makespan
        row = f"| {m} | {own:.2f} s | {_s(best_extension(full, prefix))} |"
        print(row, flush=True)
        rows.append(row)
    return head, rows


def _s(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f} s"


def _numbers(text: str, kind):
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"error: expected a comma list of numbers, got {text!r}") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", default="12.7,25",
                    help="source search times (default 12.7,25: the driver's, and about "
                         "twice it)")
    ap.add_argument("--seeds", default="1,2,3", help="CP-SAT seeds (default 1,2,3)")
    ap.add_argument("--long-seconds", type=float, default=300.0,
                    help="the driver's time at 16 x 64 for the prefixes (0: skip them)")
    ap.add_argument("--prefixes", default="24,32,40,48",
                    help="prefix lengths in microbatches (default 24,32,40,48)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    seconds, seeds = _numbers(args.seconds, float), _numbers(args.seeds, int)
    prefixes = _numbers(args.prefixes, int)
    if not seconds or min(seconds) <= 0 or not seeds or args.long_seconds < 0 or \
            any(not 0 < m < MICROBATCHES for m in prefixes):
        ap.error("--seconds must be positive, --seeds non-empty, --long-seconds >= 0 and "
                 f"--prefixes between 1 and {MICROBATCHES - 1}")
    command = shlex.join(["scripts/bench_extend_source.py"] + sys.argv[1:])
    lines = [f"Measured with `python {command}` ({time.strftime('%Y-%m-%d')}, 2 cores, 2 "
             f"solver threads; 16 x 64, budget S/2, F = B = W = 1 s, p2p 0.05 s, one stage "
             f"per device; every makespan the simulator's; the 16 x 64 optimum is 304.0 s, "
             f"16 x 32's 161.7 s).", "",
             "| source search | seed | schedules it passed (16 x 32 → best 16 x 64 "
             "extension) | its answer → extension | wall |", "|---|---|---|---|---|"]
    lines += source_paths(seconds, seeds)
    if args.long_seconds > 0:
        head, rows = prefix_rows(args.long_seconds, prefixes)
        lines += ["", f"Prefixes of a long schedule ({head}):", "",
                  "| prefix (microbatches) | as a schedule of its own | best 16 x 64 "
                  "extension |", "|---|---|---|"] + rows
    publish("\n".join(lines), DOC, *MARKERS, write=not args.no_write)


if __name__ == "__main__":
    main()
