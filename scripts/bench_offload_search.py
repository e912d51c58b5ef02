"""The randomized search over offload-aware list schedules: strategies, and the driver.

Search revision 30 replaced the fresh randomized draws of revision 29 (a GRASP near the
best variant, on the best placement only) by :class:`~optpipe.optimizer.offload_list.
RandomizedSearch` (most runs perturb the best run so far, a few draw afresh; one basin
per W policy), kept per placement and run round-robin over every placement whose best
offload-aware schedule is within ``warm_starts.RANDOMIZED_REACH`` of the best one's.
Revision 31 restarts a basin near its start once it has gone ``STALL`` runs without a
gain. Revision 32 sends a forward's activation out only when it can come back in time
behind the copies already queued (``offload_list.QUEUE_AWARE``; a share of the fresh
draws, ``QUEUE_FLIP``, take the old rule). Revision 33 also builds every variant with
its OFFLOADs listed only when due (``offload_list.DEFERRED_VARIANTS``), so that a
forward that does not fit waits for the first queued copy that makes room for it (and,
since revision 34, for the next reload due too: ``WAIT_KEEPS_RELOAD_ROOM``), and a share
of the fresh draws (``DEFERRED_FLIP``) switch that listing rule.

``--strategies`` measures the search alone, from the best variant on a placement, with
three seeds: fresh draws only (``FRESH`` = 1, one basin: revision 29's GRASP), the
perturbing search with one basin, with two (revision 30), with two that restart when
stalled (revision 31), with the queue-aware offloads (revision 32), one basin per W
policy and offload rule (``rules``, tried and not kept: the log's item "four basins";
``--seeds`` for more than three), with the deferred listing too (``deferred``), and
with a waiting forward leaving the next reload's room (``reload-room``: revision 34,
what the driver uses)::

    python scripts/bench_offload_search.py --strategies      # writes docs/optimizer-log.md
    python scripts/bench_offload_search.py --strategies --kinds queue,deferred
    python scripts/bench_offload_search.py --strategies --kinds deferred,reload-room --no-write
    python scripts/bench_offload_search.py --strategies --kinds queue,rules --seeds 0,1,2,3,4,5 --no-write

Without it, the presets are solved as ``optpipe solve`` does (offload decided
automatically, the cache off), once with the previous revision's search (``PREVIOUS``,
revision 33) and once as now (``NOW``, revision 34)::

    python scripts/bench_offload_search.py
    python scripts/bench_offload_search.py --no-write --cases 16stage-40GB
    python scripts/bench_offload_search.py --now-only --cases 8stage-40GB,16stage-40GB --seconds 600

The tables of revision 30's item in docs/optimizer-log.md (revision 29 against 30) were
measured with this script at f4db9b2 and 1bc0eb6, those of revision 31's item (30
against 31) at 4d58875, those of revision 32's item (31 against 32, between the
``offload-queue`` markers) at a74529f, those of revision 33's item (32 against 33,
between the ``offload-deferred`` markers) at a47526e, before it moved on to revision 34.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_offload_list import PRESETS, problem_of  # noqa: E402
from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
DRIVER = "<!-- offload-reload-room:start -->", "<!-- offload-reload-room:end -->"
STRATEGIES = ("<!-- offload-reload-room-strategies:start -->",
              "<!-- offload-reload-room-strategies:end -->")
NEVER = 10**9                           # a STALL no search reaches: no restarts


class Kind(NamedTuple):
    """One search strategy: a column of the tables and the knobs it sets for its runs,
    ``fresh``, ``basins`` and ``stall`` on :class:`~optpipe.optimizer.offload_list.
    RandomizedSearch` (upper-cased), the rest on :mod:`~optpipe.optimizer.offload_list`.
    Each kind below is the one before it with what its revision changed."""

    column: str
    fresh: float = 0.3
    basins: int = 2
    stall: int = NEVER
    queue_aware: bool = False
    queue_flip: float = 0.0
    deferred_variants: bool = False
    deferred_flip: float = 0.0
    wait_keeps_reload_room: bool = False
    revision: int | None = None     # the search revision it is, if the driver used it

    @property
    def heading(self) -> str:
        """The column's heading in the tables."""
        return self.column + (f" (revision {self.revision})" if self.revision else "")


