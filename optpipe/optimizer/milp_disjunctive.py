"""The disjunctive MILP formulation (Pyomo), for any data and with offload.

Why a module of its own: it is the MILP engine's (:mod:`.milp`) larger formulation
beside the time-indexed one (:mod:`.milp_ti`), and the one the solver runs
(:mod:`.milp_run`) build for Gurobi and for HiGHS's horizon probes. One binary per pair
of tasks of different FIFO chains whose order preprocessing (:mod:`.milp_prep`) left
open, with a big-M from the two windows, "staircase" links between neighbouring pairs,
memory as linear counts of the tasks done before each F (exact: a compute-only order
fixes the memory curve), energy rows tying the counts to time; a MIP start from a
schedule and the extraction of a schedule from a solution.

Offload model (``offload=True``; why each choice keeps the simulator on the safe side):
an OFFLOAD is listed right after its F; a RELOAD of microbatch ``i`` is listed right after
a compute task ``X`` (an ``F_j``, ``j > i``, or a ``B_k`` or ``W_k``, ``k < i``) between
``F_i`` and ``B_i``, so its buffer is reserved exactly at ``X``'s end, which is where the model
counts it from; reloads run in microbatch order. The simulator may start any task
earlier than the model and never makes a forward wait for an offload, so an offload is
counted as released at a checkpoint only when the compute work listed between its F and
that checkpoint is at least the d2h channel's backlog (an upper bound the model
carries), which holds however the simulator shifts tasks.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

from optpipe.optimizer import milp_prep
from optpipe.optimizer.milp_prep import Windows
from optpipe.optimizer.preprocess import Key, TaskGraph
from optpipe.problem import Problem
from optpipe.schedule import Op, Schedule
from optpipe.simulator import SimResult

#: room (in model time units, i.e. longest tasks) an offload must leave before it
#: counts as released; far above the solvers' 1e-6 feasibility tolerance
RELEASE_MARGIN = 1e-4


class DisjunctiveModel:
    """The Pyomo model, the maps from tasks to its variables, MIP start and extraction.

    Time inside the model is in units of ``unit`` seconds (the longest task), so that
    coefficients and big-Ms are O(1…1000) whatever the problem's scale.
    """

    formulation = "disjunctive"

    def __init__(self, problem: Problem, graph: TaskGraph, win: Windows,
                 offload: bool = False) -> None:
        import pyomo.environ as pyo

        self.pyo = pyo
        self.problem = problem
        self.graph = graph
        self.win = win
        self.offload = offload and any(math.isfinite(b) for b in problem.budget)
        positive = [d for d in win.dur if d > 0] + ([problem.p2p] if problem.p2p > 0 else [])
        self.unit = max(positive) if positive else 1.0
        u = self.unit
        N = len(win.keys)
        self.N = N
        self.dur = [d / u for d in win.dur]
        self.est = [e / u for e in win.est]
        self.lst = [max(l, e) / u for l, e in zip(win.lst, win.est)]
        self.tail = [q / u for q in win.tail]
        self.H = win.horizon / u
        self.LB = min(win.lower_bound, win.horizon) / u
        m = pyo.ConcreteModel(name="optpipe_milp")
        self.m = m
        m.s = pyo.Var(range(N), bounds=lambda _, a: (self.est[a], self.lst[a]))
        m.C = pyo.Var(bounds=(self.LB, self.H))
        self.pair_index = {pair: p for p, pair in enumerate(win.free_pairs)}
        m.v = pyo.Var(range(len(win.free_pairs)), within=pyo.Binary)
        self.cons = pyo.ConstraintList()
        m.cons = self.cons
        P = problem
        self.off_stages = [s for s in range(P.stages)
                           if math.isfinite(P.budget[s] - P.static[s])
                           and P.activation[s] > 0 and P.microbatches > 1] \
            if self.offload else []
        self._build_compute()
        if self.offload:
            self._build_offload()
        m.obj = pyo.Objective(expr=m.C, sense=pyo.minimize)

    # ---------------------------------------------------------------- helpers
    def add(self, relation: Any) -> None:
        """Add a row; a relation that folded to a constant must hold and is dropped."""
        if isinstance(relation, bool):
            if not relation:  # pragma: no cover - windows come from a feasible horizon
                raise RuntimeError("MILP: a constant row is violated")
            return
        self.cons.add(relation)

    def before(self, a: int, b: int) -> Any:
        """1 if task ``a`` runs before task ``b`` (same device): a constant or a binary."""
        fixed = self.win.order(a, b)
        if fixed is not None:
            return 1 if fixed else 0
        if a < b:
            return self.m.v[self.pair_index[(a, b)]]
        return 1 - self.m.v[self.pair_index[(b, a)]]

    def k(self, op: Op, s: int, mb: int) -> int:
        return self.win.index[(op, s, mb)]

    def size(self) -> dict[str, int]:
        """Variables, binaries and constraints (what a size-limited license counts)."""
        nv = self.N + 1 + len(self.win.free_pairs) + self._extra_vars
        return {"variables": nv, "binaries": len(self.win.free_pairs) + self._extra_bins,
                "constraints": len(self.cons), "tasks": self.N}

    _extra_vars = 0
    _extra_bins = 0

    # ------------------------------------------------------------ compute model
    def _build_compute(self) -> None:
        m, win, add = self.m, self.win, self.add
        dur, est, lst = self.dur, self.est, self.lst
        lag_u = 1.0 / self.unit
        # data dependencies and chains, then deduced orders
        for a, b, lag in win.edges:
            add(m.s[b] >= m.s[a] + dur[a] + lag * lag_u)
        for a, b in win.added:
            add(m.s[b] >= m.s[a] + dur[a])
        # disjunctions with per-pair big-M from windows
        for p, (a, b) in enumerate(win.free_pairs):
            m_ab = max(0.0, lst[a] + dur[a] - est[b])  # relaxes "a before b" when v = 0
            m_ba = max(0.0, lst[b] + dur[b] - est[a])  # relaxes "b before a" when v = 1
            add(m.s[b] >= m.s[a] + dur[a] - m_ab * (1 - m.v[p]))
            add(m.s[a] >= m.s[b] + dur[b] - m_ba * m.v[p])
        # staircase links between neighbouring pairs of the same two chains
        nxt = self._chain_next()
        for (a, b) in win.free_pairs:
            # a before b  =>  a before next(b);   next(a) before b  =>  a before b
            for x, y in ((a, b), (b, a)):
                ny = nxt[y]
                if ny is not None:
                    lhs, rhs = self.before(x, y), self.before(x, ny)
                    if not (isinstance(lhs, int) or isinstance(rhs, int)):
                        add(lhs <= rhs)
        # makespan: tails, and per device the work that must follow a task
        for a in range(self.N):
            add(m.C >= m.s[a] + self.tail[a])
        for tasks in win.device_tasks:
            head = min(est[t] for t in tasks)
            for a in tasks:
                after = [(dur[b], self.before(a, b)) for b in tasks if b != a]
                if any(not isinstance(x, int) for _, x in after):
                    add(m.C >= m.s[a] + dur[a] + sum(d * x for d, x in after))
                    add(m.s[a] >= head + sum(d * self.before(b, a) for b in tasks if b != a
                                             for d in (dur[b],)))
        # memory at every forward's start
        P = self.problem
        split = self.graph.split_backward
        M = P.microbatches
        for s in range(P.stages):
            room = P.budget[s] - P.static[s]
            act = P.activation[s]
            if not math.isfinite(room) or act <= 0 or s in self.off_stages:
                continue
            scale = float(act)
            for i in range(M):
                f = self.k(Op.F, s, i)
                freed = []
                if split:
                    for j in range(i):
                        freed.append((P.freed_by_b[s], self.before(self.k(Op.B, s, j), f)))
                        freed.append((P.freed_by_w[s], self.before(self.k(Op.W, s, j), f)))
                else:
                    for j in range(i):
                        freed.append((act, self.before(self.k(Op.BW, s, j), f)))
                worst = (i + 1) * act - sum(c * x for c, x in freed if isinstance(x, int))
                if worst <= room + 1e-9 * act:
                    continue
                add((i + 1) - sum((c / scale) * x for c, x in freed) <= room / scale)

    def _chain_next(self) -> list[Optional[int]]:
        nxt: list[Optional[int]] = [None] * self.N
        for chain in self.graph.chains:
            for x, y in zip(chain, chain[1:]):
                nxt[self.win.index[x]] = self.win.index[y]
        return nxt

    # ------------------------------------------------------------ offload model
    def _build_offload(self) -> None:
        """Offload choices, reload attachments, channel backlog and memory checkpoints.

        Per stage and microbatch ``i``: ``o[i]`` offloads it; ``a[i, X]`` says its RELOAD
        is listed right after compute task ``X`` (an ``F_j``, ``j > i``, or a ``B_k`` or
        ``W_k``, ``k < i``, that comes after ``F_i`` and before ``B_i``), so its buffer is
        reserved at ``X``'s end. Memory is checked where it can rise: at each F's start
        and at the end of every task a reload may follow. An offload counts as released
        at a checkpoint only when ``beta[i]`` (an upper bound on how long after ``F_i``'s
        end the d2h channel finishes it, computed from the work listed between forwards)
        is at most the work listed between ``F_i`` and that checkpoint: the simulator
        cannot run that work faster than back to back, so the release really happened.
        """
        pyo, m, add = self.pyo, self.m, self.add
        P = self.problem
        M = P.microbatches
        split = self.graph.split_backward
        dur = self.dur
        big = self.H * 2 + 1.0
        bop = Op.B if split else Op.BW
        st = self.off_stages
        self.cand: dict[tuple[int, int], list[Key]] = {}
        for s in st:
            for i in range(M):
                self.cand[(s, i)] = ([(Op.F, s, j) for j in range(i + 1, M)]
                                     + [(bop, s, k) for k in range(i)]
                                     + ([(Op.W, s, k) for k in range(i)] if split else []))
        idx_o = [(s, i) for s in st for i in range(M)]
        idx_a = [(s, i, c) for s in st for i in range(M) for c in range(len(self.cand[(s, i)]))]
        idx_e = [(s, i, j) for s in st for i in range(M) for j in range(i + 1, M)]
        idx_eb = [(s, i, k) for s in st for i in range(M) for k in range(i)]
        idx_ew = idx_eb if split else []
        m.o = pyo.Var(idx_o, within=pyo.Binary)
        m.ew = pyo.Var(idx_ew, within=pyo.Binary)
        m.a = pyo.Var(idx_a, within=pyo.Binary)
        m.e = pyo.Var(idx_e, within=pyo.Binary)
        m.ef = pyo.Var(idx_e, within=pyo.Binary)
        m.eb = pyo.Var(idx_eb, within=pyo.Binary)
        m.beta = pyo.Var(idx_o, bounds=(0, None))
        m.rs = pyo.Var(idx_o, bounds=(0, self.H))
        m.h = pyo.Var(idx_o, bounds=(0, self.H))
        m.pos = pyo.Var(idx_o, bounds=(0, None))
        # reservation indicators at checkpoints: Fs (F start), Fe (F end), Be (B end),
        # We (W end)
        idx_r = ([(s, i, "Fs", j) for s in st for i in range(M) for j in range(i + 1, M)]
                 + [(s, i, "Fe", j) for s in st for i in range(M) for j in range(i + 1, M)]
                 + [(s, i, "Be", k) for s in st for i in range(M) for k in range(i)]
                 + ([(s, i, "We", k) for s in st for i in range(M) for k in range(i)]
                    if split else []))
        m.rho = pyo.Var(idx_r, bounds=(0, 1))
        self._extra_vars = (len(idx_o) * 5 + len(idx_a) + 2 * len(idx_e) + len(idx_eb)
                            + len(idx_ew) + len(idx_r))
        self._extra_bins = (len(idx_o) + len(idx_a) + 2 * len(idx_e) + len(idx_eb)
                            + len(idx_ew))
        for s in st:
            act = P.activation[s]
            fb = (P.freed_by_b[s] if split else act) / act
            fwr = (P.freed_by_w[s] / act) if split else 0.0
            room = (P.budget[s] - P.static[s]) / act
            delta, rho_d, f_d, b_d, w_d, F, B, W = self._stage_offload_terms(s)
            tasks = self.win.device_tasks[s]
            work_all = sum(dur[t] for t in tasks)
            slack = delta * M + work_all + 1.0   # relaxes the robust-release rows
            # an offload counts as released only with this much room to spare: HiGHS
            # accepts rows violated by ~1e-6, and a transfer of 4e-8 s "fitting" in zero
            # work would let the simulator allocate before the release
            margin = RELEASE_MARGIN
            o = {i: m.o[s, i] for i in range(M)}

            def nb_before(x: int) -> Any:
                return sum(self.before(B[j], x) for j in range(M) if B[j] != x)

            def nw_before(x: int) -> Any:
                return sum(self.before(W[j], x) for j in range(M)) if split else 0

            def pos(x: int) -> Any:
                return sum(self.before(y, x) for y in tasks if y != x)

            nbF = [nb_before(F[i]) for i in range(M)]
            nwF = [nw_before(F[i]) for i in range(M)]
            # channel backlog after F_i, bounded via the work listed between forwards
            for i in range(M):
                add(m.beta[s, i] >= delta * o[i])
                if i > 0:
                    g = f_d + b_d * (nbF[i] - nbF[i - 1]) + w_d * (nwF[i] - nwF[i - 1])
                    add(m.beta[s, i] >= m.beta[s, i - 1] - g + delta * o[i])
            # robust releases at F_j's start (j > i) and at B_k's end (k < i)
            for i in range(M):
                for j in range(i + 1, M):
                    work = f_d * (j - i - 1) + b_d * (nbF[j] - nbF[i]) + w_d * (nwF[j] - nwF[i])
                    add(m.e[s, i, j] <= o[i])
                    add(m.beta[s, i] + margin <= work + slack * (1 - m.e[s, i, j])
                        + slack * self.before(B[i], F[j]))
                    # ... and by F_j's end (F_j itself runs in between)
                    add(m.ef[s, i, j] <= o[i])
                    add(m.beta[s, i] + margin <= work + f_d + slack * (1 - m.ef[s, i, j])
                        + slack * self.before(B[i], F[j]))
                    if j + 1 < M:
                        add(m.e[s, i, j] <= m.e[s, i, j + 1])
                for k in range(i):
                    n_f = sum(self.before(F[j], B[k]) for j in range(i + 1, M))
                    n_b = (k + 1) - sum(self.before(B[kk], F[i]) for kk in range(k + 1))
                    n_w = (sum(self.before(W[q], B[k]) for q in range(M))
                           - sum(self.before(W[q], F[i]) for q in range(M))) if split else 0
                    work = f_d * n_f + b_d * n_b + w_d * n_w
                    add(m.eb[s, i, k] <= o[i])
                    # not allocated yet, so nothing to release (else a phantom release)
                    add(m.eb[s, i, k] <= 1 - self.before(B[k], F[i]))
                    add(m.beta[s, i] + margin <= work + slack * (1 - m.eb[s, i, k])
                        + slack * self.before(B[k], F[i]))
                    if split:
                        # released by the end of W_k (k < i, W_k after F_i)
                        n_f = sum(self.before(F[j], W[k]) for j in range(i + 1, M))
                        n_b = (sum(self.before(B[q], W[k]) for q in range(M))
                               - sum(self.before(B[q], F[i]) for q in range(M)))
                        n_w = (k + 1) - sum(self.before(W[q], F[i]) for q in range(k + 1))
                        work = f_d * n_f + b_d * n_b + w_d * n_w
                        add(m.ew[s, i, k] <= o[i])
                        add(m.ew[s, i, k] <= 1 - self.before(W[k], F[i]))
                        add(m.beta[s, i] + margin <= work + slack * (1 - m.ew[s, i, k])
                            + slack * self.before(W[k], F[i])
                            + slack * self.before(B[i], W[k]))
            # reload attachments: exactly one when offloaded, after F_i, before B_i
            n_tasks = float(len(tasks))
            for i in range(M):
                cand = self.cand[(s, i)]
                add(sum(m.a[s, i, c] for c in range(len(cand))) == o[i])
                for c, key in enumerate(cand):
                    x = self.win.index[key]
                    if key[0] is not Op.F:     # after its OFFLOAD
                        add(m.a[s, i, c] <= 1 - self.before(x, F[i]))
                    if key[0] is not bop:      # before its backward
                        add(m.a[s, i, c] <= self.before(x, B[i]))
                    # list position of the reload, for microbatch order on the channel
                    px = pos(x)
                    add(m.pos[s, i] >= px - n_tasks * (1 - m.a[s, i, c]))
                    add(m.pos[s, i] <= px + n_tasks * (1 - m.a[s, i, c]))
                    # issue at X's end
                    add(m.rs[s, i] >= m.s[x] + dur[x] - big * (1 - m.a[s, i, c]))
                for i2 in range(i + 1, M):
                    add(m.pos[s, i] <= m.pos[s, i2] + n_tasks * (2 - o[i] - o[i2]))
            # reserved by a checkpoint when attached to a task ending no later

            def reserved(i: int, kind: str, y: int) -> Any:
                cand = self.cand[(s, i)]
                rv = m.rho[s, i, kind, {"Fs": F, "Fe": F, "Be": B, "We": W}[kind].index(y)]
                for c, key in enumerate(cand):
                    x = self.win.index[key]
                    inc = (1 if (x == y and kind != "Fs") else
                           (0 if x == y else self.before(x, y)))
                    if isinstance(inc, int) and inc == 0:
                        continue
                    add(rv >= m.a[s, i, c] + inc - 1)
                return rv

            for j in range(M):
                base = (j + 1) - fb * nbF[j] - fwr * nwF[j]
                add(base - sum(m.e[s, i, j] - reserved(i, "Fs", F[j]) for i in range(j))
                    <= room)
                add(base - sum(m.ef[s, i, j] - reserved(i, "Fe", F[j]) for i in range(j))
                    <= room)
            for k in range(M):
                n_f = sum(self.before(F[j], B[k]) for j in range(M))
                level = n_f - fb * (k + 1) - fwr * nw_before(B[k])
                level = level - sum(m.eb[s, i, k] - reserved(i, "Be", B[k])
                                    for i in range(k + 1, M))
                add(level <= room)
            if split:
                # memory at each W_k end (reservations happen there too); microbatches
                # whose B already ran count zero net (reloaded, then released by B/W)
                for k in range(M):
                    n_f = sum(self.before(F[j], W[k]) for j in range(M))
                    n_b = sum(self.before(B[q], W[k]) for q in range(M))
                    level = n_f - fb * n_b - fwr * (k + 1)
                    level = level - sum(m.ew[s, i, k] - reserved(i, "We", W[k])
                                        for i in range(k + 1, M))
                    add(level <= room)
            # reload timing: after its offload, after the previous reload, before B_i
            for i in range(M):
                add(m.rs[s, i] >= m.s[F[i]] + f_d + m.beta[s, i] - big * (1 - o[i]))
                if i > 0:
                    add(m.rs[s, i] >= m.h[s, i - 1] - big * (1 - o[i]))
                    add(m.h[s, i] >= m.h[s, i - 1])
                add(m.h[s, i] >= m.rs[s, i] + rho_d - big * (1 - o[i]))
                add(m.s[B[i]] >= m.rs[s, i] + rho_d - big * (1 - o[i]))

    # ------------------------------------------------------------- MIP start
    def load_schedule(self, schedule: Schedule, result: SimResult) -> bool:
        """Set every variable from a FIFO schedule; True if all constraints hold.

        Why check: a start that violates the model (say an offload the model's
        conservative accounting does not allow) would be rejected by the solver anyway,
        and the horizon must come from a schedule the model accepts.
        """
        m, win, u = self.m, self.win, self.unit
        start = {r.action.key: r.start for r in result.records if r.action.op.is_compute}
        pos: dict[Key, int] = {}
        for acts in schedule.actions:
            n = 0
            for a in acts:
                if a.op.is_compute:
                    pos[a.key] = n
                    n += 1
        try:
            for a, key in enumerate(win.keys):
                m.s[a].set_value(start[key] / u, skip_validation=True)
            for p, (a, b) in enumerate(win.free_pairs):
                m.v[p].set_value(1 if pos[win.keys[a]] < pos[win.keys[b]] else 0,
                                 skip_validation=True)
        except KeyError:
            return False
        m.C.set_value(result.makespan / u, skip_validation=True)
        if self.offload:
            if not self._load_offload(schedule, result):
                return False
        return self.max_violation() <= 1e-6

    def _load_offload(self, schedule: Schedule, result: SimResult) -> bool:
        """Offload choices and reload attachments of a schedule, derived values settled."""
        m, P, u = self.m, self.problem, self.unit
        M = P.microbatches
        rec = {r.action.key: r for r in result.records}
        after: dict[tuple[int, int], Key | None] = {}
        for acts in schedule.actions:
            last = None
            for a in acts:
                if a.op.is_compute:
                    last = a.key
                elif a.op is Op.RELOAD:
                    if a.fraction != 1.0:
                        return False
                    after[(a.stage, a.microbatch)] = last
        for s in self.off_stages:
            for i in range(M):
                cand = self.cand[(s, i)]
                issued = after.get((s, i), "none")
                if issued != "none" and issued not in cand:
                    return False
                m.o[s, i].set_value(0 if issued == "none" else 1, skip_validation=True)
                for c, key in enumerate(cand):
                    m.a[s, i, c].set_value(1 if key == issued else 0, skip_validation=True)
                r = rec.get((Op.RELOAD, s, i))
                m.rs[s, i].set_value(r.start / u if r else 0.0, skip_validation=True)
        self._settle_derived()
        return True

    def _stage_offload_terms(self, s: int) -> tuple[float, float, float, float, float,
                                                    list[Any], list[Any], list[Any]]:
        """Stage ``s``'s transfer and compute lengths in model units, and its F/B/W keys."""
        P, u, M = self.problem, self.unit, self.problem.microbatches
        split = self.graph.split_backward
        bop = Op.B if split else Op.BW
        return (P.offload_time(s) / u, P.reload_time(s) / u, P.forward[s] / u,
                (P.backward_input[s] if split else P.bw_time(s)) / u,
                P.backward_weight[s] / u if split else 0.0,
                [self.k(Op.F, s, i) for i in range(M)],
                [self.k(bop, s, i) for i in range(M)],
                [self.k(Op.W, s, i) for i in range(M)] if split else [])

    def _settle_derived(self) -> None:
        """Give the derived offload variables their tightest values (for a MIP start)."""
        pyo, m, P = self.pyo, self.m, self.problem
        M = P.microbatches
        split = self.graph.split_backward

        def val(expr: Any) -> float:
            return float(pyo.value(expr))

        for s in self.off_stages:
            delta, rho_d, f_d, b_d, w_d, F, B, W = self._stage_offload_terms(s)
            tasks = self.win.device_tasks[s]
            o = [round(val(m.o[s, i])) for i in range(M)]
            nbF = [sum(val(self.before(B[j], F[i])) for j in range(M) if j != i)
                   for i in range(M)]
            nwF = [sum(val(self.before(W[j], F[i])) for j in range(M)) if split else 0
                   for i in range(M)]
            beta: list[float] = []
            for i in range(M):
                b = delta * o[i]
                if i > 0:
                    g = f_d + b_d * (nbF[i] - nbF[i - 1]) + w_d * (nwF[i] - nwF[i - 1])
                    b = max(b, beta[-1] - g + delta * o[i])
                beta.append(b)
                m.beta[s, i].set_value(b, skip_validation=True)
            h = 0.0
            for i in range(M):
                if o[i]:
                    h = max(h, val(m.rs[s, i]) + rho_d)
                m.h[s, i].set_value(h, skip_validation=True)
            for i in range(M):
                for j in range(i + 1, M):
                    work = f_d * (j - i - 1) + b_d * (nbF[j] - nbF[i]) + w_d * (nwF[j] - nwF[i])
                    ok = o[i] and (beta[i] + RELEASE_MARGIN <= work + 1e-12
                                   or val(self.before(B[i], F[j])) > 0.5)
                    m.e[s, i, j].set_value(1 if ok else 0, skip_validation=True)
                    ok = o[i] and (beta[i] + RELEASE_MARGIN <= work + f_d + 1e-12
                                   or val(self.before(B[i], F[j])) > 0.5)
                    m.ef[s, i, j].set_value(1 if ok else 0, skip_validation=True)
                for k in range(i):
                    n_f = sum(val(self.before(F[j], B[k])) for j in range(i + 1, M))
                    n_b = (k + 1) - sum(val(self.before(B[kk], F[i])) for kk in range(k + 1))
                    n_w = (sum(val(self.before(W[q], B[k])) for q in range(M))
                           - sum(val(self.before(W[q], F[i])) for q in range(M))) if split else 0
                    work = f_d * n_f + b_d * n_b + w_d * n_w
                    ok = (o[i] and val(self.before(B[k], F[i])) < 0.5
                          and beta[i] + RELEASE_MARGIN <= work + 1e-12)
                    m.eb[s, i, k].set_value(1 if ok else 0, skip_validation=True)
                    if split:
                        n_f = sum(val(self.before(F[j], W[k])) for j in range(i + 1, M))
                        n_b = (sum(val(self.before(B[q], W[k])) for q in range(M))
                               - sum(val(self.before(B[q], F[i])) for q in range(M)))
                        n_w = (k + 1) - sum(val(self.before(W[q], F[i])) for q in range(k + 1))
                        work = f_d * n_f + b_d * n_b + w_d * n_w
                        ok = (o[i] and val(self.before(W[k], F[i])) < 0.5
                              and (beta[i] + RELEASE_MARGIN <= work + 1e-12
                                   or val(self.before(B[i], W[k])) > 0.5))
                        m.ew[s, i, k].set_value(1 if ok else 0, skip_validation=True)
                cand = self.cand[(s, i)]
                attached = [self.win.index[key] for c, key in enumerate(cand)
                            if round(val(m.a[s, i, c]))]
                x = attached[0] if attached else None
                m.pos[s, i].set_value(
                    sum(val(self.before(y, x)) for y in tasks if y != x) if x is not None
                    else 0.0, skip_validation=True)
                for kind, ys in (("Fs", F), ("Fe", F), ("Be", B), ("We", W)):
                    for n, y in enumerate(ys):
                        if (s, i, kind, n) not in m.rho:
                            continue
                        if x is None:
                            r = 0.0
                        elif x == y:
                            r = 0.0 if kind == "Fs" else 1.0
                        else:
                            r = val(self.before(x, y))
                        m.rho[s, i, kind, n].set_value(r, skip_validation=True)
            for i in range(M):
                if not o[i]:
                    m.rs[s, i].set_value(0.0, skip_validation=True)

    def max_violation(self) -> float:
        """Largest violation of any constraint at the current variable values."""
        return milp_prep.max_violation(self.pyo, self.m)

    # ------------------------------------------------------------- extraction
    def extract(self, name: str, provenance: dict[str, Any]) -> Schedule:
        """The per-device orders of the current solution (and its transfers) as a Schedule.

        Orders come from the pair binaries, not from rounded times, so the memory the
        model counted is the memory the simulator sees; start times only break ties
        between tasks the binaries do not order (none, unless durations are zero).
        """
        from optpipe.optimizer.extract import orders_from_starts

        pyo, m, win = self.pyo, self.m, self.win
        starts = [pyo.value(m.s[a]) for a in range(self.N)]
        position: dict[Key, int] = {}
        for tasks in win.device_tasks:
            rank = {}
            for a in tasks:
                rank[a] = sum(1 for b in tasks if b != a and
                              _as_bool(pyo.value(self.before(b, a))))
            order = sorted(tasks, key=lambda a: (rank[a], starts[a]))
            at = {a: n for n, a in enumerate(order)}
            if any(win.order(a, b) is True and at[a] > at[b]
                   for a in tasks for b in tasks if a < b) or any(
                    win.order(a, b) is False and at[b] > at[a]
                    for a in tasks for b in tasks if a < b):
                # only possible with zero-length ties: keep every fixed order
                order = _topological_by(tasks, win, key=lambda a: (rank[a], starts[a]))
            for p, a in enumerate(order):
                position[win.keys[a]] = p
        offloads: dict[tuple[int, int], float] = {}
        reload_after: dict[tuple[int, int], Key] = {}
        if self.offload:
            for s in self.off_stages:
                for i in range(self.problem.microbatches):
                    if _as_bool(pyo.value(m.o[s, i])):
                        offloads[(s, i)] = 1.0
                        cand = self.cand[(s, i)]
                        c = next(c for c in range(len(cand))
                                 if _as_bool(pyo.value(m.a[s, i, c])))
                        reload_after[(s, i)] = cand[c]
        return orders_from_starts(self.problem, position, offloads=offloads,
                                  reload_after=reload_after, name=name,
                                  provenance=provenance or {"source": "solver", "name": name})


def _as_bool(x: Any) -> bool:
    return x is not None and float(x) > 0.5


def _topological_by(tasks: list[int], win: Windows, key: Callable[[int], Any]) -> list[int]:
    """Order a device's tasks by ``key`` while never breaking a fixed order.

    Why: with zero-length tasks two tasks can tie in time; the fixed orders (chains,
    F→B→W of one microbatch, deduced orders) must still hold for the list to be valid.
    """
    remaining = set(tasks)
    out = []
    while remaining:
        ready = [a for a in remaining
                 if not any(win.order(b, a) is True for b in remaining if b != a)]
        a = min(ready, key=key)
        out.append(a)
        remaining.remove(a)
    return out
