"""The live progress line of a solve: elapsed time, incumbent, bound and gap.

Why a module of its own: the line must state the search's view, not one engine run's
(each run counts its own clock, knows only its own incumbent and placement), and it must
keep ticking while warm starts are built and after the search, when offloaded plans use
the time left over. :class:`SearchProgress` keeps that view; :class:`LiveLine` prints it
on stderr (in place on a terminal, throttled otherwise).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Callable

from optpipe.optimizer.candidates import bar_to_beat
from optpipe.optimizer.preprocess import FixedSet
from optpipe.optimizer.result import ProgressFn, relative_gap
from optpipe.optimizer.spaces import Space, bound_with_offload
from optpipe.units import format_seconds


def warm_start_heartbeat(reporter: ProgressFn | None, t0: float, fixed: FixedSet,
                         use_offload: bool, split_backward: bool) -> Callable[[], None] | None:
    """Keeps the live line ticking while warm starts are built (incumbent: the best
    fitting schedule in hand; no bound yet)."""
    if reporter is None:
        return None

    def beat() -> None:
        best = bar_to_beat(fixed, use_offload, split_backward)
        reporter(time.monotonic() - t0, best.makespan if best else None, None, None)
    return beat


def search_heartbeat(live: SearchProgress | None, fixed: FixedSet, split_backward: bool
                     ) -> Callable[[], None] | None:
    """Keeps the live line ticking after the search (the offloaded plans that use the
    time it left): the search's bound stays on the line, the incumbent is the best
    fitting schedule in hand (:func:`warm_start_heartbeat` is for before the search,
    with no bound yet)."""
    if live is None:
        return None

    def beat() -> None:
        best = bar_to_beat(fixed, True, split_backward)
        if best is not None:
            live.best = best.makespan if live.best is None else min(live.best, best.makespan)
        live.emit()
    return beat


class SearchProgress:
    """What the live line shows of the whole search, whichever engine run reports.

    Why not forward the engines' reports: each run counts its own elapsed time, knows
    only its own incumbent (not the fixed and periodic schedules already in hand) and
    its own placement's bound, while the answer's bound is the least over placements.
    So this keeps the solve's clock, the best makespan so far and each placement's best
    bound, and reports the bound that holds for the answer: with offload, the order
    models' bounds do not hold (see :func:`~.driver._search`), and with a faster fused backward
    the fused relaxation caps it (:func:`~.spaces.fused_relaxed_bound`).
    """

    def __init__(self, sink: ProgressFn, t0: float, spaces: list[Space],
                 incumbent: float | None, use_offload: bool, cap: float | None) -> None:
        self.sink, self.t0, self.spaces = sink, t0, spaces
        self.best = incumbent
        self.use_offload, self.cap = use_offload, cap
        self.live: dict[str, float] = {}
        self.linear_start = next((sp.bound for sp in spaces if sp.label == "linear"), None)

    def run(self, label: str) -> ProgressFn:
        """The progress function for one engine run on placement ``label``."""
        self.emit()          # a run starts: show where the search stands

        def report(_elapsed: float, best: float | None, bound: float | None,
                   _gap: float | None) -> None:
            if best is not None:
                self.best = best if self.best is None else min(self.best, best)
            if bound is not None:
                self.live[label] = max(self.live.get(label, -math.inf), bound)
            self.emit()
        return report

    def bound(self) -> float:
        if self.use_offload:
            linear = -math.inf if self.linear_start is None else \
                max(self.linear_start, self.live.get("linear+offload", -math.inf))
            found = min(bound_with_offload(sp, linear) for sp in self.spaces)
        else:
            found = min(max(sp.bound, self.live.get(sp.label, -math.inf))
                        for sp in self.spaces)
        return found if self.cap is None else min(found, self.cap)

    def emit(self) -> None:
        bound = self.bound()
        self.sink(time.monotonic() - self.t0, self.best, bound,
                  relative_gap(self.best, bound))


def progress_sink(progress: bool | ProgressFn | None) -> ProgressFn | None:
    if callable(progress):
        return progress
    if not progress:
        return None
    return LiveLine()


class LiveLine:
    """One line on stderr, rewritten in place on a terminal, throttled otherwise.

    Shows after the first second only, so quick solves print nothing. Between reports
    the line keeps its clock going (:meth:`start`): a CP-SAT run reports only new
    schedules and bounds, and a proof or a gap probe can go 20-40 s without either
    (4 x 64 at S/2, one stage per device: the probe's 23 s), which on a terminal looked
    like a hang.
    """

    def __init__(self, delay: float = 1.0, every: float = 10.0, tick: float = 1.0) -> None:
        self.delay, self.every, self.tick = delay, every, tick
        self.tty = sys.stderr.isatty()
        self.last_print = -math.inf
        self.shown = False
        self.best: float | None = None
        self.bound: float | None = None
        self.origin: float | None = None     # the solve's t0 on this clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __call__(self, elapsed: float, best: float | None, bound: float | None,
                 gap: float | None) -> None:
        # the search's own view (SearchProgress): kept for the next throttled print
        with self._lock:
            self.origin = time.monotonic() - elapsed
            self.best = best if best is not None else self.best
            self.bound = bound if bound is not None else self.bound
            self._show(elapsed)

    def start(self) -> None:
        """Keep the line's clock going until :meth:`close`: a daemon thread re-shows it
        every ``tick`` seconds (each ``every`` seconds off a terminal) with the last
        incumbent and bound."""
        if self._ticker is not None:
            return

        def run() -> None:
            while not self._stop.wait(self.tick if self.tty else self.every):
                with self._lock:
                    if self.origin is not None:
                        self._show(time.monotonic() - self.origin)
        self._ticker = threading.Thread(target=run, name="optpipe-live-line", daemon=True)
        self._ticker.start()

    def _show(self, elapsed: float) -> None:
        if elapsed < self.delay:
            return
        if not self.tty and elapsed - self.last_print < self.every:
            return
        self.last_print = elapsed
        gap = relative_gap(self.best, self.bound)
        text = (f"solving {elapsed:6.1f}s  incumbent "
                f"{format_seconds(self.best) if self.best is not None else '-':>10}  bound "
                f"{format_seconds(self.bound) if self.bound is not None else '-':>10}  gap "
                f"{f'{gap:.2%}' if gap is not None else '-':>7}")
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + text)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self.shown and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()
