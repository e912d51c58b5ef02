"""The spatio-temporal planner: one offset per buffer in a single arena, no two live
buffers overlapping, the arena as small as possible.

Why: a pipeline schedule keeps many activation buffers whose lifetimes are known in
advance. A general-purpose allocator (see :mod:`optpipe.memory.caching_allocator`)
discovers them one by one and fragments; a plan made with the whole trace in view can
come within a hair of the peak of live bytes, which is a lower bound for any layout.

How (:func:`plan`), fastest first, stopping as soon as the arena equals that lower bound:

1. **Grouping.** Buffers with identical lifetimes (the per-layer tensors of one
   microbatch) are packed side by side into one block when that at least halves the
   number of items; per-layer traces of pipeline schedules shrink ~30x this way.
2. **Periodic reuse.** A long pipeline trace repeats itself from microbatch to
   microbatch: a window of microbatches is planned and every later microbatch reuses
   the offsets of the one ``p`` microbatches earlier (the smallest ``p`` for which the
   validator accepts the result).
3. **Greedy best fit** in several orders (size, lifetime, area, start), each item placed
   in the smallest gap left by the already placed items that overlap it in time.
4. **Branch and bound** in the manner of MiniMalloc (Moffitt, ASPLOS 2023): a depth-first
   search that places buffers in non-decreasing offset order at their lowest possible
   offset, pruned by per-section inference (the unplaced bytes of every cross-section of
   time must fit above its floor), dominance (no avoidable gap) and temporal
   decomposition into independent subproblems. It answers "does the trace fit in C
   bytes?"; it is run at the lower bound first, in a portfolio of static orders (one
   per worker process), then between the lower bound and the best layout found.
5. **Exact mode** (``exact=True``): additionally a CP-SAT model (OR-Tools) with
   ``NoOverlap2D`` minimizing the arena, warm-started with the best layout; its proof
   makes a plan optimal.

An :class:`OnlineBestFit` allocator serves requests the plan does not know (used by
:class:`optpipe.memory.arena.Arena`). Every plan is checked by
:func:`optpipe.memory.validate.validate_plan`, which shares no code with this module.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from optpipe.errors import OptPipeError
from optpipe.memory.trace import Buffer, Trace
from optpipe.memory.validate import validate_plan

#: Static orders of the branch and bound (MiniMalloc's letters: T = largest total of the
#: buffer's cross-sections, W = lifetime, A = area = size x lifetime, Z = size).
HEURISTICS = ("TWA", "TAW", "WAT")


# ======================================================================== result
@dataclass
class Plan:
    """Offsets for every buffer of a trace, and what they cost.

    ``arena_size`` is the planned peak (the highest end of any buffer), ``peak_live`` the
    trace's peak of live bytes: no layout can be smaller. ``optimal`` is True when the
    arena is proven minimal (it reached ``peak_live`` or an exact solver proved it).
    """

    trace_name: str
    offsets: dict[str, int]
    sizes: dict[str, int]
    arena_size: int
    peak_live: int
    alignment: int = 1
    method: str = ""
    optimal: bool = False
    wall_time: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def fragmentation(self) -> float:
        """1 − peak live / arena size: the share of the arena that is never needed."""
        return 1.0 - self.peak_live / self.arena_size if self.arena_size else 0.0

    def to_json(self, offsets: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "trace": self.trace_name, "arena_size": self.arena_size,
            "peak_live": self.peak_live, "fragmentation": self.fragmentation,
            "alignment": self.alignment, "method": self.method, "optimal": self.optimal,
            "wall_time": self.wall_time, "details": self.details}
        if offsets:
            data["offsets"] = dict(self.offsets)
            data["sizes"] = dict(self.sizes)
        return data


# ===================================================================== instances
class _Instance:
    """Items to pack: integer sizes (in alignment units) on half-open rank intervals."""

    def __init__(self, sizes: Sequence[int], starts: Sequence[float],
                 ends: Sequence[float]) -> None:
        self.n = len(sizes)
        self.size = np.asarray(sizes, dtype=np.int64).reshape(-1)
        self.t0 = np.asarray(starts, dtype=np.float64).reshape(-1)
        self.t1 = np.asarray(ends, dtype=np.float64).reshape(-1)
        times = np.unique(np.concatenate([self.t0, self.t1])) if self.n else np.zeros(0)
        self.start = np.searchsorted(times, self.t0).astype(np.int64)
        self.end = np.searchsorted(times, self.t1).astype(np.int64)
        self._sweep: _Sweep | None = None

    def lower_bound(self) -> int:
        """Peak of live units (ends before starts at equal ranks)."""
        if not self.n:
            return 0
        delta = np.zeros(int(self.end.max()) + 2, dtype=np.int64)
        np.add.at(delta, self.start, self.size)
        np.add.at(delta, self.end, -self.size)
        return int(np.cumsum(delta).max())

    @property
    def sweep(self) -> "_Sweep":
        if self._sweep is None:
            self._sweep = _Sweep(self)
        return self._sweep


class _Sweep:
    """Cross-sections of time, overlaps and cut counts (MiniMalloc's "sweep").

    A section is the set of items live just before some item ends; every item spans a
    contiguous range ``[lo, hi)`` of sections, and two items overlap in time exactly
    when their ranges intersect.
    """

    def __init__(self, inst: _Instance) -> None:
        n = inst.n
        events = sorted([(int(inst.end[i]), 0, i) for i in range(n)]
                        + [(int(inst.start[i]), 1, i) for i in range(n)])
        active: set[int] = set()
        last = None
        sections: list[list[int]] = []
        lo = np.zeros(n, dtype=np.int64)
        hi = np.zeros(n, dtype=np.int64)
        for when, kind, i in events:
            if last is None:
                last = when
            if kind == 0:
                if last < when or not sections:
                    last = when
                    sections.append(sorted(active))
                active.discard(i)
                hi[i] = len(sections)
            else:
                active.add(i)
                lo[i] = len(sections)
        self.S = len(sections)
        self.lo, self.hi = lo, hi
        lengths = np.array([len(s) for s in sections], dtype=np.int64)
        self.flat = np.array([i for s in sections for i in s], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.total0 = np.array([int(inst.size[s].sum()) for s in sections], dtype=np.int64)
        cuts = np.zeros(max(self.S - 1, 0), dtype=np.int64)
        for i in range(n):
            if hi[i] - 1 > lo[i]:
                cuts[lo[i]:hi[i] - 1] += 1
        self.cuts0 = cuts
        order = np.argsort(lo, kind="stable")
        lo_sorted = lo[order]
        self.adj: list[np.ndarray] = []
        for i in range(n):
            upto = np.searchsorted(lo_sorted, hi[i], side="left")
            cand = order[:upto]
            nb = cand[hi[cand] > lo[i]]
            self.adj.append(nb[nb != i])
        # each item's sections, flattened, for the "largest total" key
        self.item_flat = (np.concatenate([np.arange(lo[i], hi[i]) for i in range(n)])
                          if n else np.zeros(0, dtype=np.int64))
        self.item_starts = np.concatenate([[0], np.cumsum(hi - lo)[:-1]]).astype(np.int64) \
            if n else np.zeros(0, dtype=np.int64)


# ========================================================================= greedy
def _greedy(inst: _Instance, order: np.ndarray, best_fit: bool,
            adj: list[np.ndarray]) -> tuple[int, np.ndarray]:
    """Place items in ``order``, each in the smallest (or lowest) gap that fits it."""
    off = np.full(inst.n, -1, dtype=np.int64)
    size = inst.size
    peak = 0
    for i in order:
        nb = adj[i]
        nb = nb[off[nb] >= 0]
        need = int(size[i])
        if len(nb) == 0:
            off[i] = 0
            peak = max(peak, need)
            continue
        lows = off[nb]
        highs = lows + size[nb]
        srt = np.argsort(lows, kind="stable")
        lows, highs = lows[srt], highs[srt]
        reach = np.maximum.accumulate(highs)
        gap_lo = np.concatenate([[0], reach])
        gap_hi = np.concatenate([lows, [np.iinfo(np.int64).max]])
        room = gap_hi - gap_lo
        fits = np.flatnonzero(room >= need)
        if best_fit:
            finite = fits[fits < len(room) - 1]
            pick = int(finite[np.argmin(room[finite])]) if len(finite) else int(fits[-1])
        else:
            pick = int(fits[0])
        off[i] = int(gap_lo[pick])
        peak = max(peak, int(off[i]) + need)
    return peak, off


def _greedy_orders(inst: _Instance) -> dict[str, np.ndarray]:
    dur = inst.t1 - inst.t0
    return {
        "size": np.lexsort((inst.t0, -dur, -inst.size)),
        "lifetime": np.lexsort((inst.t0, -inst.size, -dur)),
        "area": np.lexsort((inst.t0, -inst.size, -(dur * inst.size))),
        "start": np.lexsort((-inst.size, inst.t0)),
    }


def _best_greedy(inst: _Instance, adj: list[np.ndarray]) -> tuple[int, np.ndarray, str]:
    best: tuple[int, np.ndarray, str] | None = None
    for name, order in _greedy_orders(inst).items():
        for fit in (True, False):
            peak, off = _greedy(inst, order, fit, adj)
            if best is None or peak < best[0]:
                best = (peak, off, f"greedy({'best' if fit else 'first'}-fit, {name})")
    assert best is not None
    return best


def _overlaps_list(inst: _Instance) -> list[np.ndarray]:
    """Time overlaps without building sections (for traces too large to search)."""
    order = np.argsort(inst.start, kind="stable")
    st = inst.start[order]
    adj = []
    for i in range(inst.n):
        upto = np.searchsorted(st, inst.end[i], side="left")
        cand = order[:upto]
        nb = cand[inst.end[cand] > inst.start[i]]
        adj.append(nb[nb != i])
    return adj


# ================================================================ branch and bound
class _Stop(Exception):
    """The search ran out of nodes or time."""


_BIG = np.iinfo(np.int64).max // 4


class _SectionSearch:
    """Depth-first search for a layout within ``capacity`` units (MiniMalloc's rules).

    Items are placed in non-decreasing offset order, each at its lowest possible offset
    (the top of the placed items it overlaps). A node is pruned when some section's
    floor plus its unplaced bytes exceed the capacity, where the floor is the highest of:
    the placed items in it, the lowest offset any of its unplaced items can still take,
    and the current offset. Candidates placed at or above the lowest top any unplaced
    item could reach are skipped (they would leave an avoidable gap). When no unplaced
    item spans a section boundary, both sides are solved independently.
    """

    def __init__(self, inst: _Instance, capacity: int, heuristic: str,
                 deadline: float, node_limit: int | None = None) -> None:
        self.inst, self.sw = inst, inst.sweep
        self.capacity = int(capacity)
        self.heuristic = heuristic
        self.deadline = deadline
        self.node_limit = node_limit
        self.nodes = 0
        n = inst.n
        self.size = inst.size
        self.mo_u = np.zeros(n, dtype=np.int64)  # lowest offset per unplaced item, _BIG if placed
        self.off = np.full(n, -1, dtype=np.int64)
        self.sol = np.full(n, -1, dtype=np.int64)
        self.floor = np.zeros(self.sw.S, dtype=np.int64)
        self.total = self.sw.total0.copy()
        self.cuts = self.sw.cuts0.copy()
        dur = inst.t1 - inst.t0
        self.keys = {"A": -(dur * inst.size), "W": -dur, "Z": -inst.size.astype(np.float64)}

    # ------------------------------------------------------------------ driver
    def run(self) -> np.ndarray | None:
        """Offsets within capacity, or None when none exist; raises _Stop at a limit."""
        if self.inst.n == 0:
            return self.sol
        if int(self.size.max()) > self.capacity:
            return None
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 6 * self.inst.n + 1000))
        try:
            ok = self._split_solve(np.arange(self.inst.n), 0, self.sw.S)
        finally:
            sys.setrecursionlimit(limit)
        return self.sol.copy() if ok else None

    def _split_solve(self, items: np.ndarray, a: int, b: int) -> bool:
        cuts = self.cuts[a:b - 1] if b - 1 > a else np.zeros(0, dtype=np.int64)
        points = [a] + [int(x) + a + 1 for x in np.flatnonzero(cuts == 0)] + [b]
        lo, hi = self.sw.lo, self.sw.hi
        for k in range(1, len(points)):
            sa, sb = points[k - 1], points[k]
            sub = items[(self.mo_u[items] < _BIG) & (lo[items] < sb) & (hi[items] > sa)]
            if len(sub) and not self._subsolve(sub, sa, sb):
                return False
        return True

    def _preorder(self, items: np.ndarray) -> np.ndarray:
        keys: list[np.ndarray] = [items]
        for letter in self.heuristic:
            if letter == "T":
                best = np.maximum.reduceat(self.total[self.sw.item_flat], self.sw.item_starts)
                keys.append(-best[items].astype(np.float64))
            else:
                keys.append(self.keys[letter][items])
        return items[np.lexsort(tuple([keys[0]] + keys[:0:-1]))]

    def _subsolve(self, items: np.ndarray, a: int, b: int) -> bool:
        pre = self._preorder(items)
        rank = np.empty(self.inst.n, dtype=np.int64)
        rank[pre] = np.arange(len(pre))
        e0, e1 = int(self.sw.starts[a]), int(self.sw.starts[b])
        part = (self.sw.flat[e0:e1], self.sw.starts[a:b] - e0)
        return self._search(pre, rank, a, b, part, -1, -1)

    # ------------------------------------------------------------------ search
    def _section_min(self, part: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Per section of the partition: the lowest offset of an unplaced item (or 0)."""
        low = np.minimum.reduceat(self.mo_u[part[0]], part[1])
        low[low >= _BIG] = 0
        return low

    def _search(self, pre: np.ndarray, rank: np.ndarray, a: int, b: int,
                part: tuple[np.ndarray, np.ndarray], last_o: int, last_r: int) -> bool:
        self.nodes += 1
        if self.node_limit is not None and self.nodes > self.node_limit:
            raise _Stop
        if not self.nodes & 63 and time.perf_counter() > self.deadline:
            raise _Stop
        mo_all = self.mo_u[pre]
        live = mo_all < _BIG
        cand = pre[live]
        if len(cand) == 0:
            self.sol[pre] = self.off[pre]
            return True
        mo = mo_all[live]
        size, cap = self.size, self.capacity
        min_top = int((mo + size[cand]).min())
        pick = np.flatnonzero(mo < min_top)
        cand, mo = cand[pick], mo[pick]
        order = np.lexsort((rank[cand], mo))
        floor = self.floor[a:b]
        total = self.total[a:b]
        base = np.maximum(floor, self._section_min(part))
        top_total = int(total.max())
        current = None
        viol = np.zeros(0, dtype=np.int64)
        for k in order:
            o = int(mo[k])
            i = int(cand[k])
            r = int(rank[i])
            if o < last_o or (o == last_o and r < last_r):
                continue
            if o != current:
                current = o
                if o + top_total > cap:
                    break
                viol = np.nonzero(np.maximum(base, o) + total > cap)[0]
            if len(viol):
                # only placing an item across every violated section can rescue them
                if not (self.sw.lo[i] <= viol[0] + a and self.sw.hi[i] > viol[-1] + a):
                    continue
                s_i = int(size[i])
                if (np.maximum(floor[viol], o + s_i) + total[viol] - s_i > cap).any():
                    continue
            if self._place_and_recurse(pre, rank, a, b, part, o, r, i):
                return True
        return False

    def _place_and_recurse(self, pre: np.ndarray, rank: np.ndarray, a: int, b: int,
                           part: tuple[np.ndarray, np.ndarray], o: int, r: int,
                           i: int) -> bool:
        """Place item ``i`` at ``o`` on copies of the state, check them, and recurse with
        the copies swapped in (swapping back is the undo)."""
        s_i = int(self.size[i])
        top = o + s_i
        nb = self.sw.adj[i]
        lo, hi = int(self.sw.lo[i]), int(self.sw.hi[i])
        mo_u = self.mo_u.copy()
        mo_u[nb] = np.maximum(mo_u[nb], top)   # placed items keep _BIG
        mo_u[i] = _BIG
        floor = self.floor.copy()
        np.maximum(floor[lo:hi], top, out=floor[lo:hi])
        total = self.total.copy()
        total[lo:hi] -= s_i
        low = np.minimum.reduceat(mo_u[part[0]], part[1])
        low[low >= _BIG] = 0
        eff = np.maximum(np.maximum(floor[a:b], low), o) + total[a:b]
        if (eff > self.capacity).any():
            return False
        saved = self.mo_u, self.floor, self.total
        self.mo_u, self.floor, self.total = mo_u, floor, total
        self.off[i] = o
        try:
            return self._decompose(pre, rank, a, b, part, o, r, i)
        finally:
            self.mo_u, self.floor, self.total = saved
            self.off[i] = -1

    def _decompose(self, pre: np.ndarray, rank: np.ndarray, a: int, b: int,
                   part: tuple[np.ndarray, np.ndarray], o: int, r: int, i: int) -> bool:
        self.sol[i] = o
        lo, hi = int(self.sw.lo[i]), int(self.sw.hi[i])
        if hi - 1 <= lo:
            return self._search(pre, rank, a, b, part, o, r)
        self.cuts[lo:hi - 1] -= 1
        try:
            zero = np.flatnonzero(self.cuts[lo:hi - 1] == 0)
            if len(zero) == 0:
                return self._search(pre, rank, a, b, part, o, r)
            return self._split_solve(pre, a, b)
        finally:
            self.cuts[lo:hi - 1] += 1


def _search_portfolio(inst: _Instance, capacity: int, heuristics: Sequence[str],
                      deadline: float) -> np.ndarray | None:
    """Round robin over ``heuristics`` with doubling node limits (as MiniMalloc does);
    a single heuristic runs unlimited. None when the deadline passes or a heuristic
    proves there is no layout."""
    inst.sweep  # build once
    limit = 2 * max(inst.n, 16)
    while time.perf_counter() < deadline:
        for h in heuristics:
            search = _SectionSearch(inst, capacity, h, deadline,
                                    None if len(heuristics) == 1 else limit)
            try:
                return search.run()  # a layout, or None = proven infeasible
            except _Stop:
                continue
        limit *= 2
    return None


def _worker(inst: _Instance, capacity: int, heuristics: Sequence[str], deadline: float,
            queue: Any) -> None:
    try:
        queue.put((tuple(heuristics), _search_portfolio(inst, capacity, heuristics,
                                                        deadline)))
    except Exception as exc:  # pragma: no cover - reported to the parent
        queue.put((tuple(heuristics), exc))


def _fits_in(inst: _Instance, capacity: int, deadline: float,
             workers: int) -> np.ndarray | None:
    """A layout within ``capacity`` units found before ``deadline``, or None.

    One worker runs all :data:`HEURISTICS` in a round robin with doubling node limits
    (MiniMalloc's scheme). With ``k`` > 1 workers, each of the first ``k`` orders gets a
    process of its own and runs without restarts (the search time of these instances
    is heavy-tailed, so one uninterrupted order beats a shared one).
    """
    workers = max(1, min(workers, len(HEURISTICS)))
    if workers == 1 or "fork" not in multiprocessing.get_all_start_methods():
        return _search_portfolio(inst, capacity, HEURISTICS, deadline)
    inst.sweep
    shares = [[h] for h in HEURISTICS[:workers]]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(inst, capacity, share, deadline, queue),
                         daemon=True) for share in shares]
    for p in procs:
        p.start()
    found = None
    try:
        for _ in procs:
            remaining = deadline - time.perf_counter() + 2.0
            try:
                _, result = queue.get(timeout=max(remaining, 0.1))
            except Exception:
                break
            if isinstance(result, Exception):
                raise result
            if result is not None:
                found = result
                break
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=1.0)
        queue.close()
    return found


