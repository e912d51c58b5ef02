"""No-wait waves: one stage per device, every microbatch's path kept free of waiting.

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

from optpipe.problem import Problem
from optpipe.schedule import Schedule, from_orders, linear_placement

_EPS = 1e-9
#: The name of the schedule built here (the candidates' name, and the driver's test).
WAVES = "waves"


class _Timeline:
    """One device's reserved intervals, sorted by start: ``(start, end, (op, mb))``."""

    def __init__(self) -> None:
        self.busy: list[tuple[float, float, tuple[str, int]]] = []

    def clash(self, start: float, end: float) -> float | None:
        """The end of a reserved interval that overlaps ``[start, end)``, or None."""
        i = bisect.bisect_left(self.busy, (start, -math.inf))
        if i < len(self.busy) and self.busy[i][0] < end - _EPS:
            return self.busy[i][1]
        if i > 0 and self.busy[i - 1][1] > start + _EPS:
            return self.busy[i - 1][1]
        return None

    def add(self, start: float, end: float, tag: tuple[str, int]) -> None:
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


def _offsets(problem: Problem, bwd: Sequence[float]) -> tuple[list[float], list[float]]:
    """No-wait start offsets of F (``a``) and B (``b``) on each device from the
    microbatch's first forward."""
    S, lag = problem.stages, problem.p2p
    a = [0.0] * S
    for d in range(1, S):
        a[d] = a[d - 1] + problem.forward[d - 1] + lag
    b = [0.0] * S
    b[S - 1] = a[S - 1] + problem.forward[S - 1]
    for d in range(S - 2, -1, -1):
        b[d] = b[d + 1] + bwd[d + 1] + lag
    return a, b


def wave_schedule(problem: Problem) -> Schedule | None:
    """The no-wait wave schedule of ``problem`` on one stage per device, split backward
    (see the module docstring), or None when the problem is not one stage per device
    or a device's budget cannot hold even one microbatch's activation. Fused backwards
    are not built: measured by hand before they were dropped (2026-12-08), fused waves
    led in no cell of ``scripts/bench_waves.py``'s grid (16 x 64 at S/2: 417.6 s
    against the greedy list schedule's 341.1 s and the split waves' 304.4 s)."""
    reserved = reserve(problem)
    if reserved is None:
        return None
    orders = [[(op, d, mb) for _, _, (op, mb) in device] for d, device in enumerate(reserved)]
    return from_orders(WAVES, linear_placement(problem.stages), problem.microbatches,
                       orders, provenance={"source": "optimizer", "name": WAVES})


def reserve(problem: Problem) -> list[list[tuple[float, float, tuple[str, int]]]] | None:
    """Every device's reserved intervals, ``(start, end, (op, microbatch))`` sorted by
    start, as the waves place them (None as in :func:`wave_schedule`). The schedule's
    orders come from these; the simulator then times them as soon as possible, so no
    action of it starts later than reserved here."""
    S, M = problem.stages, problem.microbatches
    if problem.devices != S:
        return None
    bwd, wlen = problem.backward_input, problem.backward_weight
    freed_b, freed_w = problem.freed_by_b, problem.freed_by_w
    a, b = _offsets(problem, bwd)
    lines = [_Timeline() for _ in range(S)]
    b_end: list[list[float]] = [[] for _ in range(S)]      # per device, per microbatch
    w_end: list[list[float]] = [[] for _ in range(S)]      # math.inf while not placed
    f_start: list[list[float]] = [[] for _ in range(S)]

    def memory(d: int, at: float, w_ends: Sequence[float]) -> float:
        """Bytes kept on ``d`` just after a forward starting at ``at`` allocates."""
        kept = problem.static[d] + problem.activation[d]
        for fs, be, we in zip(f_start[d], b_end[d], w_ends):
            if fs <= at + _EPS:
                kept += problem.activation[d]
                kept -= freed_b[d] if be <= at + _EPS else 0
                kept -= freed_w[d] if we <= at + _EPS else 0
        return kept

    def pack_ws(d: int, frontier: float) -> tuple[list[float], list[tuple[int, float]], float]:
        """Pending Ws of ``d`` packed before ``frontier``: their ends, the placements,
        and the earliest time memory is next released after ``frontier``."""
        ends = list(w_end[d])
        placed: list[tuple[int, float]] = []
        trial = _Timeline()
        trial.busy = list(lines[d].busy)
        release = min((be for be in b_end[d] if be > frontier + _EPS), default=math.inf)
        for j, we in enumerate(w_end[d]):
            if we != math.inf:
                continue
            start = trial.earliest(b_end[d][j], wlen[d])
            trial.add(start, start + wlen[d], ("W", j))
            if start + wlen[d] <= frontier + _EPS:
                ends[j] = start + wlen[d]
                placed.append((j, start))
            else:
                release = min(release, start + wlen[d])
                break
        return ends, placed, release

    t = 0.0
    for i in range(M):
        while True:
            need = t                        # the least start that clears every clash
            for d in range(S):
                for off, length in ((a[d], problem.forward[d]), (b[d], bwd[d])):
                    end = lines[d].clash(t + off, t + off + length)
                    if end is not None:
                        need = max(need, end - off)
            if need > t + _EPS:
                t = need
                continue
            plans = []
            for d in range(S):
                ends, placed, release = pack_ws(d, t + a[d])
                if memory(d, t + a[d], ends) > problem.budget[d]:
                    if release == math.inf:  # nothing left to free: it never fits
                        return None
                    need = max(need, release - a[d])
                plans.append(placed)
            if need > t + _EPS:
                t = need
                continue
            break
        for d in range(S):
            for j, start in plans[d]:
                lines[d].add(start, start + wlen[d], ("W", j))
                w_end[d][j] = start + wlen[d]
            lines[d].add(t + a[d], t + a[d] + problem.forward[d], ("F", i))
            lines[d].add(t + b[d], t + b[d] + bwd[d], ("B", i))
            f_start[d].append(t + a[d])
            b_end[d].append(t + b[d] + bwd[d])
            w_end[d].append(math.inf)
        t += problem.forward[0]
    for d in range(S):                      # the Ws still pending: after the last B
        for j in range(M):
            if w_end[d][j] == math.inf:
                start = lines[d].earliest(b_end[d][j], wlen[d])
                lines[d].add(start, start + wlen[d], ("W", j))
                w_end[d][j] = start + wlen[d]
    return [line.busy for line in lines]
