"""Lower bounds on the makespan: what no schedule of a problem can beat.

Why a module of its own: every proof of optimality optpipe reports is a schedule that
meets one of these (or an engine's own bound, which starts from them), and the gap it
prints is measured against them; they are the optimizer's half that the simulator does
not check, so they stand apart, each with its argument in its docstring, each tested
against CP-SAT's proven optima (``tests/test_optimizer_preprocess.py``).

* :func:`lower_bound`: the longest path and each device's one-machine bound (no memory);
* :func:`memory_bound` / :func:`memory_bounds`: a tight budget's round trip and warm-up
  (no offload);
* :func:`offload_area_bound`, :func:`offload_warmup_bound`: what holds with offload (the
  kept bytes' area over a device's room; the warm-up with the host link);
* :func:`first_backward_bound`: the warm-up before each device's first backward.

All of them take a :class:`~.preprocess.TaskGraph` (any placement) and are built on its
time windows (:func:`~.preprocess.earliest_starts`, :func:`~.preprocess.tails`).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from typing import Iterable, Iterator, Mapping, Sequence

from optpipe.optimizer.preprocess import (Key, TaskGraph, earliest_starts, release_options,
                                          tails)
from optpipe.schedule import Op


def lower_bound(graph: TaskGraph) -> float:
    """A makespan no schedule can beat, whatever the memory budget.

    The larger of: the critical path of the task graph (one microbatch's round trip plus
    FIFO effects); per device, its one-machine bound with heads and tails
    (:func:`device_bound`: e.g. the time before its first forward can start + all of its
    work + the least tail); and for one stage per device, the time before its first
    forward + its work + the backward chain that must still run on upstream devices
    after its last input-gradient (which only its own weight-gradient work can overlap).
    """
    es = earliest_starts(graph)
    best = max(es[k] + graph.duration[k] for k in graph.keys)
    # per device, the strongest head + work + tail over any subset of its tasks
    best = max(best, device_bound(graph, es, tails(graph)))
    if graph.placement:
        return best
    p = graph.problem
    S, M = p.stages, p.microbatches
    dur = graph.duration
    for s in range(S):
        head = es[(Op.F, s, 0)]
        f = dur[(Op.F, s, 0)]
        if graph.split_backward:
            b, w = dur[(Op.B, s, 0)], dur[(Op.W, s, 0)]
            chain = sum(dur[(Op.B, u, 0)] + graph.lag for u in range(s)) + dur[(Op.W, 0, 0)] \
                if s > 0 else 0
            bound = head + M * (f + b) + max(M * w, chain)
        else:
            bw = dur[(Op.BW, s, 0)]
            chain = sum(dur[(Op.BW, u, 0)] + graph.lag for u in range(s))
            bound = head + M * (f + bw) + chain
        best = max(best, bound)
    return best


def preemptive_single_machine(jobs: Iterable[tuple[float, float, float]]) -> float:
    """Least ``max(completion + tail)`` of ``(release, duration, tail)`` jobs on one
    machine when jobs may be preempted: Jackson's preemptive schedule (always run the
    released job with the longest tail), which is optimal for it.

    Why: it equals the strongest "head + body + tail" bound over every subset of the
    jobs (least release + summed durations + least tail), in O(n log n).
    """
    order = sorted(jobs)
    heap: list[tuple[float, int]] = []
    left: dict[int, float] = {}
    t, i, best = 0.0, 0, 0.0
    while i < len(order) or heap:
        if not heap:
            t = max(t, order[i][0])
        while i < len(order) and order[i][0] <= t:
            release, length, tail = order[i]
            left[i] = length
            heapq.heappush(heap, (-tail, i))
            i += 1
        neg_tail, j = heap[0]
        run = min(left[j], (order[i][0] if i < len(order) else math.inf) - t)
        t += run
        left[j] -= run
        if left[j] <= 1e-12:
            heapq.heappop(heap)
            best = max(best, t - neg_tail)
    return best


def device_bound(graph: TaskGraph, es: Mapping[Key, float],
                 tail: Mapping[Key, float]) -> float:
    """The largest, over devices, single-machine bound of its tasks with releases ``es``
    and tails ``tail`` (:func:`preemptive_single_machine`).

    Why: a device runs one task at a time, so its tasks form a one-machine problem with
    heads and tails, whose preemptive optimum bounds the makespan. It dominates "first
    start + all work + least tail": tasks released late with long tails (a chunked
    device's later stages, or backwards behind a memory round trip) are counted.
    """
    return max(preemptive_single_machine((es[k], graph.duration[k], tail[k])
                                         for k in graph.device_keys(d))
               for d in range(graph.devices))


def device_ancestor_work(graph: TaskGraph) -> dict[Key, float]:
    """Per task, the summed durations of its ancestors on its own device.

    Why: every one of them must have run, one at a time, on that device before the task
    starts — a rule the longest path misses when the device is busy (the backwards of a
    memory-bound stage wait behind its forwards). Data dependencies stay within a
    microbatch and the FIFO chains link microbatch ``j - 1`` to ``j`` of one (op,
    stage), so ``(op', s', j')`` is an ancestor of ``(op, s, j)`` exactly when ``j' <=
    j`` and ``(op', s')`` precedes ``(op, s)`` within one microbatch, or it is the same
    (op, stage) with ``j' < j``: the work is ``(j+1) x`` the former's durations on the
    device plus ``j x`` its own — no per-task closure needed.
    """
    pairs = sorted({(k[0], k[1]) for k in graph.keys}, key=lambda x: (x[1], x[0].value))
    parents: dict[tuple[Op, int], list[tuple[Op, int]]] = {pair: [] for pair in pairs}
    for (op, s, m), preds in graph.deps.items():
        if m == 0:
            parents[(op, s)] += [(p[0], p[1]) for p, _ in preds]
    ancestors: dict[tuple[Op, int], set[tuple[Op, int]]] = {}

    def collect(pair: tuple[Op, int]) -> set[tuple[Op, int]]:
        if pair not in ancestors:
            found: set[tuple[Op, int]] = set()
            for parent in parents[pair]:
                found |= {parent} | collect(parent)
            ancestors[pair] = found
        return ancestors[pair]

    per_microbatch = {}
    for op, s in pairs:
        d = graph.device((op, s, 0))
        per_microbatch[(op, s)] = sum(graph.duration[(o, u, 0)] for o, u in collect((op, s))
                                      if graph.device((o, u, 0)) == d)
    return {k: (k[2] + 1) * per_microbatch[(k[0], k[1])] + k[2] * graph.duration[k]
            for k in graph.keys}


def memory_bound(graph: TaskGraph, no_memory: float | None = None) -> float:
    """A makespan bound that counts memory (no offload): the larger of the round trip
    (:func:`memory_bounds`) and the warm-up (:func:`first_backward_bound`)."""
    return max(memory_bounds(graph, no_memory))


def memory_bounds(graph: TaskGraph, no_memory: float | None = None) -> tuple[float, float]:
    """``(round trip, warm-up)``: two makespan bounds that count memory (no offload).

    Why apart: the round trip sets a memory-bound pipeline's steady pace (CP-SAT's
    window search is for those, :func:`~.cpsat.solve_cpsat`), while the warm-up bound
    (:func:`first_backward_bound`, over the same earliest starts) also rises at 1F1B's
    budget, where the steady state is free.

    The round trip: at a tight budget the pace is set by a cycle the other bounds
    miss — forward ``i`` of a stage cannot start until enough earlier microbatches have
    come back through every later stage and released memory here, *and* the device
    has run the work that came before. Earliest starts are propagated microbatch by
    microbatch through the task graph with that rule added to every forward (every
    task a forward waits on belongs to an earlier microbatch), and the bound is the
    latest ``start + duration + tail``, or per device the one-machine bound over those
    starts (:func:`device_bound`). Every task also waits for its ancestors on its own
    device to have run (:func:`device_ancestor_work`).

    * One stage per device: the release counts that let ``F(s, i)`` fit form a small
      set of options (:func:`release_options`); for each the forward waits for the
      last B (and W) needed and for the device to have run all earlier forwards plus
      those backwards, and it can do no better than the cheapest option. Per stage the
      last forward also leaves the backward work still to run.
    * Several stages per device (V shape, interleaved chunks): see
      :func:`_shared_ready` — the device's stages share its room, and a later chunk's
      forward finds the earlier chunk's activations of the same microbatches held.

    Valid for the schedules the engines search (FIFO per op type, as
    :func:`memory_implied_orders`); not with offload, which frees memory without
    backward work. Measured on the benchmark's uniform problems at S/2 (``python
    scripts/bench_bounds.py``): 4 x 64 gives 298.6 s where the no-memory bound is
    195.2 s; where the optimum is proven the bound is 84-92% of it.

    ``no_memory`` is :func:`lower_bound` of the same graph when the caller has it (the
    bound starts from it), so it is not computed twice.
    """
    base = lower_bound(graph) if no_memory is None else no_memory
    p = graph.problem
    dur = graph.duration
    split = graph.split_backward
    bwd = Op.B if split else Op.BW
    pos = {k: n for n, k in enumerate(graph.topological())}
    order = sorted(graph.keys, key=lambda k: (k[2], pos[k]))
    chain_pred: dict[Key, Key] = {}
    for chain in graph.chains:
        for a, b in zip(chain, chain[1:]):
            chain_pred[b] = a
    es: dict[Key, float] = {}
    tail = tails(graph)
    best = base
    M = p.microbatches
    before = device_ancestor_work(graph)
    ends: dict[tuple[Op, int], list[float]] = {}    # per (backward op, stage), j order
    on = {d: graph.stages_on(d) for d in range(graph.devices)}
    # every task of a device descends from its first forward (of its earliest stage)
    first = {d: (Op.F, min(on[d]), 0) for d in range(graph.devices)}
    for k in order:
        t = 0.0
        for pred, lag in graph.deps[k]:
            t = max(t, es[pred] + dur[pred] + lag)
        if k in chain_pred:
            t = max(t, es[chain_pred[k]] + dur[chain_pred[k]])
        if k != first[graph.device(k)]:
            t = max(t, es[first[graph.device(k)]] + before[k])
        op, s, i = k
        if op == Op.F and graph.placement:
            t = max(t, _shared_ready(graph, es, ends, on[graph.device(k)], s, i))
        options = release_options(p, s, i, split) \
            if op == Op.F and not graph.placement else None
        if options:
            f, b = dur[(Op.F, s, 0)], dur[(bwd, s, 0)]
            w = dur[(Op.W, s, 0)] if split else 0.0

            def ready(n_b: int, n_w: int) -> float:
                at = es[(Op.F, s, 0)] + i * f + n_b * b + n_w * w
                if n_b:
                    at = max(at, es[(bwd, s, n_b - 1)] + b)
                if n_w:
                    at = max(at, es[(Op.W, s, n_w - 1)] + w)
                return at
            cheapest = min(ready(n_b, n_w) for n_b, n_w in options)
            if i == M - 1:
                # the schedule may have run more W's than an option needs before this
                # forward (while waiting for the last B), leaving fewer after it
                best = max(best, min(ready(n_b, m) + f + (M - n_b) * b + (M - m) * w
                                     for n_b, n_w in options
                                     for m in range(n_w, (n_b if split else n_w) + 1)))
            t = max(t, cheapest)
        es[k] = t
        if op != Op.F:
            ends.setdefault((op, s), []).append(t + dur[k])
        best = max(best, t + dur[k] + tail[k])
    return max(best, device_bound(graph, es, tail)), first_backward_bound(graph, es)


def offload_area_bound(graph: TaskGraph) -> float:
    """A makespan bound that counts memory and holds with offload (waits included):
    each device's room above static memory, over the whole step, must hold the
    byte-seconds its microbatches' activations are kept.

    Why: with offload allowed the other memory bounds do not hold (an OFFLOAD frees
    bytes without backward work), so every placement fell back to its no-memory bound,
    far below what a device whose room holds one or two activations can reach
    (``optpipe solve --model gpt3-13b --stages 4 --mem 60GB``: one stage per device's
    best 6.26 s against a no-memory bound of 2.96 s). Where the host link is slow
    against the round trip, sending an activation away is not free in memory either:
    it stays counted while it crosses the link both ways.

    The argument, per device ``d`` with room ``R = budget - static``: memory never
    exceeds the budget, so over ``[h, T]`` (``h``: the earliest start of its first
    forward, before which nothing of it is kept) the kept bytes integrate to at most
    ``R (T - h)``. Each microbatch of stage ``s`` on ``d`` (activation ``a``, F/B/W
    times ``f, b, w``) keeps, by :mod:`optpipe.memory.accounting`: ``a`` during its F
    (allocated at the start), ``a`` during its B (a reload ends before it), ``a -
    freed_by_b`` from B's end to W's end (``>= w``); and between F's end and B's start,
    a gap of at least ``g`` (the longest dependency path between them, the same for
    every microbatch), with a fraction ``x`` offloaded: ``(1 - x) a`` for the whole gap
    and ``x a`` while it crosses the link each way (counted until the OFFLOAD ends and
    from the RELOAD's issue), ``x a`` bytes over ``x c`` seconds, ``c = a / d2h + a /
    h2d`` — one OFFLOAD per microbatch and stage, any fraction. The least of ``(1 - x) g
    + x^2 c`` over ``x`` in [0, 1] is ``g - g^2 / 4c`` below ``g = 2c``, else ``c``;
    it grows with the gap, so the least gap gives a bound. So ``T >= h + sum over
    microbatches of those byte-seconds / R``. Transfers move whole bytes (rounded down),
    which the result allows for by a relative 1e-9.

    It needs room of only a few activations to bind: on one stage per device, where
    the round trip is long; on chunked placements a chunk moves half the bytes in half
    the time, so the gap is cheap to bridge and this rarely passes their no-memory
    bound (measured on presets and the benchmark: docs/optimizer.md, "Lower bounds").
    """
    p = graph.problem
    es = earliest_starts(graph)
    dur = graph.duration
    bwd = Op.B if graph.split_backward else Op.BW
    best = 0.0
    for d in range(graph.devices):
        room = p.budget[d] - p.static[d]
        stages = graph.stages_on(d)
        if room <= 0 or not stages:
            continue
        kept = 0.0                    # byte-seconds per microbatch over the device's stages
        for s in stages:
            a = p.activation[s]
            f, b = dur[(Op.F, s, 0)], dur[(bwd, s, 0)]
            gap = es[(bwd, s, 0)] - es[(Op.F, s, 0)] - f
            cross = a / p.d2h_bandwidth + a / p.h2d_bandwidth
            between = gap - gap * gap / (4 * cross) if gap < 2 * cross else cross
            kept += a * (f + between + b)
            if graph.split_backward:
                kept += (a - p.freed_by_b[s]) * dur[(Op.W, s, 0)]
        head = min(es[(Op.F, s, 0)] for s in stages)
        best = max(best, head + p.microbatches * kept / room)
    return best * (1 - 1e-9)


def offload_warmup_bound(graph: TaskGraph) -> float:
    """The warm-up's memory bound with offload: before its first backward a device frees
    bytes only by sending activations to the host, no faster than its link.

    Why: :func:`first_backward_bound` does not hold with offload, and the no-memory
    bound lets a device run every forward it has before its first backward comes back;
    where the room holds a few activations and the link moves one slower than the
    device runs its forward, the device must idle in the warm-up however it offloads
    (``optpipe solve --stages 8 --mem 40GB``: room for about four chunks' activations,
    a chunk's copy 0.033 s against its forward's 0.018 s).

    The argument, per device with room ``R = budget - static``: let ``t`` be the start
    of its first backward, no earlier than ``e``, the least earliest start of its
    stages' first backwards (a W needs its B, so only forwards run before ``t``). Each
    forward holds its activation from its start, and only OFFLOADs free bytes before
    ``t``, one at a time on the device-to-host channel, none ending before the first
    forward has (``opened``): the forwards run before ``t`` hold at most ``R +
    d2h (t - opened)`` bytes, so their work is at most the most forward work that fits
    those bytes (:func:`_forward_room`), and at most ``t - head`` (they run one at a
    time from the earliest forward start ``head``). Everything else the device runs
    comes after ``t``: the makespan is at least ``t + work - that``, for the ``t >= e``
    that makes it least. The forward work that fits only grows at the byte sums of
    whole forwards, so the least is at ``e`` or at one of those; and where the link
    frees bytes for at most ``pace < 1`` seconds of forward per second, none past ``e +
    f_max / (1 - pace)`` can be lower than at ``e`` (the forward work that fits grows
    by at most ``pace`` per second plus one forward). Where the link keeps pace with
    the forwards the device need not idle: no term; nor where that window holds more
    than :data:`MAX_BYTE_SUMS` byte sums (a link nearly as fast as the forwards).
    """
    p = graph.problem
    es = earliest_starts(graph)
    dur = graph.duration
    bwd = Op.B if graph.split_backward else Op.BW
    best = 0.0
    for d in range(graph.devices):
        room = p.budget[d] - p.static[d]
        stages = graph.stages_on(d)
        forwards = [(dur[(Op.F, s, 0)], p.activation[s]) for s in stages]
        if not stages or not math.isfinite(room) or room < 0 \
                or any(a <= 0 for _, a in forwards):
            continue
        pace = max(f / a for f, a in forwards) * p.d2h_bandwidth
        if pace >= 1:
            continue
        work = sum(dur[k] for k in graph.device_keys(d))
        head = min(es[(Op.F, s, 0)] for s in stages)
        first = min(es[(bwd, s, 0)] for s in stages)
        opened = head + min(f for f, _ in forwards)

        def held(t: float) -> float:
            return room + p.d2h_bandwidth * max(0.0, t - opened)

        def rest_from(t: float, kept: float) -> float:
            """``t`` less the most forward work run before it within ``kept`` bytes:
            the earliest the device's other work can all have started by."""
            return t - min(t - head, _forward_room(forwards, kept, p.microbatches))

        last = first + max(f for f, _ in forwards) / (1 - pace)
        sums = set(itertools.islice(_byte_sums(
            [a for _, a in forwards], p.microbatches, held(first), held(last)),
            MAX_BYTE_SUMS + 1))
        if len(sums) > MAX_BYTE_SUMS:   # a link nearly as fast as the forwards: no term
            continue
        least = rest_from(first, held(first))
        for total in sums:
            # a byte sum of whole forwards, reached at this t; a hair more bytes, so a
            # float rounded down still counts every forward that fits (the bound only
            # gets lower)
            at = opened + (total - room) / p.d2h_bandwidth
            least = min(least, rest_from(at, total * (1 + 1e-12) + 1.0))
        best = max(best, least + work)
    return best * (1 - 1e-9)


#: the most byte sums :func:`offload_warmup_bound` looks at per device (each costs a
#: knapsack over the device's stages); only a link nearly as fast as the forwards needs
#: more, and there the bound gives little
MAX_BYTE_SUMS = 2000


def _byte_sums(sizes: Sequence[float], count: int, low: float, high: float
               ) -> Iterator[float]:
    """Every ``n_1 a_1 + n_2 a_2 + ...`` (``0 <= n_i <= count``) in ``(low, high]``,
    the last count drawn only from those that land there."""
    def walk(i: int, total: float) -> Iterator[float]:
        a = sizes[i]
        most = min(count, math.floor((high - total) / a))
        if i == len(sizes) - 1:
            for n in range(max(0, math.floor((low - total) / a)), most + 1):
                if low < total + n * a <= high:
                    yield total + n * a
            return
        for n in range(most + 1):
            yield from walk(i + 1, total + n * a)
    return walk(0, 0.0)


def first_backward_bound(graph: TaskGraph, es: Mapping[Key, float]) -> float:
    """The warm-up's memory bound: a device idles when its room fills before its first
    backward can start.

    Until a device runs its first backward nothing it holds is freed (a W needs its B),
    so the forward work it can do before then is at most what fits its room
    (:func:`_forward_room`); its first backward starts no earlier than the earliest
    ``es`` of its stages' first backwards, and everything else it runs comes after.
    So the makespan is at least that start plus the device's work minus the forward
    work that fits. Why it matters: at 1F1B's budget the V shape's middle device can
    hold four microbatches of both its chunks when its first backward comes back, so
    on the benchmark's 4 stages it idles 0.3 s, and the proven optima at S (4 x 8,
    4 x 12, 4 x 16: 25.95, 37.95, 49.95 s) are exactly this bound, where the other
    bounds stop at 0.3 s below. ``es``: earliest starts valid for every schedule (the
    round trip's, or :func:`earliest_starts`).
    """
    return max([0.0] + [term for term, _ in first_backward_terms(graph, es)])


def first_backward_terms(graph: TaskGraph, es: Mapping[Key, float]
                         ) -> list[tuple[float, Key]]:
    """:func:`first_backward_bound`'s term of every device with a finite budget, with
    the device's first backward (the one with the least ``es``): which device and which
    task the bound comes from (`scripts/bench_window_variants.py`'s ``tip-first``)."""
    p = graph.problem
    bwd = Op.B if graph.split_backward else Op.BW
    terms: list[tuple[float, Key]] = []
    for d in range(graph.devices):
        room = p.budget[d] - p.static[d]
        if not math.isfinite(room):
            continue
        stages = graph.stages_on(d)
        fits = _forward_room([(graph.duration[(Op.F, s, 0)], p.activation[s]) for s in stages],
                             room, p.microbatches)
        work = sum(graph.duration[k] for k in graph.device_keys(d))
        first, key = min((es[(bwd, s, 0)], (bwd, s, 0)) for s in stages)
        terms.append((first + work - fits, key))
    return terms


def _forward_room(forwards: Sequence[tuple[float, float]], room: float, count: int) -> float:
    """The most forward work (duration, bytes per forward; at most ``count`` of each)
    whose bytes fit ``room``: exact over the counts of all but the last stage (a device
    holds one to three), the fractional knapsack beyond (an upper bound, so still
    valid)."""
    if not forwards or room < 0:
        return 0.0
    if len(forwards) > 3:
        total, left = 0.0, room
        for f, a in sorted(forwards, key=lambda x: -x[0] / x[1] if x[1] > 0 else -math.inf):
            n = count if a <= 0 else min(count, left / a)
            total += n * f
            left -= n * a
        return total
    (f, a), rest = forwards[0], forwards[1:]
    most = count if a <= 0 else min(count, int(room // a))
    if not rest:
        return most * f
    return max(n * f + _forward_room(rest, room - n * a, count) for n in range(most + 1))


def _release_pieces(avail_b: int, avail_w: int, freed_b: float, freed_w: float,
                    cost_b: float, cost_w: float) -> list[tuple[float, float]]:
    """The cheapest device time to release ``x`` bytes of one stage, as convex pieces.

    Returns ``(seconds per byte, bytes)`` pieces of the LP ``min cost_b n_B + cost_w n_W``
    with ``freed_b n_B + freed_w n_W >= x``, ``n_W <= n_B <= avail_b``, ``n_W <=
    avail_w`` (a W needs its B): B's first when they free bytes more cheaply, else B+W
    pairs first and then lone B's. For a fused backward pass ``freed_w = 0``.
    """
    pieces: list[tuple[float, float]] = []
    if freed_w <= 0 or avail_w == 0:
        if freed_b > 0 and avail_b:
            pieces.append((cost_b / freed_b, avail_b * freed_b))
        return pieces
    if freed_b <= 0:
        return [((cost_b + cost_w) / freed_w, avail_w * freed_w)]
    if cost_b / freed_b <= cost_w / freed_w:
        return [(cost_b / freed_b, avail_b * freed_b), (cost_w / freed_w, avail_w * freed_w)]
    pieces.append(((cost_b + cost_w) / (freed_b + freed_w), avail_w * (freed_b + freed_w)))
    if avail_b > avail_w:
        pieces.append((cost_b / freed_b, (avail_b - avail_w) * freed_b))
    return pieces


def _shared_ready(graph: TaskGraph, es: Mapping[Key, float],
                  ends: Mapping[tuple[Op, int], list[float]], stages: Sequence[int],
                  s: int, i: int) -> float:
    """Earliest start of ``F(s, i)`` on a device that holds several stages (a bound).

    Why it binds: the device's stages share its room, and when ``F(s, i)`` starts, every
    earlier stage ``u`` on the device (same microbatch, upstream: the first chunk of a
    V) has run ``F(u, 0..i)`` and released only what its backwards freed — and those
    backwards need ``B(s, j)`` first, so only microbatches ``j < i`` count. So the row
    ``(i+1) (a_s + sum a_u) - releases <= room`` must hold; later stages on the device
    only add held bytes (counted as 0). Releases come from B/W of ``s`` and of the
    earlier stages with ``j < i``; the forward then waits for (a) the latest of their
    earliest ends and (b) the device having run ``F(s, 0..i-1)``, ``F(u, 0..i)``, the
    releasing tasks and, for each ``B(s, j)``, the later stages' ``F`` and ``B`` of
    ``j`` it depends on (all distinct tasks) from its first possible start. Over the
    sets of releases that fit, with the device time relaxed to the LP over counts
    (:func:`_release_pieces`), the least of ``max(a, b)`` is a bound: scan the latest
    end ``tau`` (a) — (b) only falls as more releases are available. ``ends`` holds
    the earliest ends of each stage's backwards so far, in microbatch order; ``stages``
    those on the forward's device.
    """
    p = graph.problem
    dur = graph.duration
    d = graph.device((Op.F, s, 0))
    room = p.budget[d] - p.static[d]
    lower = [u for u in stages if u < s]
    need = (i + 1) * (p.activation[s] + sum(p.activation[u] for u in lower)) - room
    if not math.isfinite(room) or need <= 0 or i == 0:
        return 0.0
    split = graph.split_backward
    bwd = Op.B if split else Op.BW
    upper_work = sum(dur[(Op.F, v, 0)] + dur[(bwd, v, 0)] for v in stages if v > s)
    head = es[(Op.F, min(stages), 0)] + i * dur[(Op.F, s, 0)] + \
        (i + 1) * sum(dur[(Op.F, u, 0)] for u in lower)
    # per releasing stage: the earliest ends of its B's and W's (j < i, non-decreasing)
    releasing = []
    for u in [s] + lower:
        b_end = ends.get((bwd, u), [])[:i]
        w_end = ends.get((Op.W, u), [])[:i] if split else []
        cost_b = dur[(bwd, u, 0)] + (upper_work if u == s else 0.0)
        cost_w = dur[(Op.W, u, 0)] if split else 0.0
        freed_b = p.freed_by_b[u] if split else p.activation[u]
        freed_w = p.freed_by_w[u] if split else 0
        releasing.append((b_end, w_end, freed_b, freed_w, cost_b, cost_w))

    def device_time(tau: float) -> float:
        pieces = []
        for b_end, w_end, freed_b, freed_w, cost_b, cost_w in releasing:
            pieces += _release_pieces(bisect.bisect_right(b_end, tau),
                                      bisect.bisect_right(w_end, tau),
                                      freed_b, freed_w, cost_b, cost_w)
        left, spent = float(need), 0.0
        for rate, amount in sorted(pieces):
            take = min(left, amount)
            spent += take * rate
            left -= take
            if left <= 0:
                return head + spent
        return math.inf

    taus = sorted([x for e in releasing for part in e[:2] for x in part])   # sorted runs
    lo, hi = 0, len(taus) - 1                 # first tau with tau >= device_time(tau)
    if not taus or device_time(taus[-1]) == math.inf:
        return 0.0                            # no fitting schedule: say nothing
    while lo < hi:
        mid = (lo + hi) // 2
        if taus[mid] >= device_time(taus[mid]):
            hi = mid
        else:
            lo = mid + 1
    best = max(taus[lo], device_time(taus[lo]))
    if lo > 0:
        best = min(best, max(taus[lo - 1], device_time(taus[lo - 1])))
    return best
