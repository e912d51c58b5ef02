"""Solved schedules kept for reuse: a user cache and the bundled library.

Why: a proven-optimal schedule for a problem never changes, and the preset problems
(``optpipe solve --stages 8 --mem 80GB``) should answer at once. Entries are keyed by
the problem's content hash plus the options that change the answer. Nothing is trusted
blindly: every entry is re-validated and re-simulated against the problem before use
(:func:`lookup` returns None for anything that does not check out).

Where: ``$OPTPIPE_CACHE_DIR`` or ``~/.cache/optpipe`` (user cache, written after every
solve), then the bundled library (``optpipe/_data/schedules`` when installed, the
repository's ``schedules/`` otherwise; read only).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from optpipe.errors import OptPipeError
from optpipe.problem import Problem
from optpipe.schedule import Schedule, load_schedule
from optpipe.simulator import SimResult, simulate

_PACKAGE = Path(__file__).resolve().parent.parent
#: Bumped when the search changes what a time-limited solve finds (2: periodic blocks
#: as warm starts; 3: pipeoffload on interleaved and V placements, the memory round-trip
#: bound; 4: the one-machine bound, the window search only where memory binds, HiGHS's
#: horizon probes; 5: periodic blocks with exact steady-state memory rows, chunked
#: placements judged on measured or modelled cuts where the problem has them; 6: extended
#: schedules as warm starts and prefix cuts for one stage per device; 7: the extended
#: schedules' larger share where their source has 512 cells or more; 8: CP-SAT without
#: its transitive closure of precedences, a smaller expected overrun on chunked
#: placements, the window search from the hint when the full model reports nothing; 9:
#: the chunked placements packed by time windows after a tenth of the time; 10: list
#: schedules on every placement as warm starts; 11: with offload, list schedules planned
#: for a looser budget and fitted by offloading; 12: with offload, time the search
#: leaves over goes to CP-SAT's plans for the looser budget and finer factors; 13: where
#: memory does not bind hard, one stage per device gets no proof attempt once its memory
#: bound rules it out, and the chunked placements have that time; 14: window steps
#: with the pinned tasks' time windows, time windows that widen while CP-SAT proves
#: them quickly, and no proof attempt after them that could not start in time; 15: where
#: memory binds but not hard, the V shape's schedules (when searched first among the
#: chunked placements) extended from a search on half the microbatches, from 64
#: microbatches on, with offload too where no offload model is built; 16: ZB-V's greedy
#: holding back only part of a new microbatch's later-chunk bytes, as starts on the
#: chunked placements, and a stale entry of the cache as a start, :func:`previous`; 17:
#: the chunked placements' time windows start from the hint past 256 stage x microbatch
#: cells, without the full model first, :data:`~.cpsat.TIME_FULL_MAX_CELLS`; 18: a
#: window step's memory rows hold a literal only where the order is open, the rest
#: constants from the hint, and its model is built faster; 19: the time-window search
#: opens with windows that end at the makespan, :data:`~.decompose.COOLDOWN_STEPS`; 20:
#: ZB-V's greedy keeping microbatch 0's path clear as starts too, and the time windows
#: opening from several starts, :data:`~.decompose.OPENING_STARTS`; 21: the drawn
#: time windows taking turns on the two shortest openings,
#: :data:`~.decompose.SEARCH_CHAINS`; 22: pipeoffload and the offloaded starts hold
#: back the devices their rounds leave over budget, OFFLOADs the device waits for, so a
#: device whose room holds about one activation keeps several microbatches in flight,
#: and with offload one stage per device keeps its no-memory bound; 23: CP-SAT's plans
#: for the looser budgets tried again with other random seeds,
#: :data:`~.offload_starts.PLAN_SEEDS`, and with offload a bound from the kept bytes'
#: area, :func:`~.bounds.offload_area_bound`, which skips one stage per device's
#: offload model where it cannot win, and that model's OFFLOADs may hold the device
#: back, so held-back schedules are its hints; 24: one stage per device's prefix cuts
#: also solve pieces of half the microbatches, with the smaller pieces' cuts in their
#: models, :func:`~.prefix.ladder`; 25: the prefix cuts also bound every window of
#: ``n`` microbatches, from its first forward until its last microbatch is done, which
#: prunes the proof, and one stage per device skips the microbatch windows where its
#: hint is within :data:`~.cpsat.WINDOWLESS_GAP` of the proven bound, leaving the
#: whole time to the full model; 26: where memory binds hard and the extended
#: schedules' source is small enough to be proven, that source's prefix cuts are
#: solved first and go into its model, :data:`~.warm_starts.SOURCE_CUTS_SHARE`; 27: a
#: model with the prefix cuts up to :data:`~.cpsat.WINDOWLESS_MAX_CELLS_WITH_CUTS`
#: cells skips the microbatch windows whatever its hint; 28: with offload, the
#: offload model runs only while one stage per device's best start is within
#: :data:`~.driver.OFFLOAD_MODEL_REACH` of the incumbent, else its time goes to the
#: order models; 29: with offload, the offloaded search starts from offload-aware list
#: schedules, :mod:`~.offload_list`, before the plans fitted by offloading; 30: their
#: randomized runs perturb the best run so far (:class:`~.offload_list.RandomizedSearch`,
#: one basin per W policy), on every placement within
#: :data:`~.warm_starts.RANDOMIZED_REACH` of the best, round-robin; 31: a basin that has not
#: improved for :attr:`~.offload_list.RandomizedSearch.STALL` runs restarts near its
#: start, the best run kept apart; 32: an offload-aware list schedule sends a forward's
#: activation to the host only when, behind the copies already queued, it can come
#: back before its backward needs it, :data:`~.offload_list.QUEUE_AWARE`; 33: every
#: offload-aware variant is also built with its OFFLOADs listed only when due, so a
#: forward that does not fit waits for the first queued copy that makes room, and the
#: randomized search's fresh draws switch that rule,
#: :data:`~.offload_list.DEFERRED_VARIANTS`; 34: that waiting forward also leaves room
#: for the next reload due on its device, :data:`~.offload_list.WAIT_KEEPS_RELOAD_ROOM`; 35: a full model near
#: its bound first asks whether a schedule 0.5% shorter exists, :data:`~.cpsat.PROBE_GAP`;
#: 36: the proof runs without CP-SAT's disjunctive precedences, so the pieces and the
#: probe finish sooner, :data:`~.cpsat.PROOF_DISJUNCTIVE_PRECEDENCES`; 37: the gap
#: probe asks for any schedule inside its horizon, without the makespan objective, so
#: it is refuted sooner, :data:`~.cpsat.PROBE_MINIMIZES`; 38: search then probe
#: past the full model's cell limit with the cuts, :mod:`~.descent`, and the extended
#: schedules' share at 30%; 39: the no-wait waves among the starts, :mod:`~.waves`, and
#: no extension where they lead with a large source, :func:`~.warm_starts.waves_lead`). A cached
#: schedule from an older search that was not proven optimal is solved again: the same
#: problem and time limit may now give a faster one. Not bumped for the warm-up memory
#: bound (2026-12-01): it proves more but searches the same way (the window search
#: still keys on the round trip), so a cached answer would come back no faster; its
#: stored bound is true, only weaker.
SEARCH_REVISION = 39


def cache_dir() -> Path:
    """The user cache directory (not created here)."""
    env = os.environ.get("OPTPIPE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "optpipe"


def library_dirs() -> list[Path]:
    """Bundled library locations, installed copy first, then the repository's."""
    return [_PACKAGE / "_data" / "schedules", _PACKAGE.parent / "schedules"]


