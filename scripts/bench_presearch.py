#!/usr/bin/env python3
"""How much of the minute the driver spends before its engines start, phase by phase.

Why this script: everything the driver builds before the search (the fixed schedules,
the list and admission schedules, the periodic and extended schedules, the placements'
bounds) comes off the engines' time limit, and at 16 stages the search's answer moves
with the time it gets. For the benchmark's problems (``bench_solver.bench_problem``:
F = B = W = 1 s, p2p 0.05 s, no offload) this runs ``optpipe.optimizer.driver.solve``
with each phase wrapped in a timer and stops it where the search would begin (the
search itself is not run). Nothing is asserted; the table goes to docs/optimizer.md
between markers.

    python scripts/bench_presearch.py                     # about half a minute
    python scripts/bench_presearch.py --sizes 16x64 --budgets 1 --no-write
    python scripts/bench_presearch.py --sizes 16x64 --budgets 1 --no-write --default-gc

``--default-gc`` keeps the collector's thresholds as Python sets them during the solve
(``optimizer.gcpause`` raises them): what the raised thresholds save; such a run is
never written to the docs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_solver import bench_problem  # noqa: E402
from benchargs import budget_label, parse_size  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer.md"
START, END = "<!-- presearch:start -->", "<!-- presearch:end -->"
#: (module, function, column): the phases timed, in the order the driver runs them.
#: A name the driver and its warm starts both call is timed in both modules.
PHASES = (("driver", "fixed_schedules", "fixed schedules"),
          ("warm_starts", "fixed_schedules", "fixed schedules"),
          ("listsched", "list_schedules", "list schedules"),
          ("listsched", "admission_schedules", "admission schedules"),
          ("driver", "add_periodic", "periodic"),
          ("driver", "add_extended", "extended (one stage per device)"),
          ("driver", "add_chunked_extended", "extended (V shape)"),
          ("driver", "shape_bounds", "placements' bounds"),
          ("driver", "placement_spaces", "placements' bounds"),
          ("warm_starts", "placement_spaces", "placements' bounds"))


class _SearchBegins(Exception):
    """Raised in place of the search: the driver's time before it is what is measured."""


def measure(problem) -> tuple[float, dict[str, float]]:
    """Seconds until the search would begin, and per phase (wall clock, 60 s limit)."""
    from optpipe.optimizer import driver, listsched, warm_starts

    modules = {"driver": driver, "listsched": listsched, "warm_starts": warm_starts}
    spent: dict[str, float] = {}
    originals = []

    def timed(column, function):
        def run(*args, **kwargs):
            began = time.monotonic()
            try:
                return function(*args, **kwargs)
            finally:
                spent[column] = spent.get(column, 0.0) + time.monotonic() - began
        return run

    def stop(*args, **kwargs):
        raise _SearchBegins

    for module, name, column in PHASES:
        originals.append((modules[module], name, getattr(modules[module], name)))
        setattr(modules[module], name, timed(column, getattr(modules[module], name)))
    originals.append((driver, "_search", driver._search))
    driver._search = stop
    began = time.monotonic()
    try:
        driver.solve(problem, solver="cpsat", offload=False, time_limit=60, cache=False,
                     progress=False)
    except _SearchBegins:
        pass
    finally:
        for module, name, function in originals:
            setattr(module, name, function)
    return time.monotonic() - began, spent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8x32,16x32,16x64", help="benchmark SxM")
    ap.add_argument("--budgets", default="0.5,1", help="multiples of S")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--default-gc", action="store_true",
                    help="do not raise the collector's thresholds (see above)")
    args = ap.parse_args()
    if args.default_gc:
        from optpipe.optimizer import gcpause
        gcpause.THRESHOLDS = (0, 0, 0)     # never above the program's own: unchanged
    columns = list(dict.fromkeys(column for _, _, column in PHASES))   # in order, once
    lines = ["| problem | search begins at | " + " | ".join(columns) + " |",
             "|---|---|" + "---|" * len(columns)]
    for spec in args.sizes.split(","):
        stages, microbatches = parse_size(spec)
        for k in (float(x) for x in args.budgets.split(",")):
            total, spent = measure(bench_problem(stages, microbatches, stages * k, False))
            cells = [f"{spent[c]:.1f} s" if c in spent else "—" for c in columns]
            label = budget_label(k)
            lines.append(f"| {stages}×{microbatches} at {label} | {total:.1f} s | "
                         + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    text = ("Measured with `python scripts/bench_presearch.py` on 2 CPU cores (the driver "
            "with a 60 s limit, no offload, stopped where its search would begin; a phase "
            "that did not run is —; the bounds include building each placement's task "
            "graph).\n\n" + "\n".join(lines))
    publish(text, DOC, START, END, write=not (args.no_write or args.default_gc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
