#!/usr/bin/env python3
"""How close the lower bounds come at half of 1F1B's memory.

For each of the benchmark's problems (``bench_solver.bench_problem`` at budget S/2) it
prints, one stage per device, the no-memory bound (``bounds.lower_bound``) and the
memory round-trip bound (``bounds.memory_bound``), the prefix cuts' bound
(``prefix.prefix_cuts`` in ``--cuts-time`` seconds, from 17 microbatches on); the no-memory
and memory bounds for the V shape and
interleaved two chunks (whose devices share their room between two stages); and, for
the cells in ``--prove``, what CP-SAT alone finds
for one stage per device (``solve_cpsat(..., decompose=False)``, hinted with the fitting
fixed schedules as the driver does, and starting from the memory bound): status,
makespan, proven bound and seconds. The table goes into
docs/optimizer.md between markers (``--no-write`` prints only).

    python scripts/bench_bounds.py                          # 9 sizes, 5 proof attempts
    python scripts/bench_bounds.py --prove 4x32 --time-limit 60
    python scripts/bench_bounds.py --random 60      # + soundness on 60 random problems
    python scripts/bench_bounds.py --small 4x8,8x8,4x12 --small-time 60
    python scripts/bench_bounds.py --offload-presets --offload-time 30

``--small CELLS`` (alone: the S/2 table is then not re-measured) asks where the gaps of
the V shape and interleaved chunks come from, on cells small enough for CP-SAT to prove
their optimum: for each cell, budget S/2 and S and the two chunked placements, it
prints the no-memory and memory bounds, CP-SAT's result (hinted with the placement's
fitting fixed and periodic schedules) and how far the best bound is below the optimum.
A bound equal to the optimum says the open gaps of larger cells are the search's; a
bound below it says what the bounds miss. The table goes between its own markers.

``--offload-presets`` (alone, like ``--small``) measures the bounds that hold with
offload (``bounds.offload_area_bound``: the kept bytes' area over each device's
room; ``bounds.offload_warmup_bound``: the forwards a device can run before its
first backward, with only the host link freeing bytes) on presets whose devices have
room for one to four activations: per placement, the no-memory bound, the two bounds,
and the best schedule ``optpipe solve`` finds there with offload in
``--offload-time`` seconds, with the gap under the no-memory bound and under the
largest. The table goes between its own markers.

``--random N`` also checks soundness where optima are cheap to prove: on the tests'
``random_problem(seed)`` for N seeds, each placement (one stage per device, V,
interleaved) and split/fused backwards, CP-SAT proves the optimum (hinted with the
fitting fixed and periodic schedules) and the bound must not exceed it; the count of
cases, of bounds that equal the optimum and of violations (must be 0) goes under the
table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchargs import parse_size  # noqa: E402
from bench_solver import ROOT, bench_problem  # also puts the repository on sys.path

from optpipe.optimizer.bounds import lower_bound, memory_bound  # noqa: E402
from optpipe.optimizer.cpsat import solve_cpsat  # noqa: E402
from optpipe.optimizer.prefix import MAX_PIECE, prefix_cuts, truncated_hints  # noqa: E402
from optpipe.optimizer.preprocess import fixed_schedules, task_graph  # noqa: E402
from optpipe.schedule import interleaved_placement, v_placement  # noqa: E402

DOC = ROOT / "docs" / "optimizer.md"
START, END = "<!-- bounds:table:start -->", "<!-- bounds:table:end -->"
SMALL_START, SMALL_END = "<!-- bounds:small:start -->", "<!-- bounds:small:end -->"
OFFLOAD_START, OFFLOAD_END = "<!-- bounds:offload:start -->", "<!-- bounds:offload:end -->"
#: (label, model, hardware, stages, budget or None for the hardware's): devices with
#: room for about one or two activations above static memory
OFFLOAD_PRESETS = [
    ("gpt3-13b, 4 x H100 at 60 GB", "gpt3-13b", "h100-80gb", 4, "60GB"),
    ("llama2-70b, 16 x H100", "llama2-70b", "h100-80gb", 16, None),
    ("gpt-14.6b, 4 x H100 (`--stages 4 --mem 80GB`)", "gpt-14.6b", "h100-80gb", 4, "80GB"),
    ("llama2-13b, 8 x A100-40GB", "llama2-13b", "a100-40gb", 8, None),
    ("gpt-14.6b, 8 x H100 (`--stages 8 --mem 40GB`)", "gpt-14.6b", "h100-80gb", 8, "40GB"),
]
SIZES = [(s, m) for s in (4, 8, 16) for m in (16, 32, 64)]


def _soundness(seeds: int, threads: int) -> str:
    """Bound against CP-SAT's proven optimum on small random problems, every placement."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_optimizer_preprocess import placement_hints, random_problem

    shapes = {"linear": None, "v": v_placement, "interleaved":
              lambda d: interleaved_placement(d, 2)}
    cases = {name: [0, 0, 0] for name in shapes}          # proven, bound == optimum, over
    for seed in range(seeds):
        problem = random_problem(seed)
        for name, make in shapes.items():
            place = make(problem.devices) if make else list(range(problem.devices))
            for split in (True, False):
                hints = placement_hints(problem, place, split, 1.0 if make else None)
                if not hints:
                    continue
                run = solve_cpsat(problem, warm_start=hints, time_limit=20, threads=threads,
                                  placement=place, split_backward=split, decompose=False)
                if run.status != "optimal":
                    continue
                bound = memory_bound(task_graph(problem, split, place))
                cases[name][0] += 1
                cases[name][1] += abs(bound - run.objective) <= 1e-6
                cases[name][2] += bound > run.objective + 1e-6
    parts = [f"{name}: {n} proven, bound = optimum in {tight}, above it in {over}"
             for name, (n, tight, over) in cases.items()]
    return (f"Soundness (`--random {seeds}`: the tests' `random_problem`, seeds 0..{seeds - 1},"
            f" split and fused, CP-SAT optimum within 20 s): " + "; ".join(parts) + ".")


