"""Search then probe: the full model finds the schedule, objective-free probes prove it.

Why: at 16 x 64 at budget S/2 on one stage per device (1024 stage x microbatch cells,
past :data:`~.cpsat.WINDOWLESS_MAX_CELLS_WITH_CUTS`) the driver searched by a share of
the full model and then microbatch windows (:func:`~.decompose.window_search`), which
leave the bound where the prefix cuts put it (299.7 s, against an optimum of 304.0 s:
2.8-4.3% gaps in search revisions 36 and 37). Measured by hand from two captured
driver states (2026-12-07: the driver's hints and cuts, pickled and replayed): the full
model minimizing from the extended hint (307.3 s) reached the optimum in 11-12 s,
model building included, its improvements 1-3 s apart; the gap probe's question
(:func:`~.cpsat.order_run` without the objective, its horizon
:data:`~.cpsat.PROBE_GAP` under the answer) was then refuted in about 17 s (11.7 s
with the fuller cuts revision 38's driver builds, every piece from 1 to 16). A probe
asked to *find* a schedule 1% under 307.3 s (304.2 s, just above the optimum) was
still open after 29 s: near the optimum, minimizing finds and probing proves.

So: the full model minimizes until it has gone :data:`STALL_SECONDS` without a better
schedule (:func:`stop_on_stall`), or until :data:`PROBE_RESERVE` before the deadline;
then :func:`probe_descent` asks the gap probe's question of its answer, again of each
shorter schedule a probe finds, until one is refuted (the answer is then within the
gap) or the time is up. Every schedule returned is a solution of the full order model
(re-timed ASAP like the simulator), and every bound raised is a refutation of that
model with the prefix cuts, so both hold for the problem. Through the driver (with the
extended schedules' share at 30%, :data:`~.warm_starts.EXTEND_SHARE_LARGE`): 16 x 64
at S/2 within 0.5% in 3 of 3 runs, each of two runs of ``python
scripts/bench_descent.py``, against 0 of 3 for search revision 37. Later, on a slower
machine, that extension was a lottery (0 of 7); since search revision 39 the no-wait
waves (:mod:`.waves`) start it at 304.4 s instead, and with :data:`PROBE_RESERVE` at
19 s the probe's 0.5% held in 6 of 6 runs (9 of 15 with 15 s; probes refuted in
11.3-19.1 s; docs/optimizer-log.md, the revision-39 item).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ortools.sat.python import cp_model

from optpipe.optimizer.result import ProgressFn, relative_gap
from optpipe.problem import Problem

if TYPE_CHECKING:
    from optpipe.optimizer.cpsat import ProbeOutcome
    from optpipe.optimizer.cpsat_model import Hint, Ticks
    from optpipe.optimizer.prefix import PrefixCuts

#: The search (the full model minimizing) stops after this many seconds without a
#: better schedule, and the probes take over. Why 4 s: at 16 x 64 at S/2, from the
#: driver's extended hint (307.3 s), its improvements came 1-3 s apart until the
#: optimum (304.0 s, at 11.1-12.0 s in five runs by hand over two captured states).
STALL_SECONDS = 4.0
#: ... and it stops this many seconds before the deadline at the latest, for the
#: probe: 0.5% under the optimum it took 17.1-17.4 s there, model building included
#: (two runs by hand with revision 37's partial cuts; 11.7 s with revision 38's;
#: 11.5 s after 120 s of cuts, ``scripts/bench_gap_probe.py``;
#: 9.7-11.0 s inside the driver, ``scripts/bench_descent.py``). 19 s since search
#: revision 39: on the slower machine of 2026-12-08 the probe took 13.6-19.1 s inside
#: the driver, and the runs whose search went on past 16 s left it too little (open
#: after 15.8-16.9 s); with 19 s and :data:`SEARCH_MIN_SHARE` 0.4, three runs by hand
#: were refuted in 11.3-14.8 s, and the table's runs are in docs/optimizer-log.md.
PROBE_RESERVE = 19.0
#: ... but the search keeps at least this share of the time it has left: where the
#: minute is short the answer matters more than a probe that has too little time to
#: prove anything (16 x 64 at S/2 with a 45 s limit: the run had about 15 s, the
#: reserve left the search none, and the probe stayed open at 5.98%; by hand with
#: ``python scripts/bench_descent.py --variants 'revision 38' --runs 1 --seconds 45
#: --no-write``; 0.5 then, 0.4 since search revision 39, whose waves start the search
#: within 0.15% of the optimum there).
SEARCH_MIN_SHARE = 0.4
#: A probe is not started with less time than this left (s): building the order model
#: at 1024 cells takes a few seconds of it, and a probe cut short proves nothing.
MIN_PROBE_SECONDS = 3.0


@dataclass
class DescentStats:
    """What the descent did: every probe's outcome, in order."""

    probes: list["ProbeOutcome"] = field(default_factory=list)

    def record(self, scale: float) -> list[list[Any]]:
        """The probes as the run's provenance keeps them: ``[horizon s, found |
        refuted | open, seconds]`` (``scale``: ticks per second)."""
        return [[round(o.horizon / scale, 3),
                 "found" if o.found is not None else
                 "refuted" if o.status == "INFEASIBLE" else "open",
                 round(o.seconds, 2)] for o in self.probes]


def stop_on_stall(solver: cp_model.CpSolver, improved_at: Callable[[], float | None],
                  seconds: float) -> threading.Event:
    """Stop ``solver``'s search once ``seconds`` pass without a better schedule
    (``improved_at``: when the last one came, None before the first). Returns the event
    that ends the watch: set it when the solve returns."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.25):
            last = improved_at()
            if last is not None and time.monotonic() - last > seconds:
                solver.stop_search()
                return
    threading.Thread(target=watch, name="optpipe-stall-watch", daemon=True).start()
    return done


def probe_descent(problem: Problem, ticks: "Ticks", hint: "Hint", *, lower: int,
                  cuts: "PrefixCuts", gap: float, deadline: float, threads: int,
                  progress: ProgressFn | None = None, t0: float | None = None
                  ) -> tuple["Hint", int, DescentStats]:
    """Probe from ``hint`` down to within ``gap`` of the bound, or until ``deadline``.

    Returns the shortest schedule found (``hint`` if none), the proven lower bound in
    ticks (``lower``, raised by every refutation) and the probes made. A probe that
    ends without an answer (the deadline) ends the descent.
    """
    from optpipe.optimizer.cpsat import run_probe

    t0 = time.monotonic() if t0 is None else t0
    best, stats = hint, DescentStats()
    while best.makespan > lower and (relative_gap(best.makespan, lower) or 0.0) > gap:
        if deadline - time.monotonic() < MIN_PROBE_SECONDS:
            break
        outcome = run_probe(problem, ticks, best, lower, cuts, gap, deadline, threads)
        stats.probes.append(outcome)
        if outcome.found is not None:
            best = outcome.found
        elif outcome.status == "INFEASIBLE":
            lower = outcome.horizon + 1
        else:
            break                                   # open at the deadline
        if progress is not None:
            value, bound = best.makespan / ticks.scale, lower / ticks.scale
            progress(time.monotonic() - t0, value, bound, relative_gap(value, bound))
    return best, lower, stats

