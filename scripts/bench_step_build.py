#!/usr/bin/env python3
"""What a time-window step costs besides CP-SAT's search: its windows, its model, its
hints and reading its answer back.

Why this script: past 256 stage x microbatch cells a chunked placement's whole minute is
time-window steps (:func:`optpipe.optimizer.decompose.time_window_search`), and every
step builds the full model anew with most task orders pinned. At 16 x 64 on the V shape
that build was about a second of each 6 s step, time CP-SAT does not search. For the
benchmark's problems (``bench_solver.bench_problem``: F = B = W = 1 s, p2p 0.05 s, budget
S, no offload) on the V shape this draws windows as the search does (around idle gaps,
seeded; the first width and a wider one) on the driver's starting schedule and times each phase of
``decompose._Stepper.run``: ``pinned_windows``, ``build_order_model``, ``add_hints``, and
after a short CP-SAT solve, ``extract_schedule`` + ``make_hint``. The collector's thresholds are
raised as in the driver (``optimizer.gcpause``).

It also prints a digest of the models it built (their protos, hints included): a
change that only makes the build faster must leave it as it was.

    python scripts/bench_step_build.py                    # about three minutes
    python scripts/bench_step_build.py --sizes 16x64 --steps 4 --no-write
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_relaxation import setup  # noqa: E402
from benchargs import parse_size  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer.md"
START, END = "<!-- step-build:start -->", "<!-- step-build:end -->"
PHASES = ("windows", "model", "hints", "answer")
#: CP-SAT's limit in each measured step (its time is not measured; it gives an answer
#: to read back).
SOLVE_SECONDS = 1.0


def _serialized(model) -> bytes:
    """The model's proto, binary (CP-SAT's Python proto has no serializer of its own)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.pb"
        model.export_to_file(str(path))
        return path.read_bytes()


def measure(stages: int, microbatches: int, steps: int, seed: int, widen: float = 1.0
            ) -> tuple[dict[str, list[float]], str, int, int]:
    """Seconds per phase per step, the models' digest, mean free tasks, variables;
    windows ``widen`` times the search's first width (it widens them up to 8 times,
    ``decompose.TIME_WINDOW_RANGE``)."""
    from ortools.sat.python import cp_model

    from optpipe.optimizer import cpsat, cpsat_model, cpsat_order, decompose
    from optpipe.optimizer.gcpause import fewer_collections

    problem, _, ticks, _, hint, _ = setup(stages, microbatches, "v")
    stepper = decompose._Stepper(problem, ticks, 0, time.monotonic() + 3600, 2, 6.0)
    g = ticks.graph
    mean = sum(int(g.duration[k]) for k in g.keys) / len(g.keys)
    width = int(round(decompose.TIME_WINDOW_TASKS * mean * widen))
    rng = random.Random(seed)
    spent: dict[str, list[float]] = {phase: [] for phase in PHASES}
    digest = hashlib.sha256()
    free_counts, variables = [], 0
    with fewer_collections():
        for _ in range(steps):
            at = decompose._window_start(hint, width, rng)
            free = {k for seq in hint.order for k in seq if at <= hint.times[k][0] < at + width}
            pinned = [[k for k in seq if k not in free] for seq in hint.order]
            t0 = time.monotonic()
            windows = decompose.pinned_windows(g, hint, pinned, free, stepper.implied, at,
                                               stepper.static)
            t1 = time.monotonic()
            builder, handles = cpsat_order.build_order_model(
                problem, ticks, hint.makespan, 0, hint, fixed_order=pinned, free=free,
                windows=windows, implied=stepper.implied)
            t2 = time.monotonic()
            builder.add_hints()
            t3 = time.monotonic()
            digest.update(_serialized(builder.model))
            variables = max(variables, len(builder.model.proto.variables))
            solver = cpsat.new_solver(SOLVE_SECONDS, 2)
            code = solver.solve(builder.model)
            t4 = time.monotonic()
            if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                cpsat_model.make_hint(
                    cpsat.extract_schedule(problem, solver, handles, offload=False), ticks)
            t5 = time.monotonic()
            for phase, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t5 - t4)):
                spent[phase].append(seconds)
            free_counts.append(len(free))
    return spent, digest.hexdigest()[:16], round(statistics.mean(free_counts)), variables


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8x64,16x32,16x64", help="benchmark SxM")
    ap.add_argument("--steps", type=int, default=8, help="windows per size")
    ap.add_argument("--widths", default="1,4",
                    help="windows' widths, in multiples of the search's first")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    lines = ["| problem | width | steps | free tasks (mean) | variables (most) | "
             + " | ".join(PHASES) + " | all but the search | models' digest |",
             "|---" * (len(PHASES) + 7) + "|"]
    for size in args.sizes.split(","):
        stages, microbatches = parse_size(size)
        for widen in (float(w) for w in args.widths.split(",")):
            spent, digest, free, variables = measure(stages, microbatches, args.steps,
                                                     args.seed, widen)
            means = [statistics.mean(spent[phase]) for phase in PHASES]
            cells = [f"{m:.3f} s" for m in means]
            lines.append(f"| {stages} x {microbatches}, V, budget S | {widen:g} x | "
                         f"{args.steps} | {free} | {variables} | " + " | ".join(cells)
                         + f" | **{sum(means):.2f} s** | `{digest}` |")
            print(lines[-1], flush=True)
    text = ("Measured with `python scripts/bench_step_build.py` on 2 CPU cores (seconds "
            "per step, mean over the steps; windows drawn with seed "
            f"{args.seed}; width in multiples of the search's first).\n\n" + "\n".join(lines))
    publish(text, DOC, START, END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