# ========================================================================= exact
def _cpsat(inst: _Instance, lower: int, upper: int, hint: np.ndarray, time_limit: float,
           workers: int) -> tuple[int, np.ndarray, bool] | None:
    """Minimize the arena with CP-SAT's NoOverlap2D; (size, offsets, proven) or None."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    peak = model.NewIntVar(lower, upper, "peak")
    xs, ys, offs = [], [], []
    for i in range(inst.n):
        s = int(inst.size[i])
        o = model.NewIntVar(0, upper - s, f"o{i}")
        model.Add(o + s <= peak)
        xs.append(model.NewFixedSizeIntervalVar(int(inst.start[i]),
                                                int(inst.end[i] - inst.start[i]), f"t{i}"))
        ys.append(model.NewFixedSizeIntervalVar(o, s, f"a{i}"))
        model.AddHint(o, int(hint[i]))
        offs.append(o)
    model.AddNoOverlap2D(xs, ys)
    model.Minimize(peak)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, time_limit)
    solver.parameters.num_workers = max(1, workers)
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    values = np.array([solver.Value(o) for o in offs], dtype=np.int64)
    return int(solver.Value(peak)), values, status == cp_model.OPTIMAL


# ================================================================= solving items
@dataclass
class _Solved:
    offsets: np.ndarray
    size: int
    method: str
    optimal: bool
    info: dict[str, Any] = field(default_factory=dict)


#: Traces larger than this are planned greedily only (the search's overlap lists grow
#: quadratically with the number of buffers live at once).
SEARCH_LIMIT = 6000


def _solve(inst: _Instance, time_limit: float, exact: bool, workers: int,
           capacity: int | None = None, search: bool = True) -> _Solved:
    """Best layout of ``inst`` found within ``time_limit`` seconds (greedy only when
    ``search`` is False)."""
    start = time.perf_counter()
    deadline = start + time_limit
    lower = inst.lower_bound()
    if inst.n == 0:
        return _Solved(np.zeros(0, dtype=np.int64), 0, "empty", True)
    searchable = inst.n <= SEARCH_LIMIT
    adj = inst.sweep.adj if searchable else _overlaps_list(inst)
    peak, offsets, method = _best_greedy(inst, adj)
    info: dict[str, Any] = {"lower_bound_units": lower, "greedy_units": peak}
    best = _Solved(offsets, peak, method, peak == lower, info)
    if best.optimal or not searchable or not search:
        return best
    # the branch and bound at the lower bound first: success is a proof of optimality
    wants_capacity = capacity is not None and lower < capacity < best.size
    share = 0.25 if exact else 0.3 if wants_capacity else 0.6
    found = _fits_in(inst, lower, start + share * time_limit, workers)
    if found is not None:
        return _Solved(found, lower, "branch-and-bound", True, info)
    if exact:
        result = _cpsat(inst, lower, best.size, best.offsets,
                        deadline - time.perf_counter(), workers)
        if result is not None and (result[0] < best.size or result[2]):
            best = _Solved(result[1], result[0], "cp-sat", result[2], info)
            info["cpsat_proven"] = result[2]
        return best
    if wants_capacity:
        # the caller's limit is the question MiniMalloc answers: try it before bisecting
        left = deadline - time.perf_counter()
        found = _fits_in(inst, capacity, time.perf_counter() + 0.8 * left, workers)
        if found is not None:
            best = _Solved(found, int((found + inst.size).max()), "branch-and-bound", False,
                           info)
    # then bisect between the lower bound and the best layout with the time left (a
    # search that runs out of time counts as a no: this is a heuristic from here on)
    lo, hi = lower + 1, best.size - 1
    while lo <= hi and time.perf_counter() < deadline - 0.05:
        left = deadline - time.perf_counter()
        target = (lo + hi) // 2
        found = _fits_in(inst, target, time.perf_counter() + left / 2, workers)
        if found is None:
            lo = target + 1
        else:
            top = int((found + inst.size).max())
            best = _Solved(found, top, "branch-and-bound", False, info)
            hi = top - 1
    return best


# =========================================================== grouping, periodic
def _group_key(b: Buffer) -> tuple[float, float, Any]:
    return (b.start, b.end, b.tags.get("microbatch"))


def _items_of(buffers: Sequence[Buffer], units: Callable[[int], int],
              group: bool) -> tuple[list[list[int]], _Instance]:
    """Items (lists of buffer indices packed side by side) and their instance."""
    if group:
        index: dict[tuple[float, float, Any], int] = {}
        items: list[list[int]] = []
        for k, b in enumerate(buffers):
            key = _group_key(b)
            if key not in index:
                index[key] = len(items)
                items.append([])
            items[index[key]].append(k)
    else:
        items = [[k] for k in range(len(buffers))]
    sizes = [sum(units(buffers[k].size) for k in item) for item in items]
    starts = [buffers[item[0]].start for item in items]
    ends = [buffers[item[0]].end for item in items]
    return items, _Instance(sizes, starts, ends)


def _expand(buffers: Sequence[Buffer], items: list[list[int]], item_offsets: Sequence[int],
            units: Callable[[int], int]) -> list[int]:
    """Unit offsets per buffer: each item's members side by side from its offset."""
    out = [0] * len(buffers)
    for item, base in zip(items, item_offsets):
        at = int(base)
        for k in item:
            out[k] = at
            at += units(buffers[k].size)
    return out


