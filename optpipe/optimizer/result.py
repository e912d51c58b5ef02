"""What one optimization engine hands back to the driver.

Every engine (CP-SAT in :mod:`optpipe.optimizer.cpsat`, the Pyomo MILP in
:mod:`optpipe.optimizer.milp`) returns an :class:`EngineResult`, so the driver can pick,
check and fall back without knowing which engine ran. Figures here are the *engine's*
view (its objective and bound, in seconds); the figures a user sees always come from
simulating ``schedule`` (:mod:`optpipe.simulator` is the one judge).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from optpipe.schedule import Schedule

#: Status words every engine uses (the driver adds ``"fallback"`` and ``"cached"``).
OPTIMAL = "optimal"            # proven optimal (within the requested gap)
FEASIBLE = "feasible"          # a schedule, optimality not proven before the time limit
INFEASIBLE = "infeasible"      # proven: no schedule satisfies the model
UNKNOWN = "unknown"            # stopped with no schedule and no proof
ERROR = "error"                # the engine failed (message says why)

STATUSES = (OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN, ERROR)


@dataclass
class EngineResult:
    """One engine run: the extracted schedule (or None) and the engine's own figures.

    ``objective`` and ``bound`` are makespans in seconds (``bound`` is a proven lower
    bound); ``gap`` is ``(objective - bound) / objective`` (0 when proven optimal, None
    when unknown); ``wall_time`` is seconds spent in the engine; ``engine`` names it
    (``"cpsat"``, ``"highs"``, ``"gurobi"``). ``extra`` carries engine details worth
    keeping in a schedule's provenance (tick size, model size, phases …).
    """

    schedule: Optional[Schedule]
    status: str
    objective: Optional[float]
    bound: Optional[float]
    gap: Optional[float]
    wall_time: float
    engine: str
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def has_schedule(self) -> bool:
        return self.schedule is not None


#: Signature of the live-progress hook engines call on each improvement:
#: ``progress(elapsed_seconds, incumbent_makespan_or_None, bound_or_None, gap_or_None)``.
ProgressFn = Callable[[float, Optional[float], Optional[float], Optional[float]], None]


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """``(objective - bound) / objective``, clipped at 0; None when either is unknown."""
    if objective is None or bound is None:
        return None
    if objective <= 0:
        return 0.0
    return max(0.0, (objective - bound) / objective)
