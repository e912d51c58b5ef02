"""The simulator: the one judge of every schedule, heuristic or solved.

It executes a :class:`~optpipe.schedule.Schedule` against a
:class:`~optpipe.problem.Problem` and reports the start and end of every action, busy and
idle time per device, the makespan, the bubble rate and the memory curve per device.

Execution rules (the optimizers model exactly these):

* Each device has one **compute stream** that runs its compute actions (F, B, W, BW) one
  at a time, in list order.
* An action starts when its stream is free and its inputs have arrived:
  ``F(s, m)`` needs ``F(s-1, m)``; ``B``/``BW(s, m)`` needs ``B``/``BW(s+1, m)`` (the last
  stage needs its own ``F(S-1, m)``), and ``RELOAD(s, m)`` when it was offloaded;
  ``W(s, m)`` needs ``B(s, m)``. Data crossing devices arrives ``p2p`` seconds after the
  producer ends; between stages on the same device it arrives at once.
* Each device has two **host-link channels**: device-to-host for OFFLOAD and
  host-to-device for RELOAD, each one transfer at a time in list order. A transfer is
  *issued* when the compute action listed before it on the device ends (time 0 if none)
  and starts at the latest of: its issue, its channel being free, and its input
  (``F(s, m)`` for OFFLOAD, ``OFFLOAD(s, m)`` for RELOAD). It lasts bytes / bandwidth.
* An OFFLOAD marked ``wait`` **holds its device back**: every action listed after it on
  the device is issued no earlier than its end (a compute action starts no earlier, a
  transfer is issued no earlier), so the bytes it frees are free for what follows.
* Memory follows :mod:`optpipe.memory.accounting`.

Definitions (stated once, here and in the README):

* makespan = last end − first start, over all actions of all devices;
* bubble rate = 1 − (sum of compute-busy time over all devices) / (devices × makespan);
* device span = last end − first start of that device's compute actions.

A schedule whose devices wait on each other in a cycle is rejected with the actions
involved; the simulator never hangs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from optpipe.errors import InvalidScheduleError, OptPipeError
from optpipe.memory.accounting import duration, memory_delta
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule

COMPUTE, D2H, H2D = "compute", "d2h", "h2d"


@dataclass(frozen=True)
class ActionRecord:
    """When one action ran: ``issue`` is when it became eligible on its lane."""

    device: int
    action: Action
    start: float
    end: float
    issue: float
    lane: str

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "stage": self.action.stage,
                "op": self.action.op.value, "microbatch": self.action.microbatch,
                "start": self.start, "end": self.end, "lane": self.lane,
                **({"fraction": self.action.fraction} if self.action.fraction != 1.0 else {})}


@dataclass
class SimResult:
    """Everything the simulator measured about one schedule on one problem."""

    schedule: Schedule
    problem: Problem                      # the problem actually simulated (split if chunked)
    records: list[ActionRecord]
    makespan: float
    bubble_rate: float
    device_busy: list[float]
    device_span: list[float]
    peak_memory: list[int]                # static + kept activations, bytes, per device
    memory_timeline: list[list[tuple[float, int]]]  # per device: (time, bytes after time)
    budget: list[float]
    start_time: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        """True when every device stays within its budget at every moment."""
        return all(p <= b for p, b in zip(self.peak_memory, self.budget))

    @property
    def device_idle(self) -> list[float]:
        return [self.makespan - busy for busy in self.device_busy]

    @property
    def device_bubble_rate(self) -> list[float]:
        """Idle share of each device's own span (the figure papers often quote)."""
        return [1.0 - busy / span if span > 0 else 0.0
                for busy, span in zip(self.device_busy, self.device_span)]

    def over_budget(self) -> list[int]:
        return [d for d, (p, b) in enumerate(zip(self.peak_memory, self.budget)) if p > b]

    def record(self, op: Op | str, stage: int, microbatch: int) -> ActionRecord:
        op = Op(op)
        for rec in self.records:
            if rec.action.op is op and rec.action.stage == stage and \
                    rec.action.microbatch == microbatch:
                return rec
        raise KeyError((op, stage, microbatch))

    def to_json(self, actions: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schedule": self.schedule.name,
            "makespan": self.makespan,
            "bubble_rate": self.bubble_rate,
            "peak_memory": list(self.peak_memory),
            "budget": [b if b != float("inf") else None for b in self.budget],
            "fits": self.fits,
            "device_span": list(self.device_span),
            "device_busy": list(self.device_busy),
            "device_bubble_rate": self.device_bubble_rate,
            "provenance": self.schedule.provenance,
        }
        if actions:
            data["actions"] = [r.to_json() for r in self.records]
        return data


def problem_for(problem: Problem, schedule: Schedule) -> Problem:
    """The problem a schedule is judged against: split into chunks when it uses them."""
    schedule.check_fits(problem.stages, problem.devices, problem.microbatches)
    if problem.chunks != 1:
        if schedule.stages != problem.stages or list(schedule.placement) != list(
                problem.meta.get("placement", schedule.placement)):
            raise OptPipeError(f"schedule '{schedule.name}' does not match the split problem")
        return problem
    if schedule.stages == problem.stages and schedule.placement == list(range(problem.stages)):
        return problem
    return problem.split(schedule.placement)


