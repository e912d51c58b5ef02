"""Measure the MILP engine on the benchmark grid of issue #5 and print a table.

Run ``python -m optpipe.optimizer.milp_bench`` (options: ``--time-limit``, ``--solver``,
``--formulation``, ``--only S,M,W,k``, ``--p2p``). Every row is a fresh solve of a
uniform problem (F = B = 1, W as listed, ``p2p`` 0 unless given) whose budget is
static + ``k`` microbatches' worth of kept activations
(:meth:`Problem.activation_budget`); the makespan column is the *simulated* makespan of
the returned schedule, and ``fits`` says the simulator found it within budget. Why a
module and not a test: it takes minutes, and its figures go into ``docs/milp.md``
verbatim.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

from optpipe.optimizer.milp import solve_milp
from optpipe.problem import uniform_problem
from optpipe.simulator import simulate

#: (stages, microbatches) pairs of the issue's targets
GRID = [(4, 4), (4, 8), (4, 12), (4, 16), (8, 16)]


def _row(spec: str) -> tuple[int, int, float, float]:
    """``--only``'s ``S,M,W,k``, or an argparse error naming what is wrong."""
    parts = spec.split(",")
    try:
        if len(parts) != 4:
            raise ValueError
        row = (int(parts[0]), int(parts[1]), float(parts[2]), float(parts[3]))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{spec!r} is not S,M,W,k (stages, microbatches, W's duration, budget in "
            f"activations), e.g. 8,16,0.5,4") from None
    if row[0] < 1 or row[1] < 1 or row[2] < 0 or row[3] <= 0:
        raise argparse.ArgumentTypeError(f"{spec!r}: stages and microbatches must be at "
                                         f"least 1, W at least 0 and the budget positive")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--formulation", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--p2p", type=float, default=0.0,
                    help="p2p latency in seconds (0.05: scripts/bench_solver.py's problem)")
    ap.add_argument("--only", action="append", default=[], type=_row,
                    help="S,M,W,k (repeatable), e.g. 8,16,0.5,4: stages, microbatches, "
                         "W's duration, budget in activations")
    ap.add_argument("--issue-example", action="store_true",
                    help="the issue's irregular costs (8x16, budgets 4 and 16) instead")
    args = ap.parse_args(argv)
    if args.issue_example:
        return _issue_example(args)
    rows = []
    if args.only:
        rows = list(args.only)
    else:
        for S, M in GRID:
            for W in (1.0, 0.5):
                for k in (S / 2, 2 * S):
                    rows.append((S, M, W, k))
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
          f"p2p {args.p2p:g} s")
    print(f"{'S':>2} {'M':>3} {'W':>4} {'k':>4} | {'form':>12} {'status':>8} "
          f"{'makespan':>9} {'bound':>9} {'gap%':>6} {'time s':>7} {'cpu s':>6} {'fits':>5} "
          f"{'start':>9}")
    worst = 0.0
    for S, M, W, k in rows:
        problem = uniform_problem(S, M, backward_weight=W, p2p=args.p2p).activation_budget(k)
        t0 = time.perf_counter()
        c0 = _cpu()
        res = solve_milp(problem, time_limit=args.time_limit, solver=args.solver,
                         threads=args.threads, formulation=args.formulation)
        wall = time.perf_counter() - t0
        cpu = _cpu() - c0
        sim = simulate(problem, res.schedule)
        worst = max(worst, wall)
        gap = 100 * (res.gap or 0.0)
        print(f"{S:>2} {M:>3} {W:>4g} {k:>4g} | {res.extra.get('formulation', '-'):>12} "
              f"{res.status:>8} {sim.makespan:>9.4g} {res.bound:>9.4g} {gap:>6.2f} "
              f"{wall:>7.1f} {cpu:>6.1f} {str(sim.fits):>5} "
              f"{res.extra.get('warm_start_makespan', 0):>9.4g}",
              flush=True)
        if res.extra.get("probes"):         # the horizon probes settled it (docs/milp.md)
            print("      horizon probes: " + ", ".join(f"{h:g} s {outcome}" for h, outcome
                                                      in res.extra["probes"]), flush=True)
    print(f"slowest solve: {worst:.1f} s; load average at end: {os.getloadavg()[0]:.2f}")
    return 0


def _issue_example(args: argparse.Namespace) -> int:
    """The issue's example costs (no common tick, so the disjunctive model), 8x16."""
    from optpipe.problem import Problem

    S, M = 8, 16
    mib = 2 ** 20
    base = Problem(stages=S, microbatches=M, forward=(0.018522,) * S,
                   backward_input=(0.018086,) * S, backward_weight=(0.009337,) * S,
                   activation=(10 * mib,) * S, freed_by_b=(6 * mib,) * S,
                   freed_by_w=(4 * mib,) * S, static=(0,) * S,
                   budget=(float("inf"),) * S, p2p=0.000601, name="issue-example")
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    for k in (S / 2, 2 * S):
        problem = base.activation_budget(k)
        t0 = time.perf_counter()
        res = solve_milp(problem, time_limit=args.time_limit, solver=args.solver,
                         threads=args.threads, formulation=args.formulation)
        wall = time.perf_counter() - t0
        sim = simulate(problem, res.schedule)
        print(f"budget {k:g}: {res.extra.get('formulation')} {res.status} makespan "
              f"{sim.makespan:.6f} s bound {res.bound:.6f} s gap {100 * (res.gap or 0):.2f}% "
              f"time {wall:.1f} s fits {sim.fits}", flush=True)
    return 0


def _cpu() -> float:
    """CPU seconds of this process and its (portfolio) children so far.

    Why: on a shared machine wall time depends on other people's jobs; CPU time says
    what the solve itself cost (on an idle 2-core machine the portfolio's wall time is
    about half of it).
    """
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


if __name__ == "__main__":
    sys.exit(main())
