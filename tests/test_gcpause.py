"""The driver's raised collector thresholds: raised for the call, put back after.

Why: optpipe is imported into training programs that may tune the collector
themselves; a solve must not leave its settings behind, even when it raises.
"""

from __future__ import annotations

import gc

import pytest

from optpipe.optimizer.gcpause import THRESHOLDS, fewer_collections, with_fewer_collections


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_raised_inside_and_put_back_after(thresholds) -> None:
    gc.set_threshold(700, 10, 10)
    with fewer_collections():
        assert gc.get_threshold() == THRESHOLDS
    assert gc.get_threshold() == (700, 10, 10)


def test_a_program_s_higher_thresholds_are_never_lowered(thresholds) -> None:
    gc.set_threshold(10**6, 5, 10**4)
    with fewer_collections():
        assert gc.get_threshold() == (10**6, THRESHOLDS[1], 10**4)
    assert gc.get_threshold() == (10**6, 5, 10**4)


def test_put_back_when_the_call_raises_and_when_nested(thresholds) -> None:
    gc.set_threshold(700, 10, 10)

    @with_fewer_collections
    def inner() -> None:
        assert gc.get_threshold() == THRESHOLDS
        raise ValueError("a user mistake")

    with fewer_collections():
        with pytest.raises(ValueError):
            inner()
        assert gc.get_threshold() == THRESHOLDS
    assert gc.get_threshold() == (700, 10, 10)


def test_solve_keeps_its_signature_and_docstring() -> None:
    import inspect

    from optpipe.optimizer.driver import solve

    assert "time_limit" in inspect.signature(solve).parameters
    assert solve.__doc__ and "fastest schedule" in solve.__doc__
