"""The placements searched, and what is known about each: bounds, best start, and how
long a run on it takes.

Why a module of its own: a placement (one stage per device, the V shape, interleaved
chunks; each again with fused backwards where a fused backward is faster) is the unit
the driver's search (:func:`~.driver.solve`) hands its time to, the warm starts
(:mod:`.warm_starts`) pick their source from, and the live line (:mod:`.progress`)
takes its bound over. :class:`Space` holds one placement's figures; the functions here
build them, order them, and state which bound holds with offload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from optpipe.errors import OptPipeError
from optpipe.optimizer.bounds import (lower_bound, memory_bound, offload_area_bound,
                                      offload_warmup_bound)
from optpipe.optimizer.candidates import fitting_on, fused_is_faster
from optpipe.optimizer.preprocess import FixedSet, task_graph
from optpipe.problem import Problem
from optpipe.schedule import linear_placement, searched_placements

#: Starts within this share of the best count as equally promising: the lowest bound
#: among them goes first (:func:`room_first`).
CLOSE_STARTS = 0.01
#: Expected first-run overrun of CP-SAT per stage x microbatch x chunk on a chunked
#: placement (seconds; see :func:`expected_overrun`).
OVERRUN_PER_CHUNK_CELL = 0.001


@dataclass
class Space:
    """One placement searched: its stage -> device list and what is proven about it."""

    label: str
    placement: list[int]
    bound: float            # proven lower bound for schedules on this placement
    best_fixed: float       # best fitting start on it without offload (inf if none)
    split: bool = True      # backwards modelled as B and W (else fused BW)
    overrun: float = 0.0    # seconds a run on it may go past its limit (expected or seen)
    free_bound: float = 0.0  # its no-memory bound (what decides a proof attempt)
    # its memory bound without offload: what ranks placements with equal starts for the
    # order models (:func:`room_first`), with offload allowed too, where ``bound`` is
    # the no-memory bound of every placement and would rank none ahead
    order_bound: float = 0.0
    # what holds with offload: the largest of its no-memory bound, the kept bytes' area
    # over its room (:func:`~.bounds.offload_area_bound`) and the warm-up's with the
    # host link (:func:`~.bounds.offload_warmup_bound`)
    offload_bound: float = 0.0

    @property
    def hinted(self) -> bool:
        """A fitting schedule without offload exists here to start a search from."""
        return math.isfinite(self.best_fixed)

    @property
    def search_bound(self) -> float:
        """The least makespan the order model can reach here (its proven bound, or its
        memory bound where ``bound`` is the no-memory bound because offload is allowed):
        what decides whether searching it can still beat the incumbent."""
        return max(self.bound, self.order_bound)


def searched_shapes(problem: Problem, split_backward: bool, allowed: tuple[str, ...] | None = None
                    ) -> list[tuple[str, list[int], bool]]:
    """Placements searched, as (label, stage -> device, split backward): one stage per
    device, the V shape and interleaved 2 chunks (those ``allowed``, default all); each
    again with fused backwards (``.../fused``) when a measured fused backward is faster
    than B + W."""
    options = list(searched_placements(problem.devices).items())
    if allowed is not None:
        options = [(label, place) for label, place in options if label in allowed]
    modes = [(split_backward, "")] + ([(False, "/fused")] if split_backward
                                      and fused_is_faster(problem) else [])
    return [(label + suffix, place, split) for split, suffix in modes
            for label, place in options]


@dataclass(frozen=True)
class ShapeBounds:
    """One searched shape's lower bounds, which hold whatever schedules are in hand."""

    free: float             # no memory (:func:`~.bounds.lower_bound`)
    held: float             # without offload (:func:`~.bounds.memory_bound`)
    with_offload: float     # with offload (see :attr:`Space.offload_bound`)

    def bound(self, use_offload: bool) -> float:
        return self.with_offload if use_offload else self.held


def shape_bounds(problem: Problem, split_backward: bool, use_offload: bool,
                 allowed: tuple[str, ...] | None = None) -> dict[str, ShapeBounds]:
    """Every searched shape's bounds (:func:`searched_shapes`), by label.

    Why apart from :func:`placement_spaces`: they do not depend on the warm starts, and
    known before them they say when one is already optimal (:func:`least_bound`), so
    the rest need not be built (about 0.5 s at 16 x 64, computed once for both).
    """
    out = {}
    for label, place, split in searched_shapes(problem, split_backward, allowed):
        graph = task_graph(problem, split, place)
        free = lower_bound(graph)
        held = memory_bound(graph, free)
        with_offload = max(free, offload_area_bound(graph), offload_warmup_bound(graph)) \
            if use_offload else free
        out[label] = ShapeBounds(free, held, with_offload)
    return out


