#!/usr/bin/env python3
"""Variants of the time-window search on a chunked placement, over seeds.

Why this script: the window search's answers at 8 x 16 and 16 x 32 (budget S, V shape)
move by about 0.4 s from run to run, so a change to it can only be judged over several
runs. This runs CP-SAT alone on the placement (``cpsat.solve_cpsat``, hinted with the
fitting fixed and list schedules, as the driver hints it) for a given time, once per
seed of the window search and per variant, on the benchmark's problem
(``bench_solver.bench_problem``: F = B = W = 1 s, p2p 0.05 s; budget S unless
``--budget`` says another multiple of S). The variants are
patches of :mod:`optpipe.optimizer.decompose` for the run, none of them kept (why:
docs/optimizer-log.md, "16 x 32 at S: the bound or the search?"):

* ``plain``: the committed search;
* ``unavoidable``: the idle no schedule avoids (before a device's earliest start,
  after its last task's least tail) left out of where windows are drawn;
* ``origin``: a third of the windows start at time 0;
* ``step12``: 12 s steps (``TIME_STEP_LIMIT``) instead of 6;
* ``warmup-first``: one window over the first 28% of the schedule, up to 15 s,
  before the drawn windows;
* ``warmup-last``: the same window after them (they stop 16 s early);
* ``run-on``: a step still finding shorter schedules at its limit runs on, up to
  :data:`RUN_ON_FACTOR` times the limit, until :data:`RUN_ON_QUIET` of a limit passes
  without one (the 6 s steps at 16 x 32 often find their last improvement after 3-5 s);
* ``no-cooldown``: without the windows at the end that open the search since search
  revision 19 (``decompose.COOLDOWN_STEPS`` = 0; they were measured here as the
  variant ``cooldown-first`` against ``plain`` before they were kept);
* ``widen-end``: those opening windows widen like the drawn ones (``_next_width``)
  after a window at the end proven quickly without a shorter schedule, up to
  :data:`WIDEN_END_STEPS` steps (through the driver at 16 x 64, S with offload the
  committed opening stops in the first width's local optimum: docs/optimizer-log.md,
  "Search revision 19").
* ``critical``: half the windows are drawn around a *critical* idle gap, one before a
  task without slack (its latest start in the schedule's orders equals its start),
  each such gap as likely as any other; the other half as in the search. Why: the
  draws weigh gaps by length, and the chunked placements' long idle stretches sit on
  the devices with slack (16 x 32 at S, a 106.75 s schedule: device 15, the bound's
  device, loses 0.5 s in five 0.1 s gaps mid-schedule, while device 0 idles 6.6 s
  after its first backward).
* ``bottleneck``: the same share drawn around an idle gap of the device that idles
  least (after its first task), each of its gaps as likely as any other: that
  device's idle is what the makespan is made of (at S on the V shape, the warm-up
  bound's device 15).
* ``tip-first``: before the search, one step over the tasks that start before the
  warm-up bound's device can first run a backward (plus a first width), whose objective
  is that backward's start first and the makespan second (no later than the start's):
  at 16 x 64 a 203.1 s schedule started it 1.1 s late, which is most of its gap.
* ``one-chain``: the drawn windows go on from the shortest opening only
  (``decompose.SEARCH_CHAINS`` = 1, search revision 20) instead of taking turns on
  the two shortest within ``CHAIN_MARGIN``.
* ``open-8``: the search opens from the 8 fastest starts instead of 4
  (``decompose.OPENING_STARTS``): at 16 x 32, S the sixth fastest start (108.5 s,
  greedy W) opens to 106.5 s, the fastest to 107.25 s.
* ``counted``: a drawn window frees as many tasks as its width holds when every device
  is busy (width / mean task x devices), running on in time where the schedule is
  sparse. Why: the width is in time, so at 16 x 32 a window freed 330-470 tasks in the
  warm-up (proven in 0.1-4 s) and 560-1,045 later (most ran to their 6 s limit
  without a shorter schedule), while the warm-up is where the gains are.

Nothing is asserted; the table goes to docs/optimizer-log.md between markers.

    python scripts/bench_window_variants.py        # all: about an hour
    python scripts/bench_window_variants.py --sizes 8x16 --variants plain,warmup-last \\
        --seeds 1,2 --seconds 20 --no-write
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchargs import parse_size  # noqa: E402
from bench_solver import bench_problem  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
START, END = "<!-- window-variants:start -->", "<!-- window-variants:end -->"
VARIANTS = ("plain", "unavoidable", "origin", "step12", "warmup-first", "warmup-last",
            "run-on", "no-cooldown", "widen-end", "critical", "bottleneck", "tip-first", "counted",
            "one-chain", "open-8")
#: the warm-up window: this share of the schedule, up to this many seconds
WARMUP_SHARE, WARMUP_SECONDS, WARMUP_RESERVE = 0.28, 15.0, 16.0
#: ``run-on``: a step runs at most this many times its limit, and stops past the limit
#: once this share of a limit has passed without a shorter schedule
RUN_ON_FACTOR, RUN_ON_QUIET = 3.0, 0.5
#: ``widen-end``: at most this many opening windows at the end
WIDEN_END_STEPS = 8
#: ``critical``: the share of windows drawn around a critical gap
CRITICAL_SHARE = 0.5
#: ``tip-first``: CP-SAT's limit for its step (s)
TIP_SECONDS = 12.0


def _unavoidable_idle_left_out(decompose, graph) -> None:
    """Draw windows only around idle time some schedule could avoid."""
    from optpipe.optimizer.preprocess import earliest_starts, tails

    es, tail = earliest_starts(graph), tails(graph)
    first = [min(es[k] for k in graph.device_keys(d)) for d in range(graph.devices)]
    last = [min(tail[k] for k in graph.device_keys(d)) for d in range(graph.devices)]

    def idle_gaps(best):
        gaps = []
        for d, seq in enumerate(best.order):
            edge = first[d]
            for begin, end in sorted(best.times[k][:2] for k in seq):
                if begin > edge:
                    gaps.append((edge, begin))
                edge = max(edge, end)
            if best.makespan - last[d] > edge:
                gaps.append((edge, best.makespan - last[d]))
        return gaps
    decompose.idle_gaps = idle_gaps


def _critical_gaps_drawn(decompose, problem, graph) -> None:
    """Draw :data:`CRITICAL_SHARE` of the windows around an idle gap before a task
    without slack (the ``critical`` variant)."""
    from optpipe.optimizer.preprocess import graph_placement, memory_implied_orders

    implied = memory_implied_orders(problem, graph.split_backward, graph_placement(graph))
    static = decompose.static_successors(graph, implied)
    drawn = decompose._window_start

    def window_start(best, width, rng):
        if rng.random() >= CRITICAL_SHARE:
            return drawn(best, width, rng)
        span = decompose.pinned_windows(graph, best, best.order, (), implied, None, static)
        gaps = []
        for seq in best.order:
            edge = 0
            for k in sorted(seq, key=lambda k: best.times[k][0]):
                begin, end = best.times[k][:2]
                if begin > edge > 0 and span[k][1] <= begin:
                    gaps.append((edge, begin))
                edge = max(edge, end)
        return _around_one_of(gaps, best, width, rng, drawn)
    decompose._window_start = window_start


def _bottleneck_gaps_drawn(decompose) -> None:
    """Draw :data:`CRITICAL_SHARE` of the windows around an idle gap of the device
    that idles least (the ``bottleneck`` variant)."""
    drawn = decompose._window_start

    def window_start(best, width, rng):
        if rng.random() >= CRITICAL_SHARE:
            return drawn(best, width, rng)
        # after each device's first task (every task lasts a tick or more)
        per_device = [[(a, b) for a, b in decompose.device_idle_gaps(best, seq) if a > 0]
                      for seq in best.order]
        gaps = min(per_device, key=lambda g: sum(b - a for a, b in g))
        return _around_one_of(gaps, best, width, rng, drawn)
    decompose._window_start = window_start


def _counted_windows(decompose) -> None:
    """Drawn windows free a full-density window's number of tasks (``counted``)."""
    plain = decompose.started_within

    def started_within(best, at, until=float("inf")):
        if until == float("inf"):     # the opening windows at the end: as they are
            return plain(best, at, until)
        keys = [k for seq in best.order for k in seq]
        mean = sum(best.times[k][1] - best.times[k][0] for k in keys) / len(keys)
        want = max(1, round((until - at) / mean * len(best.order)))
        starts = sorted(best.times[k][0] for k in keys if best.times[k][0] >= at)
        if len(starts) <= want:
            return plain(best, at)
        return plain(best, at, starts[want - 1] + 1)
    decompose.started_within = started_within


