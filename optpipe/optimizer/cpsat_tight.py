"""CP-SAT's tight model (offload allowed): solver times are the simulator's times.

With transfers, memory also depends on *when* an OFFLOAD ends relative to later
forwards, which is not fixed by the orders: an ASAP re-timing could start a forward
before an offload it relied on has finished. So this model pins every time to the
simulator's ASAP rule: a circuit per device chooses each task's predecessor and
``start = max(ready, end of predecessor)``; transfers start at ``max(issue, input,
channel free)``; a RELOAD is issued at the end of a chosen compute action (where it is
then listed). Memory is a cumulative resource over the bytes that are held. Solver
times then *are* simulator times (up to tick rounding, which a safety margin ``delta``
on offload releases absorbs, :func:`~.cpsat_model.make_ticks`), so the extracted
schedule reproduces the solver's makespan and memory exactly.

Why apart from the order model (:mod:`.cpsat_order`): past the shared base variables
(:mod:`.cpsat_model`) the two have no constraint in common, and this one has a single
caller, the engine's run with offload (:func:`~.cpsat.solve_cpsat`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from optpipe.memory.accounting import transfer_bytes
from optpipe.optimizer.cpsat_model import Builder, Hint, ModelVars, Ticks, base_vars
from optpipe.optimizer.preprocess import Key
from optpipe.problem import Problem
from optpipe.schedule import Action, Op


# ---------------------------------------------------------------- tight model
def build_tight_model(problem: Problem, ticks: Ticks, horizon: int, lower: int,
                      hint: Hint | None, levels: Sequence[float]
                      ) -> tuple[Builder, ModelVars]:
    """The offload model: solver times equal the simulator's ASAP times."""
    b = Builder()
    m_ = b.model
    g = ticks.graph
    dur = {k: int(v) for k, v in g.duration.items()}
    H = horizon
    start, _, makespan = base_vars(b, g, horizon, lower, hint)
    S, M = problem.stages, problem.microbatches
    split = g.split_backward
    bwd = Op.B if split else Op.BW
    last_op = Op.W if split else Op.BW
    T = hint.times if hint else {}
    out = ModelVars(start=start, makespan=makespan)

    def end(k: Key) -> Any:
        return start[k] + dur[k]

    def hend(k: Key) -> int | None:
        return T[k][1] if hint else None

    # ---------------- transfers: offload choice, channel chains, reload issue
    offloaded: dict[tuple[int, int], Any] = {}
    reload_end0: dict[tuple[int, int], Any] = {}      # reload end if offloaded, else 0
    transfer_vars: dict[tuple[int, int], dict[str, Any]] = {}

    def equals_after(var: Any, c: Key, lit: Any) -> None:
        """``var`` is the time the device issues what it lists after compute action
        ``c`` (when ``lit``): ``c``'s end, or, after an F whose OFFLOAD holds the device
        back, that offload's end (>= the F's end)."""
        held = transfer_vars.get((c[1], c[2])) if c[0] is Op.F else None
        if held is None:
            m_.add(var == end(c)).only_enforce_if(lit)
        else:
            m_.add(var == end(c)).only_enforce_if([lit, ~held["w"]])
            m_.add(var == held["oe"]).only_enforce_if([lit, held["w"]])

    arcs_total = 0
    for s in range(S):
        if problem.activation[s] == 0:
            continue
        cf = b.int_var(0, 0, f"cf{s}_0", 0)           # offload channel free
        for mb in range(M):
            f = (Op.F, s, mb)
            hx = hint.offloads.get((s, mb)) if hint else None
            lits = []
            for x in levels:
                lit = b.bool_var(f"off{s}_{mb}_{x}",
                                 (hx is not None and abs(hx - x) < 1e-12) if hint else None)
                out.level[(s, mb, x)] = lit
                lits.append((x, lit))
            o = b.bool_var(f"o{s}_{mb}", (hx is not None) if hint else None)
            m_.add(sum(l for _, l in lits) == o)
            offloaded[(s, mb)] = o
            # held back: what the device issues after this F waits for the offload's end
            w = b.bool_var(f"w{s}_{mb}", ((s, mb) in hint.waits) if hint else None)
            m_.add_implication(w, o)
            out.wait[(s, mb)] = w
            h_on = hint is not None and hx is not None
            # offload: starts at max(F end, channel free)
            h_cf = b.hint.get(cf) if hint else None
            h_os = max(hend(f), h_cf) if hint else None
            os_ = b.int_var(0, H, f"os{s}_{mb}", h_os)
            m_.add_max_equality(os_, [end(f), cf])
            osz_vals = [ticks.transfer[(Op.OFFLOAD, s, x)] for x, _ in lits]
            osz = b.int_var(0, max(osz_vals), f"osz{s}_{mb}",
                            ticks.transfer[(Op.OFFLOAD, s, hx)] if h_on else (0 if hint else None))
            m_.add(osz == sum(v * l for v, (_, l) in zip(osz_vals, lits)))
            oe = b.int_var(0, H, f"oe{s}_{mb}", (h_os + b.hint[osz]) if hint else None)
            m_.add(oe == os_ + osz)
            off_iv = m_.new_optional_interval_var(os_, osz, oe, o, f"OFF{s}_{mb}")
            cf = _running_max(b, cf, oe, o, H, f"cf{s}_{mb + 1}",
                              (b.hint[oe] if h_on else 0) if hint else None)
            # its bytes count as freed delta ticks after its end; a waited one's exactly
            # then: whatever the device issues after it starts no sooner in the simulator
            freed = b.int_var(0, H + ticks.delta, f"fr{s}_{mb}",
                              (b.hint[oe] + (0 if (s, mb) in hint.waits else ticks.delta))
                              if hint else None)
            m_.add(freed == oe + ticks.delta - ticks.delta * w)
            transfer_vars[(s, mb)] = {"oe": oe, "freed": freed, "lits": lits, "o": o,
                                      "w": w, "off": off_iv}
        rcf = b.int_var(0, 0, f"rcf{s}_0", 0)         # reload channel free
        li = b.int_var(0, 0, f"li{s}_0", 0)           # latest reload issue so far
        for mb in range(M):
            f = (Op.F, s, mb)
            t = transfer_vars[(s, mb)]
            o, oe = t["o"], t["oe"]
            hx = hint.offloads.get((s, mb)) if hint else None
            h_on = hint is not None and hx is not None
            # reload issue: the end of one compute action listed before B_m, at/after F_m
            # (after a waited F: its offload's end, which holds the device back)
            cands: list[Key] = [(Op.F, s, k) for k in range(mb, M)]
            cands += [(bwd, s, k) for k in range(mb)]
            if split:
                cands += [(Op.W, s, k) for k in range(mb)]
            h_after = hint.reload_after.get((s, mb)) if h_on else None
            h_iss = T[(Op.RELOAD, s, mb)][2] if h_on else (0 if hint else None)
            iss = b.int_var(0, H, f"iss{s}_{mb}", h_iss)
            choice = []
            for c in cands:
                r = b.bool_var(f"r{s}_{mb}_{c[0].value}{c[2]}",
                               (c == h_after) if hint else None)
                equals_after(iss, c, r)
                choice.append((c, r))
            out.reload_choice[(s, mb)] = choice
            m_.add(sum(r for _, r in choice) == o)
            m_.add(iss >= end(f)).only_enforce_if(o)
            m_.add(iss <= start[(bwd, s, mb)]).only_enforce_if(o)
            m_.add(iss >= li).only_enforce_if(o)
            li = _running_max(b, li, iss, o, H, f"li{s}_{mb + 1}",
                              h_iss if h_on else (0 if hint else None))
            # reload: starts at max(issue, offload end, channel free)
            h_rs = max(b.hint[iss], b.hint[oe], b.hint[rcf]) if hint else None
            rs = b.int_var(0, H, f"rs{s}_{mb}", h_rs)
            m_.add_max_equality(rs, [iss, oe, rcf])
            rsz_vals = [ticks.transfer[(Op.RELOAD, s, x)] for x, _ in t["lits"]]
            rsz = b.int_var(0, max(rsz_vals), f"rsz{s}_{mb}",
                            ticks.transfer[(Op.RELOAD, s, hx)] if h_on else (0 if hint else None))
            m_.add(rsz == sum(v * l for v, (_, l) in zip(rsz_vals, t["lits"])))
            re_ = b.int_var(0, H, f"re{s}_{mb}", (h_rs + b.hint[rsz]) if hint else None)
            m_.add(re_ == rs + rsz)
            t["rld"] = m_.new_optional_interval_var(rs, rsz, re_, o, f"RLD{s}_{mb}")
            rcf, reload_end0[(s, mb)] = _running_max(
                b, rcf, re_, o, H, f"rcf{s}_{mb + 1}",
                (b.hint[re_] if h_on else 0) if hint else None, gated_too=True)
            t["iss"] = iss
        m_.add_no_overlap([transfer_vars[(s, mb)]["off"] for mb in range(M)])
        m_.add_no_overlap([transfer_vars[(s, mb)]["rld"] for mb in range(M)])

    # ---------------- compute: start = max(ready, end of predecessor on the device)
    for s in range(S):
        nodes = g.device_keys(s)
        index = {k: i + 1 for i, k in enumerate(nodes)}
        pred_of: dict[Key, Key | None] = {}
        if hint:
            seq = hint.order[s]
            pred_of = {k: (seq[i - 1] if i else None) for i, k in enumerate(seq)}
        arcs = [(0, index[(Op.F, s, 0)], b.true()), (index[(last_op, s, M - 1)], 0, b.true())]
        incoming: dict[Key, list[tuple[Key, Any]]] = {k: [] for k in nodes}
        for i_key in nodes:
            for j_key in nodes:
                if i_key != j_key and _arc_allowed(i_key, j_key, split):
                    lit = b.bool_var(f"a{s}_{i_key[0].value}{i_key[2]}_{j_key[0].value}{j_key[2]}",
                                     (pred_of.get(j_key) == i_key) if hint else None)
                    arcs.append((index[i_key], index[j_key], lit))
                    incoming[j_key].append((i_key, lit))
        arcs_total += len(arcs)
        m_.add_circuit(arcs)
        for k in nodes:
            op, _, mb = k
            deps = [end(p) + int(lg) for p, lg in g.deps[k]]
            if op is bwd and (s, mb) in reload_end0:
                deps.append(reload_end0[(s, mb)])
            if k == (Op.F, s, 0):
                if deps:
                    m_.add_max_equality(start[k], deps)
                else:
                    m_.add(start[k] == 0)
                continue
            h_pe = hend(pred_of[k]) if hint and pred_of.get(k) else (0 if hint else None)
            pred = pred_of.get(k) if hint else None
            if pred is not None and pred[0] is Op.F and (s, pred[2]) in hint.waits:
                h_pe = b.hint[transfer_vars[(s, pred[2])]["oe"]]   # held back until then
            pe = b.int_var(0, H, f"pe{s}_{op.value}{mb}", h_pe)
            for i_key, lit in incoming[k]:
                equals_after(pe, i_key, lit)
            m_.add_max_equality(start[k], deps + [pe])

    # ---------------- memory: cumulative of held bytes per device
    for s in range(S):
        a, fb, fw, unit, moved, room = _memory_units(problem, s, levels)
        if room is None:
            continue
        intervals: list[Any] = []
        demands: list[int] = []
        for mb in range(M):
            f = (Op.F, s, mb)
            t = transfer_vars.get((s, mb))
            ends_by: list[tuple[Key, int]] = ([((Op.B, s, mb), fb), ((Op.W, s, mb), fw)]
                                              if split else [((Op.BW, s, mb), a)])
            variants: list[tuple[Any, list[int], int]] = []   # presence, kept-per-part, moved
            if t is None:
                variants.append((b.true(), [amt for _, amt in ends_by], 0))
            else:
                variants.append((~t["o"], [amt for _, amt in ends_by], 0))
                for (x, lit), y in zip(t["lits"], moved):
                    parts, left = [], y
                    for _, amt in ends_by:          # offload comes out of B's part first
                        take = min(left, amt)
                        parts.append(amt - take)
                        left -= take
                    variants.append((lit, parts, y))
            for presence, parts, y in variants:
                for (k, _), keep in zip(ends_by, parts):
                    if keep > 0:
                        size = b.int_var(0, H, f"kz{s}_{mb}_{k[0].value}",
                                         (hend(k) - T[f][0]) if hint else None)
                        intervals.append(m_.new_optional_interval_var(
                            start[f], size, end(k), presence, "keep"))
                        demands.append(keep)
                if y > 0 and t is not None:
                    hx = hint.offloads.get((s, mb)) if hint else None
                    on = hint is not None and hx is not None
                    # held until the offload frees it, then again from the issue
                    size = b.int_var(0, H + ticks.delta, f"hz{s}_{mb}",
                                     (b.hint[t["freed"]] - T[f][0]) if on
                                     else (0 if hint else None))
                    intervals.append(m_.new_optional_interval_var(
                        start[f], size, t["freed"], presence, "held"))
                    demands.append(y)
                    left = y
                    for (k, amt) in ends_by:
                        back = min(left, amt)
                        left -= back
                        if back > 0:
                            size = b.int_var(0, H, f"bz{s}_{mb}_{k[0].value}",
                                             (hend(k) - b.hint[t["iss"]]) if on
                                             else (0 if hint else None))
                            intervals.append(m_.new_optional_interval_var(
                                t["iss"], size, end(k), presence, "back"))
                            demands.append(back)
        m_.add_cumulative(intervals, demands, room)
    m_.minimize(makespan)
    out.size = {"arcs": arcs_total, "delta_ticks": ticks.delta}
    return b, out


