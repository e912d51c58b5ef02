#!/usr/bin/env python3
"""Benchmark the optimizer against every fixed schedule; write the table to the docs.

Problems: uniform stages with F = B = W = 1 s (so bubble rates read directly), p2p
0.05 s, activation 1 GB per microbatch of which B frees half, no static bytes, and a
host link that moves one activation in half an F (2 GB/s each way). Budgets are
``k`` microbatches' worth of activations per device (``Problem.activation_budget``),
``k`` in {S/2, S, 2S}. ``--hetero`` makes the first stage 30% and the last 60% slower.

Every figure is simulated (the simulator is the judge); nothing is asserted about times.
Results accumulate in docs/optimizer.md (a JSON block between markers), so partial runs
(``--sizes``, ``--engines``, ``--quick``) add to the table instead of replacing it.

    python scripts/bench_solver.py --quick                 # 4x16, 8x16 at S/2, S, 2S
    python scripts/bench_solver.py --sizes 16x64 --budgets 0.5 --engines cpsat
    python scripts/bench_solver.py --hetero --sizes 4x16,8x32
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchargs import budget_label, parse_size  # noqa: E402

from optpipe.errors import OptPipeError  # noqa: E402
from optpipe.problem import Problem, uniform_problem  # noqa: E402

DOC = ROOT / "docs" / "optimizer.md"
TABLE_START, TABLE_END = "<!-- bench:table:start -->", "<!-- bench:table:end -->"
DATA_START, DATA_END = "<!-- bench:data:start", "bench:data:end -->"
FIXED = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "zb-auto",
         "pipeoffload"]
GB = 10**9


def bench_problem(stages: int, microbatches: int, k: float, hetero: bool) -> Problem:
    """The benchmark's problem (see the module docstring)."""
    p = uniform_problem(stages, microbatches, forward=1.0, backward_input=1.0,
                        backward_weight=1.0, p2p=0.05, activation=GB, freed_by_b=GB // 2,
                        static=0, d2h_bandwidth=2 * GB, h2d_bandwidth=2 * GB,
                        name=f"uniform-{stages}x{microbatches}")
    if hetero:
        slow = [1.0] * stages
        slow[0], slow[-1] = 1.3, 1.6
        p = replace(p, forward=tuple(f * x for f, x in zip(p.forward, slow)),
                    backward_input=tuple(f * x for f, x in zip(p.backward_input, slow)),
                    backward_weight=tuple(f * x for f, x in zip(p.backward_weight, slow)),
                    name=f"hetero-{stages}x{microbatches}")
    return p.activation_budget(k)


def run_case(stages: int, microbatches: int, k_label: str, k: float, hetero: bool,
             engines: list[str], offloads: list[bool], time_limit: float,
             threads: int, placements: list[str] | None = None) -> dict[str, Any]:
    from optpipe.generators import GENERATORS, generate
    from optpipe.optimizer.driver import solve
    from optpipe.schedule import placement_name
    from optpipe.simulator import simulate

    problem = bench_problem(stages, microbatches, k, hetero)
    row: dict[str, Any] = {"stages": stages, "microbatches": microbatches,
                           "budget": k_label, "hetero": hetero, "fixed": {}, "solve": {}}
    for name in FIXED:
        if name not in GENERATORS:
            continue
        try:
            schedule = generate(name, problem)
            sim = simulate(problem, schedule)
            row["fixed"][name] = {"bubble": sim.bubble_rate, "makespan": sim.makespan,
                                  "fits": sim.fits, "offloads": schedule.offloads,
                                  "placement": placement_name(schedule.placement,
                                                              schedule.devices)}
        except OptPipeError as exc:
            row["fixed"][name] = {"error": str(exc)}
    only = f"/{'+'.join(placements)}" if placements else ""
    for engine in engines:
        for offload in offloads:
            column = f"{engine}/{'off' if offload else 'nooff'}{only}"
            t0 = time.monotonic()
            try:
                res = solve(problem, solver=engine, offload=offload, time_limit=time_limit,
                            threads=threads, cache=False, progress=False,
                            placements=placements)
            except OptPipeError as exc:
                row["solve"][column] = {"error": str(exc)}
                continue
            wall = time.monotonic() - t0
            sim = simulate(problem, res.schedule)  # judged again, independently
            bound_bubble = (None if res.bound is None else
                            1 - sum(sim.device_busy) / (problem.devices * res.bound))
            row["solve"][column] = {
                "bubble": sim.bubble_rate, "makespan": sim.makespan, "fits": sim.fits,
                "status": res.status, "bound": res.bound, "bound_bubble": bound_bubble,
                "gap": res.gap, "time": wall, "offloads": res.schedule.offloads,
                "schedule": res.schedule.name,
                # the best fixed schedule on the allowed placements (the driver's capped
                # 1F1B family included; its own periodic and extended warm starts are
                # not fixed schedules): what a restricted column is compared with
                "bar": min((c.makespan for c in res.fixed if c.fits
                            and c.schedule.provenance.get("source") != "optimizer"
                            and (offload or not c.schedule.offloads)
                            and (placements is None or placement_name(
                                c.schedule.placement, c.schedule.devices) in placements)),
                           default=None),
                "placements": [{**pl, "bubble": 1 - sum(sim.device_busy)
                                / (problem.devices * pl["best"])} for pl in res.placements]}
    best = [v for v in row["fixed"].values() if v.get("fits")]
    row["best_fixed"] = min((v["makespan"] for v in best), default=None)
    return row