def dependency_function(schedule: Schedule) -> Callable[[Action], list[tuple[Op, int, int]]]:
    """For ``schedule``, a function giving the actions whose end an action must wait for.

    ``F(s, m)`` waits for ``F(s-1, m)``; ``B``/``BW(s, m)`` for its own F, the backward of
    ``(s+1, m)`` (split ``B`` or fused ``BW``, whichever the schedule runs) and its RELOAD
    when offloaded; ``W(s, m)`` for ``B(s, m)``; OFFLOAD for its F; RELOAD for its OFFLOAD.
    The runtime orders a one-process run with the same function.
    """
    F, B, W, BW, OFFLOAD, RELOAD = Op.F, Op.B, Op.W, Op.BW, Op.OFFLOAD, Op.RELOAD
    every = [a for acts in schedule.actions for a in acts]
    backward_op = {(a.stage, a.microbatch): a.op for a in every if a.op is B or a.op is BW}
    offloaded = {(a.stage, a.microbatch) for a in every if a.op is OFFLOAD}
    last_stage = schedule.stages - 1

    def dependencies(action: Action) -> list[tuple[Op, int, int]]:
        op, s, m = action.op, action.stage, action.microbatch
        if op is F:
            return [(F, s - 1, m)] if s > 0 else []
        if op is B or op is BW:
            deps = [(F, s, m)]
            if s < last_stage:
                deps.append((backward_op[(s + 1, m)], s + 1, m))
            if offloaded and (s, m) in offloaded:
                deps.append((RELOAD, s, m))
            return deps
        if op is W:
            return [(B, s, m)]
        if op is OFFLOAD:
            return [(F, s, m)]
        return [(OFFLOAD, s, m)]

    return dependencies


def simulate(problem: Problem, schedule: Schedule, check_budget: bool = False) -> SimResult:
    """Execute ``schedule`` on ``problem``; the figures every other part reports.

    With ``check_budget`` a schedule that exceeds a device's budget raises an error that
    names the device, its peak and its budget, instead of returning a result whose
    ``fits`` is False.

    Why it is written over flat lists: every fixed schedule, list schedule and warm start
    is judged here, thousands of actions each, so the loop works on action indices with
    their durations and dependencies resolved once. A device that waits on an action of
    another device is parked on it and woken when it ends, so no device is polled in vain.
    """
    schedule.validate()
    prob = problem_for(problem, schedule)
    D = schedule.devices
    plan = _Plan(prob, schedule)
    end = [-1.0] * plan.count                # end of each action; < 0 while not run
    start_of = [0.0] * plan.count
    issue_of = [0.0] * plan.count
    pointer = [0] * D
    stream_free = [0.0] * D
    last_compute_end = [0.0] * D
    held_until = [0.0] * D                  # the end of the last OFFLOAD marked wait
    channel_free = [[0.0, 0.0] for _ in range(D)]   # per device: d2h, h2d
    parked: dict[int, list[int]] = {}       # action index -> devices waiting for its end
    runnable = list(range(D - 1, -1, -1))
    deps, length, lane_of, wait = plan.deps, plan.length, plan.lane, plan.wait
    while runnable:
        d = runnable.pop()
        order = plan.order[d]
        at = pointer[d]
        while at < len(order):
            i = order[at]
            ready = 0.0
            missing = -1
            for j, lag in deps[i]:
                e = end[j]
                if e < 0.0:
                    missing = j
                    break
                if e + lag > ready:
                    ready = e + lag
            if missing >= 0:
                parked.setdefault(missing, []).append(d)
                break
            lane = lane_of[i]
            if lane == _COMPUTE:
                issue = max(stream_free[d], held_until[d])
                begin = max(issue, ready)
                finish = begin + length[i]
                stream_free[d] = finish
                last_compute_end[d] = finish
            else:
                issue = max(last_compute_end[d], held_until[d])
                begin = max(issue, ready, channel_free[d][lane])
                finish = begin + length[i]
                channel_free[d][lane] = finish
                if wait[i]:
                    held_until[d] = finish
            start_of[i], end[i], issue_of[i] = begin, finish, issue
            woken = parked.pop(i, None)
            if woken:
                runnable.extend(woken)
            at += 1
        pointer[d] = at
    if any(pointer[d] < len(plan.order[d]) for d in range(D)):
        done = {plan.actions[i].key for i in range(plan.count) if end[i] >= 0.0}
        raise InvalidScheduleError(_deadlock_message(
            schedule, pointer, done, dependency_function(schedule)))
    return _summarize(prob, schedule, plan, start_of, end, issue_of, check_budget)


_D2H_LANE, _H2D_LANE, _COMPUTE = 0, 1, 2
_LANE_NAMES = (D2H, H2D, COMPUTE)


