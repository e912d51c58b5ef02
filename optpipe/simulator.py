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
    backward_op = {(a.stage, a.microbatch): a.op for _, a in schedule
                   if a.op in (Op.B, Op.BW)}
    offloaded = {(a.stage, a.microbatch) for _, a in schedule if a.op is Op.OFFLOAD}
    last_stage = schedule.stages - 1

    def dependencies(action: Action) -> list[tuple[Op, int, int]]:
        s, m = action.stage, action.microbatch
        if action.op is Op.F:
            return [(Op.F, s - 1, m)] if s > 0 else []
        if action.op in (Op.B, Op.BW):
            deps = [(Op.F, s, m)]
            if s < last_stage:
                deps.append((backward_op[(s + 1, m)], s + 1, m))
            if (s, m) in offloaded:
                deps.append((Op.RELOAD, s, m))
            return deps
        if action.op is Op.W:
            return [(Op.B, s, m)]
        if action.op is Op.OFFLOAD:
            return [(Op.F, s, m)]
        return [(Op.OFFLOAD, s, m)]

    return dependencies


def simulate(problem: Problem, schedule: Schedule, check_budget: bool = False) -> SimResult:
    """Execute ``schedule`` on ``problem``; the figures every other part reports.

    With ``check_budget`` a schedule that exceeds a device's budget raises an error that
    names the device, its peak and its budget, instead of returning a result whose
    ``fits`` is False.
    """
    schedule.validate()
    prob = problem_for(problem, schedule)
    D = schedule.devices
    placement = schedule.placement
    keys = {a.key for _, a in schedule}
    dependencies = dependency_function(schedule)
    end: dict[tuple[Op, int, int], float] = {}
    device_of = {k: placement[k[1]] for k in keys}
    pointer = [0] * D
    stream_free = [0.0] * D
    last_compute_end = [0.0] * D
    held_until = [0.0] * D                  # the end of the last OFFLOAD marked wait
    channel_free = {(d, lane): 0.0 for d in range(D) for lane in (D2H, H2D)}
    records: list[ActionRecord] = []
    remaining = sum(len(acts) for acts in schedule.actions)
    while remaining:
        progressed = False
        for d in range(D):
            acts = schedule.actions[d]
            while pointer[d] < len(acts):
                action = acts[pointer[d]]
                deps = dependencies(action)
                ready = 0.0
                blocked = False
                for dep in deps:
                    if dep not in end:
                        blocked = True
                        break
                    arrival = end[dep]
                    if device_of[dep] != d:
                        arrival += prob.p2p
                    ready = max(ready, arrival)
                if blocked:
                    break
                length = duration(prob, action)
                if action.op.is_compute:
                    issue = max(stream_free[d], held_until[d])
                    start = max(issue, ready)
                    finish = start + length
                    stream_free[d] = finish
                    last_compute_end[d] = finish
                    lane = COMPUTE
                else:
                    lane = D2H if action.op is Op.OFFLOAD else H2D
                    issue = max(last_compute_end[d], held_until[d])
                    start = max(issue, ready, channel_free[(d, lane)])
                    finish = start + length
                    channel_free[(d, lane)] = finish
                    if action.wait:
                        held_until[d] = finish
                end[action.key] = finish
                records.append(ActionRecord(d, action, start, finish, issue, lane))
                pointer[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise InvalidScheduleError(_deadlock_message(
                schedule, pointer, end, dependencies))
    return _summarize(prob, schedule, records, check_budget)


def _deadlock_message(schedule: Schedule, pointer: list[int],
                      end: dict[tuple[Op, int, int], float], deps_of: Any) -> str:
    waits = []
    for d, acts in enumerate(schedule.actions):
        if pointer[d] < len(acts):
            action = acts[pointer[d]]
            missing = [dep for dep in deps_of(action) if dep not in end]
            names = ", ".join(f"{op.value}(stage {s}, mb {m})" for op, s, m in missing)
            waits.append(f"device {d} waits at {action} for {names}")
    return (f"schedule '{schedule.name}' cannot run: the devices wait on each other in a "
            f"cycle ({'; '.join(waits)})")


def _summarize(prob: Problem, schedule: Schedule, records: list[ActionRecord],
               check_budget: bool) -> SimResult:
    D = schedule.devices
    first = min(r.start for r in records)
    last = max(r.end for r in records)
    makespan = last - first
    busy = [0.0] * D
    span_lo = [float("inf")] * D
    span_hi = [0.0] * D
    events: list[list[tuple[float, int, int]]] = [[] for _ in range(D)]
    for r in records:
        if r.lane == COMPUTE:
            busy[r.device] += r.end - r.start
            span_lo[r.device] = min(span_lo[r.device], r.start)
            span_hi[r.device] = max(span_hi[r.device], r.end)
        moment, delta = memory_delta(prob, r.action)
        when = {"start": r.start, "end": r.end, "issue": r.issue}[moment]
        # releases (0) sort before allocations (1) at equal times
        events[r.device].append((when, 0 if delta < 0 else 1, delta))
    peak = []
    timeline = []
    for d in range(D):
        level = prob.static[d]
        top = level
        curve = [(first, level)]
        for when, _, delta in sorted(events[d]):
            level += delta
            top = max(top, level)
            if curve and curve[-1][0] == when:
                curve[-1] = (when, level)
            else:
                curve.append((when, level))
        peak.append(top)
        timeline.append(curve)
    span = [hi - lo if lo != float("inf") else 0.0 for lo, hi in zip(span_lo, span_hi)]
    bubble = 1.0 - sum(busy) / (D * makespan) if makespan > 0 else 0.0
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
