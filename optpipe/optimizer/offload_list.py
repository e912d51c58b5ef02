"""Offload-aware list schedules: compute order and transfers decided together.

Why: where the host link is slow next to compute (the presets at tight budgets: on
8 H100s at 40 GB a chunk's activation takes 0.033 s to copy out, its forward 0.018 s),
a plan made for a looser budget and fitted by offloading afterwards
(:mod:`.offload_starts`) keeps more activations in flight than the link can move, and the
fitting then holds devices back until only a few stay (``--stages 8 --mem 40GB``: the
interleaved plan for 3 x the room runs 3.96 s and fits at 6.6 s). Here the transfers are
planned as the schedule is built, under the simulator's own rules, so a forward starts
only when the copies already under way have made room for it.

The greedy, one event at a time as :func:`.listsched.list_schedule` (whenever a device
is free it runs the first ready task by: a backward first, then a forward that fits,
then a W; ``eager_w`` runs W's before forwards), with the simulator's transfer rules
(:mod:`optpipe.simulator`): an OFFLOAD is listed right after each forward whose
activation would otherwise sit idle longer than the copy out and back (its path to its
own backward, :func:`.preprocess.tails`-style, is at least ``away`` times the two
copies, counted from when the device-to-host channel is free of the copies already
queued on it: :data:`QUEUE_AWARE`); a RELOAD is listed after the device's latest
compute action once the backward's gradient is due within the copy's time (estimated
from the part of the microbatch's backward path already placed); memory is counted with
:mod:`optpipe.memory.accounting` at the simulator's moments (a forward's bytes at its
start, an OFFLOAD's release at its end, a RELOAD's reservation at its issue). A forward
that fits only once an OFFLOAD under way has ended waits for it with the OFFLOAD's
``wait`` flag, which the simulator honours; that is possible when no action listed after
that OFFLOAD would be held back by it, else the device runs something else or stays idle.
With ``deferred`` (search revision 33) an OFFLOAD whose copy is queued behind others is
listed only when the compute after it would otherwise issue it late: the copies then
start when they would have anyway, and a forward can wait for the first queued copy
after which it fits instead of the last one listed (revision 32's answer to ``--stages
8 --mem 40GB``: device 0's room was full at 0.118 s, and it idled until the last of
the ten copies it had queued was out, 0.238 s, where the fifth made room at 0.125 s).

Every schedule is judged by the simulator before use; the internal times are the
simulator's own in all cases tested (``tests/test_offload_list.py``).
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from typing import Sequence

from optpipe.memory.accounting import memory_delta, transfer_bytes
from optpipe.optimizer.listsched import pop_waking
from optpipe.optimizer.preprocess import Key, TaskGraph, tails, task_graph
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule

_EPS = 1e-12
#: The variants :func:`offload_list_schedules` tries, in this order: (eager_w, reserve,
#: away). ``reserve``: activations of room a forward leaves for reloads; ``away``: how
#: many times the two copies a forward's activation must be expected to sit idle to go
#: out. The first was the fastest on most problems measured
#: (``python scripts/bench_offload_list.py``), so a short deadline still runs it.
VARIANTS = ((False, 0, 1.0), (False, 1, 1.0), (False, 0, 2.0), (True, 0, 1.0),
            (True, 0, 2.0), (False, 1, 2.0), (True, 1, 1.0), (True, 1, 2.0))


#: Whether a forward's activation goes out only when it can still come back in time
#: behind the copies already queued on the device-to-host channel (search revision 32),
#: rather than by its stage's path alone. Why: in a slow link's warm-up the channel's
#: queue grows, and by the path alone an activation whose backward comes soon went out
#: late, came back later still, and held its backward and every device behind it
#: (``--stages 8 --mem 40GB``: microbatch 0's first backward 0.28 s late on device 1,
#: waiting for its reload). Measured with ``python scripts/bench_offload_search.py
#: --strategies --kinds restart,queue`` (docs/optimizer-log.md, revision-32 item).
QUEUE_AWARE = True
#: The share of :class:`RandomizedSearch`'s fresh draws that take the other rule (the
#: path alone), drawn from a stream of their own: neither rule is best everywhere
#: (``--stages 8 --mem 40GB``'s search ends a hair higher with the new one, 3.918
#: against 3.899 s mean after 15 s; 16 stages lower, 1.948 against 1.992 s).
QUEUE_FLIP = 0.25
#: Whether an OFFLOAD is listed only when the compute after it would otherwise issue it
#: late (its copy queued behind others), so that a forward that does not fit can wait
#: for the first queued copy that makes room for it rather than the last one listed.
DEFERRED = False
#: Whether :func:`offload_list_schedules` runs every variant with both listing rules
#: (the deferred ones second, so a short deadline still runs revision 32's), and the
#: share of :class:`RandomizedSearch`'s fresh draws that switch the rule of the run they
#: start from. Why both: neither rule is best everywhere (by hand, the best of the
#: variants: interleaved on ``--stages 4 --mem 80GB`` 7.357 s with eager listing, 7.166
#: s deferred; on ``--stages 8 --mem 40GB`` 3.96 s against 4.31 s).
DEFERRED_VARIANTS = True
DEFERRED_FLIP = 0.25
#: Whether a forward that waits for a deferred copy must also leave room for the next
#: reload due on its device. Why: with the copies deferred, every copy that made room
#: let a forward in before the reload a due backward waited for could be listed
#: (interleaved ``--stages 8 --mem 40GB``, the first variant: device 0 ran 44 forwards
#: before its first backward, at 1.08 s). Measured with ``python
#: scripts/bench_offload_search.py --strategies --kinds deferred,reload-room``.
WAIT_KEEPS_RELOAD_ROOM = True


class _Device:
    """What the greedy tracks per device, in the simulator's terms."""

    def __init__(self, room: float) -> None:
        self.room = room
        self.free = 0.0                 # compute stream free (= last compute end)
        self.held = 0.0                 # end of the last OFFLOAD marked wait
        self.d2h = 0.0                  # channel free times
        self.h2d = 0.0
        self.base = 0.0                 # bytes held from events up to now
        self.pending: list[tuple[float, int, float]] = []  # (time, alloc?, delta) ahead
        self.actions: list[Action] = []
        self.issue: list[float] = []    # when each listed action is issued
        self.last_offload: int | None = None   # index in actions
        # OFFLOADs timed but not listed yet, in channel order: (action, start, end)
        self.deferred: list[tuple[Action, float, float]] = []

    def settle(self) -> None:
        """Fold every event up to the stream's free time into ``base``: every later
        check is at or after it (a task starts no earlier than the stream is free)."""
        while self.pending and self.pending[0][0] <= self.free:
            self.base += heapq.heappop(self.pending)[2]

    def add(self, when: float, delta: float) -> None:
        heapq.heappush(self.pending, (when, 0 if delta < 0 else 1, delta))

    def fits(self, t: float, size: float) -> bool:
        """Do ``size`` more bytes from ``t`` on stay within the room at every later
        moment, given the events already listed? (``t`` >= the stream's free time.)"""
        self.settle()
        events = sorted(self.pending)
        level = self.base + size + sum(e[2] for e in events if e[0] <= t)
        if level > self.room + 1e-6:
            return False
        for when, _, delta in events:     # exact times, as the simulator orders them
            if when > t:
                level += delta
                if level > self.room + 1e-6:
                    return False
        return True


