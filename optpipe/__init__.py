"""optpipe: memory-aware optimal pipeline-parallel schedules.

Public entry points (imported lazily so that ``import optpipe`` stays light):
``Problem``, ``load_problem``, ``Schedule``, ``load_schedule``, ``simulate``,
``generate``, ``solve`` and ``OptPipeRunner``.
"""

from __future__ import annotations

from optpipe._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "Problem": "optpipe.problem",
    "load_problem": "optpipe.problem",
    "uniform_problem": "optpipe.problem",
    "Schedule": "optpipe.schedule",
    "Action": "optpipe.schedule",
    "Op": "optpipe.schedule",
    "load_schedule": "optpipe.schedule",
    "simulate": "optpipe.simulator",
    "generate": "optpipe.generators",
    "solve": "optpipe.optimizer",
    "OptPipeRunner": "optpipe.runtime",
    "OptPipeError": "optpipe.errors",
}


__getattr__ = lazy_exports("optpipe", _EXPORTS)

__all__ = sorted(_EXPORTS)
