"""pipeoffload: fit a budget that fixed schedules exceed by sending activations to host memory.

In the spirit of PipeOffload (Wan et al. 2025): on the first stages of a pipeline a
microbatch's activations sit idle for a long time between its F and its backward, and
that idle time is long enough to hide a device-to-host copy and the copy back. Offloading
exactly those microbatches lowers the peak without slowing the step, as long as each round
trip hides behind compute. The paper builds on interleaved and V-shaped placements, where
a microbatch's first chunk waits longest; so do we.

How the microbatches are chosen (by simulating, never by formula):

1. start from each of four orders: ZB-H1, 1F1B, interleaved 1F1B (2 chunks) and ZB-V;
2. simulate; on every device over its budget, walk the moments its memory is over budget
   and, at each, pick microbatches kept at that moment whose activations could be away
   over it: their ``OFFLOAD`` (issued right after their F, so the copy starts when the F
   ends) is estimated to finish before the moment, and their ``RELOAD`` is issued after
   it. Longest time-away first, until the moment is under budget;
3. the RELOAD is placed after the latest compute action that still leaves the whole copy
   back before the backward starts (so the backward does not wait), never before the
   OFFLOAD; if no such action exists the microbatch is not offloaded (a later round may
   accept an unhidden reload when nothing else helps);
4. a device whose excess no offload can remove (the ``freed_by_w`` bytes of deferred W's,
   which cannot be offloaded after their B) runs W's sooner instead: with ZB-H1 its W's
   move that many steps earlier (down to 1F1B's order); with ZB-V, the W held longest
   at the first moment over budget moves to right after its B;
5. re-simulate and repeat a few rounds;
6. if it still does not fit, **hold back** the devices still over budget, round by
   round (:func:`_hold_back`): first the OFFLOADs already chosen get ``wait`` (the
   device issues nothing more until the copy has ended); then, at each moment over
   budget, the microbatches kept then are offloaded right after their F with ``wait``
   and reloaded right before their backward; if that does not settle, every
   microbatch of such a device is. A device held back entirely holds one activation at
   a time, so this fits wherever one activation (and what the base's W's keep) fits,
   at the price of the transfers on its critical path: the only way to keep several
   microbatches in flight on a device whose room holds about one (a 70B model on 16
   H100s: 14.0 s against 67.1 s without offload).
   Among all bases, the shortest schedule that fits wins; if none fits, the one that
   overshoots least, with ``provenance["fits"] = False``.

The simulator's transfer rules apply: a transfer is issued when the compute action listed
before it ends, runs on its device's one channel per direction in list order, a RELOAD
reserves its bytes at issue and an OFFLOAD frees them at its end, and the backward waits
for the RELOAD.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from optpipe.errors import OptPipeError
from optpipe.generators.base import Order, require_base
from optpipe.generators.classic import one_f_one_b_orders
from optpipe.generators.zero_bubble import zb_h1_orders
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule, linear_placement
from optpipe.simulator import ActionRecord, SimResult, simulate

#: Rounds of offloading per base. ZB-V may need one round per W it runs sooner.
ROUNDS = 30

#: Rounds of holding devices back (step 6, :func:`_hold_back`): each simulates once.
HOLD_BACK_ROUNDS = 12

Key = tuple[int, int]              # (stage, microbatch)
Slot = tuple[str, int, int]        # a compute action (op, stage, microbatch)


@dataclass
class _Plan:
    """One base order, the offloaded microbatches and where each one's RELOAD goes.

    ``delays`` (ZB-H1 only) is how many steady steps each stage defers its W's (ZB-H1
    uses ``s`` on stage ``s``); the orders are rebuilt from it. Deferred W's keep
    ``freed_by_w`` bytes that cannot be offloaded any more (an OFFLOAD must precede the
    backward), so a stage whose excess is made of those gets its delay lowered instead.
    Other bases keep their orders here and have single W's moved sooner.
    """

    base: str
    placement: list[int]
    base_orders: list[Order]
    delays: list[int] | None = None
    reload_after: dict[Key, Slot] = field(default_factory=dict)
    waited: set[Key] = field(default_factory=set)     # offloads that hold the device back

    def orders(self, problem: Problem) -> list[Order]:
        if self.delays is not None:
            return zb_h1_orders(problem.devices, problem.microbatches, self.delays)
        return self.base_orders

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
                    acts.append(Action(Op.OFFLOAD, s, m, wait=(s, m) in self.waited))
                for ks, km in sorted(after.get((op, s, m), []), key=lambda k: (k[1], k[0])):
                    acts.append(Action(Op.RELOAD, ks, km))
            actions.append(acts)
        per_device = [0] * problem.devices
        for s, _ in self.reload_after:
            per_device[self.placement[s]] += 1
        provenance: dict[str, Any] = {"source": "generator", "name": "pipeoffload",
                                      "base": self.base, "offloaded": per_device}
        if self.delays is not None:
            provenance["w_delays"] = list(self.delays)
        if self.waited:
            held = [0] * problem.devices
            for s, _ in self.waited:
                held[self.placement[s]] += 1
            provenance["held_back"] = held
        if fits is not None:
            provenance["fits"] = fits
        return Schedule(name="pipeoffload", stages=len(self.placement),
                        devices=problem.devices, microbatches=problem.microbatches,
                        placement=list(self.placement), actions=actions,
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


def _compute_records(result: SimResult) -> dict[Slot, ActionRecord]:
    return {(r.action.op.value, r.action.stage, r.action.microbatch): r
            for r in result.records if r.action.op.is_compute}


def _improve(problem: Problem, plan: _Plan, result: SimResult,
             rec: dict[Slot, ActionRecord], hidden: bool) -> list[int]:
    """One round of steps 2-3 of the module docstring; the over-budget devices it did not help."""
    judged = result.problem                       # split into chunks when the base is
    orders = plan.orders(problem)
    stuck = []
    for d in result.over_budget():
        order = orders[d]
        options = []
        for op, s, m in order:
            if op != "F" or (s, m) in plan.reload_after or judged.activation[s] == 0:
                continue
            slot = _reload_slot(order, rec, (s, m), judged.reload_time(s), hidden)
            if slot is None:
                continue
            away_from, away_to = rec[("F", s, m)].end + judged.offload_time(s), rec[slot].end
            if away_to > away_from:
                options.append((away_to - away_from, away_from, away_to, (s, m), slot))
        options.sort(key=lambda o: (-o[0], o[3]))
        chosen: list[tuple[float, float, int]] = []
        added = False
        for t, level in _over_moments(result, d):
            level -= sum(size for lo, hi, size in chosen if lo <= t < hi)
            for option in options:
                if level <= result.budget[d]:
                    break
                _, lo, hi, key, slot = option
                if key in plan.reload_after or not lo <= t < hi:
                    continue
                plan.reload_after[key] = slot
                size = judged.activation[key[0]]
                chosen.append((lo, hi, size))
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


def _run_w_sooner(plan: _Plan, result: SimResult, rec: dict[Slot, ActionRecord],
                  d: int) -> bool:
    """Move the W held longest at device d's first moment over budget to right after its B.

    Reload slots that no longer lie between their F and their backward are dropped (the
    next round may offload those microbatches again).
    """
    if plan.delays is not None:
        return False
    order = plan.base_orders[d]
    over = _over_moments(result, d)
    if not over:
        return False
    t = over[0][0]
    held = [k for k in order if k[0] == "W" and rec[("B",) + k[1:]].end <= t < rec[k].start]
    if not held:
        return False
    w = min(held, key=lambda k: rec[("B",) + k[1:]].end)
    order.remove(w)
    order.insert(order.index(("B",) + w[1:]) + 1, w)
    pos = {k: i for i, k in enumerate(order)}
    for key, slot in list(plan.reload_after.items()):
        if slot in pos and not (pos[("F",) + key] < pos[slot]
                                < pos[(_backward_op(order, key),) + key]):
            del plan.reload_after[key]
    return True


def _hold_back(problem: Problem, plan: _Plan, result: SimResult,
               everything: bool = False) -> bool:
    """One round of step 6 of the module docstring on the devices still over budget.

    In turn, the first that changes something: (1) the OFFLOADs the rounds chose become
    waited for; (2) at each moment a device is over budget, the microbatches kept then
    are held back, longest kept first, until the moment is under budget: offloaded
    right after the F with a wait, reloaded right before the backward; (3) every
    microbatch of the device is (at once with ``everything``).

    Why it fits where the rounds could not: the wait keeps the next action back until
    the copy has ended, so a device held back entirely holds one microbatch's activation
    at a time (plus what its W's keep), whatever its compute order; the price is each
    transfer on the device's critical path, so (1) and (2) try to pay it for fewer
    microbatches first. False when it changed nothing.
    """
    judged = result.problem
    orders = plan.orders(problem)
    over = result.over_budget()
    chosen = [k for k in plan.reload_after if k not in plan.waited
              and plan.placement[k[0]] in over]
    if chosen and not everything:
        plan.waited.update(chosen)
        return True
    slots: dict[int, dict[Key, Slot]] = {}        # device -> held-back option -> slot
    for d in over:
        order = orders[d]
        slots[d] = {}
        for i, (op, s, m) in enumerate(order):
            if op in ("B", "BW") and judged.activation[s] > 0 \
                    and order[i - 1] != ("F", s, m):        # something between F and B
                slots[d][(s, m)] = order[i - 1]
    rec = _compute_records(result)
    changed = False
    for d in over if not everything else ():
        order, held = orders[d], set()

        def kept_at(key: Key, t: float) -> bool:
            return rec[("F",) + key].start <= t < rec[(_backward_op(order, key),) + key].end

        for t, level in _over_moments(result, d):
            kept = sorted((k for k in slots[d] if k not in held and k not in plan.waited
                           and kept_at(k, t)),
                          key=lambda k: (rec[("F",) + k].start, k))   # longest kept first
            level -= sum(judged.activation[k[0]] for k in held if kept_at(k, t))
            for k in kept:
                if level <= result.budget[d]:
                    break
                held.add(k)
                level -= judged.activation[k[0]]
        for k in held:
            plan.reload_after[k] = slots[d][k]
            plan.waited.add(k)
            changed = True
    if changed:
        return True
    for d in over:                # (3): all of them, each reloaded right before its B
        for k, slot in slots[d].items():
            if k not in plan.waited or plan.reload_after.get(k) != slot:
                plan.reload_after[k] = slot
                plan.waited.add(k)
                changed = True
    return changed


def _fit(problem: Problem, plan: _Plan, give_up_at: float | None = None
         ) -> tuple[_Plan, SimResult]:
    """Rounds of offloading (and, for a split backward, of earlier W's) until it fits;
    given ``give_up_at``, also until a round that still does not fit takes that long;
    then, if nothing fit, the devices still over budget held back (:func:`_hold_back`).
    """
    result = simulate(problem, plan.schedule(problem))
    best = (_rank(result), _snapshot(plan), result)
    hidden = True
    for _ in range(ROUNDS):
        if result.fits or (give_up_at is not None and result.makespan >= give_up_at):
            break
        rec = _compute_records(result)       # one lookup per round, shared by both steps
        stuck = _improve(problem, plan, result, rec, hidden)
        lowered = [d for d in stuck if _lower_delay(problem, plan, result, d)
                   or _run_w_sooner(plan, result, rec, d)]
        if len(stuck) == len(result.over_budget()) and not lowered:
            if not hidden:
                break
            hidden = False          # nothing hides any more: accept waiting reloads
            continue
        result = simulate(problem, plan.schedule(problem))
        if _rank(result) < best[0]:
            best = (_rank(result), _snapshot(plan), result)
    # step 6: a few microbatches held back at a time, then every one of a device
    for rounds, everything in ((HOLD_BACK_ROUNDS, False), (HOLD_BACK_ROUNDS, True)):
        plan, result = _snapshot(best[1]), best[2]
        for _ in range(rounds):
            if result.fits or (give_up_at is not None and result.makespan >= give_up_at) \
                    or not _hold_back(problem, plan, result, everything):
                break
            result = simulate(problem, plan.schedule(problem))
            if _rank(result) < best[0]:
                best = (_rank(result), _snapshot(plan), result)
    return best[1], best[2]


def _snapshot(plan: _Plan) -> _Plan:
    return _Plan(plan.base, list(plan.placement), [list(o) for o in plan.base_orders],
                 None if plan.delays is None else list(plan.delays),
                 dict(plan.reload_after), set(plan.waited))


def _rank(result: SimResult) -> tuple[float, float]:
    """Fitting first by makespan; otherwise by how far the worst device is over."""
    over = max(p - b for p, b in zip(result.peak_memory, result.budget))
    return (0.0, result.makespan) if result.fits else (1.0 + over, result.makespan)


def _compute_orders(schedule: Schedule) -> list[Order]:
    return [[(a.op.value, a.stage, a.microbatch) for a in acts if a.op.is_compute]
            for acts in schedule.actions]


#: The base orders pipeoffload starts from (step 1 of the module docstring).
BASES = ("zb-h1", "1f1b", "interleaved-1f1b", "zb-v")


def _bases(problem: Problem, names: Sequence[str]) -> list[_Plan]:
    """The starting orders named; a chunked one is skipped if its generator declines."""
    from optpipe.generators.interleaved import interleaved_1f1b
    from optpipe.generators.zbv import zb_v

    D, M = problem.devices, problem.microbatches
    linear = linear_placement(D)
    chunked: dict[str, Callable[[Problem], Schedule]] = {
        "interleaved-1f1b": interleaved_1f1b, "zb-v": zb_v}
    plans = []
    for name in names:
        if name == "zb-h1":
            plans.append(_Plan("zb-h1", linear, [], delays=list(range(D))))
        elif name == "1f1b":
            plans.append(_Plan("1f1b", linear, one_f_one_b_orders(D, M)))
        else:
            try:
                base = chunked[name](problem)
            except OptPipeError:
                continue
            plans.append(_Plan(name, list(base.placement), _compute_orders(base)))
    return plans


def fit_by_offloading(problem: Problem, schedule: Schedule,
                      give_up_at: float | None = None) -> tuple[Schedule, SimResult]:
    """Steps 2-5 of the module docstring on any schedule's compute orders: offload (and
    run W's sooner) until they fit ``problem``'s budget, or come as close as they can.

    Why public: the optimizer plans list schedules for a looser budget than the real
    one and fits them here (:mod:`optpipe.optimizer.offload_starts`); the orders need
    not come from a fixed schedule. Transfers already in ``schedule`` are dropped.
    Returns the fitted schedule (named ``pipeoffload``, with ``schedule.name`` as its
    base in the provenance) and its simulation; ``result.fits`` says whether it fits.

    ``give_up_at`` (seconds): stop once a round that is still over budget takes at least
    that long — a caller that only wants schedules faster than what it has passes its
    best. Why that loses (almost) nothing: each round only adds transfers or moves W's
    earlier, and the makespan did not fall from one round to the next in any fit
    measured (2026-12-01, 16 x 64, 16 x 32, 8 x 32 and 4 x 16 at S/2 and S); a fit
    that cannot succeed otherwise runs all :data:`ROUNDS` (7 s each at 16 x 64).
    """
    plan = _Plan(schedule.name, list(schedule.placement), _compute_orders(schedule))
    plan, result = _fit(problem, plan, give_up_at)
    return plan.schedule(problem, fits=result.fits), result


def pipeoffload(problem: Problem, bases: Sequence[str] = BASES) -> Schedule:
    """Offload the activations that are away long enough, until the peak fits the budget.

    ``bases`` restricts the starting orders (e.g. ``("zb-h1", "1f1b")`` for one stage
    per device, which the optimizer's offload model needs as its warm start).
    """
    require_base(problem, "pipeoffload")
    unknown = [b for b in bases if b not in BASES]
    if unknown or not bases:
        raise OptPipeError(f"pipeoffload bases must be a non-empty choice of "
                           f"{', '.join(BASES)}; got {list(bases)}")
    best: tuple[tuple[float, float], _Plan, SimResult] | None = None
    for plan in _bases(problem, bases):
        plan, result = _fit(problem, plan)
        if best is None or _rank(result) < best[0]:
            best = (_rank(result), plan, result)
    if best is None:                  # only chunked bases were asked for, and they declined
        raise OptPipeError(f"pipeoffload: none of the bases {list(bases)} applies to this "
                           f"problem; include zb-h1 or 1f1b")
    _, plan, result = best
    return plan.schedule(problem, fits=result.fits)
