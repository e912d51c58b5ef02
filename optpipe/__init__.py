"""optpipe: memory-aware optimal pipeline-parallel schedules.

Public entry points (imported lazily so that ``import optpipe`` stays light):
``Problem``, ``load_problem``, ``Schedule``, ``load_schedule``, ``simulate``,
``generate``, ``solve`` and ``OptPipeRunner``.
"""

from __future__ import annotations

from typing import Any

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'optpipe' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = sorted(_EXPORTS)
