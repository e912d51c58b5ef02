#!/usr/bin/env python3
"""How long the simulator takes to judge one schedule, at the driver's sizes.

Why this script: every figure of every schedule comes from ``optpipe.simulator``, and
the driver judges every fixed schedule, list schedule and warm start with it before
its search begins (at 16 x 64 about 70 simulations, each with its
``Schedule.validate``), so its speed is part of what a short ``--time-limit`` cannot
buy back (the ``time-limit`` table in docs/optimizer.md).

For each problem it builds every fixed schedule and times ``validate``
and ``simulate`` on each (the best of ``--repeats``), then reports the mean over the
schedules. ``--tree DIR`` times another checkout's optpipe on the same schedules' problems
as well (a ``git worktree`` of an older commit, say), each tree in a fresh process.
Nothing is asserted; the table goes to docs/optimizer.md between markers.

    python scripts/bench_simulator.py                       # ~30 s
    python scripts/bench_simulator.py --tree /tmp/old       # before and after
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent

DOC = ROOT / "docs" / "optimizer.md"
MARKERS = "<!-- simulator-speed:start -->", "<!-- simulator-speed:end -->"
#: (stages, microbatches, budget in multiples of S): the benchmark's problems.
CASES = ((8, 32, 1.0), (16, 64, 1.0), (16, 64, 0.5))


def measure(cases: list[tuple[int, int, float]], repeats: int) -> list[dict[str, float]]:
    """In this process (optpipe as imported): per case, the fixed schedules' timings."""
    # optpipe first: bench_solver puts this checkout's root first on the path
    from optpipe.generators import GENERATORS, generate
    from optpipe.simulator import simulate
    sys.path.insert(0, str(SCRIPTS))
    from bench_solver import bench_problem

    rows = []
    for stages, microbatches, k in cases:
        problem = bench_problem(stages, microbatches, stages * k, False)
        schedules = [generate(name, problem) for name in GENERATORS]  # all take a base problem
        validate = simulation = 0.0
        for schedule in schedules:
            validate += best_of(repeats, schedule.validate)
            simulation += best_of(repeats, lambda: simulate(problem, schedule))
        n = len(schedules)
        rows.append({"schedules": n,
                     "actions": sum(len(a) for s in schedules for a in s.actions) / n,
                     "validate_ms": 1000 * validate / n, "simulate_ms": 1000 * simulation / n,
                     "makespans": [simulate(problem, s).makespan for s in schedules]})
    return rows


def best_of(repeats: int, work) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure_tree(tree: Path, cases: list[tuple[int, int, float]],
                 repeats: int) -> list[dict[str, float]]:
    """:func:`measure` in a fresh process whose optpipe is ``tree``'s."""
    code = (f"import sys, json; sys.path.insert(0, {str(tree)!r}); "
            f"sys.path.insert(1, {str(SCRIPTS)!r}); import bench_simulator as b; "
            f"print(json.dumps(b.measure({cases!r}, {repeats})))")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=str(tree))
    if done.returncode != 0:
        raise SystemExit(f"error: timing {tree} failed: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(cases, here, other, command: str, tree: Path | None) -> str:
    from benchargs import budget_label

    lines = [f"Measured with `{command}` ({time.strftime('%Y-%m-%d')}, 2 cores; the mean "
             "over the fixed schedules, each the best of its repeats; the "
             "benchmark's problems, F = B = W = 1 s).", ""]
    head = "| problem | schedules | actions each | validate | simulate (validate included) |"
    rule = "|---|---|---|---|---|"
    if other is not None:
        head += f" simulate in {tree.name} | same makespans |"
        rule += "---|---|"
    lines += [head, rule]
    for i, (stages, microbatches, k) in enumerate(cases):
        r = here[i]
        row = (f"| {stages} x {microbatches} at {budget_label(k)} | {r['schedules']} | "
               f"{r['actions']:.0f} | {r['validate_ms']:.1f} ms | {r['simulate_ms']:.1f} ms |")
        if other is not None:
            o = other[i]
            row += (f" {o['simulate_ms']:.1f} ms ({o['simulate_ms'] / r['simulate_ms']:.2f} x)"
                    f" | {'yes' if o['makespans'] == r['makespans'] else 'NO'} |")
        lines.append(row)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, help="another checkout to time beside this one")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    cases = list(CASES)
    here = measure_tree(ROOT, cases, args.repeats)
    other = measure_tree(args.tree.resolve(), cases, args.repeats) if args.tree else None
    command = "python scripts/bench_simulator.py" + (f" --tree {args.tree}" if args.tree else "")
    sys.path.insert(0, str(SCRIPTS))
    from docblock import publish
    publish(table(cases, here, other, command, args.tree), DOC, *MARKERS,
            write=not args.no_write)


if __name__ == "__main__":
    main()