def least_bound(problem: Problem, bounds: dict[str, ShapeBounds], split_backward: bool,
                use_offload: bool) -> float | None:
    """A lower bound on every schedule the driver may return, known before the warm
    starts: the least over the shapes searched, or None where the driver's bound is
    that of a relaxation of them (a fused backward faster than B + W,
    :func:`fused_relaxed_bound`). It is never above the bound the driver reports (the
    least over the placements that end up searched, a subset), so a schedule in hand at
    or below it is optimal."""
    if not bounds or (split_backward and fused_is_faster(problem)):
        return None
    return min(b.bound(use_offload) for b in bounds.values())


def placement_spaces(problem: Problem, split_backward: bool, fixed: FixedSet,
                     engine: str, use_offload: bool = False,
                     allowed: tuple[str, ...] | None = None,
                     bounds: dict[str, ShapeBounds] | None = None) -> list[Space]:
    """Placements worth searching, most promising first.

    One stage per device always; also the V shape and interleaved 2 chunks (what ZB-V,
    zb-auto and interleaved 1F1B use) when some fixed schedule on them fits: one that
    does without offload is the hint a search there needs (``hinted``); one that
    offloads (pipeoffload on ZB-V) may be returned, so the placement's bound counts.
    Each starts with its no-memory lower bound; only CP-SAT searches the chunked ones
    (the MILP models one stage per device), but their bounds always count, because a
    fixed schedule on them may be returned.

    When a measured fused backward is faster than B + W, each placement is also searched
    with fused backwards (label ``.../fused``): the split model cannot express the
    saving, and fused schedules (1F1B-like) may then be the fastest.

    Without offload, each placement starts from its memory round-trip bound
    (:func:`~.bounds.memory_bound`), which at tight budgets is above its no-memory
    bound (far above for one stage per device). ``bounds``: :func:`shape_bounds` of the
    same arguments, when the caller has them.
    """
    faster = fused_is_faster(problem)
    if bounds is None:
        bounds = shape_bounds(problem, split_backward, use_offload, allowed)
    out = []
    for label, place, split in searched_shapes(problem, split_backward, allowed):
        on = fitting_on(fixed, place, split, faster, use_offload)
        if place != linear_placement(problem.devices) and not on:
            continue
        known = bounds[label]
        # the start an order-model search has here: offloading schedules count for the
        # incumbent, but no order model can start from one
        start = min((c.makespan for c in on if not c.schedule.offloads), default=math.inf)
        out.append(Space(label, place, known.bound(use_offload), start, split,
                         overrun=expected_overrun(problem, place, engine),
                         free_bound=known.free, order_bound=known.held,
                         offload_bound=known.with_offload))
    if not out:
        raise OptPipeError(f"no fixed schedule on the {' or '.join(allowed or ())} "
                           f"placement fits this budget, so the search has nothing to "
                           f"start from; allow one stage per device too (--placements "
                           f"linear,{','.join(allowed or ())}) or raise the budget")
    out.sort(key=lambda sp: (sp.best_fixed, sp.bound))
    return room_first(out)


def room_first(spaces: list[Space]) -> list[Space]:
    """``spaces`` (sorted by their best start) with, among those whose start is within
    :data:`CLOSE_STARTS` of the best, the one with the lowest bound moved to the front.

    Why: the first placement gets most of the time (:data:`~.driver.FIRST_SPACE_SHARE`), and
    where the starts are about equal the bound says which has more room. Measured at
    budget S (search revision 10): the list schedules start interleaved chunks 0.8%
    ahead of ZB-V at 8 x 32, and searched first interleaved ended at 101.5 s (the V
    shape, second, 101.2 s) where the V shape given that time had proven 100.55 s.
    """
    if not spaces:
        return spaces
    close = [sp for sp in spaces if sp.best_fixed <= spaces[0].best_fixed * (1 + CLOSE_STARTS)]
    first = min(close, key=lambda sp: sp.order_bound)
    return [first] + [sp for sp in spaces if sp is not first]


def memory_lifts(held: float, free: float, use_offload: bool) -> bool:
    """Without offload, memory lifts the bound (``held``) above the no-memory one
    (``free``): the pieces of the prefix cuts then see waits the bounds do not. One
    rule for the driver's cuts (:func:`~.driver._cuts_pay`) and the extended schedules' source
    (:func:`~.warm_starts.add_extended`)."""
    return not use_offload and held > free * (1 + 1e-9)