def _around_one_of(gaps, best, width: int, rng, drawn) -> int:
    """A window's start around one of ``gaps`` (each as likely), at a random point of
    it and of the window; ``drawn`` (the search's own draw) when there are none."""
    if not gaps:
        return drawn(best, width, rng)
    a, b = gaps[rng.randrange(len(gaps))]
    return rng.randrange(a, b) - rng.randrange(0, width)


def _tip_step(decompose, problem, ticks, best, deadline: float, threads: int):
    """``best`` after one step that starts the warm-up bound's first backward as early
    as it can, the makespan no longer (the ``tip-first`` variant)."""
    from ortools.sat.python import cp_model

    from optpipe.optimizer.bounds import first_backward_terms
    from optpipe.optimizer.cpsat import extract_schedule, new_solver
    from optpipe.optimizer.cpsat_model import make_hint
    from optpipe.optimizer.cpsat_order import build_order_model
    from optpipe.optimizer.preprocess import earliest_starts

    graph = ticks.graph
    es = earliest_starts(graph)
    _, key = max(first_backward_terms(graph, es), key=lambda term: term[0])
    until = es[key] + decompose.first_width(graph)
    free = decompose.started_within(best, 0, until)
    stepper = decompose._Stepper(problem, ticks, 0, deadline, threads, TIP_SECONDS)
    fixed = [[k for k in seq if k not in free] for seq in best.order]
    windows = decompose.pinned_windows(graph, best, fixed, free, stepper.implied, None,
                                       stepper.static)
    builder, handles = build_order_model(problem, ticks, best.makespan, 0, best,
                                         fixed_order=fixed, free=free, windows=windows,
                                         implied=stepper.implied)
    builder.add_hints()
    builder.model.minimize(handles.start[key] * (best.makespan + 1) + handles.makespan)
    solver = new_solver(min(TIP_SECONDS, deadline - time.monotonic() - 1), threads)
    code = solver.solve(builder.model)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        print(f"    tip step: {solver.status_name(code)} in {solver.wall_time:.1f} s, "
              f"{len(free)} tasks", flush=True)
        return best
    found = make_hint(extract_schedule(problem, solver, handles, offload=False), ticks)
    print(f"    tip step: first backward {best.times[key][0]} -> {found.times[key][0]} "
          f"ticks, makespan {best.makespan} -> {found.makespan}, {len(free)} tasks, "
          f"{solver.wall_time:.1f} s", flush=True)
    return found if found.makespan <= best.makespan else best