def _running_max(b: Builder, prev: Any, value: Any, present: Any, horizon: int, name: str,
                 gated_hint: int | None, gated_too: bool = False) -> Any:
    """``max(prev, value if present else 0)``: a channel's free time (or the latest reload
    issue) after one more microbatch, whose transfer exists only if it is offloaded.

    Returns the new running max, and with ``gated_too`` also the gated value itself
    (the reload's end, or 0). ``gated_hint`` is the gated value's hint (None: no hint).
    """
    gated = b.int_var(0, horizon, "g_" + name, gated_hint)
    b.model.add(gated == value).only_enforce_if(present)
    b.model.add(gated == 0).only_enforce_if(~present)
    nxt = b.int_var(0, horizon, name,
                    None if gated_hint is None else max(b.hint[prev], gated_hint))
    b.model.add_max_equality(nxt, [prev, gated])
    return (nxt, gated) if gated_too else nxt


def _arc_allowed(i: Key, j: Key, split: bool) -> bool:
    """Can compute task ``j`` immediately follow ``i`` on a device (FIFO + data order)?"""
    (oi, _, mi), (oj, _, mj) = i, j
    if oi is oj:
        return mj == mi + 1
    if oi is Op.F:
        return mj <= mi if oj in (Op.B, Op.BW) else mj < mi      # F_m -> B_k (k<=m), W_k (k<m)
    if oj is Op.F:
        return mj > mi                                          # B_k/W_k -> F_m (m>k)
    if oi is Op.B and oj is Op.W:
        return mj <= mi
    if oi is Op.W and oj is Op.B:
        return mj > mi
    return False


def _memory_units(problem: Problem, s: int, levels: Sequence[float] = ()
                 ) -> tuple[int, int, int, int, list[int], int | None]:
    """Bytes of stage ``s`` divided by their gcd, and the room left by the budget.

    Returns ``(activation, freed_by_b, freed_by_w, unit, moved_per_level, room)`` with
    ``room`` None when the budget cannot bind.
    """
    a, fb, fw = problem.activation[s], problem.freed_by_b[s], problem.freed_by_w[s]
    moved = [transfer_bytes(problem, Action(Op.OFFLOAD, s, 0, x)) for x in levels]
    unit = math.gcd(a, fb, fw, *moved) or 1
    room = problem.budget[s] - problem.static[s]
    if not math.isfinite(room) or problem.microbatches * a <= room:
        return a // unit, fb // unit, fw // unit, unit, [y // unit for y in moved], None
    return (a // unit, fb // unit, fw // unit, unit, [y // unit for y in moved],
            int(math.floor(room / unit)))