class _Plan:
    """A schedule's actions as flat lists: what :func:`simulate` reads in its loop.

    ``deps[i]`` lists ``(j, lag)``: action ``i`` may start ``lag`` seconds (``p2p`` across
    devices, 0 on one device) after action ``j`` ends, from :func:`dependency_function`.
    ``moment[i]`` and ``delta[i]`` are its memory change from
    :func:`~optpipe.memory.accounting.memory_delta`.
    """

    def __init__(self, prob: Problem, schedule: Schedule) -> None:
        self.actions = [a for acts in schedule.actions for a in acts]
        self.count = len(self.actions)
        self.device = [d for d, acts in enumerate(schedule.actions) for _ in acts]
        index = {a.key: i for i, a in enumerate(self.actions)}
        starts = [0]
        for acts in schedule.actions:
            starts.append(starts[-1] + len(acts))
        self.order = [range(lo, hi) for lo, hi in zip(starts, starts[1:])]  # per device
        placement = schedule.placement
        dependencies = dependency_function(schedule)
        p2p = prob.p2p
        self.deps = [[(index[dep], p2p if placement[dep[1]] != d else 0.0)
                      for dep in dependencies(a)]
                     for d, a in zip(self.device, self.actions)]
        self.length = [duration(prob, a) for a in self.actions]
        self.lane = [_LANE_OF[a.op] for a in self.actions]
        self.wait = [a.wait for a in self.actions]
        changes = [memory_delta(prob, a) for a in self.actions]
        self.moment = [_MOMENT_CODE[moment] for moment, _ in changes]
        self.delta = [delta for _, delta in changes]


_LANE_OF = {Op.F: _COMPUTE, Op.B: _COMPUTE, Op.W: _COMPUTE, Op.BW: _COMPUTE,
            Op.OFFLOAD: _D2H_LANE, Op.RELOAD: _H2D_LANE}
_MOMENT_CODE = {"start": 0, "end": 1, "issue": 2}


def _deadlock_message(schedule: Schedule, pointer: list[int],
                      done: set[tuple[Op, int, int]], deps_of: Any) -> str:
    waits = []
    for d, acts in enumerate(schedule.actions):
        if pointer[d] < len(acts):
            action = acts[pointer[d]]
            missing = [dep for dep in deps_of(action) if dep not in done]
            names = ", ".join(f"{op.value}(stage {s}, mb {m})" for op, s, m in missing)
            waits.append(f"device {d} waits at {action} for {names}")
    return (f"schedule '{schedule.name}' cannot run: the devices wait on each other in a "
            f"cycle ({'; '.join(waits)})")


def _summarize(prob: Problem, schedule: Schedule, plan: _Plan, start_of: list[float],
               end: list[float], issue_of: list[float], check_budget: bool) -> SimResult:
    D = schedule.devices
    first = min(start_of)
    last = max(end)
    makespan = last - first
    busy = [0.0] * D
    span_lo = [float("inf")] * D
    span_hi = [0.0] * D
    events: list[list[tuple[float, int, int]]] = [[] for _ in range(D)]
    moments = (start_of, end, issue_of)
    for i, (d, lane, moment, delta) in enumerate(zip(plan.device, plan.lane, plan.moment,
                                                     plan.delta)):
        if lane == _COMPUTE:
            begin, finish = start_of[i], end[i]
            busy[d] += finish - begin
            if begin < span_lo[d]:
                span_lo[d] = begin
            if finish > span_hi[d]:
                span_hi[d] = finish
        # releases (0) sort before allocations (1) at equal times
        events[d].append((moments[moment][i], 0 if delta < 0 else 1, delta))
    peak = []
    timeline = []
    for d in range(D):
        level = prob.static[d]
        top = level
        curve = [(first, level)]
        for when, _, delta in sorted(events[d]):
            level += delta
            if level > top:
                top = level
            if curve[-1][0] == when:
                curve[-1] = (when, level)
            else:
                curve.append((when, level))
        peak.append(top)
        timeline.append(curve)
    span = [hi - lo if lo != float("inf") else 0.0 for lo, hi in zip(span_lo, span_hi)]
    bubble = 1.0 - sum(busy) / (D * makespan) if makespan > 0 else 0.0
    records = [ActionRecord(plan.device[i], plan.actions[i], start_of[i], end[i],
                            issue_of[i], _LANE_NAMES[plan.lane[i]])
               for i in range(plan.count)]
    records.sort(key=lambda r: (r.start, r.device, r.lane))
    result = SimResult(schedule=schedule, problem=prob, records=records, makespan=makespan,
                       bubble_rate=bubble, device_busy=busy, device_span=span,
                       peak_memory=peak, memory_timeline=timeline,
                       budget=list(prob.budget), start_time=first)
    if check_budget and not result.fits:
        d = result.over_budget()[0]
        from optpipe.units import format_bytes
        raise OptPipeError(
            f"schedule '{schedule.name}' needs {format_bytes(peak[d])} on device {d}, over "
            f"its budget of {format_bytes(prob.budget[d])}")
    return result
