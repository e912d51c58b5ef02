#!/usr/bin/env python3
"""How much of a prefix-cut link's lost warm-up comes back when the link is split on
where the microbatch before it stands (one stage per device, no offload, S/2).

Why this script: the prefix cuts (:mod:`optpipe.optimizer.prefix`) chain
``F(0, k) >= reach[k]`` and ``makespan - F(0, k) >= whole[M - k]``; both pieces start
from an empty pipeline, so the link loses about one warm-up (4 x 64: 324.9 s against
the optimum 327.6 s), and at M = 64 that loss is what keeps one stage per device's S/2
cells open. Split the link on ``p``, how many tasks of microbatch ``k - 1``'s path
``F(1), ..., F(S - 1), B(S - 1), ..., B(0)`` are done when ``F(0, k)`` starts (they
are done in path order). For every schedule:

* its first ``k + 1`` microbatches form a schedule in which path task ``p - 1`` of
  microbatch ``k - 1`` has ended by ``F(0, k)``'s start: ``F(0, k) >= before[p]``, the
  least such start;
* its microbatches ``k - 1 .. M - 1`` form one in which path task ``p`` of their
  microbatch 0 ends after their ``F(0, 1)`` starts: ``makespan - F(0, k) >= after[p]``,
  the least such span;

so ``makespan >= min over p of before[p] + after[p]`` (``before`` grows with ``p``,
``after`` shrinks; ``before[0] = reach[k]`` and ``after[L] >= whole[M - k]`` give the
plain link). Each piece is :func:`optpipe.optimizer.cpsat.solve_least` with its
condition.

For each case ``S x M : n`` (the link at ``k = M - n``) the script solves the problem
on one stage per device (its answer hints the pieces), the prefix cuts (in every
piece's model), then every ``before[p]`` and ``after[p]`` with ``--piece-seconds``
each, and prints the plain link, the split link, the best answer, and how much of the
plain link's loss the split recovers. Nothing is asserted; the table goes to
docs/optimizer-log.md between markers.

    python scripts/bench_split_link.py          # 4x16:8, 4x32:16, 8x32:16: about 15 min
    python scripts/bench_split_link.py --cases 4x16:8 --no-write
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_solver import bench_problem  # noqa: E402
from benchargs import parse_size  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
START, END = "<!-- split-link:start -->", "<!-- split-link:end -->"


def path(stages: int) -> list[tuple[object, int]]:
    """A microbatch's tasks after ``F(0)`` in the order its dependencies force."""
    from optpipe.schedule import Op
    return [(Op.F, s) for s in range(1, stages)] + \
        [(Op.B, s) for s in range(stages - 1, -1, -1)]


def piece(problem, side: str, task, hint, cuts, seconds: float) -> tuple[float, bool]:
    """The least ``F(0, M - 1)`` with ``task`` (of microbatch ``M - 2``) ended by then
    (``side="before"``), or the least ``makespan - F(0, 1)`` with ``task`` (of
    microbatch 0) ending after ``F(0, 1)`` starts (``"after"``): CP-SAT's proven bound
    in seconds and whether it is the least value itself (``inf`` when no schedule is
    in that state; :func:`optpipe.optimizer.cpsat.solve_least`, whose horizon holds
    here)."""
    from optpipe.optimizer.cpsat import solve_least
    from optpipe.schedule import Op

    link = (Op.F, 0, problem.microbatches - 1) if side == "before" else (Op.F, 0, 1)

    def objective(start, makespan, dur):
        return start[link] if side == "before" else makespan - start[link]

    def condition(start, makespan, dur):
        end = start[task] + int(dur[task])
        return end <= start[link] if side == "before" else end >= start[link] + 1
    got = solve_least(problem, objective, condition=condition, warm_start=[hint],
                      time_limit=seconds, threads=2, cuts=cuts)
    return (0.0, False) if got is None else (got.seconds, got.optimal)