#: the knobs of :class:`Kind` that are RandomizedSearch's (the rest are offload_list's)
SEARCH_KNOBS = ("fresh", "basins", "stall")
_TWO = Kind("perturbing, two basins", revision=30)
_RESTART = _TWO._replace(column="two basins, restarted when stalled", stall=60,
                         revision=31)
_QUEUE = _RESTART._replace(column="restarts, offloads that can come back in time",
                           queue_aware=True, queue_flip=0.25, revision=32)
_DEFERRED = _QUEUE._replace(
    column="offloads listed when due, waits for the first copy that makes room",
    deferred_variants=True, deferred_flip=0.25, revision=33)
KINDS = {"fresh": Kind("fresh draws only", fresh=1.0, basins=1, revision=29),
         "one": Kind("perturbing, one basin", basins=1),
         "two": _TWO,
         "restart": _RESTART,
         "queue": _QUEUE,
         "rules": _QUEUE._replace(column="four basins, W policy x offload rule", basins=4,
                                  revision=None),
         "deferred": _DEFERRED,
         "reload-room": _DEFERRED._replace(
             column="deferred, a waiting forward leaves room for the next reload due",
             wait_keeps_reload_room=True, revision=34)}
#: the kinds the driver table compares: the search before and as now
PREVIOUS, NOW = "deferred", "reload-room"
#: (case, placement) the strategies are measured on: the placements the driver's
#: randomized runs went to (and the V shape, the optimum's, at 8 x 16)
SEARCH_CASES = (("8stage-40GB", "interleaved"), ("16stage-40GB", "interleaved"),
                ("4stage-80GB", "interleaved"), ("bench-8x16", "v"),
                ("bench-8x16", "interleaved"), ("bench-8x32", "v"),
                ("gpt3-13b-8stage-40GB", "interleaved"))
SEEDS = (0, 1, 2)


def strategies_row(label: str, placement: str, seconds: float, kinds: list[str],
                   seeds: tuple[int, ...] = SEEDS) -> str:
    """For each of ``kinds`` (keys of :data:`KINDS`): the best variant's makespan (the
    start, built with the kind's knobs), the mean over ``seeds`` after a third of
    ``seconds`` and after all of it, and the best."""
    from optpipe.optimizer import offload_list
    from optpipe.schedule import searched_placements
    from optpipe.simulator import simulate

    problem = problem_of(label)
    place = searched_placements(problem.devices)[placement]
    cells = [label, placement]
    for kind in kinds:
        with _knobs(KINDS[kind]):
            made = [(simulate(problem, s), i, s) for i, s in
                    enumerate(offload_list.offload_list_schedules(problem, place))]
            best, _, start = min(((r.makespan, i, s) for r, i, s in made if r.fits),
                                 key=lambda t: t[:2])
            early, late = [], []
            for seed in seeds:
                search = offload_list.RandomizedSearch(
                    problem, place, True, start.provenance["offload_list"], best, seed=seed)
                search.run(time.monotonic() + seconds / 3)
                early.append(search.makespan)
                search.run(time.monotonic() + seconds * 2 / 3)
                late.append(search.makespan)
        cells.append(f"{best:.4g} s / {statistics.mean(early):.4g} / "
                     f"{statistics.mean(late):.4g} s (best {min(late):.4g})")
    line = "| " + " | ".join(cells) + " |"
    print(line, flush=True)
    return line


