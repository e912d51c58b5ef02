"""No-wait waves: every microbatch's path through the pipeline kept free of waiting.

Why: when memory binds on one stage per device, device 0 holds at most ``k``
microbatches, so the step is paced by the *round trip* of each microbatch: from its
forward on device 0 to its backward there. Any wait on any device along the forward
wave or the backward wave lengthens that trip, and with it the time device 0 has to
wait before its next forward fits. The engines find such schedules slowly at 16 stages
(the 16 x 64 cell at budget S/2 hung on which of 16 x 32's optima the extended
schedules, :mod:`.extend`, happened to repeat: docs/optimizer-log.md, "16 x 64 at S/2
undependable"). This construction aims at the trip directly:

* microbatches are injected in order; each is given the earliest start ``t`` at which
  its whole path, forward then backward, runs without waiting: on every device ``d``
  its F occupies ``[t + a_d, t + a_d + F_d)`` and its B ``[t + b_d, t + b_d + B_d)``,
  with ``a`` and ``b`` the no-wait offsets (compute plus p2p latency along the path),
  and none of them may overlap a reserved interval;
* W tasks are not reserved ahead. Whenever a microbatch is placed, every device's time
  before its forward there (its *frontier*) can no longer be used by a later forward or
  backward (they start later), so pending Ws are packed into the gaps before the
  frontier, the oldest first, earliest first: time that would otherwise stay idle;
* the start must also leave room in memory on every device at the forward, counted
  with the simulator's accounting (F allocates at its start, B and W release at their
  end), which is what holds device 0 to ``k`` in flight.

On the chunked placements (:func:`~optpipe.schedule.searched_placements`: the V shape,
interleaved chunks) the same holds stage by stage on the split problem: a device's
frontier is the forward of its earliest stage there, and its memory is checked at each
of its forwards. The V shape's waves at S/2 beat every other V start there from 4 x 16
to 16 x 64 (4 x 16: 57.1 s, the optimum over all placements 56.9 s; 16 x 64: 235.6 s
against the admission schedules' 238.3 s); interleaved chunks, whose path crosses
every device twice in the same direction, do worse. The driver uses the waves on one
stage per device only: from the V shape's, its 60 s search ended no better than from
the other starts (docs/optimizer-log.md, the revision-39 item).

The result is turned into per-device orders (sorted by reserved time) and judged by
the simulator like every other warm start; it needs no solver and takes milliseconds.
At 16 x 64, budget S/2 (F = B = W = 1 s, p2p 0.05 s) it gives 304.4 s, against the
optimum 304.0 s and the extended schedules' 304.0-323.7 s (``python
scripts/bench_waves.py`` measures it on the benchmark's grid).
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence

from optpipe.errors import OptPipeError
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule, linear_placement, placement_name

_EPS = 1e-9
#: The name of the schedule built here (the candidates' name, and the driver's test).
WAVES = "waves"


class _Timeline:
    """One device's reserved intervals, sorted by start: ``(start, end, tag)``."""

    def __init__(self) -> None:
        self.busy: list[tuple[float, float, tuple[str, int, int]]] = []

    def clash(self, start: float, end: float) -> float | None:
        """The end of a reserved interval that overlaps ``[start, end)``, or None."""
        i = bisect.bisect_left(self.busy, (start, -math.inf))
        if i < len(self.busy) and self.busy[i][0] < end - _EPS:
            return self.busy[i][1]
        if i > 0 and self.busy[i - 1][1] > start + _EPS:
            return self.busy[i - 1][1]
        return None

    def add(self, start: float, end: float, tag: tuple[str, int, int]) -> None:
        bisect.insort(self.busy, (start, end, tag))

    def earliest(self, lo: float, length: float) -> float:
        """The earliest start ``>= lo`` of a free stretch ``length`` long."""
        start = lo
        i = bisect.bisect_left(self.busy, (lo, -math.inf))
        if i > 0:
            start = max(start, self.busy[i - 1][1])
        while i < len(self.busy) and self.busy[i][0] < start + length - _EPS:
            start = max(start, self.busy[i][1])
            i += 1
        return start


Tag = tuple[str, int, int]                   # (op, stage, microbatch)
Reserved = list[list[tuple[float, float, Tag]]]


def _offsets(problem: Problem, placement: Sequence[int]) -> tuple[list[float], list[float]]:
    """No-wait start offsets of each stage's F (``a``) and B (``b``) from the
    microbatch's first forward (p2p latency only between devices, as the simulator)."""
    S, lag = len(placement), problem.p2p
    a = [0.0] * S
    for s in range(1, S):
        a[s] = a[s - 1] + problem.forward[s - 1] + (lag if placement[s] != placement[s - 1]
                                                    else 0.0)
    b = [0.0] * S
    b[S - 1] = a[S - 1] + problem.forward[S - 1]
    for s in range(S - 2, -1, -1):
        b[s] = b[s + 1] + problem.backward_input[s + 1] + (
            lag if placement[s] != placement[s + 1] else 0.0)
    return a, b


