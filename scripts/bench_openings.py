#!/usr/bin/env python3
"""The V shape's admission starts at budget S, and what the search's opening makes of each.

Why this script: search revision 20 rests on two measurements. ZB-V's greedy with
``Policy.lookahead`` starts the tip's first backward (the warm-up bound's device) at the
bound, where without it microbatch 0 waits on every device on its way down; and the
fastest start is not the best one to search from, because the opening windows at the
end (``decompose._opening``) remove idle at the end of a schedule in seconds but not
idle scattered through its steady state (``decompose.OPENING_STARTS``). For the
benchmark's problems (``bench_solver.bench_problem``: F = B = W = 1 s, p2p 0.05 s) this
runs every admission policy (``listsched.RESERVE_SHARES`` x ZB-V's eight variants, with
and without the lookahead), keeps the distinct fitting orders, and for the fastest
``--top`` of them, and the fastest without the lookahead, prints: the simulated makespan, when the tip's first backward starts
(against the warm-up bound's earliest), the tip device's idle after it (before the
makespan, and at the end), and the makespan after the opening (up to ``--steps``
windows at the end, each up to 6 s of CP-SAT on 2 threads) with its steps and seconds.
Nothing is asserted; the table goes to docs/optimizer-log.md between markers.

    python scripts/bench_openings.py                     # 16 x 32 and 16 x 64: about a minute
    python scripts/bench_openings.py --sizes 8x32 --top 4 --no-write
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchargs import parse_size  # noqa: E402
from bench_solver import bench_problem  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
START, END = "<!-- openings:start -->", "<!-- openings:end -->"


def policy_runs(problem, place):
    """Every admission policy's fitting order on ``place``: (label, orders), distinct
    orders once, fastest estimate first
    (:func:`~optpipe.optimizer.listsched.admission_runs`)."""
    from optpipe.optimizer.listsched import admission_runs

    return [(f"share {policy.reserve:g}, {policy.prefer} first, {policy.w_mode} W"
             + (", guard" if policy.guard_b else "")
             + (", **lookahead**" if policy.lookahead else ""), orders)
            for orders, policy in admission_runs(problem, place)]


def rows(stages: int, microbatches: int, top: int, steps: int) -> list[str]:
    """One size's table rows: the ``top`` fastest starts, each with its opening."""
    from optpipe.optimizer import decompose
    from optpipe.optimizer.bounds import first_backward_terms, lower_bound, memory_bounds
    from optpipe.optimizer.cpsat_model import make_hint, make_ticks
    from optpipe.optimizer.preprocess import earliest_starts
    from optpipe.schedule import from_orders, searched_placements

    problem = bench_problem(stages, microbatches, stages, False)
    place = searched_placements(stages)["v"]
    ticks = make_ticks(problem, True, False, (), place)
    graph, scale = ticks.graph, ticks.scale
    free = lower_bound(graph)
    lower = int(math.ceil(max(memory_bounds(graph, free)) - 1e-9))
    earliest = earliest_starts(graph)
    _, tip_key = max(first_backward_terms(graph, earliest), key=lambda term: term[0])
    tip = place[tip_key[1]]
    first = decompose.first_width(graph)
    hints = []
    for label, orders in policy_runs(problem, place):
        hint = make_hint(from_orders(label, place, microbatches, orders), ticks)
        hints.append((hint.makespan, label, hint))
    hints.sort(key=lambda h: h[0])
    shown = hints[:top]
    # and the fastest without the lookahead (the start before search revision 20)
    shown += [h for h in hints if "lookahead" not in h[1] and h not in shown][:1]
    out = []
    for _, label, hint in shown:
        seq = hint.order[tip]
        began = hint.times[tip_key][0]
        gaps = [(a, b) for a, b in decompose.device_idle_gaps(hint, seq) if a >= began]
        inside = sum(b - a for a, b in gaps if b < hint.makespan)
        end = sum(b - a for a, b in gaps if b >= hint.makespan)
        t0 = time.monotonic()
        stepper = decompose._Stepper(problem, ticks, lower, time.monotonic() + 120, 2, 6.0)
        stats = decompose.WindowStats()
        opened = hint
        for _ in range(steps):
            at = opened.makespan - first
            timed = stepper.run(opened, decompose.started_within(opened, at), stats,
                                frozen_before=at)
            if timed is None or timed.makespan >= opened.makespan:
                break
            opened = timed
        out.append(f"| {stages} x {microbatches} | {label} | {hint.makespan / scale:.2f} s | "
                   f"{began / scale:.2f} s (earliest {earliest[tip_key] / scale:.2f} s) | "
                   f"{inside / scale:.2f} s in {sum(b < hint.makespan for _, b in gaps)} "
                   f"gaps, {end / scale:.2f} s at the end | {opened.makespan / scale:.2f} s | "
                   f"{stats.steps}, {time.monotonic() - t0:.1f} s |")
        print(out[-1], flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16x32,16x64", help="SxM, ... (default 16x32,16x64)")
    ap.add_argument("--top", type=int, default=6, help="starts per size (default 6)")
    ap.add_argument("--steps", type=int, default=8,
                    help="opening windows at most (default 8; the search runs "
                         "decompose.COOLDOWN_STEPS)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    table = ["| size | start (admission policy) | makespan | tip's first backward | "
             "tip's idle after it | after the opening | steps, time |",
             "|---|---|---|---|---|---|---|"]
    for size in args.sizes.split(","):
        stages, microbatches = parse_size(size)
        table += rows(stages, microbatches, args.top, args.steps)
    text = ("Measured with `python scripts/bench_openings.py` on 2 CPU cores, 2 solver "
            "threads (the V shape at budget S; F = B = W = 1 s, p2p 0.05 s; up to "
            f"{args.steps} opening windows).\n\n" + "\n".join(table))
    publish(text, DOC, START, END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
