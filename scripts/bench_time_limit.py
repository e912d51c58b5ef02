#!/usr/bin/env python3
"""How long ``optpipe solve`` takes against its ``--time-limit``, as the user runs it.

Why this script: ``--time-limit`` is the whole command's (start-up and chart included,
``optimizer/cli.py``), but part of what runs before the search is built whatever the
limit: every fixed schedule, simulated, for the comparison and the never-worse rule,
and the first warm starts. Until 2026-12-07 the list schedules of the chunked
placements ran in full too (5 s at 16 x 64 on 2 cores), so ``--time-limit 5`` took
11.5 s there; since then they stop at the first of each kind past
``warm_starts.LIST_SCHEDULES_SHARE`` of the limit, and a command that still runs past
its limit says why in a note (``cli._over_limit``).

Each case runs the real command in a fresh process (``--no-cache``, the chart drawn)
and times it from outside. ``--tree DIR`` runs another checkout's optpipe instead (a
``git worktree`` of an older commit, say), for a before-and-after on this machine.
The table gives the wall time, the driver's time before its search and in all (from
the schedule's provenance; "—" where the tree does not record it), the answer, and
whether the note was printed. Nothing is asserted; the table goes to
docs/optimizer.md between markers.

    python scripts/bench_time_limit.py                       # 4 problems x 3 limits: ~5 min
    python scripts/bench_time_limit.py --limits 5 --no-write --tree /tmp/old
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer.md"
MARKERS = "<!-- time-limit:start -->", "<!-- time-limit:end -->"
CASES = ("--stages 8 --mem 80GB", "--stages 16 --mem 40GB",
         "--stages 16 --microbatches 64 --mem 40GB", "--stages 16 --microbatches 64")
#: Run as the ``optpipe`` command is (its argv[0] decides that start-up counts).
LAUNCH = "import sys; sys.argv[0] = 'optpipe'; from optpipe.cli import main; sys.exit(main())"


def run_case(tree: Path, args: str, limit: float) -> dict[str, object]:
    """One command in a fresh process: its wall time, note and schedule's figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "s.json"
        command = [sys.executable, "-c", LAUNCH, "solve", *shlex.split(args),
                   "--time-limit", f"{limit:g}", "--no-cache", "--quiet", "-o", str(out)]
        env = {**os.environ, "PYTHONPATH": str(tree), "OPTPIPE_CACHE_DIR": tmp}
        t0 = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp)
        wall = time.monotonic() - t0
        if done.returncode != 0:
            raise SystemExit(f"error: `optpipe solve {args}` exited {done.returncode}: "
                             f"{done.stderr.strip().splitlines()[-1:]}")
        prov = json.loads(out.read_text()).get("provenance", {})
    return {"wall": wall, "warm": prov.get("warm_start_time"), "driver": prov.get("wall_time"),
            "makespan": prov.get("makespan"), "status": prov.get("status"),
            "note": "over --time-limit" in done.stderr}


def seconds(value: object) -> str:
    return "—" if value is None else f"{float(value):.1f} s"


def table(rows: list[tuple[str, float, dict[str, object]]], command: str, tree: str) -> str:
    lines = [f"Measured with `{command}` ({time.strftime('%Y-%m-%d')}, 2 cores, {tree}; "
             "each a fresh `optpipe solve ... --no-cache`, the chart drawn, timed from "
             "outside).", "",
             "| problem | --time-limit | took | before the search | the driver in all "
             "| answer | note printed |", "|---|---|---|---|---|---|---|"]
    for args, limit, r in rows:
        answer = f"{float(r['makespan']):.3f} s, {r['status']}" if r["makespan"] else "—"
        lines.append(f"| `{args}` | {limit:g} s | {r['wall']:.1f} s | {seconds(r['warm'])} "
                     f"| {seconds(r['driver'])} | {answer} | {'yes' if r['note'] else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=";".join(CASES),
                        help="problems as `optpipe solve` options, separated by ;")
    parser.add_argument("--limits", default="5,10,60", help="--time-limit values, e.g. 5,60")
    parser.add_argument("--tree", type=Path, default=ROOT,
                        help="the checkout whose optpipe runs (default: this one)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    a = parser.parse_args()
    try:
        limits = [float(x) for x in a.limits.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"error: --limits {a.limits!r} is not a list of seconds, e.g. 5,60")
    if not limits or any(x <= 0 for x in limits):
        raise SystemExit("error: --limits needs positive seconds, e.g. 5,60")
    if not (a.tree / "optpipe" / "cli.py").is_file():
        raise SystemExit(f"error: --tree {a.tree} holds no optpipe checkout")
    rows = []
    for args in (c.strip() for c in a.cases.split(";") if c.strip()):
        for limit in limits:
            r = run_case(a.tree.resolve(), args, limit)
            print(f"{args} --time-limit {limit:g}: {r['wall']:.1f} s", file=sys.stderr)
            rows.append((args, limit, r))
    tree = "this tree" if a.tree.resolve() == ROOT else f"the tree at {a.tree}"
    command = "python scripts/bench_time_limit.py " + " ".join(
        shlex.quote(x) for x in sys.argv[1:])
    publish(table(rows, command.strip(), tree), DOC, *MARKERS, write=not a.no_write)


if __name__ == "__main__":
    main()