@contextlib.contextmanager
def _knobs(kind: Kind) -> Iterator[None]:
    """The knobs of ``kind`` set on their owners for the block, then restored."""
    from optpipe.optimizer import offload_list

    knobs = [(offload_list.RandomizedSearch if name in SEARCH_KNOBS else offload_list,
              name.upper(), getattr(kind, name)) for name in Kind._fields
             if name not in ("column", "revision")]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in knobs]
    for owner, name, value in knobs:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def driver_row(label: str, now: bool, seconds: float) -> str:
    """``optpipe solve`` on a preset, with the previous revision's offload-aware list
    schedules (:data:`PREVIOUS`) or as now (:data:`NOW`)."""
    from optpipe.optimizer import driver

    kind = KINDS[NOW if now else PREVIOUS]
    with _knobs(kind):
        t0 = time.monotonic()
        result = driver.solve(problem_of(label), time_limit=seconds, cache=False,
                              progress=False)
        wall = time.monotonic() - t0
    placement = result.schedule.provenance.get("placement")
    placed = f" ({placement})" if placement else ""
    line = (f"| {label} | revision {kind.revision}"
            f" | {result.sim.makespan:.4g} s | {(result.gap or 0.0):.2%} | "
            f"{result.schedule.name}{placed} | "
            f"{wall:.0f} s |")
    print(line, flush=True)
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(PRESETS),
                    help=f"comma-separated, of {', '.join(PRESETS)}")
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="time limit per solve; with --strategies, per seed (default 15)")
    ap.add_argument("--strategies", action="store_true",
                    help="measure the search's strategies alone (module docstring)")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"with --strategies, comma-separated, of {', '.join(KINDS)}")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)),
                    help="with --strategies, comma-separated random seeds (default 0,1,2)")
    ap.add_argument("--now-only", action="store_true",
                    help="without --strategies: only the current search, not the previous "
                         "beside it (printed, not written: the table keeps both)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.strategies:
        seconds = 15.0 if args.seconds == 60.0 else args.seconds
        kinds = args.kinds.split(",")
        seeds = tuple(int(s) for s in args.seeds.split(","))
        if not set(kinds) <= set(KINDS):
            raise SystemExit(f"unknown kind in {args.kinds!r}; known: {', '.join(KINDS)}")
        table = ["| problem | placement | "
                 + " | ".join(KINDS[kind].heading for kind in kinds) + " |",
                 "|---" * (2 + len(kinds)) + "|"]
        table += [strategies_row(label, placement, seconds, kinds, seeds)
                  for label, placement in SEARCH_CASES]
        command = "python scripts/bench_offload_search.py --strategies" + (
            f" --kinds {args.kinds}" if kinds != list(KINDS) else "") + (
            f" --seeds {args.seeds}" if seeds != SEEDS else "")
        caption = (f"Measured with `{command} "
                   f"--seconds {seconds:g}` ({time.strftime('%Y-%m-%d')}, 2 cores; each "
                   "cell: the best variant's makespan (the search's start), the mean "
                   f"over seeds {', '.join(map(str, seeds))} after "
                   f"{seconds / 3:g} s / after {seconds:g} s, and the best after "
                   f"{seconds:g} s; makespans simulated; bench-SxM: the benchmark's "
                   "uniform problem at S/2).")
        publish(caption + "\n\n" + "\n".join(table), DOC, *STRATEGIES,
                write=not args.no_write)
        return
    table = ["| problem | randomized runs | answer | gap | from (placement) | wall |",
             "|---|---|---|---|---|---|"]
    for label in args.cases.split(","):
        if label not in PRESETS:
            raise SystemExit(f"unknown case {label!r}; known: {', '.join(PRESETS)}")
        for now in ((True,) if args.now_only else (False, True)):
            table.append(driver_row(label, now, args.seconds))
    flags = (" --now-only" if args.now_only else "") + (
        f" --cases {args.cases}" if args.cases != ",".join(PRESETS) else "")
    caption = (f"Measured with `python scripts/bench_offload_search.py{flags} --seconds "
               f"{args.seconds:g}` ({time.strftime('%Y-%m-%d')}, 2 cores, 2 solver "
               "threads, one run each; presets as `optpipe solve --model M --hardware H "
               "--stages S --mem X --no-cache`).")
    publish(caption + "\n\n" + "\n".join(table), DOC, *DRIVER,
            write=not (args.no_write or args.now_only))


if __name__ == "__main__":
    main()