def offload_list_schedule(problem: Problem, placement: Sequence[int],
                          split_backward: bool = True, *, eager_w: bool = False,
                          reserve: float = 0, away: float = 1.0, lead: float = 1.0,
                          jitter: float = 0.0, seed: int = 0,
                          queue_aware: bool | None = None,
                          deferred: bool | None = None,
                          graph: TaskGraph | None = None,
                          scale: dict[Key, float] | None = None) -> Schedule | None:
    """One offload-aware list schedule (module docstring), or None when it stalls.

    ``lead``: a reload is listed once its backward is due within ``lead`` times the
    copy's time (and the next compute action). ``jitter``: each task's priority (its
    path to the end) is scaled by a random factor within ``1 +- jitter`` (``seed``), for
    the randomized runs the driver makes with time left over (:func:`randomized`).
    ``scale``: the priorities' factors instead (:class:`RandomizedSearch`'s perturbed
    runs; the provenance then says ``perturbed``: jitter and seed do not rebuild it).
    ``queue_aware``: :data:`QUEUE_AWARE` when None. ``deferred``: :data:`DEFERRED` when
    None."""
    if graph is None:
        graph = task_graph(problem, split_backward, placement)
    if queue_aware is None:
        queue_aware = QUEUE_AWARE
    if deferred is None:
        deferred = DEFERRED
    split = graph.problem
    place = list(placement)
    D, M = split.devices, split.microbatches
    stages_on = [[s for s in range(split.stages) if place[s] == d] for d in range(D)]
    ops = graph.ops
    bwd = Op.B if split_backward else Op.BW
    tail = tails(graph)
    rng = random.Random(seed)
    given = scale
    if scale is None:
        scale = {k: 1 + rng.uniform(-jitter, jitter) for k in graph.keys}
    prio = {k: (-(tail[k] + graph.duration[k]) * scale[k], k[2]) for k in graph.keys}
    succ: dict[Key, list[tuple[Key, float]]] = {k: [] for k in graph.keys}
    for k, preds in graph.deps.items():
        for p, lag in preds:
            succ[p].append((k, lag))
    last = split.stages - 1
    # a forward's activation sits idle at least this long: its path to its backward
    path = {}
    for s in range(split.stages):
        length = 0.0
        for x in range(s + 1, split.stages):
            length += split.forward[x] + (split.p2p if place[x] != place[x - 1] else 0)
        for x in range(last, s, -1):
            length += graph.duration[(bwd, x, 0)] + (
                split.p2p if place[x] != place[x - 1] else 0)
        path[s] = length
    # how long an activation must be expected to sit idle to go out: ``away`` x its copies
    round_trip = [away * (split.offload_time(s) + split.reload_time(s))
                  for s in range(split.stages)]
    goes_out = [split.activation[s] > 0 and path[s] >= round_trip[s]
                for s in range(split.stages)]
    reserve_bytes = [reserve * max((split.activation[x] for x in stages_on[d]), default=0)
                     for d in range(D)]

    dev = [_Device(split.budget[d] - split.static[d]) for d in range(D)]
    shortest = [min(graph.duration[(op, x, 0)] for x in stages_on[d] for op in ops)
                for d in range(D)]
    end: dict[Key, float] = {}
    offload_end: dict[tuple[int, int], float] = {}
    reload_end: dict[tuple[int, int], float] = {}
    # per device and stage, the offloaded microbatches not yet reloaded (FIFO order)
    waiting_reload: list[dict[int, list[int]]] = [{x: [] for x in stages_on[d]}
                                                   for d in range(D)]
    nxt = {(op, s): 0 for s in range(split.stages) for op in ops}
    tick = itertools.count()
    wake: list[tuple[float, int, int]] = [(0.0, next(tick), d) for d in range(D)]
    left = len(graph.keys)

    def ready_at(key: Key) -> float | None:
        t = 0.0
        for p, lag in graph.deps[key]:
            if p not in end:
                return None
            t = max(t, end[p] + lag)
        if key[0] is bwd and (key[1], key[2]) in offload_end:
            if (key[1], key[2]) not in reload_end:
                return None
            t = max(t, reload_end[(key[1], key[2])])
        return t

    def due(s: int, m: int) -> float:
        """Earliest moment the backward (s, m) can have its gradient, from what is placed."""
        extra = 0.0
        x = s + 1
        while x <= last:
            k = (bwd, x, m)
            lag = split.p2p if place[x] != place[x - 1] else 0.0
            if k in end:
                return end[k] + lag + extra
            extra += graph.duration[k] + lag
            x += 1
        f = (Op.F, last, m)
        if f in end:
            return end[f] + extra
        return float("inf")

    def list_transfer(d: int, op: Op, s: int, m: int, at_issue: float) -> float:
        """Append a transfer issued at ``at_issue``; its end."""
        dv = dev[d]
        action = Action(op, s, m)
        length = transfer_bytes(split, action) / (
            split.d2h_bandwidth if op is Op.OFFLOAD else split.h2d_bandwidth)
        if op is Op.OFFLOAD:
            start = max(at_issue, dv.d2h, end[(Op.F, s, m)])
            dv.d2h = start + length
            dv.add(start + length, memory_delta(split, action)[1])
            if deferred:
                dv.deferred.append((action, start, start + length))
                return start + length
            dv.last_offload = len(dv.actions)
        else:
            # its OFFLOAD must be listed before it
            held = [(a.stage, a.microbatch) for a, _, _ in dv.deferred]
            if (s, m) in held:
                list_deferred(d, held.index((s, m)) + 1)
            start = max(at_issue, dv.h2d, offload_end[(s, m)])
            dv.h2d = start + length
            dv.add(at_issue, memory_delta(split, action)[1])
        dv.actions.append(action)
        dv.issue.append(at_issue)
        return start + length

    def reloads_pending(d: int, per_stage: int = 2) -> list[tuple[float, tuple[int, int]]]:
        """The reloads device ``d`` may list next, as (due, (stage, microbatch)), earliest
        due first: the backwards of a stage run in microbatch order, so its next
        ``per_stage`` offloaded microbatches are the candidates."""
        return sorted((due(x, m), (x, m)) for x, waiting in waiting_reload[d].items()
                      for m in waiting[:per_stage])

    def issue_reloads(d: int, horizon: float, most: int | None = None) -> None:
        """List the reloads (earliest due first) whose backward is due before
        ``horizon``, the next chance to issue them, while they fit; ``most`` caps how
        many. In due order, stopping at the first that does not fit: a later one would
        take the room the earlier backward needs."""
        dv = dev[d]
        at = max(dv.free, dv.held)
        for when, (s, m) in reloads_pending(d)[:most]:
            if when == float("inf") or when - lead * split.reload_time(s) > horizon:
                break
            if not dv.fits(at, transfer_bytes(split, Action(Op.RELOAD, s, m))):
                break
            waiting_reload[d][s].remove(m)
            reload_end[(s, m)] = list_transfer(d, Op.RELOAD, s, m, at)
            heapq.heappush(wake, (reload_end[(s, m)], next(tick), d))

    def list_deferred(d: int, count: int) -> None:
        """List the first ``count`` deferred OFFLOADs, unheld. Any prefix may be listed
        at any moment: each starts no earlier than the last compute listed ends (see
        :func:`flush`), so being issued then changes no time."""
        dv = dev[d]
        issue = max(dv.free, dv.held)
        for _ in range(count):
            dv.last_offload = len(dv.actions)
            dv.actions.append(dv.deferred.pop(0)[0])
            dv.issue.append(issue)

    def flush(d: int, before: float) -> None:
        """List the deferred OFFLOADs that start before ``before`` (the end of the
        compute action about to be listed): listed after it, they would be issued at
        its end, later than they start. The rest start after it anyway, so listing them
        later changes no time."""
        list_deferred(d, sum(1 for _ in itertools.takewhile(
            lambda held: held[1] < before - _EPS, dev[d].deferred)))

    def wait_deferred(d: int, size: float, ready: float) -> float | None:
        """Mark the first deferred OFFLOAD after whose end a forward of ``size`` bytes,
        ready at ``ready``, fits ``wait`` and list it (with those before it); the
        forward's start. Nothing listed comes after it, so it holds nothing back."""
        dv = dev[d]
        # each stage's first in line, as revision 34 was measured (its next two would
        # change two deferred variants of the V shape on ``--stages 16 --mem 40GB``)
        pending = reloads_pending(d, 1) if WAIT_KEEPS_RELOAD_ROOM else []
        if pending and pending[0][0] < float("inf"):
            # the room of the next reload due here is not the forward's to take
            size += transfer_bytes(split, Action(Op.RELOAD, *pending[0][1]))
        for n, (action, _, when) in enumerate(dv.deferred):
            start = max(ready, when)
            if dv.fits(start, size):
                list_deferred(d, n)             # those before it, unheld
                dv.deferred.pop(0)
                dv.last_offload = len(dv.actions)
                dv.actions.append(Action(Op.OFFLOAD, action.stage, action.microbatch,
                                         wait=True))
                dv.issue.append(max(dv.free, dv.held))
                dv.held = max(dv.held, when)
                return start
        return None

    def wait_for(d: int, size: float, ready: float) -> float | None:
        """Mark the last OFFLOAD ``wait`` so that a forward of ``size`` bytes, ready at
        ``ready``, fits once it has ended, if that holds nothing already listed back
        (every action listed after it is issued no earlier); the forward's start.

        With ``deferred`` the OFFLOADs whose copies are still queued are not listed
        yet, so the forward can wait for the first of them that makes room instead of
        the last one listed (``wait_deferred``)."""
        dv = dev[d]
        if dv.deferred:
            start = wait_deferred(d, size, ready)
            if start is not None:
                return start
        i = dv.last_offload
        if i is None or dv.actions[i].wait:
            return None
        when = offload_end[(dv.actions[i].stage, dv.actions[i].microbatch)]
        start = max(ready, when)
        if any(issue < when for issue in dv.issue[i + 1:]) or not dv.fits(start, size):
            return None
        dv.actions[i] = Action(Op.OFFLOAD, dv.actions[i].stage, dv.actions[i].microbatch,
                               wait=True)
        dv.held = max(dv.held, when)
        return start

    def pick(d: int, t: float) -> tuple[Key, float] | None:
        """The task device ``d`` runs next and its start, as the simulator will time it:
        the latest of the stream's free time, the hold and the inputs (which may be
        before ``t`` when the device sat idle)."""
        dv = dev[d]
        ready = {}
        for s in stages_on[d]:
            for op in ops:
                if nxt[(op, s)] < M:
                    k = (op, s, nxt[(op, s)])
                    r = ready_at(k)
                    if r is not None and r <= t + _EPS:
                        ready[k] = max(dv.free, dv.held, r)
        backward = [k for k in ready if k[0] in (Op.B, Op.BW)]
        if backward:
            k = min(backward, key=prio.__getitem__)
            return k, ready[k]
        weights = sorted((k for k in ready if k[0] is Op.W), key=lambda k: (k[2], k[1]))
        if eager_w and weights:
            return weights[0], ready[weights[0]]
        forwards = sorted((k for k in ready if k[0] is Op.F), key=prio.__getitem__)
        for k in forwards:
            if dv.fits(ready[k], split.activation[k[1]] + reserve_bytes[d]):
                return k, ready[k]
        if weights:
            return weights[0], ready[weights[0]]
        for k in forwards:
            start = wait_for(d, split.activation[k[1]] + reserve_bytes[d], ready[k])
            if start is not None:
                return k, start
        return None

    while wake and left:
        t, devices = pop_waking(wake)
        for d in devices:
            dv = dev[d]
            if dv.free > t + _EPS or dv.held > t + _EPS:
                continue
            issue_reloads(d, t + shortest[d])
            chosen = pick(d, t)
            if chosen is None:
                issue_reloads(d, float("inf"), 1)   # idle: bring back the next one due
                continue
            key, start = chosen
            op, s, m = key
            finish = start + graph.duration[key]
            flush(d, finish)
            end[key] = finish
            dv.free = finish
            action = Action(op, s, m)
            moment, delta = memory_delta(split, action)
            dv.add(start if moment == "start" else finish, delta)
            dv.actions.append(action)
            dv.issue.append(start)
            nxt[(op, s)] += 1
            left -= 1
            # with queue_aware: behind the copies queued, can it still come back in time?
            if op is Op.F and goes_out[s] and (
                    not queue_aware
                    or finish + path[s] >= max(finish, dv.d2h) + round_trip[s]):
                offload_end[(s, m)] = list_transfer(d, Op.OFFLOAD, s, m, finish)
                waiting_reload[d][s].append(m)
                heapq.heappush(wake, (offload_end[(s, m)], next(tick), d))
            heapq.heappush(wake, (finish, next(tick), d))
            for n, lag in succ[key]:
                heapq.heappush(wake, (finish + lag, next(tick), place[n[1]]))
    if left:
        return None
    for d in range(D):
        flush(d, float("inf"))
    perturbed = given is not None
    name = (f"offlist{'-eager' if eager_w else ''}{'-d' if deferred else ''}"
            f"-r{reserve:g}-a{away:.3g}"
            + (f"-l{lead:.3g}" if lead != 1.0 else "")
            + ("-p" if perturbed else f"-j{jitter:.2g}" if jitter else ""))
    schedule = Schedule(name=name, stages=len(place), devices=D,
                        microbatches=problem.microbatches, placement=place,
                        actions=[dv.actions for dv in dev],
                        provenance={"source": "optimizer", "name": name,
                                    "planned_by": "an offload-aware list schedule",
                                    "offload_list": {"eager_w": eager_w, "reserve": reserve,
                                                     "away": away, "lead": lead,
                                                     "queue_aware": queue_aware,
                                                     "deferred": deferred,
                                                     "jitter": jitter, "seed": seed,
                                                     "perturbed": perturbed},
                                    "planned_makespan": max(end.values(), default=0.0)})
    return schedule.validate()