def _small(cells: list[tuple[int, int]], seconds: float, threads: int) -> list[str]:
    """Chunked placements on small cells: the bounds against CP-SAT's optimum there."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_optimizer_preprocess import placement_hints

    lines = ["| problem | budget | placement | no-memory bound | memory bound "
             "| CP-SAT | best bound below the optimum |",
             "|---|---|---|---|---|---|---|"]
    for stages, microbatches in cells:
        for label, k in (("S/2", 0.5), ("S", 1.0)):
            problem = bench_problem(stages, microbatches, stages * k, False)
            for name, place in (("v", v_placement(stages)),
                                ("interleaved", interleaved_placement(stages, 2))):
                graph = task_graph(problem, True, place)
                free, memory = lower_bound(graph), memory_bound(graph)
                hints = placement_hints(problem, place, True)
                if not hints:
                    lines.append(f"| {stages}×{microbatches} | {label} | {name} | "
                                 f"{free:.2f} s | {memory:.2f} s | nothing fits | |")
                    print(lines[-1], flush=True)
                    continue
                t0 = time.monotonic()
                run = solve_cpsat(problem, warm_start=hints, time_limit=seconds,
                                  threads=threads, placement=place, decompose=False)
                below = ""
                if run.status == "optimal":
                    best = max(free, memory)
                    below = f"{max(0.0, run.objective - best) / run.objective:.1%}"
                lines.append(f"| {stages}×{microbatches} | {label} | {name} | {free:.2f} s | "
                             f"{memory:.2f} s | {run.status} {run.objective:.2f} s, bound "
                             f"{run.bound:.2f} s, {time.monotonic() - t0:.0f} s | {below} |")
                print(lines[-1], flush=True)
    return lines


def _offload_presets(seconds: float, threads: int) -> list[str]:
    """Per preset and placement: the no-memory, area and warm-up bounds, and the best
    schedule the optimizer finds there with offload (its gap under the no-memory bound
    and under the largest)."""
    from optpipe import costmodel
    from optpipe.optimizer.driver import solve
    from optpipe.optimizer.bounds import offload_area_bound, offload_warmup_bound
    from optpipe.schedule import searched_placements
    from optpipe.units import parse_bytes

    lines = ["| problem | least room (activations) | placement | no-memory bound "
             "| area bound | warm-up bound | best found | gap: no-memory → largest |",
             "|---|---|---|---|---|---|---|---|"]
    for label, model, hardware, stages, mem in OFFLOAD_PRESETS:
        problem = costmodel.build_problem(model, hardware, stages=stages,
                                          microbatches=costmodel.DEFAULT_MICROBATCHES)
        if mem is not None:
            problem = problem.with_budget(parse_bytes(mem, "--mem"))
        room = min((b - s) / a for b, s, a in zip(problem.budget, problem.static,
                                                  problem.activation))
        result = solve(problem, offload=True, time_limit=seconds, threads=threads,
                       cache=False, progress=False)
        best = {p["placement"].replace("+offload", ""): p["best"] for p in result.placements}
        for name, place in searched_placements(problem.devices).items():
            graph = task_graph(problem, True, place)
            free, area = lower_bound(graph), offload_area_bound(graph)
            warm = offload_warmup_bound(graph)
            found = best.get(name)
            cells = ["", ""] if found is None else [
                f"{found:.3f} s",
                f"{(found - free) / found:.1%} → "
                f"{(found - max(free, area, warm)) / found:.1%}"]
            lines.append(f"| {label} | {room:.2f} | {name} | {free:.3f} s | {area:.3f} s | "
                         f"{warm:.3f} s | {cells[0]} | {cells[1]} |")
            print(lines[-1], flush=True)
    return lines


def _report(args: argparse.Namespace, flags: str, what: str, markers: tuple[str, str],
            lines: list[str]) -> None:
    """Write ``lines`` under a header naming the command (``flags``) and the setting
    (``what``) between ``markers``, unless ``--no-write``."""
    meta = (f"Measured with `python scripts/bench_bounds.py {flags}` on {os.cpu_count()} "
            f"CPU cores, {args.threads} solver threads ({what}).")
    if not args.no_write:
        _write(*markers, meta + "\n\n" + "\n".join(lines))


def _write(start: str, end: str, block: str) -> None:
    """Replace what lies between ``start`` and ``end`` in docs/optimizer.md."""
    from docblock import replace_between

    text = replace_between(DOC.read_text(), start, end, block)
    if text is None:
        raise SystemExit(f"no {start} ... {end} markers in {DOC}")
    DOC.write_text(text)


def _cuts(problem, seconds: float, threads: int) -> tuple[float, float] | None:
    """The prefix cuts' chain bound for one stage per device (as the driver computes
    them, hinted with the first microbatches of the fitting fixed schedules), and the
    seconds taken; None below 17 microbatches (the pieces are the problem itself)."""
    if problem.microbatches <= MAX_PIECE:
        return None
    place = list(range(problem.devices))
    on = sorted((c for c in fixed_schedules(problem).candidates if c.fits
                 and c.schedule.placement == place and not c.schedule.offloads),
                key=lambda c: c.makespan)[:3]
    t0 = time.monotonic()
    cuts = prefix_cuts(problem, place, True, time_limit=seconds, threads=threads,
                       hints=truncated_hints([c.schedule for c in on]))
    return max(cuts.makespan_bound(problem.microbatches), memory_bound(task_graph(problem))), \
        time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prove", default="4x16,8x16,16x16,4x32,8x32",
                    help="cells where CP-SAT alone searches one stage per device")
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--random", type=int, default=0,
                    help="check the bounds against proven optima on this many random problems")
    ap.add_argument("--cuts-time", type=float, default=15.0,
                    help="seconds for the prefix cuts of one stage per device (0: skip)")
    ap.add_argument("--small", default="",
                    help="cells (e.g. 4x8,8x8) where the V shape's and interleaved chunks' "
                         "optima are proven at S/2 and S, instead of the S/2 table")
    ap.add_argument("--small-time", type=float, default=60.0,
                    help="seconds per proof attempt with --small")
    ap.add_argument("--offload-presets", action="store_true",
                    help="the bound that holds with offload on starved presets, instead "
                         "of the S/2 table")
    ap.add_argument("--offload-time", type=float, default=30.0,
                    help="seconds per solve with --offload-presets")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if args.offload_presets:
        _report(args, f"--offload-presets --offload-time {args.offload_time:g}",
                "the cost model's presets, 32 microbatches; least room: the smallest "
                "budget above static memory, in activations; best found: `optpipe solve` "
                "with offload, per placement", (OFFLOAD_START, OFFLOAD_END),
                _offload_presets(args.offload_time, args.threads))
        return 0
    if args.small:
        _report(args, f"--small {args.small} --small-time {args.small_time:g}",
                "F = B = W = 1 s, p2p 0.05 s; the bounds and CP-SAT as the driver has them",
                (SMALL_START, SMALL_END),
                _small([parse_size(x) for x in args.small.split(",") if x], args.small_time,
                       args.threads))
        return 0
    prove = {parse_size(x) for x in args.prove.split(",") if x}
    lines = ["| problem | no-memory bound | memory bound | prefix cuts "
             "| CP-SAT, one stage per device "
             "| V: no-memory → memory | interleaved: no-memory → memory |",
             "|---|---|---|---|---|---|---|"]
    for stages, microbatches in SIZES:
        problem = bench_problem(stages, microbatches, stages / 2, False)
        graph = task_graph(problem)
        free, memory = lower_bound(graph), memory_bound(graph)
        cut = _cuts(problem, args.cuts_time, args.threads) if args.cuts_time > 0 else None
        cuts_cell = "" if cut is None else f"{cut[0]:.2f} s ({cut[1]:.0f} s)"
        cell = ""
        if (stages, microbatches) in prove:
            hints = sorted((c for c in fixed_schedules(problem).candidates if c.fits),
                           key=lambda c: c.makespan)
            t0 = time.monotonic()
            run = solve_cpsat(problem, warm_start=[c.schedule for c in hints],
                              time_limit=args.time_limit, threads=args.threads,
                              decompose=False)
            cell = (f"{run.status} {run.objective:.2f} s, bound {run.bound:.2f} s, "
                    f"{time.monotonic() - t0:.0f} s")
        chunked = []
        for place in (v_placement(stages), interleaved_placement(stages, 2)):
            g = task_graph(problem, True, place)
            chunked.append(f"{lower_bound(g):.2f} → {memory_bound(g):.2f} s")
        lines.append(f"| {stages}×{microbatches} | {free:.2f} s | {memory:.2f} s | {cuts_cell} | "
                     f"{cell} | "
                     + " | ".join(chunked) + " |")
        print(lines[-1], flush=True)
    if args.random:
        lines += ["", _soundness(args.random, args.threads)]
        print(lines[-1], flush=True)
    meta = (f"Measured with `python scripts/bench_bounds.py` on {os.cpu_count()} CPU cores, "
            f"{args.threads} solver threads, {args.time_limit:g} s per proof attempt, "
            f"{args.cuts_time:g} s for the prefix cuts (the larger of their chain and the "
            f"memory bound; budget S/2, F = B = W = 1 s, p2p 0.05 s).")
    if not args.no_write:
        _write(START, END, f"{meta}\n\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