# ------------------------------------------------------------------- output
def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.1f}%"


def render(rows: list[dict[str, Any]]) -> str:
    """Markdown table: fixed schedules' bubble (✗ = over budget) and optpipe's."""
    keys = sorted({k for r in rows for k in r["solve"]})
    head = ["problem", "budget"] + [n for n in FIXED] + \
        [f"optpipe {k}" for k in keys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = sorted(rows, key=lambda r: (r["hetero"], r["stages"], r["microbatches"],
                                       _budget_order(r["budget"])))
    for r in rows:
        cells = [f"{'hetero ' if r['hetero'] else ''}{r['stages']}×{r['microbatches']}",
                 r["budget"]]
        for n in FIXED:
            v = r["fixed"].get(n)
            if v is None or "error" in v:
                cells.append("n/a")
            else:
                cells.append(_pct(v["bubble"]) + ("" if v["fits"] else " ✗"))
        for k in keys:
            v = r["solve"].get(k)
            if v is None:
                cells.append("")
            elif "error" in v:
                cells.append("error")
            else:
                better = ""
                only = _column_placements(k)
                ref = v.get("bar") if only else _best_fixed(r, offload="/off" in k)
                if ref:
                    gain = 1 - v["makespan"] / ref
                    better = f", {gain * 100:.1f}% faster than best fixed" \
                        if gain > 5e-4 else ", = best fixed" if gain > -5e-4 else \
                        f", {-gain * 100:.1f}% SLOWER"
                gap = "" if v["gap"] is None else f" gap {_pct(v['gap'])}"
                cells.append(f"**{_pct(v['bubble'])}** {v['status']}{gap}, "
                             f"{v['time']:.0f}s{better}" + ("" if v["fits"] else " ✗OVER")
                             + _placement_cell(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _placement_cell(v: dict[str, Any]) -> str:
    """`` · linear optimal 8.0%`` when the overall gap is open but a placement is proven."""
    if v["status"] == "optimal":
        return ""
    proven = [pl for pl in v.get("placements", []) if pl["optimal"]]
    return "".join(f" · {pl['placement']} optimal {_pct(pl['bubble'])}" for pl in proven)


def _column_placements(column: str) -> list[str] | None:
    """``cpsat/nooff/linear`` -> ["linear"]: the placements a column's solves allowed."""
    parts = column.split("/")
    return parts[2].split("+") if len(parts) > 2 else None


def _best_fixed(row: dict[str, Any], offload: bool) -> float | None:
    """Best fitting fixed makespan a solve with/without offload is compared with (a
    column restricted to some placements uses its ``bar``: the best fixed schedule on
    them, the driver's capped 1F1B family included)."""
    spans = [v["makespan"] for name, v in row["fixed"].items() if v.get("fits") and
             (offload or not v.get("offloads", name == "pipeoffload"))]
    return min(spans, default=None)


def _budget_order(label: str) -> float:
    return {"S/2": 0.5, "S": 1.0, "2S": 2.0}.get(label, 9.0)


def load_data() -> list[dict[str, Any]]:
    if not DOC.exists():
        return []
    text = DOC.read_text()
    m = re.search(re.escape(DATA_START) + r"\n(.*?)\n" + re.escape(DATA_END), text, re.S)
    return json.loads(m.group(1)) if m else []


def save(rows: list[dict[str, Any]], meta: str) -> None:
    from docblock import replace_between

    text = DOC.read_text() if DOC.exists() else "# The optimizer\n"
    body = ",\n".join(json.dumps(r, separators=(",", ":")) for r in rows)
    for start, end, inner in ((TABLE_START, TABLE_END, f"{meta}\n\n{render(rows)}"),
                              (DATA_START, DATA_END, f"[\n{body}\n]")):
        text = replace_between(text, start, end, inner) or \
            f"{text.rstrip()}\n\n{start}\n{inner}\n{end}\n"
    DOC.write_text(text)


def write_library(stages_list: list[int], mem: str, time_limit: float) -> None:
    """Solve the preset problems (default model and hardware) into the bundled library.

    ``optpipe solve --stages S --mem MEM`` then answers from ``schedules/`` at once (the
    entry is re-validated and re-simulated before use, and ignored if the cost model's
    numbers change, since the key is the problem's content hash). Solved with the cache
    on, so an entry that is still current is kept as it is, and a stale one (an older
    search revision, not proven) is solved again from itself as a warm start: a new
    revision never leaves the library slower (``cache.previous``).
    """
    from optpipe import costmodel
    from optpipe.optimizer.driver import solve
    from optpipe.units import parse_bytes

    os.environ["OPTPIPE_CACHE_DIR"] = str(ROOT / "schedules")
    for stages in stages_list:
        problem = costmodel.build_problem(
            costmodel.DEFAULT_MODEL, costmodel.DEFAULT_HARDWARE, stages=stages,
            microbatches=costmodel.DEFAULT_MICROBATCHES).with_budget(parse_bytes(mem))
        res = solve(problem, time_limit=time_limit, cache=True, progress=False)
        from optpipe.optimizer import cache as cache_mod
        key = cache_mod.cache_key(problem, solver="auto", split_backward=True,
                                  offload=bool(res.schedule.provenance.get("offload")),
                                  levels=tuple(res.schedule.provenance.get(
                                      "offload_levels", (1.0,))))
        path = cache_mod.store(res.schedule, key, ROOT / "schedules")
        print(f"stages {stages}: {res.status} makespan {res.sim.makespan:.6g}s bubble "
              f"{res.sim.bubble_rate:.2%} gap {res.gap} -> {path}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4x16 and 8x16 only, 20 s limit")
    ap.add_argument("--sizes", help="comma list of SxM, default 4x16,...,16x64 (9 sizes)")
    ap.add_argument("--budgets", default="0.5,1,2", help="multiples of S (default 0.5,1,2)")
    ap.add_argument("--engines", default="cpsat", help="comma list: cpsat,highs,gurobi")
    ap.add_argument("--offload", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--hetero", action="store_true", help="first/last stages slower")
    ap.add_argument("--placements", help="comma list the solves may use (solve's "
                    "placements=, e.g. linear); results go to their own column")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--reset", action="store_true", help="drop stored results first")
    ap.add_argument("--library", metavar="STAGES",
                    help="instead: solve the presets with these stage counts (e.g. 4,8,16) "
                         "at --mem into schedules/ with --library-time seconds each")
    ap.add_argument("--mem", default="80GB")
    ap.add_argument("--library-time", type=float, default=300.0)
    args = ap.parse_args(argv)
    if args.library:
        write_library([int(x) for x in args.library.split(",")], args.mem, args.library_time)
        return 0
    if args.quick:
        sizes = [(4, 16), (8, 16)]
        limit = min(args.time_limit, 20.0)
    else:
        limit = args.time_limit
        sizes = [(s, m) for s in (4, 8, 16) for m in (16, 32, 64)]
    if args.sizes:
        sizes = [parse_size(item) for item in args.sizes.split(",")]
    offloads = {"no": [False], "yes": [True], "both": [False, True]}[args.offload]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    rows = [] if args.reset else load_data()
    for stages, microbatches in sizes:
        for mult in (float(x) for x in args.budgets.split(",")):
            label = budget_label(mult)
            row = run_case(stages, microbatches, label, mult * stages, args.hetero, engines,
                           offloads, limit, args.threads,
                           args.placements.split(",") if args.placements else None)
            same = [r for r in rows if (
                r["stages"] == stages and r["microbatches"] == microbatches and
                r["budget"] == label and r["hetero"] == args.hetero)]
            for old in same:  # keep results of engines/offload modes not rerun now
                row["solve"] = {**old["solve"], **row["solve"]}
            rows = [r for r in rows if r not in same] + [row]
            prev = dict(row["solve"])
            print(json.dumps({"case": f"{stages}x{microbatches} {label}"
                              f"{' hetero' if args.hetero else ''}",
                              "best_fixed": row["best_fixed"],
                              **{k: {kk: (round(vv, 4) if isinstance(vv, float) else vv)
                                     for kk, vv in v.items()} for k, v in prev.items()}}),
                  flush=True)
            if not args.no_write:
                save(rows, f"Measured with `python scripts/bench_solver.py` on "
                           f"{os.cpu_count()} CPU cores, {args.threads} solver threads, "
                           f"{limit:g} s limit per solve (F = B = W = 1 s, p2p 0.05 s). "
                           f"Bubble rate per schedule; ✗ = over budget.")
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
