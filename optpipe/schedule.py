"""The Schedule: per device, the ordered actions; where it came from; its JSON file.

A schedule holds *orders*, never times: times come from simulating it against a
:class:`~optpipe.problem.Problem` (:mod:`optpipe.simulator`). Each device has one list of
actions in the order it issues them. Compute actions (``F``, ``B``, ``W``, ``BW``) run
one at a time in that order; ``OFFLOAD`` and ``RELOAD`` run on the device's host-link
channels (see the simulator for the exact rules) and are issued at their place in the
list.

``placement[s]`` is the device of model stage ``s``: ``[0, 1, …, D-1]`` for one stage per
device, ``[0, 1, …, D-1, 0, 1, …]`` for interleaved chunks, ``[0, …, D-1, D-1, …, 0]`` for
the V shape.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Iterator

from optpipe.errors import InvalidScheduleError, OptPipeError

FORMAT_VERSION = 1


class Op(str, Enum):
    """The kinds of action a device can issue."""

    F = "F"              # forward of one microbatch through one stage
    B = "B"              # backward for the input gradient only (sent upstream at once)
    W = "W"              # backward for the weight gradients (deferred)
    BW = "BW"            # fused backward: B and W together
    OFFLOAD = "OFFLOAD"  # move one microbatch's kept activations of a stage to host memory
    RELOAD = "RELOAD"    # bring them back before the backward that needs them

    @property
    def is_compute(self) -> bool:
        return self in (Op.F, Op.B, Op.W, Op.BW)

    @property
    def is_transfer(self) -> bool:
        return self in (Op.OFFLOAD, Op.RELOAD)


COMPUTE_OPS = (Op.F, Op.B, Op.W, Op.BW)
_PLAIN = frozenset(COMPUTE_OPS)


@dataclass(frozen=True)
class Action:
    """One action: an op on one stage for one microbatch.

    ``fraction`` (OFFLOAD/RELOAD only) is the share of the kept activation moved; the
    matching OFFLOAD and RELOAD carry the same fraction.

    ``wait`` (OFFLOAD only): the device holds back every action listed after this one
    until the copy has ended, so the bytes it frees are free before the next
    allocation. Why: without it a forward starts as soon as the one before it ends, so
    a device whose room holds about one activation can never have two in flight, however
    the transfers are placed (a 70B model on 16 H100s runs one microbatch at a time);
    with it, offloading every activation lets the pipeline fill.
    """

    op: Op
    stage: int
    microbatch: int
    fraction: float = 1.0
    wait: bool = False

    def __str__(self) -> str:
        extra = f"x{self.fraction:g}" if self.fraction != 1.0 else ""
        held = ", wait" if self.wait else ""
        return f"{self.op.value}{extra}(stage {self.stage}, mb {self.microbatch}{held})"

    @property
    def key(self) -> tuple[Op, int, int]:
        return (self.op, self.stage, self.microbatch)

    def to_json(self) -> list:
        item: list = [self.op.value, self.stage, self.microbatch]
        if self.fraction != 1.0 or self.wait:
            item.append(self.fraction)
        if self.wait:
            item.append("wait")
        return item


@dataclass
class Schedule:
    """Ordered actions per device, the stage placement, and provenance.

    ``provenance`` holds at least ``source`` (``generator`` or ``solver``) and ``name``;
    a solver adds ``solver``, ``status``, ``objective``, ``bound``, ``gap``,
    ``wall_time``, ``time_limit`` and ``problem_hash``.
    """

    name: str
    stages: int
    devices: int
    microbatches: int
    placement: list[int]
    actions: list[list[Action]]
    provenance: dict[str, Any] = field(default_factory=dict)

    # ----------------------------------------------------------------- queries
    @property
    def chunks(self) -> int:
        """Stages per device: 1, or v for interleaved and V-shaped placements."""
        return self.stages // self.devices

    @property
    def splits_backward(self) -> bool:
        return any(a.op is Op.W for acts in self.actions for a in acts)

    @property
    def offloads(self) -> bool:
        return any(a.op is Op.OFFLOAD for acts in self.actions for a in acts)

    def __iter__(self) -> Iterator[tuple[int, Action]]:
        for device, acts in enumerate(self.actions):
            for action in acts:
                yield device, action

    # -------------------------------------------------------------- validation
    def validate(self) -> "Schedule":
        """Check the schedule's structure; raise :class:`InvalidScheduleError` naming the action.

        Checks: placement covers every stage once with equal load per device; every action
        names a known stage on the device that runs it and a known microbatch; every
        (stage, microbatch) has exactly one F and exactly one backward (``B`` then ``W``,
        or ``BW``); on its device B comes after F and W after B; an OFFLOAD follows its F
        and precedes its RELOAD, which precedes the backward. Dependencies *across*
        devices are the simulator's to check (a cyclic wait is reported there).
        """
        S, D, M = self.stages, self.devices, self.microbatches
        if S < 1 or D < 1 or M < 1:
            raise InvalidScheduleError(f"schedule '{self.name}': stages, devices and "
                                       f"microbatches must be positive")
        if len(self.placement) != S:
            raise InvalidScheduleError(
                f"schedule '{self.name}': placement lists {len(self.placement)} stages, "
                f"expected {S}")
        for s, d in enumerate(self.placement):
            if not 0 <= d < D:
                raise InvalidScheduleError(f"schedule '{self.name}': stage {s} is placed on "
                                           f"unknown device {d}")
        if S % D or any(self.placement.count(d) != S // D for d in range(D)):
            raise InvalidScheduleError(f"schedule '{self.name}': placement {self.placement} "
                                       f"does not give every device the same number of stages")
        if len(self.actions) != D:
            raise InvalidScheduleError(f"schedule '{self.name}': has action lists for "
                                       f"{len(self.actions)} devices, expected {D}")
        seen: dict[tuple[Op, int, int], int] = {}
        placement = self.placement
        before = {op: need for op, (need, _) in self._NEEDS_BEFORE.items()}
        for device, acts in enumerate(self.actions):
            position: dict[tuple[Op, int, int], int] = {}
            for index, action in enumerate(acts):
                op, s, m = key = (action.op, action.stage, action.microbatch)
                # the common case, a plain F, B, W or BW in its place, checked inline; the
                # rest (and anything wrong) by _action_problem, which names the problem
                if not (op in _PLAIN and 0 <= s < S and 0 <= m < M and placement[s] == device
                        and not action.wait and key not in seen
                        and (op is Op.F or (before[op], s, m) in position)
                        and (op is not Op.B and op is not Op.BW
                             or (Op.OFFLOAD, s, m) not in position)):
                    problem = self._action_problem(device, action, position, seen, acts)
                    if problem:
                        raise InvalidScheduleError(
                            f"schedule '{self.name}', device {device}, action #{index} "
                            f"{action}: {problem}")
                seen[key] = device
                position[key] = index
        if not self._complete(seen):
            self._name_incomplete(seen)
        return self

    def _complete(self, seen: dict[tuple[Op, int, int], int]) -> bool:
        """Whether every (stage, microbatch) has its F, one backward and its reloads.

        Counting suffices given what the loop in :meth:`validate` already checked (no
        duplicates, every W after its B and every RELOAD after its OFFLOAD on its device).
        """
        count = Counter(op for op, _, _ in seen)
        cells = self.stages * self.microbatches
        backward = {(s, m) for op, s, m in seen if op is Op.B or op is Op.BW}
        return (count[Op.F] == cells and count[Op.B] + count[Op.BW] == cells
                and len(backward) == cells and count[Op.W] == count[Op.B]
                and count[Op.RELOAD] == count[Op.OFFLOAD])

    def _name_incomplete(self, seen: dict[tuple[Op, int, int], int]) -> None:
        """Raise naming the first (stage, microbatch) that lacks an action."""
        S, M = self.stages, self.microbatches
        for s in range(S):
            for m in range(M):
                has_f, has_b, has_w, has_bw, has_off, has_re = (
                    (op, s, m) in seen for op in (Op.F, Op.B, Op.W, Op.BW, Op.OFFLOAD, Op.RELOAD))
                problem = ("has no F" if not has_f
                           else "has both a fused BW and a split B/W" if has_bw and (has_b or has_w)
                           else f"has no {'B' if not has_b else 'W'} (and no fused BW)"
                           if not has_bw and not (has_b and has_w)
                           else "is offloaded and never reloaded" if has_off and not has_re
                           else "")
                if problem:
                    raise InvalidScheduleError(
                        f"schedule '{self.name}': stage {s}, microbatch {m} {problem}")
        raise AssertionError("_complete and _name_incomplete disagree")

    _NEEDS_BEFORE = {
        Op.B: (Op.F, "its F"), Op.BW: (Op.F, "its F"), Op.W: (Op.B, "its B"),
        Op.OFFLOAD: (Op.F, "its F"), Op.RELOAD: (Op.OFFLOAD, "an OFFLOAD"),
    }

    def _action_problem(self, device: int, action: Action,
                        position: dict[tuple[Op, int, int], int],
                        seen: dict[tuple[Op, int, int], int], acts: list[Action]) -> str:
        """What is wrong with one action given those before it ('' when nothing is).

        Kept separate so that the common, valid case builds no message strings.
        """
        S, M = self.stages, self.microbatches
        s, m = action.stage, action.microbatch
        if not 0 <= s < S:
            return f"unknown stage (there are {S})"
        if self.placement[s] != device:
            return (f"stage {s} is placed on device {self.placement[s]}, so a stage would "
                    f"run on two devices")
        if not 0 <= m < M:
            return f"unknown microbatch (there are {M})"
        if action.op.is_transfer and not 0.0 < action.fraction <= 1.0:
            return "fraction must be in (0, 1]"
        if action.wait and action.op is not Op.OFFLOAD:
            return "only an OFFLOAD can hold its device back (wait)"
        if action.key in seen:
            return f"duplicated (already at device {seen[action.key]})"
        need = self._NEEDS_BEFORE.get(action.op)
        if need is not None and (need[0], s, m) not in position:
            if any(a.key == (need[0], s, m) for a in acts):
                return f"comes before {need[1]}"
            return f"{need[1]} is missing on device {device}"
        if action.op in (Op.B, Op.BW) and (Op.OFFLOAD, s, m) in position \
                and (Op.RELOAD, s, m) not in position:
            return "its activations were offloaded and not reloaded before it"
        if action.op is Op.RELOAD and acts[position[(Op.OFFLOAD, s, m)]].fraction != action.fraction:
            return "moves a different fraction than its OFFLOAD"
        if action.op is Op.OFFLOAD and ((Op.B, s, m) in position or (Op.BW, s, m) in position):
            return "comes after the backward"
        return ""

    def check_fits(self, problem_stages: int, problem_devices: int, microbatches: int) -> None:
        """Reject a schedule made for a different pipeline than the problem describes."""
        if self.devices != problem_devices or self.stages % problem_devices:
            raise OptPipeError(
                f"schedule '{self.name}' is for {self.devices} devices but the problem has "
                f"{problem_devices}; generate or solve it for this problem")
        if self.microbatches != microbatches:
            raise OptPipeError(
                f"schedule '{self.name}' is for {self.microbatches} microbatches but the "
                f"problem has {microbatches}; generate or solve it for this problem")

    # ------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "optpipe-schedule",
            "version": FORMAT_VERSION,
            "name": self.name,
            "stages": self.stages,
            "devices": self.devices,
            "microbatches": self.microbatches,
            "placement": list(self.placement),
            "provenance": self.provenance,
            "actions": [[a.to_json() for a in acts] for acts in self.actions],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def schedule_from_dict(data: Any, origin: str = "schedule") -> Schedule:
    """Parse and validate schedule JSON data; errors name ``origin`` and the bad field."""
    if not isinstance(data, dict) or data.get("format") != "optpipe-schedule":
        raise InvalidScheduleError(f"{origin} is not an optpipe schedule (no "
                                   f"\"format\": \"optpipe-schedule\")")
    version = data.get("version")
    if version != FORMAT_VERSION:
        raise InvalidScheduleError(f"{origin} has format version {version!r}; this optpipe "
                                   f"reads version {FORMAT_VERSION}")
    try:
        actions = []
        for device, items in enumerate(data["actions"]):
            acts = []
            for index, item in enumerate(items):
                if not isinstance(item, list) or len(item) not in (3, 4, 5) or \
                        (len(item) == 5 and item[4] != "wait"):
                    raise InvalidScheduleError(
                        f"{origin}: device {device}, action #{index} {item!r} is not "
                        f"[op, stage, microbatch], [op, stage, microbatch, fraction] or "
                        f"[\"OFFLOAD\", stage, microbatch, fraction, \"wait\"]")
                try:
                    op = Op(item[0])
                except ValueError:
                    raise InvalidScheduleError(
                        f"{origin}: device {device}, action #{index} has unknown op "
                        f"{item[0]!r}; known: {[o.value for o in Op]}") from None
                if not all(isinstance(x, int) and not isinstance(x, bool) for x in item[1:3]):
                    raise InvalidScheduleError(f"{origin}: device {device}, action #{index} "
                                               f"{item!r}: stage and microbatch must be integers")
                fraction = float(item[3]) if len(item) >= 4 else 1.0
                acts.append(Action(op, item[1], item[2], fraction, wait=len(item) == 5))
            actions.append(acts)
        schedule = Schedule(
            name=str(data.get("name", origin)),
            stages=int(data["stages"]),
            devices=int(data["devices"]),
            microbatches=int(data["microbatches"]),
            placement=[int(d) for d in data["placement"]],
            actions=actions,
            provenance=dict(data.get("provenance") or {}),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidScheduleError(f"{origin} is missing or has a malformed field: "
                                   f"{exc}") from None
    return schedule.validate()


def load_schedule(path: str | Path) -> Schedule:
    """Read and validate a schedule JSON file."""
    path = Path(path)
    if not path.is_file():
        raise OptPipeError(f"schedule file {str(path)!r} does not exist")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidScheduleError(f"schedule file {str(path)!r} is not valid JSON: "
                                   f"{exc}") from None
    return schedule_from_dict(data, origin=f"schedule file {str(path)!r}")


def check_placement(placement: Iterable[int], devices: int | None = None) -> list[int]:
    """``placement`` (the device of each model stage) as a list, if it puts the same
    number of stages on each of the devices 0..D-1 (``devices``, else inferred)."""
    placement = [int(d) for d in placement]
    if devices is None:
        devices = max(placement) + 1 if placement else 0
    if (not placement or len(placement) % devices
            or sorted(set(placement)) != list(range(devices))
            or any(placement.count(d) != len(placement) // devices for d in range(devices))):
        raise OptPipeError(f"placement {placement} must use the devices 0..{devices - 1} "
                           f"equally: the same number of stages on each")
    return placement


def linear_placement(devices: int) -> list[int]:
    """One stage per device."""
    return list(range(devices))


def interleaved_placement(devices: int, chunks: int) -> list[int]:
    """Stage s on device s mod D (Megatron's interleaved virtual stages)."""
    return [s % devices for s in range(devices * chunks)]


def v_placement(devices: int) -> list[int]:
    """Two chunks per device in a V: stages 0..D-1 go down, D..2D-1 come back up."""
    return list(range(devices)) + list(range(devices - 1, -1, -1))


def searched_placements(devices: int) -> dict[str, list[int]]:
    """The placements the optimizer searches, by name: one stage per device, and from
    2 devices on the V shape and 2 interleaved chunks (what ZB-V and interleaved 1F1B
    use)."""
    named = {"linear": linear_placement(devices)}
    if devices >= 2:
        named.update(v=v_placement(devices), interleaved=interleaved_placement(devices, 2))
    return named


def placement_name(placement: Iterable[int], devices: int) -> str | None:
    """The name of ``placement`` in :func:`searched_placements`, else None."""
    placement = list(placement)
    return next((name for name, known in searched_placements(devices).items()
                 if placement == known), None)


def from_orders(name: str, placement: list[int], microbatches: int,
                orders: Iterable[Iterable[tuple[str | Op, int, int]]],
                provenance: dict[str, Any] | None = None) -> Schedule:
    """Build and validate a schedule from per-device ``(op, stage, microbatch)`` tuples."""
    actions = [[Action(Op(op), stage, mb) for op, stage, mb in device_order]
               for device_order in orders]
    devices = max(placement) + 1
    return Schedule(name=name, stages=len(placement), devices=devices,
                    microbatches=microbatches, placement=list(placement), actions=actions,
                    provenance=provenance or {"source": "generator", "name": name}).validate()
