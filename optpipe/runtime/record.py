"""What a recorded step measured, and the measured run as a simulator-style result.

``runner.step(..., record=True)`` fills a :class:`StepRecord`: the start and end of every
action on its lane (compute, d2h, h2d), the kept-activation events of every device (the
runtime's accounting, :mod:`optpipe.runtime.activations`), each device's peak, static
bytes and what every OFFLOAD moved. :meth:`StepRecord.to_sim_result` turns it into a
:class:`~optpipe.simulator.SimResult` so that the Gantt chart, the tables and the JSON of
the simulator show a measured step exactly like a simulated one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from optpipe.problem import Problem, uniform_problem
from optpipe.schedule import Action, Op, Schedule
from optpipe.simulator import COMPUTE, D2H, H2D, ActionRecord, SimResult, problem_for

LANES = {Op.OFFLOAD: D2H, Op.RELOAD: H2D}


@dataclass
class MeasuredAction:
    """One executed action: seconds from the step's start, and its kept-bytes change."""

    device: int
    op: str
    stage: int
    microbatch: int
    start: float
    end: float
    lane: str = COMPUTE
    fraction: float = 1.0
    delta: int = 0             # change of the device's kept activation bytes it caused
    moved: int = 0             # OFFLOAD/RELOAD: bytes copied
    left: int = -1             # RELOAD: bytes of that microbatch still on device before it

    @property
    def action(self) -> Action:
        return Action(Op(self.op), self.stage, self.microbatch, self.fraction)


@dataclass
class StepRecord:
    """Measured figures of one training step over all devices."""

    schedule: str
    devices: int
    stages: int
    microbatches: int
    actions: list[MeasuredAction] = field(default_factory=list)
    memory_events: list[list[tuple[float, int, int]]] = field(default_factory=list)
    peak_activation: list[int] = field(default_factory=list)    # kept bytes, per device
    static: list[int] = field(default_factory=list)             # params + grads, per device
    cuda_peak: list[int] = field(default_factory=list)          # max_memory_allocated (GPU)
    step_time: float = 0.0
    loss: float | None = None

    @property
    def makespan(self) -> float:
        """First start to last end over all actions of all devices (as the simulator's)."""
        if not self.actions:
            return 0.0
        return max(a.end for a in self.actions) - min(a.start for a in self.actions)

    def find(self, op: str, stage: int, microbatch: int) -> MeasuredAction:
        for a in self.actions:
            if a.op == op and a.stage == stage and a.microbatch == microbatch:
                return a
        raise KeyError((op, stage, microbatch))

    def memory_timeline(self, device: int) -> list[tuple[float, int]]:
        level, curve = self.static[device] if self.static else 0, []
        start = min((a.start for a in self.actions), default=0.0)
        curve.append((start, level))
        for when, _, delta in sorted(self.memory_events[device]):
            level += delta
            if curve[-1][0] == when:
                curve[-1] = (when, level)
            else:
                curve.append((when, level))
        return curve

    def to_sim_result(self, schedule: Schedule, problem: Problem | None = None) -> SimResult:
        """The measured step in the simulator's result type (for Gantt charts and JSON).

        ``problem`` only supplies budgets and names; every time and byte is measured.
        """
        base = problem or uniform_problem(schedule.devices, schedule.microbatches,
                                          name="measured")
        prob = problem_for(base, schedule)
        records = [ActionRecord(a.device, a.action, a.start, a.end, a.start, a.lane)
                   for a in self.actions]
        records.sort(key=lambda r: (r.start, r.device, r.lane))
        D = schedule.devices
        busy, lo, hi = [0.0] * D, [float("inf")] * D, [0.0] * D
        for r in records:
            if r.lane == COMPUTE:
                busy[r.device] += r.end - r.start
                lo[r.device] = min(lo[r.device], r.start)
                hi[r.device] = max(hi[r.device], r.end)
        makespan = self.makespan
        span = [h - l if l != float("inf") else 0.0 for l, h in zip(lo, hi)]
        static = self.static or [0] * D
        return SimResult(
            schedule=schedule, problem=prob, records=records, makespan=makespan,
            bubble_rate=1.0 - sum(busy) / (D * makespan) if makespan > 0 else 0.0,
            device_busy=busy, device_span=span,
            peak_memory=[static[d] + self.peak_activation[d] for d in range(D)],
            memory_timeline=[self.memory_timeline(d) for d in range(D)],
            budget=list(prob.budget), start_time=min((r.start for r in records), default=0.0),
            extra={"measured": True, "step_time": self.step_time})

    def to_json(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule, "devices": self.devices, "stages": self.stages,
            "microbatches": self.microbatches, "step_time": self.step_time,
            "makespan": self.makespan, "loss": self.loss,
            "peak_activation": self.peak_activation, "static": self.static,
            "cuda_peak": self.cuda_peak,
            "actions": [vars(a) for a in self.actions],
        }


class Clock:
    """Action timestamps: host ``perf_counter`` on CPU, CUDA events on a GPU.

    CUDA events are recorded on the stream that runs the work, so a GPU action's start
    and end are when the device ran it, not when Python issued it; they are resolved
    into seconds once the step is synchronized.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.t0: float = 0.0
        self.e0: Any = None

    def start(self) -> None:
        self.t0 = time.perf_counter()
        if self.cuda:
            self.e0 = torch.cuda.Event(enable_timing=True)
            self.e0.record(torch.cuda.current_stream(self.device))

    def mark(self, stream: Any = None) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(stream or torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def host(self) -> float:
        """Host seconds since the step's start (accounting events are ordered by these)."""
        return time.perf_counter() - self.t0

    def seconds(self, mark: Any) -> float:
        if self.cuda:
            return self.e0.elapsed_time(mark) / 1e3
        return mark - self.t0
