"""Fewer garbage collections while the driver builds its warm starts.

Why: before its engines start, the driver builds and simulates dozens of schedules in
Python (at 16 x 64 each holds 6,144 actions, and the simulator's records as many),
all alive until the search. CPython's cyclic collector runs a full pass over every
live object each time enough younger passes have run, and with the default thresholds
(700, 10, 10) those full passes cost the driver a third of its time before the
search: at 16 x 64, budget S, 4,697 young, 426 middle and 30 full collections, and the
search began at 10.3–13.5 s; with the thresholds below, 62, 3 and 0, and it began at
8.0–9.4 s (three runs each in fresh processes, 2026-12-02; rerun with
`python scripts/bench_presearch.py --sizes 16x64 --budgets 1 --no-write`, with and
without `--default-gc`: 8.6–9.3 s raised, 11.2–12.2 s default, three runs each). Those objects are not garbage and hold almost no
cycles, so the passes find nothing; memory is not what the collector would have saved.

The thresholds are raised for the call and put back after it (nested calls keep the
outer call's), so a program that imports optpipe keeps its own settings; during the
call they hold for the whole process (the collector has no per-thread setting), so a
program's other threads collect less often for that long too.
"""

from __future__ import annotations

import functools
import gc
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

#: The thresholds (young, middle, full) while a solve runs; never lowered below the
#: program's own.
THRESHOLDS = (50_000, 20, 100)

F = TypeVar("F", bound=Callable)


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the block with the collector's thresholds raised to :data:`THRESHOLDS`."""
    before = gc.get_threshold()
    gc.set_threshold(*(max(mine, theirs) for mine, theirs in zip(THRESHOLDS, before)))
    try:
        yield
    finally:
        gc.set_threshold(*before)


def with_fewer_collections(function: F) -> F:
    """``function`` run inside :func:`fewer_collections`."""
    @functools.wraps(function)
    def run(*args, **kwargs):
        with fewer_collections():
            return function(*args, **kwargs)
    return run  # type: ignore[return-value]
