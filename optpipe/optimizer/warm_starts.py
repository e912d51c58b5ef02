"""The optimizer's own warm starts, built before and after the engines' search.

Why: the engines start from the best schedule in hand on each placement, so a better
start is a better answer in the same minute, and some answers only these constructions
reach (the offload-aware list schedules and their randomized search: no engine searches
offload on the chunked placements). Each ``add_*`` function builds one kind, simulates
it (the simulator has the word) and adds what fits to the candidates
(:class:`~.preprocess.FixedSet`): list schedules of the chunked placements, the cached
answer of an older search, offloaded starts, periodic blocks, schedules extended from a
search on half the microbatches; :func:`refine_offloaded` spends the time the search
leaves over on offloaded starts near the winner. The driver (:func:`~.driver.solve`)
decides which to build and gives each its share of the time limit (the constants here).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from optpipe.errors import OptPipeError
from optpipe.optimizer import cache as cache_mod
from optpipe.optimizer.bounds import lower_bound, memory_bound
from optpipe.optimizer.candidates import (add_fitting, bar_to_beat, best_listed,
                                          fastest_in_hand, fitting_on, fused_is_faster)
from optpipe.optimizer.prefix import PrefixCuts
from optpipe.optimizer.preprocess import Candidate, FixedSet, fixed_schedules, task_graph
from optpipe.optimizer.result import EngineResult
from optpipe.optimizer.spaces import (build_seconds, expected_overrun, memory_lifts,
                                      placement_spaces, searched_shapes)
from optpipe.optimizer.waves import WAVES
from optpipe.problem import Problem
from optpipe.schedule import Schedule, linear_placement, placement_name
from optpipe.simulator import simulate
from optpipe.units import format_seconds

if TYPE_CHECKING:
    from optpipe.optimizer.offload_list import RandomizedSearch
    from optpipe.optimizer.spaces import ShapeBounds

#: Share of the time limit after which the list schedules (:func:`add_list_schedules`)
#: stop at the first of each kind per placement. Why a share at all: they take a fixed
#: time whatever the limit (about 4 s at 16 x 64 on 2 cores, ``scripts/
#: bench_presearch.py``), which put ``--stages 16 --microbatches 64 --mem 40GB
#: --time-limit 5`` at 13.2 s; at the default minute 20% is 12 s, more than they need,
#: so nothing changes there (``scripts/bench_time_limit.py`` measures both).
LIST_SCHEDULES_SHARE = 0.2
#: Share of the time limit for periodic blocks (:mod:`.periodic`), over all placements.
PERIODIC_SHARE = 0.08
#: ... and at most this many seconds per placement.
PERIODIC_MAX_SECONDS = 3.0
#: Share of the time before the extended schedules' largest source search that goes to
#: that source's prefix cuts (:func:`~.extend.extended_schedules`), where the cuts pay.
SOURCE_CUTS_SHARE = 0.4
#: Share of the time limit for extended schedules (:mod:`.extend`), when they are built.
EXTEND_SHARE = 0.25
#: ... and when their source (half the microbatches) has at least
#: :data:`EXTEND_LARGE_SOURCE_CELLS` stage x microbatch cells. Why: such a source is
#: not proven within a minute, so the time its search gets decides the extension. In
#: search revision 7 more was better (16 x 64 at S/2, one stage per device: 334.8 s
#: with 0.25 in three runs, 323.2-323.7 s with 0.6, 312.5 s with 0.8, and 0.75 chosen).
#: Since then the source search got faster, and 16 x 32 has many optima whose
#: extensions differ (304.0 s to 311.3 s from 161.7 s sources): the extensions alone,
#: by hand on 2026-12-07, gave 304.0 s (the 16 x 64 optimum) with 20, 27 and 33 s and
#: 307.4 and 311.3 s with 45 s. With 0.3 the driver's extension was the optimum in 12
#: of 12 runs and the search then probe (:mod:`.descent`) has the time to prove it
#: (two runs of ``python scripts/bench_descent.py``, docs/optimizer-log.md, search
#: revision 38: 3 of 3 within 0.5% each time; with 0.75 and the windows, 0 of 3 each
#: time, answers 304.0-311.9 s). At the edge, though: alone, 18 s gave 304.0 s once and
#: 313.6 s once, 27 s 304.0 s twice, 45 s 311.3 s twice (``python
#: scripts/bench_extend_share.py``). Through the driver 0.45 is no better: 5 of 6 runs
#: within 0.5% against 5 of 6 for 0.3 (its misses a probe out of time, 0.3's a worse
#: extension; ``python scripts/bench_descent.py --variants 'revision 38,share 0.45'``,
#: twice, docs/optimizer-log.md). Since search revision 39 no such extension is built
#: where the no-wait waves lead one stage per device (:func:`waves_lead`): 16 x 64 at
#: S/2 then starts from 304.4 s every time (3 of 3 driver runs within 0.5%, 0 of 3
#: without the waves, ``python scripts/bench_descent.py``).
EXTEND_SHARE_LARGE = 0.3
EXTEND_LARGE_SOURCE_CELLS = 512
#: Share of the time limit for the V shape's extended schedules
#: (:func:`add_chunked_extended`), where memory binds but not hard; their source is
#: searched with at most :data:`CHUNKED_EXTEND_MAX_SOURCE_CELLS` stage x microbatch
#: cells. Why that limit (``python scripts/bench_extend.py``, table in
#: docs/optimizer-log.md): at S the search on 8 x 32 (V shape, 256 cells) reaches 101.0 s
#: in 30 s and extends to 197.0 s at 8 x 64; the one on 16 x 32 (512 cells)
#: ends near 111 s, 15 s over the work, which extended to 16 x 64 is slower than the
#: 203.8-204.6 s the search there reaches alone.
CHUNKED_EXTEND_SHARE = 0.3
CHUNKED_EXTEND_MAX_SOURCE_CELLS = 256
#: Share of the time limit for offloaded list schedules (:mod:`.offload_starts`), when
#: offload is allowed and the budget holds the schedule back (:func:`add_offloaded_starts`)
#: and binds hard (:func:`~.candidates.memory_binds_hard`); where it does not bind hard
#: :data:`OFFLOAD_STARTS_SHARE_SOFT`. Why less there: at budget S the plans either fit at
#: once (8 x 16 and 16 x 32: the no-memory bound, in 0.2-1.3 s a try) or not at all
#: (16 x 64: no factor on any placement, 14.5 s of the minute gone, 206.4 s against
#: 204.3 s without offload); time the search leaves over comes back to them anyway
#: (:func:`refine_offloaded`).
OFFLOAD_STARTS_SHARE = 0.2
OFFLOAD_STARTS_SHARE_SOFT = 0.08
#: The time the offload-aware list schedules (:mod:`.offload_list`) may take before the
#: plans fitted by offloading, as a share of theirs (added to it); the first variant on
#: every placement runs whatever the time. Why first: where the host link is slow next
#: to compute they are far ahead (``--stages 8 --mem 40GB``: 4.05 s against the fitted
#: plans' 5.21 s), and a variant costs 0.02-0.3 s up to 16 x 32, while where the link
#: is fast the fitted plans can win and still run.
OFFLOAD_LIST_SHARE = 0.5
#: After the fitted plans, when an offloading schedule leads, the randomized runs
#: (:func:`add_randomized`) get this share of the offloaded starts' time again (search
#: revision 30): where an engine keeps the rest of the minute, the time left over is
#: too little (``--stages 16 --mem 40GB``: 3 s of runs, about 20, before).
OFFLOAD_LIST_AFTER_SHARE = 0.5
#: Time the search leaves over goes to the winning offloaded start's neighbours
#: (:func:`refine_offloaded`): CP-SAT's plans get this share of it, each at most
#: :data:`REFINE_PLAN_SECONDS` (16 x 16 at S/2: optimal for the looser budget in 5-11 s),
#: the finer factors the rest, then the plans not yet tried whatever is left.
REFINE_PLAN_SHARE = 0.6
#: Where an offload-aware list schedule (:mod:`.offload_list`) won, randomized runs
#: (:func:`add_randomized`) get this share of the time left first.
REFINE_RANDOMIZED_SHARE = 0.5
#: The randomized runs (:func:`add_randomized`) go round the placements whose best
#: offload-aware list schedule is within this share of the best one's, this long each.
RANDOMIZED_REACH = 0.05
RANDOMIZED_SLICE_SECONDS = 2.0
REFINE_PLAN_SECONDS = 15.0


def add_list_schedules(problem: Problem, fixed: FixedSet, split_backward: bool,
                       allowed: tuple[str, ...] | None = None,
                       deadline: float | None = None, floor: float | None = None,
                       use_offload: bool = False) -> None:
    """Add the fitting list schedules (:mod:`.listsched`) of the chunked placements.

    Why: at every budget they are cheap (about 2.5 s for both chunked placements at
    16 x 64, simulation included) and on the chunked placements often far better than
    any fixed schedule, which the engines' minute at 16 stages cannot make up (the
    16-stage preset: 1.820 s on the V shape against zb-auto's 1.944 s, which the search
    had returned). Added after the
    periodic blocks' trigger is decided (:func:`~.candidates.memory_binds_hard` compares fixed
    schedules only). Not on one stage per device: the fixed schedules hold memory-aware
    greedy list schedules there already (``preprocess.greedy_schedule``), and these
    were never faster than the best fixed schedule there
    (``scripts/bench_listsched.py``), only one more set of hints to sort. With split
    backwards, ZB-V's greedy holding back only part of each microbatch's later-chunk
    bytes (:func:`~.listsched.admission_schedules`; about 0.7 s per placement at 16 x 32).
    Past ``deadline`` (the driver's :data:`LIST_SCHEDULES_SHARE` of a short time limit)
    only the first of each kind per placement. Once a schedule in hand meets ``floor``
    (a bound below every schedule, :func:`~.spaces.least_bound`) no more are built: it
    is optimal (``--stages 16 --microbatches 64``: the V shape's first list schedule,
    and the other kinds took 4 s more).
    """
    from optpipe.optimizer.listsched import warm_start_kinds

    if meets(fixed, floor, use_offload, split_backward):
        return
    for label, place, split in searched_shapes(problem, split_backward, allowed):
        if place == linear_placement(problem.devices):
            continue
        for kind in warm_start_kinds(problem, place, split, deadline):
            add_fitting(problem, fixed, kind, label)
            if meets(fixed, floor, use_offload, split_backward):
                return


def meets(fixed: FixedSet, floor: float | None, use_offload: bool,
          split_backward: bool) -> bool:
    """Does the best schedule in hand (that may be returned) meet ``floor``, a bound
    below every schedule (:func:`~.spaces.least_bound`; None: none known)?"""
    if floor is None:
        return False
    best = bar_to_beat(fixed, use_offload, split_backward)
    return best is not None and best.makespan <= floor * (1 + 1e-9)


def add_previous(problem: Problem, fixed: FixedSet, key: str, split_backward: bool,
                 allowed: tuple[str, ...] | None) -> None:
    """Add the cached answer that :func:`~.cache.lookup` did not accept (an older
    search's, or one with less time, not proven) as a warm start named ``cached``.

    Why: solving again should never return slower than the schedule it replaces; the
    search starts from it on its placement, and the driver's never-worse rule returns
    it when nothing beats it. Added with the other warm starts, after the decisions
    taken on the fixed schedules alone (whether memory binds hard, whether offloading
    can help).
    """
    hit = cache_mod.previous(problem, key)
    if hit is None or (not split_backward and hit.schedule.splits_backward):
        return
    label = placement_name(hit.schedule.placement, problem.devices)
    if allowed is not None and label not in allowed:
        return
    schedule = replace(hit.schedule, name="cached", provenance={
        **hit.schedule.provenance, "source": "optimizer", "name": "cached",
        "cached_from": str(hit.path), "placement": label})
    fixed.candidates.append(Candidate("cached", schedule, hit.result))


def add_offloaded_starts(problem: Problem, fixed: FixedSet, split_backward: bool,
                         allowed: tuple[str, ...] | None, seconds: float,
                         searches: dict[str, RandomizedSearch]) -> None:
    """Add the fitting offloaded list schedules (:mod:`.offload_starts`) of every placement.

    Why: with offload allowed no engine searches the chunked placements, and the tight
    offload model on one stage per device found nothing faster than pipeoffload within
    the minute from 4 x 16 on (S/2 on the benchmark); these plans for a looser budget,
    fitted by offloading, beat pipeoffload on the benchmark at S/2 (docs/optimizer.md,
    "Offloaded list schedules"). Only when some schedule without offload is faster but
    does not fit (otherwise offloading cannot help); the caller decides that on the
    fixed schedules, before its own warm starts join them (since search revision 16: the
    admission schedules at budget S start ahead of every fixed schedule that does not
    fit, 54.9 s against ZB-H2's 55.4 s at 8 x 16, and deciding after them dropped these
    starts where they are the answer: 8 x 16 with offload went from 51.85 s, proven, to
    52.55 s, and 16 x 32 from 104.25 s to 108.95 s, in the table's run). The chunked
    placements first, factor by factor (they gave every fastest one; interleaved chunks
    before the V shape), one stage per device last, until ``seconds`` have passed.

    Before them (search revision 29) the offload-aware list schedules
    (:mod:`.offload_list`), which decide the transfers as they are built: the first
    variant on every placement whatever the time (with its copies listed at once and
    deferred, :data:`~.offload_list.DEFERRED_VARIANTS`), the others and then randomized runs
    (:func:`add_randomized`) within :data:`OFFLOAD_LIST_SHARE` of ``seconds`` (on top
    of it: the fitted plans keep their own ``seconds``; a variant costs 0.02-0.3 s up
    to 16 x 32). Randomized runs here too, not only with the time the search leaves
    over: at ``--stages 4 --mem 80GB`` the V shape's order model keeps the whole
    minute (and the library's 180 s) without beating the offloaded start, 7.249 s.
    """
    from optpipe.optimizer.offload_list import VARIANTS, offload_list_schedules
    from optpipe.optimizer.offload_starts import FACTORS, offloaded_list_schedules

    linear = linear_placement(problem.devices)
    shapes = searched_shapes(problem, split_backward, allowed)
    # the offload-aware list schedules first (chunked placements first): the first
    # variant on each placement, then the others while OFFLOAD_LIST_SHARE of the time lasts
    until = time.monotonic() + seconds * OFFLOAD_LIST_SHARE
    ordered = sorted(shapes, key=lambda s: (s[1] == linear, s[0] != "interleaved"))
    for variants, by in ((VARIANTS[:1], None), (VARIANTS[1:], until)):
        for label, place, split in ordered:
            add_fitting(problem, fixed, offload_list_schedules(
                problem, place, split, variants=variants, deadline=by), label)
    # what is left of that share: randomized runs, here rather than only with time the
    # search leaves over, which an engine may keep
    add_randomized(problem, fixed, until, searches)
    tries = sorted(((factor, shape) for factor in FACTORS for shape in shapes),
                   key=lambda t: (t[1][1] == linear, FACTORS.index(t[0]),
                                  t[1][0] != "interleaved"))
    deadline = time.monotonic() + seconds
    for factor, (label, place, split) in tries:
        if time.monotonic() > deadline:
            break
        add_fitting(problem, fixed, offloaded_list_schedules(
            problem, place, split, factor, deadline=deadline,
            bar=fastest_in_hand(fixed, split_backward)), label)
    # an offloading schedule leads: the randomized runs again (the fitted plans may have
    # overtaken the offload-aware ones, which the runs can take back)
    best = bar_to_beat(fixed, True, split_backward)
    if best is not None and best.schedule.offloads:
        add_randomized(problem, fixed,
                       time.monotonic() + seconds * OFFLOAD_LIST_AFTER_SHARE, searches)


def add_randomized(problem: Problem, fixed: FixedSet, deadline: float,
                   searches: dict[str, RandomizedSearch],
                   bound: float | None = None) -> int:
    """Randomized runs of the offload-aware list schedules' greedy
    (:class:`.offload_list.RandomizedSearch`) until ``deadline``, round-robin in slices
    of :data:`RANDOMIZED_SLICE_SECONDS` over every placement whose best such schedule
    is within :data:`RANDOMIZED_REACH` of the best one's; each placement's search is
    kept in ``searches`` (by label) from call to call, and what it finds joins
    ``fixed`` (a placement's best is also its warm start); they stop early once one
    meets ``bound``. Returns how many runs were made (0 when there is no such
    schedule).

    Why every placement, not only the best one's: the greedy's first variants do not
    rank the placements as the randomized runs do (``python
    scripts/bench_offload_list.py --detail``: on the benchmark's 8 x 16 at S/2 the
    interleaved chunks start 52.5 s against the V shape's 53.1 s, and reach 51.9 s in
    20 s where the V shape reaches 51.85 s, the optimum; 8 x 32 likewise, 99.9 s
    against 99.85 s, the bound)."""
    from optpipe.optimizer.offload_list import RandomizedSearch

    leader = best_listed(fixed)
    if leader is None or time.monotonic() >= deadline:
        return 0
    bests: dict[str, Candidate] = {}          # each placement's best, in one pass
    for c in fixed.candidates:
        label = c.schedule.provenance.get("placement")
        if c.fits and "offload_list" in c.schedule.provenance and (
                label not in bests or c.makespan < bests[label].makespan):
            bests[label] = c
    labels = sorted((label for label, best in bests.items()
                     if best.makespan <= leader.makespan * (1 + RANDOMIZED_REACH)),
                    key=lambda label: bests[label].makespan)
    for label in labels:
        own = bests[label]
        if label not in searches or own.makespan < searches[label].makespan * (1 - 1e-9):
            searches[label] = RandomizedSearch(
                problem, own.schedule.placement, own.schedule.splits_backward,
                own.schedule.provenance["offload_list"], own.makespan,
                seed=len(searches))
    before = sum(searches[label].runs for label in labels)

    def done() -> bool:
        return time.monotonic() >= deadline or (bound is not None and min(
            searches[label].makespan for label in labels) <= bound * (1 + 1e-9))

    while not done():
        for label in labels:
            if done():
                break
            now = time.monotonic()
            found = searches[label].run(min(deadline, now + RANDOMIZED_SLICE_SECONDS))
            add_fitting(problem, fixed, [found] if found else [], label)
    return sum(searches[label].runs for label in labels) - before


def refine_offloaded(problem: Problem, fixed: FixedSet, runs: list[EngineResult],
                     split_backward: bool, allowed: tuple[str, ...] | None,
                     deadline: float, threads: int, bound: float | None,
                     heartbeat: Callable[[], None] | None,
                     searches: dict[str, RandomizedSearch]) -> str | None:
    """Spend the time the search left over on offloaded starts near the one that won:
    CP-SAT's plans for looser budgets (:data:`~.offload_starts.SEARCHED_FACTORS`) on the
    chunked placements (the winner's placement first), then list plans for the finer
    factors on the winner's placement.

    Why: at S/2 with offload the offloaded list schedules are ahead of every engine's
    reach, so the search ended after 6-24 s of the minute (search revision 11), and the
    searched plans are often better (``scripts/bench_offload_starts.py``, 5 s each: 4 x
    8 on the V shape 25.65 s, the no-memory bound, against 26.8 s; 16 x 16 interleaved
    58.05 s against 59.8 s, 57.8 s given the driver's 15 s), though not at every factor
    (8 x 32: 103.6 s at 2.25 against the list plans' 102.4 s, 101.9 s at 2). On the
    benchmark at S/2 this took 8 x 16 from 53.2 s to 51.95 s and proved 4 x 8
    (docs/optimizer-log.md, search revision 12). CP-SAT's plans get
    :data:`REFINE_PLAN_SHARE` of the time left, each run at most
    :data:`REFINE_PLAN_SECONDS`; once every factor and placement has had CP-SAT's
    default seed, the others of :data:`~.offload_starts.PLAN_SEEDS` (a plan's fit
    depends on which optimal order the seed picks: 4 x 8 at S/2, 26.0 s with the default
    alone, 25.65 s, proven, with seed 0). Since search revision 29, randomized runs of
    the offload-aware list schedules' greedy (:func:`add_randomized`, until one meets
    ``bound``) get :data:`REFINE_RANDOMIZED_SHARE` of the time first (revision 29's, 20
    s each, ``python scripts/bench_offload_list.py --detail``: 4.05 -> 3.912 s at
    ``--stages 8 --mem 40GB``, 7.249 -> 7.122 s at ``--stages 4 --mem 80GB``). Only when
    the answer would be an offloading schedule (pipeoffload's too, since revision 29; no
    engine run beat it), until one meets ``bound``. Returns what it did, for the
    result's message (the time is otherwise unaccounted for: no engine's run shows it),
    or None when it did not run.
    """
    from optpipe.optimizer.offload_starts import (FINER_FACTORS, PLAN_SEEDS,
                                                  SEARCHED_FACTORS,
                                                  offloaded_list_schedules,
                                                  offloaded_searched_plan)

    best = bar_to_beat(fixed, True, split_backward)
    if best is None or not best.schedule.offloads or any(
            r.objective is not None and r.objective < best.makespan * (1 - 1e-9)
            for r in runs):
        return None
    began, before = time.monotonic(), best.makespan
    listed = best_listed(fixed)
    won = best.schedule.provenance.get("placement") or (
        listed.schedule.provenance["placement"] if listed else None)
    linear = linear_placement(problem.devices)
    shapes = sorted(searched_shapes(problem, split_backward, allowed), key=lambda s: s[0] != won)
    plans = [(seed, factor, shape) for seed in PLAN_SEEDS for factor in SEARCHED_FACTORS
             for shape in shapes if shape[1] != linear]
    planned = len(plans)
    finer_tried = 0

    def proven() -> bool:
        now = fastest_in_hand(fixed, split_backward)
        return bound is not None and now is not None and now <= bound * (1 + 1e-9)

    def search_plans(until: float) -> None:
        while plans and not proven():
            seed, factor, (label, place, split) = plans[0]
            limit = min(until - time.monotonic(), REFINE_PLAN_SECONDS) \
                - expected_overrun(problem, place, "cpsat")
            if limit < max(1.0, build_seconds(problem)):
                return
            plans.pop(0)
            add_fitting(problem, fixed, offloaded_searched_plan(
                problem, place, split, factor, time_limit=limit, threads=threads,
                bar=fastest_in_hand(fixed, split_backward), seed=seed), label)
            if heartbeat:
                heartbeat()

    label, place, split = shapes[0]                  # the winner's placement
    # randomized runs of the offload-aware list schedules first (every close placement)
    randomized_runs = 0 if listed is None else add_randomized(
        problem, fixed, time.monotonic() + (deadline - time.monotonic())
        * REFINE_RANDOMIZED_SHARE, searches, bound)
    search_plans(time.monotonic() + (deadline - time.monotonic()) * REFINE_PLAN_SHARE)
    for finer in FINER_FACTORS:
        if time.monotonic() > deadline or proven():
            break
        finer_tried += 1
        add_fitting(problem, fixed, offloaded_list_schedules(
            problem, place, split, finer, deadline=deadline,
            bar=fastest_in_hand(fixed, split_backward)), label)
        if heartbeat:
            heartbeat()
    search_plans(deadline)           # what the finer factors left: the plans not tried
    after = fastest_in_hand(fixed, split_backward)
    found = (f"{format_seconds(before)} -> {format_seconds(after)}"
             if after is not None and after < before * (1 - 1e-9) else "nothing faster")
    randomized_note = (f"{randomized_runs} randomized offload-aware list schedules, "
                       if randomized_runs else "")
    return (f"then {time.monotonic() - began:.0f} s on offloaded plans ({randomized_note}"
            f"{planned - len(plans)} of CP-SAT's for looser budgets, {finer_tried} finer "
            f"list-plan factors): {found}")


def add_periodic(problem: Problem, fixed: FixedSet, split_backward: bool,
                 use_offload: bool, seconds: float, threads: int,
                 allowed: tuple[str, ...] | None = None) -> None:
    """Add periodic schedules (:mod:`.periodic`) on every placement to ``fixed``.

    Why: when memory binds they are often far better than any fixed schedule (a V-shaped
    block at half of 1F1B's memory), and the engines start from the best schedule on
    each placement, so a better start is a better answer in the same time. Called only
    when memory binds hard (:func:`~.candidates.memory_binds_hard`): measured at budget S (1F1B's
    memory) the blocks never beat the fixed schedules, and their time is better spent
    searching. Not on one stage per device where the no-wait waves lead it
    (:func:`waves_lead_linear`): there its blocks were 10-17% slower than the waves
    (8 x 16 to 16 x 64 at S/2, by hand on 2026-12-08: 16 x 64 355.8 s in 3 s against
    304.4 s), so the 3 s per placement go to the search.
    """
    from optpipe.optimizer.periodic import periodic_schedules

    # fused backwards too when they are faster: the engines search those spaces as well
    runs = [(label.replace("/", "-"), place, split)
            for label, place, split in searched_shapes(problem, split_backward, allowed)
            if not (place == linear_placement(problem.devices)
                    and waves_lead_linear(problem, fixed, split, use_offload))]
    t0 = time.monotonic()
    for i, (label, place, split) in enumerate(runs):
        left = seconds - (time.monotonic() - t0)
        if left <= 0.1:
            break
        try:
            found = periodic_schedules(problem, place, split,
                                       time_limit=min(PERIODIC_MAX_SECONDS,
                                                      left / (len(runs) - i)),
                                       threads=threads, label=f"periodic-{label}")
        except OptPipeError as exc:
            fixed.skipped[f"periodic-{label}"] = str(exc)
            continue
        for schedule in found:
            result = simulate(problem, schedule)
            if result.fits:     # guaranteed by construction; the simulator has the word
                fixed.candidates.append(Candidate(schedule.name, schedule, result))
            else:  # pragma: no cover - a bug in the block's memory bound
                fixed.skipped[schedule.name] = "over budget in the simulator"


def add_extended(problem: Problem, fixed: FixedSet, split_backward: bool,
                 use_offload: bool, seconds: float, threads: int,
                 allowed: tuple[str, ...] | None,
                 heartbeat: Callable[[], None] | None = None,
                 proven: PrefixCuts | None = None) -> None:
    """Add schedules extended from a search on half the microbatches (:mod:`.extend`).

    Why: with one stage per device and memory binding, the best schedules run groups of
    several microbatches, which neither the fixed nor the periodic schedules express,
    and which the search on many microbatches does not find in its time; a small
    problem's optimum holds the pattern (8 x 16 at S/2: proven in 2 s). Built for one
    stage per device only when memory binds hard (as the periodic blocks), from
    ``2 * MIN_SOURCE_MICROBATCHES`` microbatches on, and only while that placement's
    memory bound leaves it a chance to win. Not for the chunked placements: there,
    measured at 8 x 64 and 16 x 64, S/2, extensions of a 15 s search were 14-33 %
    slower than the periodic V blocks, which already are their steady state.
    What the searches on fewer microbatches prove goes into ``proven``, for the prefix
    cuts (:func:`~.driver._search`); where those cuts pay (without offload, memory above the
    no-memory bound) and the source is small enough to be proven in the time, the small
    pieces are solved before the largest source's search and go into its model
    (:data:`SOURCE_CUTS_SHARE`).
    """
    from optpipe.optimizer.extend import MIN_SOURCE_MICROBATCHES, extended_schedules

    if problem.microbatches < 2 * MIN_SOURCE_MICROBATCHES or \
            (allowed is not None and "linear" not in allowed):
        return
    place = linear_placement(problem.devices)
    incumbent = bar_to_beat(fixed, use_offload, split_backward)
    graph = task_graph(problem, split_backward)
    free = lower_bound(graph)
    held = memory_bound(graph, free)
    if incumbent is not None and held >= incumbent.makespan * (1 - 1e-9):
        return                                   # one stage per device cannot win
    if waves_lead(problem, fixed, split_backward, use_offload):
        return
    # a large source (16 x 32) is searched best with its windows and not proven in the
    # time anyway: its pieces (8.7 s at 16 stages) would only take from its search
    # (16 x 64 at S/2: the source reached 165.7 s with them, 161.7 s without; by hand)
    cuts_pay = memory_lifts(held, free, use_offload) and not large_source(problem)

    def hints(half: Problem) -> list[Schedule]:
        on = [c for c in fixed_schedules(half).candidates
              if c.fits and list(c.schedule.placement) == place and not c.schedule.offloads]
        return [c.schedule for c in sorted(on, key=lambda c: c.makespan)]

    for schedule, result in extended_schedules(problem, place, split_backward,
                                               time_limit=seconds, threads=threads,
                                               label="extended-linear", hints=hints,
                                               heartbeat=heartbeat, proven=proven,
                                               cuts_share=SOURCE_CUTS_SHARE if cuts_pay
                                               else 0.0):
        fixed.candidates.append(Candidate(schedule.name, schedule, result))


def waves_lead(problem: Problem, fixed: FixedSet, split_backward: bool,
               use_offload: bool) -> bool:
    """Does a no-wait wave schedule (:mod:`.waves`) lead one stage per device where the
    extension's source is large (:func:`large_source`)? Then no extension is built.

    Why: such a source is not proven in the time, and which of its many optima the
    search lands on decides the extension (16 x 64 at S/2: 304.0-323.7 s, docs/
    optimizer-log.md, "16 x 64 at S/2 undependable"), while the waves are 304.4 s
    there in milliseconds every time; the extension's 30% of the minute then goes to
    the prefix cuts, the search and its probe (``python scripts/bench_waves.py``).
    Where the waves do not lead (uneven stages break their lattice; small sources,
    whose optimum the extension repeats exactly) the extension runs as before.
    """
    return large_source(problem) and waves_lead_linear(problem, fixed, split_backward,
                                                       use_offload)


def waves_lead_linear(problem: Problem, fixed: FixedSet, split_backward: bool,
                      use_offload: bool) -> bool:
    """Is a no-wait wave schedule (:mod:`.waves`) the fastest fitting start on one
    stage per device in ``fixed``?"""
    on = fitting_on(fixed, linear_placement(problem.devices), split_backward,
                    fused_is_faster(problem), use_offload)
    return bool(on) and on[0].name == WAVES


def add_chunked_extended(problem: Problem, fixed: FixedSet, split_backward: bool,
                         seconds: float, threads: int, allowed: tuple[str, ...] | None,
                         heartbeat: Callable[[], None] | None = None,
                         bounds: "dict[str, ShapeBounds] | None" = None) -> None:
    """Add schedules of the V shape, when searched first among the chunked placements,
    extended from a search on half the microbatches (:mod:`.extend`), where memory
    binds but not hard.

    Why: at budget S the optimum on the V shape keeps its warm-up and cool-down as the
    microbatches double and only its steady state grows (8 x 32: 100.55 s, 4.55 s over
    the work; 8 x 64's bound 196.55 s, the same 4.55 s), yet the search on 64
    microbatches does not find that steady state within its minute (8 x 64: 197.55 s
    in three runs of search revision 14) while a search on 32 gets within 0.5% of its
    optimum in 30 s (101.05 s; extended to 64: 197.05 s, by hand). So the half is
    searched on the V shape and its steady state repeated; the result is a warm start
    like any fixed schedule. Only where it pays, as measured at S (see
    :data:`CHUNKED_EXTEND_MAX_SOURCE_CELLS`):

    * on the V shape, when the search takes it first: CP-SAT's schedules on interleaved
      chunks hold no window to repeat (none of the 134 group sizes and starts at 8 x 64
      of the 8-stage preset at 64 GB, where the search lost 17 s to it; none at the
      benchmark's 8 x 64 at S);
    * the half has at least twice ``MIN_SOURCE_MICROBATCHES`` microbatches (a
      16-microbatch half searched for 15 s ended 4% above its optimum at 8 x 16, and
      nothing extended from it fitted) and is small enough to be searched well;
    * the V shape's best start is above its bound (at 2S the fixed schedules are
      optimal already).

    Where memory binds hard the periodic V blocks are the better start
    (:func:`add_extended`). With offload allowed, only beyond ``OFFLOAD_MAX_CELLS``
    (the caller's rule), where no offload model takes the time: 8 x 64 at S with
    offload, 196.7 s (gap 0.43% to the no-memory bound) against 197.55 s without them.
    ``bounds``: the placements' :func:`~.spaces.shape_bounds`, when the caller has them.
    """
    from optpipe.optimizer.extend import MIN_SOURCE_MICROBATCHES, extended_schedules

    source_microbatches = problem.microbatches // 2
    if source_microbatches < 2 * MIN_SOURCE_MICROBATCHES or \
            problem.stages * source_microbatches > CHUNKED_EXTEND_MAX_SOURCE_CELLS:
        return
    linear = linear_placement(problem.devices)
    chunked = [sp for sp in placement_spaces(problem, split_backward, fixed, "cpsat", False,
                                             allowed, bounds)
               if sp.placement != linear and sp.hinted]
    if not chunked or chunked[0].best_fixed <= chunked[0].bound * (1 + 1e-9) or \
            chunked[0].label.split("/")[0] != "v":
        return
    space = chunked[0]
    hints = chunked_source_hints(space.label, space.placement, space.split,
                                 fused_is_faster(problem))
    for schedule, result in extended_schedules(problem, space.placement, space.split,
                                               time_limit=seconds, threads=threads,
                                               label=f"extended-{space.label}",
                                               hints=hints, heartbeat=heartbeat,
                                               recurse=False):
        schedule.provenance["placement"] = space.label
        fixed.candidates.append(Candidate(schedule.name, schedule, result))


def chunked_source_hints(label: str, place: list[int], split: bool, fused_faster: bool
                         ) -> Callable[[Problem], list[Schedule]]:
    """The hints a chunked placement's extensions start their source from: for a
    problem with fewer microbatches, its fitting fixed, list and admission schedules on
    ``place``, fastest first (what the search on the full problem starts from too).
    Public for ``scripts/bench_extend.py``, which measures the same sources."""
    from optpipe.optimizer.listsched import warm_starts

    def hints(half: Problem) -> list[Schedule]:
        half_fixed = fixed_schedules(half)
        add_fitting(half, half_fixed, warm_starts(half, place, split), label)
        return [c.schedule for c in fitting_on(half_fixed, place, split, fused_faster,
                                               False)]
    return hints


def extend_share(problem: Problem) -> float:
    """The share of the time limit the extended schedules get (see
    :data:`EXTEND_SHARE_LARGE`)."""
    return EXTEND_SHARE_LARGE if large_source(problem) else EXTEND_SHARE


def large_source(problem: Problem) -> bool:
    """Is the extended schedules' source (half the microbatches) too large to be proven
    in the time (:data:`EXTEND_LARGE_SOURCE_CELLS`)? One rule for their share and for
    whether its pieces are solved first (:func:`add_extended`)."""
    return problem.stages * (problem.microbatches // 2) >= EXTEND_LARGE_SOURCE_CELLS