def offload_list_schedules(problem: Problem, placement: Sequence[int],
                           split_backward: bool = True, *,
                           variants: Sequence[tuple[bool, int, float]] = VARIANTS,
                           deadline: float | None = None) -> list[Schedule]:
    """``variants`` (:data:`VARIANTS`) on ``placement`` in order, until ``deadline``
    (``time.monotonic()``; checked before each): the schedules built (unsimulated)."""
    out: list[Schedule] = []
    if not variants or (deadline is not None and time.monotonic() > deadline):
        return out
    graph = task_graph(problem, split_backward, placement)
    for deferred in (False, True) if DEFERRED_VARIANTS else (None,):
        for eager_w, reserve, away in variants:
            if deadline is not None and time.monotonic() > deadline:
                return out
            schedule = offload_list_schedule(problem, placement, split_backward,
                                             eager_w=eager_w, reserve=reserve, away=away,
                                             deferred=deferred, graph=graph)
            if schedule is not None:
                out.append(schedule)
    return out


class RandomizedSearch:
    """Randomized runs of the greedy near one schedule of it, kept between calls.

    Each run either perturbs its basin's run in hand (70%: the reload lead or the
    offload threshold scaled a little, the priorities of 1, 3 or 10% of the tasks by up
    to 20%) or draws afresh near it (:data:`FRESH`: the reserve moved by half an
    activation, the lead and the threshold drawn, in :data:`QUEUE_FLIP` of them the
    other offload rule and in :data:`DEFERRED_FLIP` the other listing rule, every
    priority jittered anew); a run as fast as the one in
    hand replaces it (the search walks plateaus). The two W policies (eager or not) are
    two basins, run in turn, each from its own start (:data:`BASINS`). Why: the
    greedy's choices hang on ties and thresholds, and fresh draws alone (revision 29's
    GRASP) forget every good choice they found; the other W policy's first runs
    are slower than the start and would never be kept against it, yet on ``--stages 16
    --mem 40GB`` it is the better one (``python scripts/bench_offload_search.py
    --strategies``: 1.992 s mean after 15 s against 2.086 s with one basin and 2.103 s
    with fresh draws). A basin that has gone :data:`STALL` runs without a gain restarts
    from a fresh draw near its start (revision 31; the best run overall is kept apart,
    since a restarted basin may be slower than it): the perturbing search settles where
    fresh draws alone still find more (``--model gpt3-13b --stages 8 --mem 40GB``: the
    strategies table in docs/optimizer-log.md, revision-31 item). Not a basin per
    offload rule too (``BASINS = 4``): with the runs split four ways each walk is half
    as long, behind on every case where the rule matters (six seeds; the log's item
    "four basins"). A run costs 0.02-0.5 s up to 16 x 32.

    ``around`` is the start's ``provenance["offload_list"]`` and ``makespan`` its
    simulated makespan (None: run and simulated here); its priorities are rebuilt from
    its jitter and seed (unless it was itself perturbed: then from the paths alone).
    """

    FRESH = 0.3                         # share of runs drawn afresh
    # 1: only the start's W policy; 2: both W policies; 4: both W policies x both
    # offload rules (each basin keeps its rule: no switch in its fresh draws)
    BASINS = 2
    STALL = 60                          # runs without a gain before a basin restarts

    def __init__(self, problem: Problem, placement: Sequence[int], split_backward: bool,
                 around: dict, makespan: float | None, *, seed: int = 0) -> None:
        self.problem, self.placement = problem, list(placement)
        self.split_backward = split_backward
        self.graph = task_graph(problem, split_backward, placement)
        self.keys = list(self.graph.keys)
        self.rng = random.Random(seed)
        # the offload rule's switch draws from its own stream: where the rule changes
        # nothing (a link fast enough that no copies queue) the runs are those of
        # revision 31, draw for draw
        self.switch = random.Random(seed + 1)
        self.defer_switch = random.Random(seed + 2)     # the same for the listing rule
        params = {"eager_w": bool(around["eager_w"]), "reserve": around["reserve"],
                  "away": around["away"], "lead": around.get("lead", 1.0),
                  "queue_aware": around.get("queue_aware", False),
                  "deferred": around.get("deferred", False)}
        # a perturbed start's priorities are not in its provenance: start from its path
        jitter = 0.0 if around.get("perturbed") else around.get("jitter", 0.0)
        start = random.Random(around.get("seed", 0))
        scale = {k: 1 + start.uniform(-jitter, jitter) for k in self.keys}
        if makespan is None:
            makespan = self._simulated(offload_list_schedule(
                problem, placement, split_backward, graph=self.graph, scale=scale,
                **params))
        # one basin per W policy (and per offload rule with BASINS = 4), each with its
        # best (params, scales, makespan): the other policy's first runs are worse, and
        # would never be kept against this one
        eager, rule = params["eager_w"], params["queue_aware"]
        self.first = (eager, rule)
        self.started = {self.first}
        self.basins = {(e, r): ({**params, "eager_w": e, "queue_aware": r}, scale,
                                makespan if (e, r) == self.first else float("inf"))
                       for r in ((rule, not rule) if self.BASINS == 4 else (rule,))
                       for e in (False, True)}
        # where each basin restarts from once it stalls, and its runs since it last
        # improved; the best run overall is kept apart, since a restarted basin's
        # current run may be slower than it
        self.origins = {basin: held[0] for basin, held in self.basins.items()}
        self.stalled = {basin: 0 for basin in self.basins}
        self.best = makespan
        self.runs = self.restarts = 0

    def _simulated(self, schedule: Schedule | None) -> float:
        """``schedule``'s simulated makespan; infinity when it stalled or does not fit."""
        from optpipe.simulator import simulate

        result = None if schedule is None else simulate(self.problem, schedule)
        return result.makespan if result is not None and result.fits else float("inf")

    @property
    def makespan(self) -> float:
        """The fastest run's makespan so far (the start's at first)."""
        return self.best

    def _basin(self) -> tuple[bool, bool]:
        """The next run's basin, ``(eager_w, queue_aware)``: in turn, the lazy W policy
        first (the order of revision 30), the start's offload rule before the other."""
        if self.BASINS == 1:
            return self.first
        rule = self.first[1]
        if self.BASINS == 4 and (self.runs // 2) % 2:
            rule = not rule
        return bool(self.runs % 2), rule

    def _draw(self, basin: tuple[bool, bool]) -> tuple[dict, dict[Key, float]]:
        """The next run's parameters and priority scales in ``basin``."""
        rng = self.rng
        params, scale, _ = self.basins[basin]
        if basin not in self.started:   # the basin's own start first
            self.started.add(basin)
            return params, scale
        params = dict(params)
        if rng.random() < self.FRESH:
            return self._fresh(params)
        if rng.random() < 0.3:
            params["lead"] = max(0.25, params["lead"] * rng.uniform(0.8, 1.25))
        if rng.random() < 0.3:
            params["away"] *= rng.uniform(0.85, 1.2)
        scale = dict(scale)
        share = rng.choice((0.01, 0.03, 0.1))
        for k in rng.sample(self.keys, max(1, int(share * len(self.keys)))):
            scale[k] *= 1 + rng.uniform(-0.2, 0.2)
        return params, scale

    def run(self, deadline: float) -> Schedule | None:
        """Runs until ``deadline`` (``time.monotonic()``), the two basins in turn: the
        fastest schedule that fits and beats the best held when called (simulated),
        or None."""
        bar, found = self.makespan, None
        while time.monotonic() < deadline:
            basin = self._basin()
            self.runs += 1
            restart = self.stalled[basin] >= self.STALL
            self.restarts += restart
            params, scale = self._fresh(self.origins[basin]) if restart \
                else self._draw(basin)
            schedule = offload_list_schedule(self.problem, self.placement,
                                             self.split_backward, graph=self.graph,
                                             scale=scale, **params)
            makespan = self._simulated(schedule)
            held = self.basins[basin][2]
            if makespan < float("inf") and (restart or makespan <= held * (1 + 1e-12)):
                self.basins[basin] = (params, scale, makespan)
            self.stalled[basin] = 0 if restart or makespan < held * (1 - 1e-9) \
                else self.stalled[basin] + 1
            if makespan < self.best * (1 - 1e-9):
                self.best = makespan
                if makespan < bar * (1 - 1e-9):
                    found = schedule
        return found

    def _fresh(self, params: dict) -> tuple[dict, dict[Key, float]]:
        """A run drawn afresh near ``params``: the reserve moved by half an activation,
        the lead and the offload threshold drawn, the offload rule switched in
        :data:`QUEUE_FLIP` of them and the listing rule in :data:`DEFERRED_FLIP` (each
        from a stream of its own), every priority jittered anew."""
        rng = self.rng
        params = dict(params)
        params["reserve"] = max(0.0, params["reserve"] + rng.choice((-0.5, 0.0, 0.5)))
        params["away"] *= rng.uniform(0.6, 1.5)
        params["lead"] = rng.uniform(0.5, 2.5)
        if self.BASINS != 4 and self.switch.random() < QUEUE_FLIP:
            params["queue_aware"] = not params["queue_aware"]
        # no draw at all while the switch is off: revision 32's runs, draw for draw
        if DEFERRED_FLIP and self.defer_switch.random() < DEFERRED_FLIP:
            params["deferred"] = not params["deferred"]
        jitter = rng.uniform(0.0, 0.1)
        return params, {k: 1 + rng.uniform(-jitter, jitter) for k in self.keys}


def randomized(problem: Problem, placement: Sequence[int], split_backward: bool,
               around: dict, *, deadline: float, seed: int = 0,
               bar: float | None = None) -> tuple[Schedule | None, int]:
    """A :class:`RandomizedSearch` near the variant ``around`` (a schedule's
    ``provenance["offload_list"]``) until ``deadline``: the fastest schedule found
    that fits and beats ``bar`` (simulated; default: ``around``'s own schedule), or
    None, and how many runs were made."""
    search = RandomizedSearch(problem, placement, split_backward, around, None, seed=seed)
    found = search.run(deadline)
    if found is None or bar is None:
        return found, search.runs
    return (found if search.makespan < bar * (1 - 1e-9) else None), search.runs