def _warmup_step(decompose, problem, ticks, best, lower: int, deadline: float,
                 threads: int, seconds: float):
    """``best`` after one window over its first :data:`WARMUP_SHARE`, if shorter."""
    stepper = decompose._Stepper(problem, ticks, lower, deadline, threads, seconds)
    free = {k for seq in best.order for k in seq
            if best.times[k][0] < WARMUP_SHARE * best.makespan}
    found = stepper.run(best, free, decompose.WindowStats(), frozen_before=0)
    return found if found is not None and found.makespan <= best.makespan else best


def _widening_end(decompose, problem, ticks, best, lower: int, deadline: float,
                  threads: int):
    """``best`` after windows that end at its makespan, from the first width: on while
    each finds a shorter schedule, wider after one proven quickly without
    (:data:`WIDEN_END_STEPS` at most; the ``widen-end`` variant)."""
    stepper = decompose._Stepper(problem, ticks, lower, deadline, threads,
                                 decompose.TIME_STEP_LIMIT)
    first = decompose.first_width(ticks.graph)
    narrowest, widest = (max(1, int(first * r)) for r in decompose.TIME_WINDOW_RANGE)
    width = first
    for _ in range(WIDEN_END_STEPS):
        if not stepper.room() or best.makespan <= lower:
            break
        at = best.makespan - width
        found = stepper.run(best, decompose.started_within(best, at),
                            decompose.WindowStats(), frozen_before=at)
        if found is not None and found.makespan < best.makespan:
            best = found
        elif stepper.proven and stepper.seconds < stepper.step_limit / 2 and width < widest:
            width = decompose._next_width(width, stepper, narrowest, widest)
        else:
            break
    return best


