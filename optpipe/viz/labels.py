"""The words on the figures: one phrasing of makespan, bubble rate, memory and budget.

Every picture of a schedule quotes the same simulator figures in the same words, so a
Gantt chart, a comparison panel and the CLI's table can be read side by side.
"""

from __future__ import annotations

import math

from optpipe.simulator import SimResult
from optpipe.units import format_bytes, format_seconds


def pipeline(result: SimResult) -> str:
    """``8 devices × 32 microbatches``: the size of the pipeline, whatever the schedule."""
    sched = result.schedule
    return f"{sched.devices} devices × {sched.microbatches} microbatches"


def shape(result: SimResult) -> str:
    """:func:`pipeline`, plus chunks per device when there are several."""
    sched = result.schedule
    text = pipeline(result)
    if sched.chunks > 1:
        text += f", {sched.chunks} chunks/device"
    return text


def budget_text(result: SimResult) -> str:
    """The budget in words: one value, ``per-device budgets``, or ``no budget``."""
    finite = [b for b in result.budget if math.isfinite(b)]
    if not finite:
        return "no budget"
    if len(finite) == len(result.budget) and len(set(finite)) == 1:
        return f"budget {format_bytes(finite[0])}"
    return "per-device budgets"


def fit_text(result: SimResult) -> tuple[str, bool]:
    """``fits budget`` or ``OVER budget on device 3 (…)``, and whether it fits."""
    if result.fits:
        return ("fits " + budget_text(result) if budget_text(result) != "no budget"
                else "no budget"), True
    over = result.over_budget()
    d = over[0]
    more = f" (+{len(over) - 1} more)" if len(over) > 1 else ""
    return (f"OVER budget on device {d}: {format_bytes(result.peak_memory[d])} > "
            f"{format_bytes(result.budget[d])}{more}"), False


def figures(result: SimResult) -> str:
    """``makespan 101.20 ms · bubble 21.3% · peak 12.00 GiB``: the headline numbers."""
    return (f"makespan {format_seconds(result.makespan)} · bubble {result.bubble_rate:.1%} · "
            f"peak {format_bytes(max(result.peak_memory))}")