def bound_with_offload(space: Space, linear: float) -> float:
    """What holds on ``space`` when offload is allowed.

    The order models' proofs do not cover offload, which fixed schedules may use on any
    placement (pipeoffload builds on ZB-V too): the chunked placements keep their
    bounds that hold with offload (``offload_bound``: no-memory, the kept bytes' area,
    :func:`~.bounds.offload_area_bound`, or the warm-up's,
    :func:`~.bounds.offload_warmup_bound`), and one stage per device keeps
    ``linear`` (that, or the value its order model proved optimal at that bound). Not
    the offload model's bound: in that model an OFFLOAD that holds its device back
    (``wait``) comes right after its F, and one listed later, holding back a later
    action, may beat its optimum. Shared by the search's end and the live line, so both
    state one rule.
    """
    return max(linear, space.offload_bound) if space.label == "linear" \
        else space.offload_bound


def _relax_fused(b_in: Sequence[float], b_w: Sequence[float],
                 fused: Sequence[float] | None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """B and W shortened so that a fused BW maps onto a B', W' pair no longer than it."""
    b_in, b_w = list(b_in), list(b_w)
    for s, bw in enumerate(fused or ()):
        if bw < b_in[s] + b_w[s]:
            b_in[s] = min(b_in[s], bw)
            b_w[s] = max(0.0, bw - b_in[s])
    return tuple(b_in), tuple(b_w)


def fused_relaxed_bound(problem: Problem, spaces: list[Space]) -> float | None:
    """A lower bound valid for schedules that fuse some backwards, or None if not needed.

    Why: with a measured ``backward_fused`` shorter than B + W, a schedule that fuses a
    backward can beat every split schedule, so the split engines' bounds do not cover
    it. The relaxation shortens W to ``max(0, BW - B)`` (and B to ``BW`` if even that is
    shorter): any fused BW then maps onto an adjacent B', W' pair no longer than it, which
    releases memory no later and sends the gradient no later, so the relaxation's
    no-memory bound over the searched placements holds for every schedule.
    """
    if not fused_is_faster(problem):
        return None
    b_in, b_w = _relax_fused(problem.backward_input, problem.backward_weight,
                             problem.backward_fused)
    chunks = []
    for c in problem.chunk_profiles:     # measured cuts are relaxed the same way
        c_in, c_w = _relax_fused(c.backward_input, c.backward_weight, c.backward_fused)
        chunks.append(replace(c, backward_input=c_in, backward_weight=c_w,
                              backward_fused=None))
    relaxed = replace(problem, backward_input=b_in, backward_weight=b_w,
                      backward_fused=None, chunk_profiles=tuple(chunks))
    return min(lower_bound(task_graph(relaxed, True, sp.placement)) for sp in spaces)


def build_seconds(problem: Problem) -> float:
    """A generous estimate of building and hinting one order model, in seconds.

    Measured on 2 cores: 16 x 64 takes ~1 s to pick the hint and up to 3.4 s to build
    (the V shape); a run started with less time than that would overrun the deadline.
    """
    return 1.0 + 0.004 * problem.stages * problem.microbatches


def expected_overrun(problem: Problem, placement: list[int], engine: str) -> float:
    """Seconds a first CP-SAT run on a chunked placement may run past its limit.

    Measured by hand on 2 cores, runs of 10 s: up to 1.1 s past the limit at 16 x 64
    (the V shape, whose model takes ~4 s to build and whose window steps are planned
    with that), 0.0-0.7 s elsewhere. With CP-SAT's transitive closure of precedences
    (off since :func:`~.cpsat.new_solver`) runs went 5-15 s past their limits
    (`scripts/bench_cpsat_params.py`) and this estimate was 8 times larger, which cost
    the user's time: a 20 s solve of llama2-70b on 16 stages ended after 12 s (by hand;
    19 s now, the same script). Later runs use the larger of this and the
    overrun measured (a run that stopped early measures nothing). None past
    :data:`~.cpsat.TIME_FULL_MAX_CELLS`: there the run is window steps from the start,
    which plan their own overrun against the deadline (holding this back left 1-1.7 s
    of the minute unused at 8 x 64 and 16 x 64, search revision 17's runs).
    """
    from optpipe.optimizer.cpsat import windows_from_the_start

    chunks = len(placement) // problem.devices
    if engine != "cpsat" or chunks == 1 or windows_from_the_start(problem):
        return 0.0
    return OVERRUN_PER_CHUNK_CELL * chunks * problem.stages * problem.microbatches