def _run_on(stepper, solver, model, best) -> int:
    """One window step that runs on past its limit while it finds shorter schedules
    (the ``run-on`` variant of ``decompose._Stepper.solve``)."""
    import threading

    from ortools.sat.python import cp_model

    class Improvements(cp_model.CpSolverSolutionCallback):
        def __init__(self) -> None:
            super().__init__()
            self.best, self.last = best.makespan, time.monotonic()

        def on_solution_callback(self) -> None:
            if self.objective_value < self.best - 0.5:
                self.best, self.last = self.objective_value, time.monotonic()

    limit = solver.parameters.max_time_in_seconds
    left = stepper.deadline - time.monotonic() - stepper.overrun - 0.2
    solver.parameters.max_time_in_seconds = max(limit, min(limit * RUN_ON_FACTOR, left))
    seen, done, began = Improvements(), threading.Event(), time.monotonic()

    def watch() -> None:
        while not done.wait(0.05):
            now = time.monotonic()
            if now - began >= limit and now - seen.last >= RUN_ON_QUIET * limit:
                solver.stop_search()
                return
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        return solver.solve(model, seen)
    finally:
        done.set()
        watcher.join()


def run(stages: int, microbatches: int, shape: str, variant: str, seed: int,
        seconds: float, budget: float = 1.0) -> float:
    """One run: the makespan CP-SAT alone returns with ``variant`` patched in."""
    from optpipe.optimizer import decompose
    from optpipe.optimizer.candidates import hint_pool
    from optpipe.optimizer.cpsat import solve_cpsat
    from optpipe.optimizer.cpsat_model import make_ticks
    from optpipe.optimizer.preprocess import fixed_schedules
    from optpipe.optimizer.warm_starts import add_list_schedules
    from optpipe.schedule import searched_placements

    problem = bench_problem(stages, microbatches, stages * budget, False)
    place = searched_placements(stages)[shape]
    saved = (decompose.time_window_search, decompose.idle_gaps,
             decompose._window_start, decompose.TIME_STEP_LIMIT, decompose._Stepper.solve,
             decompose.COOLDOWN_STEPS, decompose.started_within, decompose.SEARCH_CHAINS,
             decompose.OPENING_STARTS)
    search = functools.partial(saved[0], seed=seed)
    try:
        if variant == "unavoidable":
            _unavoidable_idle_left_out(decompose, make_ticks(problem, True, False, (),
                                                             place).graph)
        elif variant == "critical":
            _critical_gaps_drawn(decompose, problem,
                                 make_ticks(problem, True, False, (), place).graph)
        elif variant == "tip-first":
            def tip_first(problem, ticks, hint, **kw):
                hint = _tip_step(decompose, problem, ticks, hint, kw["deadline"],
                                 kw["threads"])
                return saved[0](problem, ticks, hint, seed=seed, **kw)
            search = tip_first
        elif variant == "bottleneck":
            _bottleneck_gaps_drawn(decompose)
        elif variant == "counted":
            _counted_windows(decompose)
        elif variant == "origin":
            drawn = saved[2]
            decompose._window_start = (
                lambda best, width, rng: 0 if rng.random() < 1 / 3 else drawn(best, width, rng))
        elif variant == "step12":
            decompose.TIME_STEP_LIMIT = 12.0
        elif variant == "warmup-first":
            def warmup_first(problem, ticks, hint, **kw):
                hint = _warmup_step(decompose, problem, ticks, hint, kw["lower"],
                                    kw["deadline"], kw["threads"], WARMUP_SECONDS)
                return saved[0](problem, ticks, hint, seed=seed, **kw)
            search = warmup_first
        elif variant == "warmup-last":
            def warmup_last(problem, ticks, hint, **kw):
                deadline = kw["deadline"]
                best, stats = saved[0](problem, ticks, hint, seed=seed,
                                       **{**kw, "deadline": deadline - WARMUP_RESERVE})
                left = deadline - time.monotonic() - 1
                if left > 3:
                    best = _warmup_step(decompose, problem, ticks, best, kw["lower"],
                                        deadline, kw["threads"], min(WARMUP_SECONDS, left))
                return best, stats
            search = warmup_last
        elif variant == "no-cooldown":
            decompose.COOLDOWN_STEPS = 0
        elif variant == "one-chain":
            decompose.SEARCH_CHAINS = 1
        elif variant == "open-8":
            decompose.OPENING_STARTS = 8
        elif variant == "widen-end":
            decompose.COOLDOWN_STEPS = 0

            def widen_end(problem, ticks, hint, **kw):
                hint = _widening_end(decompose, problem, ticks, hint, kw["lower"],
                                     kw["deadline"], kw["threads"])
                return saved[0](problem, ticks, hint, seed=seed, **kw)
            search = widen_end
        elif variant == "run-on":
            decompose._Stepper.solve = _run_on
        elif variant != "plain":
            raise SystemExit(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
        decompose.time_window_search = search
        fixed = fixed_schedules(problem)
        add_list_schedules(problem, fixed, True)
        result = solve_cpsat(problem, warm_start=hint_pool(fixed, True),
                             time_limit=seconds, placement=place, threads=2)
    finally:
        (decompose.time_window_search, decompose.idle_gaps,
         decompose._window_start, decompose.TIME_STEP_LIMIT, decompose._Stepper.solve,
         decompose.COOLDOWN_STEPS, decompose.started_within, decompose.SEARCH_CHAINS,
         decompose.OPENING_STARTS) = saved
    return result.objective


def _budget_label(budget: float) -> str:
    """S, S/2, 2S, ... for the table's caption."""
    if budget == 1:
        return "S"
    if budget < 1 and (1 / budget).is_integer():
        return f"S/{int(1 / budget)}"
    return f"{budget:g}S"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16x32,8x16", help="SxM, ... (default 16x32,8x16)")
    ap.add_argument("--placement", default="v", choices=("v", "interleaved"))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seeds", default="1,2,3,4")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--budget", type=float, default=1.0,
                    help="the budget in multiples of S microbatches' activations (default 1)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    rows = ["| size | variant | makespan per seed (" + ", ".join(map(str, seeds)) +
            ") | mean |", "|---|---|---|---|"]
    for size in args.sizes.split(","):
        stages, microbatches = parse_size(size)
        for variant in args.variants.split(","):
            found = [run(stages, microbatches, args.placement, variant, seed, args.seconds,
                         args.budget) for seed in seeds]
            row = (f"| {stages} x {microbatches} | {variant} | "
                   f"{', '.join(f'{x:g}' for x in found)} s | "
                   f"{statistics.mean(found):.2f} s |")
            print(row, flush=True)
            rows.append(row)
    text = (f"Measured with `python scripts/bench_window_variants.py` on 2 CPU cores, "
            f"2 solver threads, CP-SAT alone on the {args.placement} placement at budget "
            f"{_budget_label(args.budget)} for {args.seconds:g} s per run "
            f"(F = B = W = 1 s, p2p 0.05 s).\n\n"
            + "\n".join(rows))
    publish(text, DOC, START, END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