def wave_schedule(problem: Problem, placement: Sequence[int] | None = None
                  ) -> Schedule | None:
    """The no-wait wave schedule of the base ``problem`` on ``placement`` (default one
    stage per device), split backward (see the module docstring), or None when the
    problem is already split, the placement does not split it evenly, or a device's
    budget cannot hold even one microbatch's activations. Fused backwards are not
    built: measured by hand before they were dropped (2026-12-08), fused waves led in
    no cell of ``scripts/bench_waves.py``'s grid on one stage per device (16 x 64 at
    S/2: 417.6 s against the greedy list schedule's 341.1 s and the split waves'
    304.4 s)."""
    place = list(placement) if placement is not None else linear_placement(problem.devices)
    reserved = reserve(problem, place)
    if reserved is None:
        return None
    label = placement_name(place, problem.devices)
    name = WAVES if place == linear_placement(problem.devices) else f"{WAVES}-{label}"
    actions = [[Action(Op(op), stage, mb) for _, _, (op, stage, mb) in device]
               for device in reserved]
    return Schedule(name=name, stages=len(place), devices=problem.devices,
                    microbatches=problem.microbatches, placement=place, actions=actions,
                    provenance={"source": "optimizer", "name": name,
                                "placement": label}).validate()


def reserve(problem: Problem, placement: Sequence[int] | None = None) -> Reserved | None:
    """Every device's reserved intervals, ``(start, end, (op, stage, microbatch))``
    sorted by start, as the waves place them (None as in :func:`wave_schedule`). The
    schedule's orders come from these; the simulator then times them as soon as
    possible, so no action of it starts later than reserved here."""
    D, M = problem.devices, problem.microbatches
    place = list(placement) if placement is not None else linear_placement(D)
    if problem.chunks != 1 or problem.stages != D:
        return None
    try:
        prob = problem if place == linear_placement(D) else problem.split(place)
    except OptPipeError:
        return None
    S = len(place)
    a, b = _offsets(prob, place)
    held_by = [[s for s in range(S) if place[s] == d] for d in range(D)]
    first = [min(a[s] for s in held_by[d]) for d in range(D)]   # each device's frontier
    lines = [_Timeline() for _ in range(D)]
    f_start: list[list[float]] = [[] for _ in range(S)]          # per stage, microbatch
    b_end: list[list[float]] = [[] for _ in range(S)]
    w_end: list[list[float]] = [[] for _ in range(S)]            # math.inf: not placed

    def memory(d: int, at: float, w_ends: dict[int, list[float]], new: float) -> float:
        """Bytes kept on ``d`` at ``at`` with ``new`` bytes of this microbatch's own."""
        kept = prob.static[d] + new
        for s in held_by[d]:
            for fs, be, we in zip(f_start[s], b_end[s], w_ends[s]):
                if fs <= at + _EPS:
                    kept += prob.activation[s]
                    kept -= prob.freed_by_b[s] if be <= at + _EPS else 0
                    kept -= prob.freed_by_w[s] if we <= at + _EPS else 0
        return kept

    def pack_ws(d: int, frontier: float
                ) -> tuple[dict[int, list[float]], list[tuple[int, int, float]], float]:
        """Pending Ws on ``d`` packed before ``frontier``, oldest backward first: their
        ends, the placements ``(stage, microbatch, start)``, and the earliest time
        memory is next released on ``d`` after ``frontier``."""
        ends = {s: list(w_end[s]) for s in held_by[d]}
        placed: list[tuple[int, int, float]] = []
        trial = _Timeline()
        trial.busy = list(lines[d].busy)
        release = min((be for s in held_by[d] for be in b_end[s] if be > frontier + _EPS),
                      default=math.inf)
        pending = sorted((b_end[s][j], s, j) for s in held_by[d]
                         for j, we in enumerate(w_end[s]) if we == math.inf)
        for ready, s, j in pending:
            length = prob.backward_weight[s]
            start = trial.earliest(ready, length)
            trial.add(start, start + length, ("W", s, j))
            if start + length > frontier + _EPS:
                release = min(release, start + length)
                break
            ends[s][j] = start + length
            placed.append((s, j, start))
        return ends, placed, release

    t = 0.0
    for i in range(M):
        while True:
            need = t                        # the least start that clears every clash
            for s in range(S):
                for off, length in ((a[s], prob.forward[s]), (b[s], prob.backward_input[s])):
                    end = lines[place[s]].clash(t + off, t + off + length)
                    if end is not None:
                        need = max(need, end - off)
            if need > t + _EPS:
                t = need
                continue
            plans = []
            for d in range(D):
                ends, placed, release = pack_ws(d, t + first[d])
                new = 0.0
                for s in sorted(held_by[d], key=lambda x: a[x]):   # each forward on d
                    new += prob.activation[s]
                    if memory(d, t + a[s], ends, new) > prob.budget[d]:
                        if release == math.inf:   # nothing left to free: never fits
                            return None
                        need = max(need, release - first[d])
                        break
                plans.append(placed)
            if need > t + _EPS:
                t = need
                continue
            break
        for d in range(D):
            for s, j, start in plans[d]:
                lines[d].add(start, start + prob.backward_weight[s], ("W", s, j))
                w_end[s][j] = start + prob.backward_weight[s]
        for s in range(S):
            line = lines[place[s]]
            line.add(t + a[s], t + a[s] + prob.forward[s], ("F", s, i))
            line.add(t + b[s], t + b[s] + prob.backward_input[s], ("B", s, i))
            f_start[s].append(t + a[s])
            b_end[s].append(t + b[s] + prob.backward_input[s])
            w_end[s].append(math.inf)
        t += prob.forward[0]
    for s in range(S):                      # the Ws still pending: after their B
        for j in range(M):
            if w_end[s][j] == math.inf:
                line, length = lines[place[s]], prob.backward_weight[s]
                start = line.earliest(b_end[s][j], length)
                line.add(start, start + length, ("W", s, j))
                w_end[s][j] = start + length
    return [line.busy for line in lines]
