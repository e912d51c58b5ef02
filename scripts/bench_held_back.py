"""Memory-starved pipelines: what holding devices back (OFFLOADs marked ``wait``) buys.

Where a device's room above static memory holds about one activation, no order keeps
two microbatches in flight on it without an OFFLOAD that the next action waits for;
pipeoffload's step 6 (:func:`optpipe.generators.offload._hold_back`) adds those. This
prints, per problem, the best fitting fixed schedule without transfers, pipeoffload
(held back where it had to be), and how many microbatches it held back, all from the
simulator, and writes the table to docs/schedules.md.

Problems: presets through the cost model (``MODEL:HARDWARE:STAGES`` at the hardware's
memory, 32 microbatches) and uniform ones (``uSxM@K``: S stages, M microbatches,
F = B = W = 1 s, p2p 0.05 s, all bytes freed by W, a host link that moves one
activation in half an F, budget K activations above static).

    python scripts/bench_held_back.py [--problems ...] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchargs import parse_size  # noqa: E402
from docblock import publish  # noqa: E402

from optpipe.generators import GENERATORS, generate  # noqa: E402
from optpipe.problem import Problem, uniform_problem  # noqa: E402
from optpipe.simulator import simulate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "schedules.md"
START, END = "<!-- held-back:start -->", "<!-- held-back:end -->"
DEFAULT = ("llama2-70b:h100-80gb:16,gpt-14.6b:h100-80gb:4,llama2-13b:a100-40gb:8,"
           "u4x8@1.1,u8x16@1.1,u8x16@1.5")


def make_problem(spec: str) -> Problem:
    """A problem from ``MODEL:HARDWARE:STAGES`` or ``uSxM@K`` (module docstring)."""
    if spec.startswith("u"):
        size, k = spec[1:].split("@")
        stages, microbatches = parse_size(size)
        return uniform_problem(stages, microbatches, p2p=0.05, freed_by_b=0,
                               d2h_bandwidth=2000.0, h2d_bandwidth=2000.0
                               ).activation_budget(float(k))
    from optpipe import costmodel

    model, hardware, stages = spec.split(":")
    return costmodel.build_problem(model, hardware, int(stages), 32)


def row(spec: str) -> str:
    problem = make_problem(spec)
    room = min((b - s) / a for b, s, a in zip(problem.budget, problem.static,
                                                problem.activation))
    plain = []
    for name in GENERATORS:
        if name == "pipeoffload":
            continue
        result = simulate(problem, generate(name, problem))
        if result.fits:
            plain.append((result.makespan, name))
    t0 = time.monotonic()
    offloaded = generate("pipeoffload", problem)
    seconds = time.monotonic() - t0
    result = simulate(problem, offloaded)
    held = sum(offloaded.provenance.get("held_back", []))
    moved = sum(offloaded.provenance.get("offloaded", []))
    best = min(plain) if plain else None
    faster = (f"{best[0] / result.makespan:.2f}x" if best and result.fits else "")
    return (f"| {spec} | {room:.2f} | "
            f"{f'{best[0]:.3f} s ({best[1]})' if best else 'none fits'} | "
            f"{result.makespan:.3f} s{'' if result.fits else ' (over budget)'} on "
            f"{offloaded.provenance.get('base')} | {moved} / {held} | {faster} | "
            f"{seconds:.1f} s |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=DEFAULT, help=f"comma-separated (default {DEFAULT})")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    table = ["| problem | least room (activations) | best fixed, no transfers | "
             "pipeoffload | offloaded / held back | speed-up | pipeoffload's time |",
             "|---|---|---|---|---|---|---|"]
    for spec in args.problems.split(","):
        table.append(row(spec))
        print(table[-1], flush=True)
    text = ("Measured with `python scripts/bench_held_back.py` on 2 CPU cores (presets: "
            "cost model, 32 microbatches, the hardware's memory; `uSxM@K`: uniform "
            "stages, F = B = W = 1 s, p2p 0.05 s, W frees every byte, a transfer of "
            "half an F, budget K activations above static).\n\n" + "\n".join(table))
    publish(text, DOC, START, END, write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
