"""What every generator shares: the order type, the base-problem check, the Schedule build.

A generator only decides *orders* (per device, the sequence of ``(op, stage,
microbatch)``); it never decides times. Keeping the building and validation of the
:class:`~optpipe.schedule.Schedule` here means every generator hands back the same kind of
object, validated the same way, with the same provenance keys, so nothing downstream has
to special-case where a schedule came from.
"""

from __future__ import annotations

from typing import Any, Sequence

from optpipe.errors import OptPipeError
from optpipe.problem import Problem
from optpipe.schedule import Schedule, from_orders

#: One device's ordered work: ``(op, stage, microbatch)`` with op in F, B, W, BW.
Order = list[tuple[str, int, int]]


def require_base(problem: Problem, name: str) -> None:
    """Generators place stages themselves, so they need the unsplit problem.

    A split problem (``problem.chunks > 1``) already fixes a placement; accepting it would
    let a generator silently produce a schedule for a different pipeline.
    """
    if problem.chunks != 1:
        raise OptPipeError(f"generator '{name}' needs the base problem (one stage per device); "
                           f"this one already has {problem.chunks} stages per device")


def build(name: str, placement: Sequence[int], microbatches: int, orders: Sequence[Order],
          **provenance: Any) -> Schedule:
    """Validate ``orders`` into a Schedule whose provenance says which generator made it."""
    record: dict[str, Any] = {"source": "generator", "name": name}
    record.update(provenance)
    return from_orders(name, list(placement), microbatches, orders, provenance=record)


def reject_options(name: str, options: dict[str, Any], accepted: Sequence[str] = ()) -> None:
    """Unknown options are mistakes (a typo must not silently fall back to a default)."""
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        known = ", ".join(accepted) if accepted else "none"
        raise OptPipeError(f"generator '{name}' does not take option(s) {unknown}; "
                           f"accepted: {known}")