def _items_clash(inst: _Instance, offsets: np.ndarray) -> bool:
    """True when two items overlap in time and address (a fast check for trial layouts;
    the final plan is still checked by the independent validator)."""
    order = np.argsort(inst.start, kind="stable")
    st = inst.start[order]
    top = offsets + inst.size
    for i in range(inst.n):
        upto = np.searchsorted(st, inst.end[i], side="left")
        cand = order[:upto]
        cand = cand[(inst.end[cand] > inst.start[i]) & (cand != i)]
        if np.any((offsets[cand] < top[i]) & (top[cand] > offsets[i])):
            return True
    return False


def _periodic(buffers: list[Buffer], items: list[list[int]], inst: _Instance,
              time_limit: float, workers: int,
              window: int) -> tuple[np.ndarray, int, dict[str, Any]] | None:
    """Plan the items of the first ``window`` microbatches, then let every item of
    microbatch ``m`` reuse the offset of its counterpart in ``m - p`` (same tags but the
    microbatch, same size); the smallest period ``p`` that leaves no clash wins. None
    when the trace has no microbatch tags or no period works."""
    mb = []
    roles: dict[tuple, dict[int, int]] = {}
    for j, item in enumerate(items):
        tags = buffers[item[0]].tags
        m = tags.get("microbatch")
        if not isinstance(m, int) or isinstance(m, bool):
            return None
        role = (tuple(sorted((k, str(v)) for k, v in tags.items() if k != "microbatch")),
                len(item), int(inst.size[j]))
        roles.setdefault(role, {})[m] = j
        mb.append((m, role))
    mbs = sorted({m for m, _ in mb})
    if len(mbs) <= window:
        return None
    head = np.array([j for j, (m, _) in enumerate(mb) if m < mbs[window]], dtype=np.int64)
    sub = _Instance(inst.size[head], inst.t0[head], inst.t1[head])
    solved = _solve(sub, time_limit, False, workers)
    base = np.full(inst.n, -1, dtype=np.int64)
    base[head] = solved.offsets
    for period in range(1, window):
        trial = base.copy()
        ok = True
        for j in np.argsort([m for m, _ in mb], kind="stable"):
            if trial[j] >= 0:
                continue
            m, role = mb[j]
            src = roles[role].get(m - period)
            if src is None or trial[src] < 0:
                ok = False
                break
            trial[j] = trial[src]
        if ok and not _items_clash(inst, trial):
            size = int((trial + inst.size).max())
            return trial, size, {"period": period, "window": window,
                                 "window_method": solved.method}
    return None


