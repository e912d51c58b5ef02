#!/usr/bin/env python3
"""CP-SAT with and without its transitive closure of precedences: overruns and proofs.

Why this script: search revision 8 switched the closure off
(``cpsat.TRANSITIVE_PRECEDENCES_WORK_LIMIT = 0``) because it ran inside CP-SAT's
full-problem worker before any look at the clock, so runs went far past their limits
and the driver had to plan for that. This measures both settings on the benchmark's
problems (``bench_solver.bench_problem``: F = B = W = 1 s, p2p 0.05 s), one run each:

* overrun: wall time against the limit of one run, for the V shape's full model at
  8 x 64, budget S (10 s), and one window-search step at 16 x 32, S/2 (4 s);
* proofs: CP-SAT alone hinted with the fixed schedules (``solve_cpsat``), up to 60 s;
* the driver at the current setting: a 20 s ``solve`` of llama2-70b on 16 stages
  (tp 4, 60 GB), which ended after 11-12 s while the driver planned for the overruns.

Nothing is asserted; the table goes to docs/optimizer.md between markers.

    python scripts/bench_cpsat_params.py            # about 6 minutes on 2 cores
    python scripts/bench_cpsat_params.py --no-write
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
from docblock import publish  # noqa: E402

from optpipe.optimizer import cpsat, cpsat_model, cpsat_order  # noqa: E402

DOC = ROOT / "docs" / "optimizer.md"
START, END = "<!-- cpsat-params:start -->", "<!-- cpsat-params:end -->"
#: CP-SAT's own default for the closure's work limit (``SatParameters``).
CLOSURE_ON = 1_000_000
SETTINGS = (("closure on (CP-SAT default)", CLOSURE_ON), ("closure off (optpipe)", 0))
#: (label, stages, microbatches, budget in multiples of S, placement)
PROOFS = [("linear, S/2", 4, 32, 0.5, "linear"), ("linear, S/2", 8, 16, 0.5, "linear"),
          ("linear, S/2", 16, 16, 0.5, "linear"), ("linear, S/2", 8, 32, 0.5, "linear"),
          ("linear, S", 16, 32, 1.0, "linear"), ("V, S/2", 4, 8, 0.5, "v"),
          ("V, S/2", 8, 8, 0.5, "v"), ("V, S/2", 4, 12, 0.5, "v")]


def _problem(stages: int, microbatches: int, budget: float):
    return bench_problem(stages, microbatches, stages * budget, False)


def _hints(problem):
    from optpipe.optimizer.candidates import hint_pool
    from optpipe.optimizer.preprocess import fixed_schedules
    return hint_pool(fixed_schedules(problem), True)


def _model_inputs(problem, placement):
    """Ticks, the best fixed schedule as the hint, and the memory bound in ticks: what
    ``solve_cpsat`` builds its order model from."""
    ticks = cpsat_model.make_ticks(problem, True, False, (1.0,), placement)
    hint = cpsat._pick_hint(problem, ticks, False, (1.0,), _hints(problem))
    free = cpsat.lower_bound(ticks.graph)
    lower = int(math.ceil(max(cpsat.memory_bounds(ticks.graph, free)) - 1e-9))
    return ticks, hint, lower


def _cpsat_wall(stages: int, microbatches: int, budget: float, limit: float,
                window: bool) -> float:
    """Wall seconds of one CP-SAT solve (the model built beforehand) on the V shape's
    order model, or with ``window`` on one window-search step (microbatches 0-7 free,
    the rest in the hint's order), against ``limit``."""
    from optpipe.schedule import searched_placements
    problem = _problem(stages, microbatches, budget)
    ticks, hint, lower = _model_inputs(problem, searched_placements(stages)["v"])
    fixed = [[k for k in seq if k[2] >= 8] for seq in hint.order] if window else None
    builder, _ = cpsat_order.build_order_model(problem, ticks, hint.makespan, lower, hint,
                                               fixed_order=fixed)
    builder.add_hints()
    solver = cpsat.new_solver(limit, 2)
    start = time.monotonic()
    solver.solve(builder.model)
    return time.monotonic() - start


def _proof(stages: int, microbatches: int, budget: float, place: str) -> str:
    from optpipe.schedule import searched_placements
    problem = _problem(stages, microbatches, budget)
    start = time.monotonic()
    run = cpsat.solve_cpsat(problem, warm_start=_hints(problem), time_limit=60,
                            placement=searched_placements(stages)[place])
    wall = time.monotonic() - start
    return (f"optimal {run.objective:.1f} s in {wall:.1f} s" if run.status == "optimal"
            else f"not proven in 60 s ({run.objective:.1f} s, bound {run.bound:.1f} s)")


def _llama_solve() -> str:
    from optpipe.costmodel import build_problem
    from optpipe.optimizer.driver import solve
    problem = build_problem("llama2-70b", "h100-80gb", 16, 32, tp=4, budget="60GB")
    start = time.monotonic()
    result = solve(problem, cache=False, time_limit=20, progress=False)
    return (f"{time.monotonic() - start:.1f} s of 20 s, {result.status} "
            f"{result.sim.makespan:.3f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    rows = ["| measured | " + " | ".join(name for name, _ in SETTINGS) + " |",
            "|---|" + "---|" * len(SETTINGS)]
    cells: dict[str, list[str]] = {}
    saved = cpsat.TRANSITIVE_PRECEDENCES_WORK_LIMIT
    try:
        for _, limit in SETTINGS:
            cpsat.TRANSITIVE_PRECEDENCES_WORK_LIMIT = limit
            cells.setdefault("V, 8 x 64 at S, full model, 10 s limit: CP-SAT's wall",
                             []).append(f"{_cpsat_wall(8, 64, 1.0, 10.0, False):.1f} s")
            cells.setdefault("V, 16 x 32 at S/2, one window step, 4 s limit: CP-SAT's wall",
                             []).append(f"{_cpsat_wall(16, 32, 0.5, 4.0, True):.1f} s")
            for label, S, M, budget, place in PROOFS:
                cells.setdefault(f"{label} {S} x {M}: CP-SAT alone, hinted", []).append(
                    _proof(S, M, budget, place))
                print(label, S, M, cells[f"{label} {S} x {M}: CP-SAT alone, hinted"][-1],
                      flush=True)
    finally:
        cpsat.TRANSITIVE_PRECEDENCES_WORK_LIMIT = saved
    rows += [f"| {what} | " + " | ".join(found) + " |" for what, found in cells.items()]
    rows.append(f"| llama2-70b, 16 stages, tp 4, 60 GB: `solve(..., time_limit=20)` | "
                f"not measured (the driver plans differently with it) | {_llama_solve()} |")
    text = ("Measured with `python scripts/bench_cpsat_params.py` on 2 CPU cores, 2 solver "
            "threads, one run each (F = B = W = 1 s, p2p 0.05 s).\n\n" + "\n".join(rows))
    publish(text, DOC, START, END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
