"""The fixed (heuristic) schedule generators, behind one registry.

``GENERATORS[name](problem, **options)`` returns a validated
:class:`~optpipe.schedule.Schedule` for the problem's devices and microbatches, with
provenance ``{"source": "generator", "name": name, ...}``. Chunked schedules
(``interleaved-1f1b``, ``zb-v``, and ``zb-auto`` when it picks the V placement) have
``schedule.stages = devices * chunks``; the simulator splits the base problem itself.

========================  ===================================================================
name                      what it is
========================  ===================================================================
``gpipe``                 all forwards, then all fused backwards
``1f1b``                  warm-up ``S-s`` forwards, then one backward per forward
``interleaved-1f1b``      Megatron's interleaved 1F1B, option ``chunks`` (default 2)
``zb-h1``                 zero-bubble H1: 1F1B's memory, W deferred into the cool-down
``zb-h2``                 zero-bubble H2: ``2S-1`` in flight, no steady-state bubble
``zb-v``                  zero-bubble V: two chunks in a V, 1F1B's memory
``zb-auto``               greedy zero-bubble scheduler searching its knobs under the budget
``pipeoffload``           offloads chosen activations to host so the peak fits the budget,
                          option ``bases`` (default ZB-H1, 1F1B, interleaved 1F1B, ZB-V)
========================  ===================================================================

Use :func:`generate` (it checks the name and the options) and :func:`applicable` (so that a
comparison can skip a generator with a reason instead of failing).
"""

from __future__ import annotations

from typing import Any, Callable

from optpipe.errors import OptPipeError
from optpipe.generators.auto import zb_auto
from optpipe.generators.base import reject_options
from optpipe.generators.classic import gpipe, one_f_one_b
from optpipe.generators.interleaved import chunks_problem, interleaved_1f1b
from optpipe.generators.offload import pipeoffload
from optpipe.generators.zbv import zb_v
from optpipe.generators.zero_bubble import zb_h1, zb_h2
from optpipe.problem import Problem
from optpipe.schedule import Schedule

GENERATORS: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved-1f1b": interleaved_1f1b,
    "zb-h1": zb_h1,
    "zb-h2": zb_h2,
    "zb-v": zb_v,
    "zb-auto": zb_auto,
    "pipeoffload": pipeoffload,
}

#: The options each generator accepts (anything else is an error, not a silent default).
OPTIONS: dict[str, tuple[str, ...]] = {"interleaved-1f1b": ("chunks",), "pipeoffload": ("bases",)}


def _lookup(name: str) -> Callable[..., Schedule]:
    try:
        return GENERATORS[name]
    except KeyError:
        raise OptPipeError(f"unknown schedule generator {name!r}; known: "
                           f"{', '.join(GENERATORS)}") from None


def applicable(name: str, problem: Problem, **options: Any) -> bool | str:
    """True when ``generate(name, problem, **options)`` can work, else the reason why not.

    All generators handle any stage and microbatch count, latency and stage costs; what
    they cannot take is a problem that is already split into chunks, or bad options.
    """
    _lookup(name)
    if problem.chunks != 1:
        return (f"{name} places stages itself and needs the base problem (one stage per "
                f"device), not one split into {problem.chunks} chunks per device")
    try:
        reject_options(name, options, OPTIONS.get(name, ()))
    except OptPipeError as exc:
        return str(exc)
    if name == "interleaved-1f1b":
        reason = chunks_problem(options.get("chunks", 2))
        if reason:
            return reason
    return True


def generate(name: str, problem: Problem, **options: Any) -> Schedule:
    """The named schedule for ``problem``; unknown names and options raise OptPipeError."""
    generator = _lookup(name)
    reject_options(name, options, OPTIONS.get(name, ()))
    return generator(problem, **options)


__all__ = ["GENERATORS", "OPTIONS", "applicable", "generate"]
