"""Turning an engine's solution (start times, offload choices) into a Schedule.

Why placement of transfers matters: the simulator issues a transfer when the compute
action listed before it ends, and a RELOAD reserves its buffer at that issue. So the
list position *is* the reservation time. Engines state either which compute action a
reload is issued after (exact, what CP-SAT does) or the time the engine reserved the
buffer; in the latter case the RELOAD goes right after the last compute action whose
end is at or before that time, so the simulator never reserves earlier than the engine
counted. OFFLOADs go right after their F: issuing later never helps.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

from optpipe.memory.accounting import duration
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule, linear_placement

Key = tuple[Op, int, int]

# tie-break at equal start times (only zero-length tasks can tie): data order
_PRIORITY = {Op.F: 0, Op.B: 1, Op.BW: 1, Op.W: 2}


def orders_from_starts(problem: Problem, starts: Mapping[Key, float], *,
                       offloads: Mapping[tuple[int, int], float] | None = None,
                       reload_after: Mapping[tuple[int, int], Key] | None = None,
                       reload_issue: Mapping[tuple[int, int], float] | None = None,
                       waits: Collection[tuple[int, int]] = (),
                       name: str = "optpipe",
                       provenance: dict[str, Any] | None = None,
                       placement: list[int] | None = None) -> Schedule:
    """Build and validate the schedule whose per-device orders follow ``starts``.

    ``placement`` (stage -> device) defaults to one stage per device.

    ``starts`` maps every compute task ``(op, stage, microbatch)`` to its start (any time
    unit). ``offloads`` maps ``(stage, microbatch)`` to the fraction offloaded. Each
    reload is placed after ``reload_after[(s, m)]`` when given, else after the last
    compute action on its device whose end (from ``starts`` in *seconds* and the
    problem's durations) is at or before ``reload_issue[(s, m)]`` (and never before its
    OFFLOAD). Reloads after the same action keep microbatch order. The OFFLOADs of
    ``waits`` hold their device back (``wait``).
    """
    offloads = dict(offloads or {})
    D = problem.devices
    place = list(placement) if placement is not None else linear_placement(D)
    per_device: list[list[Key]] = [[] for _ in range(D)]
    for key in starts:
        per_device[place[key[1]]].append(key)
    for keys in per_device:
        keys.sort(key=lambda k: (starts[k], _PRIORITY[k[0]], k[2]))
    actions: list[list[Action]] = []
    for d, keys in enumerate(per_device):
        after: dict[int, list[Action]] = {}
        position = {k: i for i, k in enumerate(keys)}
        for (s, m), frac in sorted(offloads.items()):
            if place[s] != d:
                continue
            f_pos = position[(Op.F, s, m)]
            if reload_after is not None and (s, m) in reload_after:
                pos = position[reload_after[(s, m)]]
            elif reload_issue is not None and (s, m) in reload_issue:
                pos = f_pos
                for i, k in enumerate(keys):
                    end = starts[k] + duration(problem, Action(*k))
                    if i >= f_pos and end <= reload_issue[(s, m)] * (1 + 1e-12) + 1e-15:
                        pos = max(pos, i)
            else:
                raise ValueError(f"no reload position for stage {s}, microbatch {m}")
            after.setdefault(max(pos, f_pos), []).append(Action(Op.RELOAD, s, m, frac))
        seq: list[Action] = []
        for i, k in enumerate(keys):
            seq.append(Action(*k))
            if k[0] is Op.F and (k[1], k[2]) in offloads:
                seq.append(Action(Op.OFFLOAD, k[1], k[2], offloads[(k[1], k[2])],
                                  (k[1], k[2]) in waits))
            seq.extend(sorted(after.get(i, []), key=lambda a: a.microbatch))
        actions.append(seq)
    return Schedule(name=name, stages=len(place), devices=D,
                    microbatches=problem.microbatches, placement=place,
                    actions=actions,
                    provenance=provenance or {"source": "solver", "name": name}).validate()


def reload_positions(schedule: Schedule) -> dict[tuple[int, int], Key | None]:
    """For each reload, the compute action it is listed after (None: listed first)."""
    out: dict[tuple[int, int], Key | None] = {}
    for acts in schedule.actions:
        last: Key | None = None
        for a in acts:
            if a.op.is_compute:
                last = a.key
            elif a.op is Op.RELOAD:
                out[(a.stage, a.microbatch)] = last
    return out
