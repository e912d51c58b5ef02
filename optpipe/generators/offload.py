"""pipeoffload: fit a budget 1F1B/ZB-H1 exceed by sending chosen activations to host memory.

In the spirit of PipeOffload (Wan et al. 2025): on the first stages of a pipeline a
microbatch's activations sit idle for a long time between its F and its backward, and
that idle time is long enough to hide a device-to-host copy and the copy back. Offloading
exactly those microbatches lowers the peak without slowing the step, as long as each round
trip hides behind compute.

How the microbatches are chosen (by simulating, never by formula):

1. start from the ZB-H1 order and from the 1F1B order (each is tried);
2. simulate; on every device over its budget, walk the moments its memory is over budget
   and, at each, pick microbatches kept at that moment whose activations could be away
   over it: their ``OFFLOAD`` (issued right after their F, so the copy starts when the F
   ends) is estimated to finish before the moment, and their ``RELOAD`` is issued after
   it. Longest time-away first, until the moment is under budget;
3. the RELOAD is placed after the latest compute action that still leaves the whole copy
   back before the backward starts (so the backward does not wait), never before the
   OFFLOAD; if no such action exists the microbatch is not offloaded (a later round may
   accept an unhidden reload when nothing else helps);
4. a device whose excess no offload can remove (with ZB-H1, the ``freed_by_w`` bytes of
   deferred W's) runs its W's that many steps sooner instead (down to 1F1B's order);
5. re-simulate and repeat a few rounds. Among both bases, the shortest schedule that fits
   wins; if none fits, the one that overshoots least, with ``provenance["fits"] = False``.

The simulator's transfer rules apply: a transfer is issued when the compute action listed
before it ends, runs on its device's one channel per direction in list order, a RELOAD
reserves its bytes at issue and an OFFLOAD frees them at its end, and the backward waits
for the RELOAD.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from optpipe.generators.base import Order, require_base
from optpipe.generators.classic import one_f_one_b_orders
from optpipe.generators.zero_bubble import zb_h1_orders
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule, linear_placement
from optpipe.simulator import ActionRecord, SimResult, simulate

ROUNDS = 12

Key = tuple[int, int]              # (stage, microbatch)
Slot = tuple[str, int, int]        # a compute action (op, stage, microbatch)


@dataclass
class _Plan:
    """One base order, the offloaded microbatches and where each one's RELOAD goes.

    ``delays`` (split backward only) is how many steady steps each stage defers its W's
    (ZB-H1 uses ``s`` on stage ``s``). Deferred W's keep ``freed_by_w`` bytes that cannot
    be offloaded any more (an OFFLOAD must precede the backward), so a stage whose excess
    is made of those gets its delay lowered instead.
    """

    base: str
    delays: list[int] | None
    reload_after: dict[Key, Slot] = field(default_factory=dict)

    def orders(self, problem: Problem) -> list[Order]:
        D, M = problem.devices, problem.microbatches
        if self.delays is None:
            return one_f_one_b_orders(D, M)
        return zb_h1_orders(D, M, self.delays)

    def schedule(self, problem: Problem, fits: bool | None = None) -> Schedule:
        """Insert OFFLOAD after each chosen F and RELOAD after its chosen compute action."""
        after: dict[Slot, list[Key]] = {}
        for key, slot in self.reload_after.items():
            after.setdefault(slot, []).append(key)
        actions = []
        for order in self.orders(problem):
            acts = []
            for op, s, m in order:
                acts.append(Action(Op(op), s, m))
                if op == "F" and (s, m) in self.reload_after:
                    acts.append(Action(Op.OFFLOAD, s, m))
                for ks, km in sorted(after.get((op, s, m), []), key=lambda k: k[1]):
                    acts.append(Action(Op.RELOAD, ks, km))
            actions.append(acts)
        per_device = [0] * problem.devices
        for s, _ in self.reload_after:
            per_device[s] += 1
        provenance: dict[str, Any] = {"source": "generator", "name": "pipeoffload",
                                      "base": self.base, "offloaded": per_device}
        if self.delays is not None:
            provenance["w_delays"] = list(self.delays)
        if fits is not None:
            provenance["fits"] = fits
        return Schedule(name="pipeoffload", stages=problem.stages, devices=problem.devices,
                        microbatches=problem.microbatches,
                        placement=linear_placement(problem.devices), actions=actions,
                        provenance=provenance).validate()


def _backward_op(order: Order, key: Key) -> str:
    return "BW" if ("BW",) + key in order else "B"


def _reload_slot(order: Order, rec: dict[Slot, ActionRecord], key: Key, reload_time: float,
                 hidden: bool) -> Slot | None:
    """The latest compute action after F(key) whose end leaves time to reload before B."""
    s, m = key
    start = order.index(("F", s, m))
    stop = order.index((_backward_op(order, key), s, m))
    b_start = rec[(_backward_op(order, key), s, m)].start
    for slot in reversed(order[start + 1:stop]):
        if not hidden or rec[slot].end + reload_time <= b_start:
            return slot
    return None


def _over_moments(result: SimResult, d: int) -> list[tuple[float, int]]:
    budget = result.budget[d]
    return [(t, level) for t, level in result.memory_timeline[d] if level > budget]


def _improve(problem: Problem, plan: _Plan, result: SimResult, hidden: bool) -> list[int]:
    """One round of steps 2-3 of the module docstring; the over-budget devices it did not help."""
    rec = {(r.action.op.value, r.action.stage, r.action.microbatch): r
           for r in result.records if r.action.op.is_compute}
    orders = plan.orders(problem)
    stuck = []
    for d in result.over_budget():
        order = orders[d]
        added = False
        s = d  # linear placement: stage s lives on device s
        size = problem.activation[s]
        if size == 0:                # only static bytes: nothing to offload
            stuck.append(d)
            continue
        t_off, t_rel = problem.offload_time(s), problem.reload_time(s)
        options = []
        for m in range(problem.microbatches):
            if (s, m) in plan.reload_after:
                continue
            slot = _reload_slot(order, rec, (s, m), t_rel, hidden)
            if slot is None:
                continue
            away_from, away_to = rec[("F", s, m)].end + t_off, rec[slot].end
            if away_to > away_from:
                options.append((away_to - away_from, away_from, away_to, (s, m), slot))
        options.sort(key=lambda o: (-o[0], o[3]))
        chosen: list[tuple[float, float]] = []
        for t, level in _over_moments(result, d):
            level -= size * sum(1 for lo, hi in chosen if lo <= t < hi)
            for option in options:
                if level <= result.budget[d]:
                    break
                _, lo, hi, key, slot = option
                if key in plan.reload_after or not lo <= t < hi:
                    continue
                plan.reload_after[key] = slot
                chosen.append((lo, hi))
                level -= size
                added = True
        if not added:
            stuck.append(d)
    return stuck


def _lower_delay(problem: Problem, plan: _Plan, result: SimResult, d: int) -> bool:
    """Run stage d's W's sooner by as many steps as its excess is worth in W-held bytes."""
    if plan.delays is None or plan.delays[d] == 0:
        return False
    held = max(problem.freed_by_w[d], 1)
    excess = result.peak_memory[d] - result.budget[d]
    plan.delays[d] = max(0, plan.delays[d] - max(1, -(-int(excess) // held)))
    plan.reload_after = {k: v for k, v in plan.reload_after.items() if k[0] != d}
    return True


def _fit(problem: Problem, plan: _Plan) -> tuple[_Plan, SimResult]:
    """Rounds of offloading (and, for a split backward, of earlier W's) until it fits."""
    result = simulate(problem, plan.schedule(problem))
    best = (_rank(result), _snapshot(plan), result)
    hidden = True
    for _ in range(ROUNDS):
        if result.fits:
            break
        stuck = _improve(problem, plan, result, hidden)
        lowered = [d for d in stuck if _lower_delay(problem, plan, result, d)]
        if len(stuck) == len(result.over_budget()) and not lowered:
            if not hidden:
                break
            hidden = False          # nothing hides any more: accept waiting reloads
            continue
        result = simulate(problem, plan.schedule(problem))
        if _rank(result) < best[0]:
            best = (_rank(result), _snapshot(plan), result)
    return best[1], best[2]


def _snapshot(plan: _Plan) -> _Plan:
    return _Plan(plan.base, None if plan.delays is None else list(plan.delays),
                 dict(plan.reload_after))


def _rank(result: SimResult) -> tuple[float, float]:
    """Fitting first by makespan; otherwise by how far the worst device is over."""
    over = max(p - b for p, b in zip(result.peak_memory, result.budget))
    return (0.0, result.makespan) if result.fits else (1.0 + over, result.makespan)


def pipeoffload(problem: Problem) -> Schedule:
    """Offload the activations that are away long enough, until the peak fits the budget."""
    require_base(problem, "pipeoffload")
    D = problem.devices
    best: tuple[tuple[float, float], _Plan, SimResult] | None = None
    for plan in (_Plan("zb-h1", list(range(D))), _Plan("1f1b", None)):
        plan, result = _fit(problem, plan)
        if best is None or _rank(result) < best[0]:
            best = (_rank(result), plan, result)
    _, plan, result = best
    return plan.schedule(problem, fits=result.fits)
