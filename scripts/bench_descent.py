#!/usr/bin/env python3
"""The driver at 16 x 64, budget S/2, one stage per device: search then probe, against
the microbatch windows it replaced, over several runs.

Why this script: at 1024 stage x microbatch cells one stage per device is past the
cell limit of the full model with the prefix cuts (``cpsat.WINDOWLESS_MAX_CELLS_WITH_
CUTS``), so until search revision 38 it searched by the full model's share and then
microbatch windows, after extended schedules that took 0.75 of the minute
(``warm_starts.EXTEND_SHARE_LARGE``). Revision 38 gives the extension 0.3 and, past
the limit, runs the full model until it stalls and then the descent by probes
(``optpipe/optimizer/descent.py``). The cell's answers spread from run to run (which
of 16 x 32's many optima the extension repeats), so one run says little: each variant
runs the driver ``--runs`` times (``bench_solver.bench_problem``: F = B = W = 1 s,
p2p 0.05 s, budget S/2, 60 s) and the table gives every run's answer, bound and gap,
what the main run did, and how many runs ended within 0.5%.

Since search revision 39 the no-wait waves (``optpipe/optimizer/waves.py``) lead one
stage per device there (304.4 s from the start) and no extension is built
(``warm_starts.waves_lead``); the older variants are run without the waves.

Variants:

* ``revision 39``: the driver as it is (the waves, no extension, the descent);
* ``revision 38``: without the waves (the extension's share 0.3, the descent);
* ``share 0.45``: the descent with the share at 0.45 (27 s of the minute, where
  ``scripts/bench_extend_share.py`` found the extensions alone dependable; it leaves
  the main run less time for the probe);
* ``revision 37``: the share back at 0.75 and the windows instead of the descent (the
  driver before revision 38);
* ``windows``: the share at 0.3 but the windows instead of the descent (what the share
  alone does).

Every time is wall time on this machine. Nothing is asserted; the table goes to
docs/optimizer-log.md between markers.

    python scripts/bench_descent.py                   # 5 variants x 3 runs: ~16 min
    python scripts/bench_descent.py --variants 'revision 39' --runs 5 --no-write
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_solver import bench_problem  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
MARKERS = "<!-- descent-waves:start -->", "<!-- descent-waves:end -->"
#: (name, the extension's share, does one stage per device descend past the limit,
#: are the waves among the starts)
VARIANTS = {"revision 39": (None, True, True), "revision 38": (None, True, False),
            "share 0.45": (0.45, True, False), "revision 37": (0.75, False, False),
            "windows": (0.3, False, False)}
GAP = 0.005


@contextmanager
def variant(name: str) -> Iterator[None]:
    """The driver as the variant has it, put back afterwards."""
    from optpipe.optimizer import cpsat, preprocess, warm_starts

    share, descends, waves = VARIANTS[name]
    saved = warm_starts.EXTEND_SHARE_LARGE, cpsat.descends, preprocess.wave_schedule
    if share is not None:
        warm_starts.EXTEND_SHARE_LARGE = share
    if not descends:
        cpsat.descends = lambda *args: False
    if not waves:
        preprocess.wave_schedule = lambda problem: None
    try:
        yield
    finally:
        warm_starts.EXTEND_SHARE_LARGE, cpsat.descends, preprocess.wave_schedule = saved


def main_run(result) -> str:
    """What the run with the prefix cuts (the main run) did, in a few words."""
    run = next((r for r in result.runs if r.extra.get("lower_bound") is not None
                and ("search" in r.extra or "windows" in r.extra)), None)
    if run is None:
        return "no main run"
    extra = run.extra
    start = f"from {extra['hint_makespan']:.2f} s"
    if extra.get("search") == "search then probe":
        probes = ", ".join(f"{h:.2f} s {outcome} in {s:.1f} s"
                           for h, outcome, s in extra["descent_probes"]) or "none"
        return (f"{start}: searched to {extra['searched_makespan']:.2f} s by "
                f"{extra['searched_seconds']:.1f} s; probes: {probes}")
    return (f"{start}: {extra['windows']} windows gained "
            f"{extra.get('window_gain', 0.0):.2f} s in {run.wall_time:.1f} s")


def rows(name: str, runs: int, seconds: float) -> list[str]:
    """The variant's lines of the table, one per run and a count."""
    from optpipe.optimizer.driver import solve

    problem = bench_problem(16, 64, 8, False)
    lines, within = [], 0
    with variant(name):
        for i in range(runs):
            result = solve(problem, solver="cpsat", offload=False, placements=["linear"],
                           time_limit=seconds, cache=False, progress=False)
            within += result.gap is not None and result.gap <= GAP + 1e-9
            answer = (f"{result.objective:.2f} s, bound {result.bound:.2f} s, "
                      f"gap {result.gap:.2%}")
            what = main_run(result)
            print(f"  {name} run {i + 1}: {answer}; {what}", flush=True)
            lines.append(f"| {name} | {i + 1} | {answer} | {what} |")
    lines.append(f"| {name} | | **{within} of {runs} within {GAP:.1%}** | |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma list of {', '.join(VARIANTS)} (default all)")
    ap.add_argument("--runs", type=int, default=3, help="driver runs per variant")
    ap.add_argument("--seconds", type=float, default=60.0, help="the driver's time limit")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        ap.error(f"--variants: choose from {', '.join(VARIANTS)}; got {args.variants!r}")
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    lines = ["| variant | run | answer | the main run (with the prefix cuts) |",
             "|---|---|---|---|"]
    for name in names:
        lines += rows(name, args.runs, args.seconds)
    command = shlex.join(["scripts/bench_descent.py"] + sys.argv[1:])
    caption = (f"Measured with `python {command}` ({time.strftime('%Y-%m-%d')}, 2 cores, "
               f"2 solver threads; 16 x 64, budget S/2, F = B = W = 1 s, p2p 0.05 s, one "
               f"stage per device, {args.seconds:g} s per run).")
    publish(caption + "\n\n" + "\n".join(lines), DOC, *MARKERS, write=not args.no_write)


if __name__ == "__main__":
    main()
