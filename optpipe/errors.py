"""The one exception type for user mistakes.

Anything a user can cause (a bad unit, a corrupt schedule file, an infeasible budget, a
missing solver) raises :class:`OptPipeError` with one line that says what is wrong and
what to do. The CLI prints that line and exits non-zero; programming errors keep their
tracebacks.
"""


class OptPipeError(Exception):
    """A user-facing error whose message is a complete, actionable sentence."""


class InvalidScheduleError(OptPipeError):
    """A schedule that cannot be executed: names the offending action."""


class InfeasibleError(OptPipeError):
    """No schedule fits the memory budget; carries per-device minimum budgets when known."""

    def __init__(self, message: str, min_budget: list[int] | None = None,
                 min_budget_offload: list[int] | None = None) -> None:
        super().__init__(message)
        self.min_budget = min_budget
        self.min_budget_offload = min_budget_offload
