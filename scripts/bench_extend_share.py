#!/usr/bin/env python3
"""The extended schedules alone at 16 x 64, budget S/2, given different times.

Why this script: the driver gives the extended schedules (``warm_starts.add_extended``)
a share of its minute where their source has 512 cells or more
(``warm_starts.EXTEND_SHARE_LARGE``). 16 x 32, the source, has many optima, and
their extensions to 64 microbatches differ, so more time for the source search is not
always a better extension. For each time in ``--seconds`` (and each of ``--runs``
repetitions) this calls ``add_extended`` alone on the benchmark's problem
(``bench_solver.bench_problem``: F = B = W = 1 s, p2p 0.05 s, one stage per device)
and reports every source it extended (its makespan) and the best extensions it
returned. 0.3 of the minute is 18 s, the old 0.75 was 45 s.

Every time is wall time on this machine. Nothing is asserted; the table goes to
docs/optimizer-log.md between markers.

    python scripts/bench_extend_share.py                     # 18, 27, 45 s, twice: ~6 min
    python scripts/bench_extend_share.py --seconds 18 --runs 1 --no-write
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
MARKERS = "<!-- extend-share:start -->", "<!-- extend-share:end -->"


def extend_alone(seconds: float) -> tuple[str, str, float]:
    """``add_extended`` alone for ``seconds``: the sources it extended, its best
    extensions, and its wall time."""
    from optpipe.optimizer import extend
    from optpipe.optimizer.driver import _restrict
    from optpipe.optimizer.prefix import PrefixCuts
    from optpipe.optimizer.preprocess import fixed_schedules
    from optpipe.optimizer.warm_starts import add_extended
    from optpipe.simulator import simulate

    problem = bench_problem(16, 64, 8, False)
    fixed = _restrict(fixed_schedules(problem), problem, ("linear",))
    before = len(fixed.candidates)
    sources: list[str] = []
    real = extend.extensions

    def noting(target, source, **kwargs):
        smaller = replace(target, microbatches=source.microbatches)
        sources.append(f"{source.microbatches}: {simulate(smaller, source).makespan:.2f} s")
        return real(target, source, **kwargs)
    extend.extensions = noting
    t0 = time.monotonic()
    try:
        add_extended(problem, fixed, True, False, seconds, 2, ("linear",), None,
                     PrefixCuts())
    finally:
        extend.extensions = real
    wall = time.monotonic() - t0
    found = sorted(c.makespan for c in fixed.candidates[before:])
    return ", ".join(sources), ", ".join(f"{m:.2f} s" for m in found) or "none", wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", default="18,27,45",
                    help="comma list of times for the extensions (default 18,27,45)")
    ap.add_argument("--runs", type=int, default=2, help="repetitions of each (default 2)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    try:
        times = [float(t) for t in args.seconds.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--seconds takes times like 18,27,45, got {args.seconds!r}")
    if not times or min(times) <= 0 or args.runs < 1:
        ap.error("--seconds must be positive and --runs at least 1")
    lines = ["| time | run | sources extended (microbatches: makespan) | 16 x 64 extensions "
             "| wall |", "|---|---|---|---|---|"]
    for seconds in times:
        for run in range(args.runs):
            sources, found, wall = extend_alone(seconds)
            print(f"  {seconds:g} s run {run + 1}: sources {sources}; extensions {found}; "
                  f"{wall:.1f} s", flush=True)
            lines.append(f"| {seconds:g} s | {run + 1} | {sources} | {found} | {wall:.1f} s |")
    command = shlex.join(["scripts/bench_extend_share.py"] + sys.argv[1:])
    caption = (f"Measured with `python {command}` ({time.strftime('%Y-%m-%d')}, 2 cores, "
               f"2 solver threads; 16 x 64, budget S/2, F = B = W = 1 s, p2p 0.05 s, one "
               f"stage per device; the extended schedules alone; the 16 x 64 optimum is "
               f"304.0 s).")
    publish(caption + "\n\n" + "\n".join(lines), DOC, *MARKERS, write=not args.no_write)


if __name__ == "__main__":
    main()
