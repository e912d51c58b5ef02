"""An independent check of a memory plan: every buffer inside the arena, no two live
buffers sharing an address.

The planner is clever (branch and bound, periodic reuse, grouping); this module is
deliberately simple and shares no code with it, so that a planner bug cannot hide
itself. It sweeps time in order, ends before starts at equal times (lifetimes are
half-open), keeps the live buffers sorted by offset, and compares each newcomer with its
neighbours in address order.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Mapping

from optpipe.errors import OptPipeError
from optpipe.memory.trace import Trace


class PlanError(OptPipeError):
    """A plan that would let two live buffers share memory or leave the arena."""


def plan_violations(trace: Trace, offsets: Mapping[str, int], arena_size: int,
                    alignment: int = 1, limit: int = 10) -> list[str]:
    """Up to ``limit`` sentences, one per violation; empty when the plan is sound."""
    problems: list[str] = []
    by_id = {b.id: b for b in trace.buffers}
    for b in trace.buffers:
        if b.id not in offsets:
            problems.append(f"buffer {b.id!r} has no offset")
        else:
            off = offsets[b.id]
            if not isinstance(off, int) or off < 0:
                problems.append(f"buffer {b.id!r} has offset {off!r}; offsets are integers "
                                f">= 0")
            elif off + b.size > arena_size:
                problems.append(f"buffer {b.id!r} at [{off}, {off + b.size}) leaves the arena "
                                f"of {arena_size} bytes")
            elif alignment > 1 and off % alignment:
                problems.append(f"buffer {b.id!r} at offset {off} is not aligned to "
                                f"{alignment} bytes")
        if len(problems) >= limit:
            return problems
    if problems:
        return problems
    events = []
    for b in trace.buffers:
        if b.size > 0 and b.end > b.start:
            events.append((b.start, 1, b.id))
            events.append((b.end, 0, b.id))
    events.sort()
    live: list[tuple[int, str]] = []  # (offset, id), sorted
    for _, kind, ident in events:
        key = (offsets[ident], ident)
        if kind == 0:
            live.pop(bisect_left(live, key))
            continue
        lo, hi = offsets[ident], offsets[ident] + by_id[ident].size
        at = bisect_left(live, key)
        # the live set has no overlaps, so only the neighbours in address order can clash:
        # the one below (if it reaches past lo) and those starting before hi.
        if at > 0:
            other = live[at - 1][1]
            top = offsets[other] + by_id[other].size
            if top > lo:
                problems.append(_clash(by_id[ident], lo, by_id[other], offsets[other]))
        if at < len(live):
            other = live[at][1]
            if offsets[other] < hi:
                problems.append(_clash(by_id[ident], lo, by_id[other], offsets[other]))
        if len(problems) >= limit:
            return problems
        insort(live, key)
    return problems


def _clash(a, a_off: int, b, b_off: int) -> str:
    return (f"buffers {a.id!r} [{a_off}, {a_off + a.size}) live [{a.start}, {a.end}) and "
            f"{b.id!r} [{b_off}, {b_off + b.size}) live [{b.start}, {b.end}) overlap in time "
            f"and address")


def validate_plan(trace: Trace, offsets: Mapping[str, int], arena_size: int,
                  alignment: int = 1) -> None:
    """Raise :class:`PlanError` naming the first violation; return quietly if sound."""
    problems = plan_violations(trace, offsets, arena_size, alignment, limit=1)
    if problems:
        raise PlanError(f"invalid memory plan for trace '{trace.name}': {problems[0]}")
