"""Where the offload model runs: the driver on presets with and without its reach rule.

Search revision 28 runs one stage per device's offload model only while its start is
within ``driver.OFFLOAD_MODEL_REACH`` of the incumbent (:func:`optpipe.optimizer.
driver._offload_model_reaches`). With the reach set to infinity the driver searches as
revision 27 did, so each problem is solved both ways, ``optpipe solve``'s defaults
(offload decided automatically, the cache off), and the table gives the answer, the
gap, and what the offload model did: its start and its end, or that it was skipped.
One uniform problem, 4 x 8 at half of 1F1B's memory with a 2 s transfer and one stage
per device only, shows how much the offload model can gain where it is the search.

    python scripts/bench_offload_reach.py               # writes docs/optimizer-log.md
    python scripts/bench_offload_reach.py --no-write --cases 4stage-80GB
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from docblock import publish  # noqa: E402

DOC = ROOT / "docs" / "optimizer-log.md"
START, END = "<!-- offload-reach:start -->", "<!-- offload-reach:end -->"
#: label -> (model, hardware, stages, budget; None: the hardware's), as on the CLI
PRESETS = {
    "4stage-80GB": ("gpt-14.6b", "h100-80gb", 4, "80GB"),
    "8stage-40GB": ("gpt-14.6b", "h100-80gb", 8, "40GB"),
    "8stage-60GB": ("gpt-14.6b", "h100-80gb", 8, "60GB"),
    "gpt3-13b-8stage-40GB": ("gpt3-13b", "h100-80gb", 8, "40GB"),
    "llama2-13b-a100": ("llama2-13b", "a100-40gb", 8, None),
}
UNIFORM = "uniform-4x8-linear"


def problem_of(label: str):
    """The problem ``optpipe solve`` builds for a preset, or the uniform case."""
    from optpipe import costmodel
    from optpipe.problem import uniform_problem
    from optpipe.units import parse_bytes

    if label == UNIFORM:
        return uniform_problem(4, 8, forward=1.0, backward_input=1.0, backward_weight=1.0,
                               p2p=0.05, activation=1000, freed_by_b=500, static=0,
                               d2h_bandwidth=500, h2d_bandwidth=500).activation_budget(2)
    model, hardware, stages, mem = PRESETS[label]
    problem = costmodel.build_problem(model, hardware, stages=stages,
                                      microbatches=costmodel.DEFAULT_MICROBATCHES)
    return problem if mem is None else problem.with_budget(parse_bytes(mem, "--mem"))


def row(label: str, reach: float, seconds: float) -> str:
    from optpipe.optimizer import driver

    problem = problem_of(label)
    uniform = label == UNIFORM
    driver.OFFLOAD_MODEL_REACH = reach
    t0 = time.monotonic()
    result = driver.solve(problem, time_limit=10 if uniform else seconds, cache=False,
                          progress=False, offload=True if uniform else None,
                          placements=["linear"] if uniform else None)
    wall = time.monotonic() - t0
    runs = result.schedule.provenance.get("runs", [])
    model = [r for r in runs if r.get("space") == "linear+offload"]
    if model:
        r = model[0]
        did = f"{r['hint_makespan']:.4g} → {r['objective']:.4g} s in {r['wall_time']:.0f} s"
    elif "offload model skipped: one stage per device" in result.message:
        did = "skipped (start out of reach)"
    else:
        did = "not run"
    rule = "none (revision 27)" if math.isinf(reach) else f"{reach:.0%}"
    line = (f"| {label} | {rule} | {result.sim.makespan:.4g} s | "
            f"{(result.gap or 0.0):.2%} | {did} | {wall:.0f} s |")
    print(line, flush=True)
    return line


def main() -> None:
    from optpipe.optimizer import driver

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join([*PRESETS, UNIFORM]),
                    help=f"comma-separated, of {', '.join([*PRESETS, UNIFORM])}")
    ap.add_argument("--seconds", type=float, default=60.0, help="time limit per solve")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    reach = driver.OFFLOAD_MODEL_REACH
    table = ["| problem | reach rule | answer | gap | offload model | wall |",
             "|---|---|---|---|---|---|"]
    for label in args.cases.split(","):
        if label not in PRESETS and label != UNIFORM:
            raise SystemExit(f"unknown case {label!r}; known: {', '.join([*PRESETS, UNIFORM])}")
        for r in (math.inf, reach):
            table.append(row(label, r, args.seconds))
    caption = (f"Measured with `python scripts/bench_offload_reach.py --seconds "
               f"{args.seconds:g}` ({time.strftime('%Y-%m-%d')}, 2 cores, 2 solver threads, "
               "one run each; presets as `optpipe solve --model M --hardware H --stages S "
               "--mem X --no-cache`; the uniform case 10 s, offload on, one stage per device "
               "only).")
    publish(caption + "\n\n" + "\n".join(table), DOC, START, END, write=not args.no_write)


if __name__ == "__main__":
    main()