def cache_key(problem: Problem, *, solver: str, split_backward: bool, offload: bool,
              levels: Sequence[float], placements: Sequence[str] | None = None) -> str:
    """File stem for a solve: problem hash + the options that change the answer
    (``placements``: the allowed ones when restricted; None = all, no suffix)."""
    parts = [problem.hash(), solver, "split" if split_backward else "fused"]
    parts.append("offload-" + "-".join(f"{x:g}" for x in levels) if offload else "nooffload")
    if placements is not None:
        parts.append("only-" + "-".join(placements))
    return "_".join(parts)


@dataclass
class CacheHit:
    schedule: Schedule
    result: SimResult
    path: Path


def _checked(problem: Problem, key: str, use_user_cache: bool) -> Iterator[CacheHit]:
    """Every cached schedule for ``key`` that validates, matches the problem's hash and
    simulates within budget, user cache first."""
    dirs = ([cache_dir()] if use_user_cache else []) + library_dirs()
    for folder in dirs:
        path = folder / f"{key}.json"
        if not path.is_file():
            continue
        try:
            schedule = load_schedule(path)
            prov = schedule.provenance
            if prov.get("problem_hash") != problem.hash():
                continue
            schedule.check_fits(problem.stages, problem.devices, problem.microbatches)
            result = simulate(problem, schedule)
        except (OptPipeError, ValueError, TypeError, json.JSONDecodeError):
            continue
        if result.fits:
            yield CacheHit(schedule, result, path)


def lookup(problem: Problem, key: str, *, time_limit: float, gap: float,
           use_user_cache: bool = True) -> CacheHit | None:
    """A cached schedule for ``key`` that still checks out, or None.

    Accepted when it was proven optimal within ``gap``, or solved with at least
    ``time_limit`` seconds by the current search (:data:`SEARCH_REVISION`); and in every case
    when it validates, matches the problem's hash, and simulates within budget.
    """
    for hit in _checked(problem, key, use_user_cache):
        prov = hit.schedule.provenance
        proven = prov.get("status") == "optimal" and float(prov.get("gap") or 0.0) <= gap
        longer = float(prov.get("time_limit") or 0.0) >= time_limit and \
            int(prov.get("search_revision") or 1) >= SEARCH_REVISION
        if proven or longer:
            return hit
    return None


def previous(problem: Problem, key: str, *, use_user_cache: bool = True) -> CacheHit | None:
    """The fastest cached schedule for ``key`` that checks out, whatever search made it
    and with whatever time: not an answer :func:`lookup` accepts, but a warm start, so
    that solving again never comes back slower than the entry it replaces.

    Why: a new search revision can end a given run behind an older one (the 16-stage
    preset: 1.7846 s from revision 15's 180 s, 1.7965 and 1.7989 s from two runs of
    revision 16's, whose admission schedules start its V shape elsewhere).
    """
    return min(_checked(problem, key, use_user_cache), key=lambda hit: hit.result.makespan,
               default=None)


def store(schedule: Schedule, key: str, folder: Path | None = None) -> Path | None:
    """Write a solved schedule to the user cache; a read-only cache is not an error."""
    folder = folder or cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{key}.json"
        tmp = path.with_suffix(".json.tmp")
        schedule.save(tmp)
        tmp.replace(path)
        return path
    except OSError:
        return None