def _ungrouped_greedy(buffers: Sequence[Buffer], units: Callable[[int], int],
                      deadline: float) -> tuple[int, np.ndarray, str] | None:
    """Greedy best fit over the buffers one by one, start order first, until the
    deadline: pieces of a group can then fill holes a whole group cannot (ZB-V's
    two-chunk devices gain most). None when the trace is too large to try."""
    if len(buffers) > 4 * SEARCH_LIMIT:
        return None
    _, inst = _items_of(buffers, units, group=False)
    adj = _overlaps_list(inst)
    orders = _greedy_orders(inst)
    best: tuple[int, np.ndarray, str] | None = None
    for name in ("start", "size", "area", "lifetime"):
        for fit in (True, False):
            if best is not None and time.perf_counter() > deadline:
                return best
            peak, off = _greedy(inst, orders[name], fit, adj)
            if best is None or peak < best[0]:
                best = (peak, off, f"greedy({'best' if fit else 'first'}-fit, {name}, "
                                   f"ungrouped)")
    return best


# ============================================================================ API
def lower_bound(trace: Trace) -> int:
    """The trace's peak of live bytes: no arena can be smaller."""
    return trace.peak_live()


def plan(trace: Trace, *, time_limit: float = 10.0, exact: bool = False,
         alignment: int = 1, workers: int = 1, capacity: int | None = None,
         group: bool | None = None, periodic: bool | None = None,
         validate: bool = True) -> Plan:
    """Give every buffer of ``trace`` an offset in one arena of minimal size.

    ``alignment`` rounds sizes and offsets up to a multiple (use 256 or 512 for device
    tensors). ``workers`` > 1 runs the branch and bound's orders in parallel processes.
    ``group`` packs buffers with identical lifetimes (and microbatch) side by side
    (default: when that halves the item count); ``periodic`` plans a window of
    microbatches and repeats it (default: for more than 512 items and 64 microbatches).
    ``exact`` adds a CP-SAT proof attempt. With ``capacity`` (bytes), a layout within it
    is searched for when minimizing alone does not reach it; ``details["fits_capacity"]``
    says whether the plan fits. The plan is validated before it is returned.
    """
    if alignment < 1:
        raise OptPipeError(f"alignment must be a positive number of bytes, got {alignment}")
    if time_limit <= 0:
        raise OptPipeError(f"time limit must be positive, got {time_limit}")
    started = time.perf_counter()

    def units(nbytes: int) -> int:
        return -(-nbytes // alignment)

    active = [b for b in trace.buffers if b.size > 0 and b.end > b.start]
    peak_live = trace.peak_live()
    if group is None:
        keys = {_group_key(b) for b in active}
        group = len(keys) * 2 <= len(active)
    items, inst = _items_of(active, units, group)
    details: dict[str, Any] = {"buffers": len(active), "items": inst.n, "grouped": group}
    item_offsets: np.ndarray | None = None
    microbatches = {b.tags.get("microbatch") for b in active}
    if periodic is None:
        periodic = len(microbatches) > 64 and inst.n > 512
    if periodic:
        window = min(len(microbatches) - 1, 32)
        found = _periodic(active, items, inst, time_limit / 2, workers, window)
        if found is not None:
            item_offsets, size_units, extra = found
            details.update(extra)
            method = f"periodic({extra['window_method']})"
            optimal = size_units == inst.lower_bound()
    if item_offsets is None:
        cap_units = None if capacity is None else capacity // alignment
        grouped = group and inst.n < len(active)
        lower = inst.lower_bound()
        # greedy on the groups; if that misses the bound, greedy on the buffers one by
        # one (pieces fill holes whole groups cannot); only then the search, on groups
        solved = _solve(inst, time_limit, exact, workers, cap_units, search=not grouped)
        single = None
        if grouped and solved.size > lower:
            single = _ungrouped_greedy(active, units, started + 0.3 * time_limit)
            if single is None or single[0] > lower:
                remaining = max(0.1, time_limit - (time.perf_counter() - started))
                solved = _solve(inst, remaining, exact, workers, cap_units)
        item_offsets, size_units = solved.offsets, solved.size
        # a proof about grouped items says nothing about the buffers taken one by one
        method = solved.method
        optimal = solved.optimal and not grouped
        details.update(solved.info)
        if single is not None and single[0] < size_units:
            size_units, item_offsets, method = single
            items = [[k] for k in range(len(active))]
            details["grouped"] = False
    unit_offsets = _expand(active, items, item_offsets, units)
    offsets = {b.id: 0 for b in trace.buffers}
    for b, off in zip(active, unit_offsets):
        offsets[b.id] = off * alignment
    arena = size_units * alignment
    if capacity is not None:
        details["fits_capacity"] = arena <= capacity
    result = Plan(trace_name=trace.name, offsets=offsets,
                  sizes={b.id: b.size for b in trace.buffers}, arena_size=arena,
                  peak_live=peak_live, alignment=alignment, method=method,
                  optimal=optimal or arena == peak_live,
                  wall_time=time.perf_counter() - started, details=details)
    if validate:
        validate_plan(trace, offsets, arena, alignment)
    return result


# ==================================================================== online fit
class OnlineBestFit:
    """Online best-fit placement in an address range, for requests no plan foresaw.

    ``allocate(size)`` returns the lowest offset of the smallest free gap that holds
    ``size`` (rounded up to ``alignment``), or None when no gap does; ``free(offset)``
    returns it and merges free neighbours. ``capacity=None`` means unbounded (the top
    gap always fits). Gaps can be reserved with ``reserve`` (e.g. planned buffers).
    """

    def __init__(self, capacity: int | None = None, alignment: int = 1) -> None:
        self.capacity = capacity
        self.alignment = max(1, alignment)
        end = capacity if capacity is not None else 1 << 62
        self._free: list[tuple[int, int]] = [(0, end)] if end > 0 else []  # (start, end)
        self._used: dict[int, int] = {}
        self.live = 0
        self.high_water = 0

    def _round(self, size: int) -> int:
        return -(-max(size, 1) // self.alignment) * self.alignment

    def allocate(self, size: int) -> int | None:
        need = self._round(size)
        best = None
        for k, (a, b) in enumerate(self._free):
            a_al = -(-a // self.alignment) * self.alignment
            room = b - a_al
            if room >= need and (best is None or room < best[0]):
                best = (room, k, a_al)
        if best is None:
            return None
        _, k, at = best
        self._take(k, at, at + need)
        return at

    def reserve(self, offset: int, size: int) -> None:
        """Mark ``[offset, offset+size)`` used (it must be free)."""
        need = max(size, 1)
        for k, (a, b) in enumerate(self._free):
            if a <= offset and offset + need <= b:
                self._take(k, offset, offset + need)
                return
        raise OptPipeError(f"cannot reserve [{offset}, {offset + need}): not free")

    def _take(self, k: int, lo: int, hi: int) -> None:
        a, b = self._free.pop(k)
        if hi < b:
            self._free.insert(k, (hi, b))
        if a < lo:
            self._free.insert(k, (a, lo))
        self._used[lo] = hi
        self.live += hi - lo
        self.high_water = max(self.high_water, hi)

    def free(self, offset: int) -> None:
        hi = self._used.pop(offset, None)
        if hi is None:
            raise OptPipeError(f"free of offset {offset}, which is not allocated")
        self.live -= hi - offset
        at = bisect_left(self._free, (offset, hi))
        lo = offset
        if at < len(self._free) and self._free[at][0] == hi:
            hi = self._free.pop(at)[1]
        if at > 0 and self._free[at - 1][1] == lo:
            lo = self._free.pop(at - 1)[0]
            at -= 1
        self._free.insert(at, (lo, hi))

    def size_of(self, offset: int) -> int:
        return self._used[offset] - offset


def default_workers() -> int:
    """Worker processes for the branch and bound: two when the machine has them."""
    return max(1, min(2, os.cpu_count() or 1))


__all__ = ["Plan", "plan", "lower_bound", "OnlineBestFit", "HEURISTICS", "default_workers"]
