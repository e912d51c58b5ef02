"""The optimizer: schedules that are optimal under per-device memory budgets.

``solve(problem, ...)`` (see :mod:`optpipe.optimizer.driver`) is the entry point; it is
imported lazily so that the engines' helpers (:mod:`.preprocess`, :mod:`.result`) stay
cheap to import for the MILP engine and the tests.
"""

from __future__ import annotations

from typing import Any

__all__ = ["solve", "SolveResult", "EngineResult"]


def __getattr__(name: str) -> Any:
    if name in ("solve", "SolveResult"):
        from optpipe.optimizer import driver
        return getattr(driver, name)
    if name == "EngineResult":
        from optpipe.optimizer.result import EngineResult
        return EngineResult
    raise AttributeError(f"module 'optpipe.optimizer' has no attribute {name!r}")