def row(stages: int, microbatches: int, n: int, hint_seconds: float, cuts_seconds: float,
        piece_seconds: float) -> str:
    """One case: every ``before[p]`` and ``after[p]`` solved; the split link's bound."""
    from optpipe.optimizer.driver import solve
    from optpipe.optimizer.extend import first_microbatches
    from optpipe.optimizer.prefix import prefix_cuts, truncated_hints

    problem = bench_problem(stages, microbatches, stages * 0.5, False)
    found = solve(problem, solver="cpsat", offload=False, placements=["linear"],
                  time_limit=hint_seconds, cache=False, progress=False)
    answer = found.objective
    cuts = prefix_cuts(problem, None, True, time_limit=cuts_seconds,
                       hints=truncated_hints([found.schedule]))
    k = microbatches - n
    if k not in cuts.reach or n not in cuts.whole:
        return f"| {stages} x {microbatches} | {k} | the cuts lack reach[{k}] or whole[{n}] |"
    steps = path(stages)
    L = len(steps)
    before = {0: (cuts.reach[k], k in cuts.exact_reach)}
    after = {L: (cuts.whole[n], n in cuts.exact)}
    t0 = time.monotonic()
    for p in range(1, L + 1):
        op, s = steps[p - 1]
        before[p] = piece(replace(problem, microbatches=k + 1), "before", (op, s, k - 1),
                          first_microbatches(found.schedule, k + 1), cuts, piece_seconds)
    for p in range(L):
        op, s = steps[p]
        after[p] = piece(replace(problem, microbatches=n + 1), "after", (op, s, 0),
                         first_microbatches(found.schedule, n + 1), cuts, piece_seconds)
    wall = time.monotonic() - t0
    # before grows with p and after shrinks: each borrows its neighbours' bounds
    low_before = [max(before[q][0] for q in range(p + 1)) for p in range(L + 1)]
    low_after = [max(after[q][0] for q in range(p, L + 1)) for p in range(L + 1)]
    sums = [low_before[p] + low_after[p] for p in range(L + 1)]
    split = min(sums)
    least = sums.index(split)
    plain = cuts.reach[k] + cuts.whole[n]
    proven = sum(ok for _, ok in before.values()) + sum(ok for _, ok in after.values())
    where = "none done" if least == 0 else \
        f"{steps[least - 1][0].value}({steps[least - 1][1]}) done"
    loss = answer - plain
    back = f"{(split - plain) / loss:.0%}" if loss > 1e-9 else "-"
    line = (f"| {stages} x {microbatches} | {k} | {plain:.2f} s | {split:.2f} s "
            f"(p = {least}: {where}) | {answer:.2f} s ({found.status}) | {back} | "
            f"{proven} of {2 * (L + 1)} | {wall:.0f} s |")
    print(line, flush=True)
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="4x16:8,4x32:16,8x32:16",
                    help="SxM:n, ... : the link at k = M - n (default 4x16:8,4x32:16,8x32:16)")
    ap.add_argument("--hint-seconds", type=float, default=30.0,
                    help="the driver on one stage per device, for the answer and hints")
    ap.add_argument("--cuts-seconds", type=float, default=15.0)
    ap.add_argument("--piece-seconds", type=float, default=20.0,
                    help="limit of each before[p] / after[p] piece (default 20)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    table = ["| size | link k | plain link reach[k] + whole[M - k] | split link (least p) | "
             "best answer | loss recovered | pieces proven | pieces' wall |",
             "|---|---|---|---|---|---|---|---|"]
    for case in args.cases.split(","):
        size, _, n = case.partition(":")
        stages, microbatches = parse_size(size)
        table.append(row(stages, microbatches, int(n or microbatches // 2),
                         args.hint_seconds, args.cuts_seconds, args.piece_seconds))
    caption = (f"Measured with `python scripts/bench_split_link.py --cases {args.cases} "
               f"--piece-seconds {args.piece_seconds:g}` ({time.strftime('%Y-%m-%d')}, "
               "2 cores, 2 solver threads; budget S/2, F = B = W = 1 s, p2p 0.05 s; "
               "a piece not proven in its time gives its proven bound).")
    publish(caption + "\n\n" + "\n".join(table), DOC, START, END, write=not args.no_write)


if __name__ == "__main__":
    main()
