"""MILP-specific preprocessing: fixed orders, tight time windows, bounds, warm starts.

Why this exists beside :mod:`optpipe.optimizer.preprocess`: a disjunctive MILP lives or
dies by how few order binaries it has and how small their big-M constants are. The
shared module gives the task graph, FIFO chains and plain windows; this one pushes
further, specifically for the MILP (see ``docs/milp.md``):

* **memory-implied orders** — on a stage whose budget holds ``k`` activations, forward
  ``i`` cannot start before enough backward work has released memory, so ``B_j`` (and,
  when B alone cannot release enough, ``W_j``) must precede ``F_i`` for the first few
  ``j``; these become hard precedences before anything else is computed;
* **one-machine windows** — a task cannot start before all the same-device work that must
  precede it could have run (heads), nor end later than the horizon minus the same-device
  work that must follow it (tails);
* **window-implied orders** — a pair ``(a, b)`` on one device where ``a`` cannot end
  before ``b``'s latest start is ordered ``b`` then ``a``; each new order tightens the
  windows, so the two are propagated to a fixpoint;
* **lower bounds** on the makespan (critical path and Carlier's one-machine bound per
  device with the heads and tails above, ``bounds.preemptive_single_machine``; with
  the memory-implied orders this counts the idle time a memory-bound warm-up forces);
* **warm starts** — a small greedy list scheduler (several priority rules) that always
  has a memory-feasible answer, used beside the shared fixed schedules.

Everything is about the base problem (one stage per device) and split or fused backward;
offload does not create orders here (an offloaded activation releases memory without
backward work, so memory-implied orders are switched off when offload is modelled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from optpipe.errors import InfeasibleError
from optpipe.optimizer.bounds import memory_bound, preemptive_single_machine
from optpipe.optimizer.preprocess import Key, TaskGraph
from optpipe.problem import Problem
from optpipe.schedule import Action, Op, Schedule, linear_placement

#: relative tolerance used when comparing float times derived from sums of durations
TIME_TOL = 1e-9


@dataclass
class Windows:
    """The result of preprocessing for one horizon: indices, orders, windows, bounds.

    ``before[(a, b)]`` (with ``a < b``, indices into ``keys``) is True when ``a`` must
    precede ``b`` on their device and False when ``b`` must precede ``a``; same-device
    pairs of different chains that are missing are the ones the MILP decides.
    ``est``/``lst`` are earliest/latest starts, ``tail[a]`` the least time from ``a``'s
    start to the end of the schedule, ``lower_bound`` a makespan no schedule beats.
    """

    graph: TaskGraph
    keys: list[Key]
    index: dict[Key, int]
    dur: list[float]
    dev: list[int]
    chain_of: list[int]
    edges: list[tuple[int, int, float]]          # data deps and chains: (a, b, lag)
    added: list[tuple[int, int]]                 # deduced orders (a before b)
    before: dict[tuple[int, int], bool]
    free_pairs: list[tuple[int, int]]
    est: list[float]
    tail: list[float]
    lst: list[float]
    horizon: float
    lower_bound: float
    device_tasks: list[list[int]]
    stats: dict[str, float] = field(default_factory=dict)

    def order(self, a: int, b: int) -> bool | None:
        """True if ``a`` precedes ``b`` for sure, False if ``b`` precedes ``a``, None if open."""
        if a < b:
            return self.before.get((a, b))
        v = self.before.get((b, a))
        return None if v is None else not v


def _tol(scale: float) -> float:
    return TIME_TOL * max(1.0, abs(scale))


def memory_orders(problem: Problem, graph: TaskGraph) -> list[tuple[Key, Key]]:
    """Precedences forced by the budget alone: backward work that must precede forwards.

    Why valid: on stage ``s`` (its own device) memory at the start of ``F_i`` is at least
    ``static + (i+1)·act − freed_b·n_B − freed_w·n_W`` where ``n_B``/``n_W`` count the B
    and W (or fused BW) ended before; other stages never share the device in the base
    problem. FIFO makes "``n_B ≥ L``" the same as "``B_0 … B_{L-1}`` before ``F_i``".
    Raises :class:`InfeasibleError` when one activation alone exceeds a budget.
    """
    out: list[tuple[Key, Key]] = []
    M = problem.microbatches
    for s in range(problem.stages):
        act = problem.activation[s]
        room = problem.budget[s] - problem.static[s]
        if act <= 0 or not math.isfinite(room):
            continue
        if act > room + 1e-9 * max(1.0, act):
            raise InfeasibleError(
                f"device {s} cannot hold one microbatch's activations: static "
                f"{problem.static[s]} B + activation {act} B is over its budget "
                f"{problem.budget[s]:.0f} B; raise the budget",
                min_budget=[problem.static[d] + problem.activation[d]
                            for d in range(problem.devices)])
        fb, fw = problem.freed_by_b[s], problem.freed_by_w[s]
        for i in range(M):
            need = (i + 1) * act - room          # bytes that must have been released
            if need <= 1e-9 * act:
                continue
            if graph.split_backward:
                # n_W <= n_B <= i: n B-and-W pairs release at most n·act, so n_B >= need/act;
                # with every earlier B done, the W must release the rest
                n_b = min(i, math.ceil(need / act - 1e-9))
                n_w = math.ceil((need - fb * i) / fw - 1e-9) if fw > 0 else 0
                for j in range(n_b):
                    out.append(((Op.B, s, j), (Op.F, s, i)))
                for j in range(min(max(0, n_w), i)):
                    out.append(((Op.W, s, j), (Op.F, s, i)))
            else:
                n = min(i, math.ceil(need / act - 1e-9))
                for j in range(n):
                    out.append(((Op.BW, s, j), (Op.F, s, i)))
    return out


def prepare(problem: Problem, graph: TaskGraph, horizon: float, *,
            use_memory: bool = True, max_rounds: int = 50) -> Windows:
    """Propagate orders and windows for schedules of makespan at most ``horizon``.

    Sound for every schedule that respects FIFO per op type, ends by ``horizon`` and
    (with ``use_memory``) keeps every device within budget without offload.
    """
    keys = list(graph.topological())
    index = {k: i for i, k in enumerate(keys)}
    N = len(keys)
    dur = [float(graph.duration[k]) for k in keys]
    dev = [graph.device(k) for k in keys]
    chain_id: dict[Key, int] = {}
    for c, chain in enumerate(graph.chains):
        for k in chain:
            chain_id[k] = c
    chain_of = [chain_id[k] for k in keys]
    edges: list[tuple[int, int, float]] = []
    for k, preds in graph.deps.items():
        for p, lag in preds:
            edges.append((index[p], index[k], float(lag)))
    for chain in graph.chains:
        for a, b in zip(chain, chain[1:]):
            edges.append((index[a], index[b], 0.0))
    device_tasks: list[list[int]] = [[] for _ in range(problem.devices)]
    for i in range(N):
        device_tasks[dev[i]].append(i)
    added: list[tuple[int, int]] = []
    if use_memory:
        for a, b in memory_orders(problem, graph):
            added.append((index[a], index[b]))
    tol = _tol(horizon)
    before: dict[tuple[int, int], bool] = {}
    stats = {"rounds": 0, "memory_orders": len(added)}
    est = tail = lst = []  # filled below
    for rounds in range(max_rounds):
        stats["rounds"] = rounds + 1
        succ: list[list[tuple[int, float]]] = [[] for _ in range(N)]
        pred: list[list[tuple[int, float]]] = [[] for _ in range(N)]
        for a, b, lag in edges:
            succ[a].append((b, lag))
            pred[b].append((a, lag))
        for a, b in added:
            succ[a].append((b, 0.0))
            pred[b].append((a, 0.0))
        topo = _toposort(N, succ)
        # reachability as bitsets (descendants), then same-device pair orders
        desc = [0] * N
        for a in reversed(topo):
            bits = 0
            for b, _ in succ[a]:
                bits |= (1 << b) | desc[b]
            desc[a] = bits
        anc_dev: list[list[int]] = [[] for _ in range(N)]
        succ_dev: list[list[int]] = [[] for _ in range(N)]
        for d_tasks in device_tasks:
            for i, a in enumerate(d_tasks):
                for b in d_tasks[i + 1:]:
                    if (desc[a] >> b) & 1:
                        before[(min(a, b), max(a, b))] = a < b
                    elif (desc[b] >> a) & 1:
                        before[(min(a, b), max(a, b))] = b < a
            for a in d_tasks:
                for b in d_tasks:
                    if a != b and (desc[b] >> a) & 1:
                        anc_dev[a].append(b)
                        succ_dev[b].append(a)
        # heads: longest path + one-machine bound over same-device ancestors
        est = [0.0] * N
        for a in topo:
            t = 0.0
            for p, lag in pred[a]:
                t = max(t, est[p] + dur[p] + lag)
            if anc_dev[a]:
                t = max(t, _head_bound([(est[p], dur[p]) for p in anc_dev[a]]))
            est[a] = t
        # tails (start of a to end of schedule): longest path + one-machine bound
        tail = [0.0] * N
        for a in reversed(topo):
            q = dur[a]
            for b, lag in succ[a]:
                q = max(q, dur[a] + lag + tail[b])
            if succ_dev[a]:
                q = max(q, dur[a] + _head_bound([(tail[b] - dur[b], dur[b])
                                                 for b in succ_dev[a]]))
            tail[a] = q
        lst = [horizon - tail[a] for a in range(N)]
        for a in range(N):
            if est[a] > lst[a] + tol:
                raise HorizonTooSmall(f"task {keys[a]} has est {est[a]} > lst {lst[a]}")
        # window-implied orders
        new: list[tuple[int, int]] = []
        for d_tasks in device_tasks:
            for i, a in enumerate(d_tasks):
                for b in d_tasks[i + 1:]:
                    if chain_of[a] == chain_of[b]:
                        continue
                    pair = (min(a, b), max(a, b))
                    if pair in before:
                        continue
                    a_first_ok = est[a] + dur[a] <= lst[b] + tol
                    b_first_ok = est[b] + dur[b] <= lst[a] + tol
                    if not a_first_ok and not b_first_ok:
                        raise HorizonTooSmall(f"tasks {keys[a]} and {keys[b]} cannot be "
                                               f"ordered within the horizon")
                    if not a_first_ok:
                        new.append((b, a))
                    elif not b_first_ok:
                        new.append((a, b))
        if not new:
            break
        added.extend(new)
    free_pairs = []
    for d_tasks in device_tasks:
        for i, a in enumerate(d_tasks):
            for b in d_tasks[i + 1:]:
                if chain_of[a] == chain_of[b]:
                    before.setdefault((min(a, b), max(a, b)),
                                      graph.chains[chain_of[a]].index(keys[min(a, b)]) <
                                      graph.chains[chain_of[a]].index(keys[max(a, b)]))
                    continue
                pair = (min(a, b), max(a, b))
                if pair not in before:
                    free_pairs.append(pair)
    lb = max(est[a] + tail[a] for a in range(N))
    for d_tasks in device_tasks:
        lb = max(lb, preemptive_single_machine((est[a], dur[a], tail[a] - dur[a])
                                               for a in d_tasks))
    if use_memory:                    # the memory round trip, shared with CP-SAT
        lb = max(lb, memory_bound(graph))
    stats["free_pairs"] = len(free_pairs)
    stats["fixed_pairs"] = sum(1 for (a, b) in before if chain_of[a] != chain_of[b])
    return Windows(graph=graph, keys=keys, index=index, dur=dur, dev=dev,
                   chain_of=chain_of, edges=edges, added=added, before=before,
                   free_pairs=free_pairs, est=est, tail=tail, lst=lst, horizon=horizon,
                   lower_bound=lb, device_tasks=device_tasks, stats=stats)


class HorizonTooSmall(Exception):
    """The horizon admits no schedule (a bug if the horizon came from a real schedule)."""


def _toposort(N: int, succ: list[list[tuple[int, float]]]) -> list[int]:
    indeg = [0] * N
    for a in range(N):
        for b, _ in succ[a]:
            indeg[b] += 1
    stack = [a for a in range(N) if indeg[a] == 0]
    out = []
    while stack:
        a = stack.pop()
        out.append(a)
        for b, _ in succ[a]:
            indeg[b] -= 1
            if indeg[b] == 0:
                stack.append(b)
    if len(out) != N:
        raise HorizonTooSmall("deduced orders form a cycle")
    return out


def _head_bound(items: list[tuple[float, float]]) -> float:
    """Least end of a set of ``(release, length)`` jobs on one machine (all must run)."""
    items = sorted(items, reverse=True)
    total = 0.0
    best = 0.0
    for release, length in items:
        total += length
        best = max(best, release + total)
    return best


# ------------------------------------------------------------------ greedy
def greedy_schedule(problem: Problem, split_backward: bool, *, prefer: str = "B",
                    w_mode: str = "fill", inflight: Sequence[float] | None = None,
                    name: str = "milp-greedy") -> Schedule:
    """A memory-feasible FIFO schedule from simple dispatch rules.

    Why our own: the MILP's windows come from the warm start's makespan, so a good one
    must exist for every budget and both backward modes. Rules, per device, at the
    earliest moment over all devices where some task can start: a ready B before F
    (``prefer="B"``) or F before B; an F only if it fits the budget and the device keeps
    fewer than ``inflight[s]`` microbatches; a W when it is ``eager``, when it fits in the
    idle gap before the next F/B could start (``fill``), when an F is held back by
    memory, or when nothing else is left. A device that keeps nothing always admits an
    F, so there is no deadlock above the minimum budget.
    """
    S, M = problem.stages, problem.microbatches
    p2p = problem.p2p
    fw_t, b_t, w_t = problem.forward, problem.backward_input, problem.backward_weight
    bw_op = Op.B if split_backward else Op.BW
    b_len = [b_t[s] if split_backward else problem.bw_time(s) for s in range(S)]
    free_b = [problem.freed_by_b[s] if split_backward else problem.activation[s]
              for s in range(S)]
    inflight = list(inflight) if inflight is not None else [math.inf] * S
    nf = [0] * S
    nb = [0] * S
    nw = [0] * S
    t_free = [0.0] * S
    level = [float(problem.static[s]) for s in range(S)]
    end_f: dict[tuple[int, int], float] = {}
    end_b: dict[tuple[int, int], float] = {}
    orders: list[list[tuple[Op, int, int]]] = [[] for _ in range(S)]
    per_stage = 3 if split_backward else 2
    remaining = S * M * per_stage
    while remaining:
        best = None
        for s in range(S):
            cands = []  # (start, rank, op)
            # F
            f_ok = False
            if nf[s] < M:
                m = nf[s]
                kept = nf[s] - nb[s]
                mem_ok = level[s] + problem.activation[s] <= problem.budget[s] + 1e-9 or \
                    kept == 0
                cap_ok = kept < inflight[s] or kept == 0
                if s == 0 or (s - 1, m) in end_f:
                    ready = 0.0 if s == 0 else end_f[(s - 1, m)] + p2p
                    if mem_ok and cap_ok:
                        cands.append((max(t_free[s], ready), 0 if prefer == "F" else 1,
                                      Op.F))
                        f_ok = True
                f_blocked_by_mem = not mem_ok
            else:
                f_blocked_by_mem = False
            # B / BW
            b_start = None
            if nb[s] < nf[s]:
                m = nb[s]
                if s == S - 1 or (s + 1, m) in end_b:
                    ready = end_f[(s, m)] if s == S - 1 else end_b[(s + 1, m)] + p2p
                    ready = max(ready, end_f[(s, m)])
                    b_start = max(t_free[s], ready)
                    cands.append((b_start, 0 if prefer == "B" else 1, bw_op))
            # W
            if split_backward and nw[s] < nb[s]:
                start = t_free[s]
                other = [c[0] for c in cands]
                nothing_else = nf[s] == M and nb[s] == M
                if w_mode == "eager" or f_blocked_by_mem or nothing_else:
                    cands.append((start, -1 if w_mode == "eager" or f_blocked_by_mem
                                  else 2, Op.W))
                elif w_mode == "fill":
                    if not other or min(other) >= start + w_t[s] - 1e-12:
                        cands.append((start, 2, Op.W))
                    elif not f_ok and b_start is None:
                        cands.append((start, 2, Op.W))
            if not cands:
                continue
            cand = min(cands, key=lambda c: (c[0], c[1]))
            key = (cand[0], s, cand[1])
            if best is None or key < best[0]:
                best = (key, s, cand[2])
        if best is None:
            raise RuntimeError("greedy schedule stalled")  # pragma: no cover
        (start, _, _), s, op = best
        if op is Op.F:
            m = nf[s]
            nf[s] += 1
            level[s] += problem.activation[s]
            t_free[s] = start + fw_t[s]
            end_f[(s, m)] = t_free[s]
        elif op in (Op.B, Op.BW):
            m = nb[s]
            nb[s] += 1
            t_free[s] = start + b_len[s]
            level[s] -= free_b[s]
            end_b[(s, m)] = t_free[s]
        else:
            m = nw[s]
            nw[s] += 1
            t_free[s] = start + w_t[s]
            level[s] -= problem.freed_by_w[s]
        orders[s].append((op, s, m))
        remaining -= 1
    actions = [[Action(op, s, m) for op, s, m in seq] for seq in orders]
    return Schedule(name=name, stages=S, devices=S, microbatches=M,
                    placement=linear_placement(S), actions=actions,
                    provenance={"source": "generator", "name": name}).validate()


def greedy_family(problem: Problem, split_backward: bool) -> list[Schedule]:
    """A handful of greedy variants (the caller simulates them and keeps the best)."""
    S = problem.stages
    out = []
    caps: list[list[float] | None] = [None]
    for factor in (1.0, 1.5, 2.0, 3.0):
        caps.append([max(1.0, math.ceil(factor * (S - s))) for s in range(S)])
    w_modes = ("fill", "eager") if split_backward else ("eager",)
    for prefer in ("B", "F"):
        for w_mode in w_modes:
            for cap in caps:
                try:
                    out.append(greedy_schedule(problem, split_backward, prefer=prefer,
                                               w_mode=w_mode, inflight=cap,
                                               name=f"milp-greedy-{prefer}-{w_mode}"))
                except Exception:  # a heuristic variant must never break the solve
                    continue
    return out


def max_violation(pyo: Any, m: Any) -> float:
    """Largest violation of any constraint or variable bound of Pyomo model ``m``
    at its current values (inf when a value is missing): checks a warm start."""
    worst = 0.0
    for c in m.component_data_objects(pyo.Constraint, active=True):
        body = pyo.value(c.body, exception=False)
        if body is None:
            return math.inf
        if c.has_lb():
            worst = max(worst, pyo.value(c.lower) - body)
        if c.has_ub():
            worst = max(worst, body - pyo.value(c.upper))
    for v in m.component_data_objects(pyo.Var):
        if v.value is None:
            return math.inf
        if v.lb is not None:
            worst = max(worst, v.lb - v.value)
        if v.ub is not None:
            worst = max(worst, v.value - v.ub)
    return worst
