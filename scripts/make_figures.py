"""Regenerate the figures in docs/img from the generators, the simulator and optpipe.viz.

Usage::

    python scripts/make_figures.py                 # cost-model problem (GPT-3 13B, H100)
    python scripts/make_figures.py --uniform       # the uniform toy problem instead
    python scripts/make_figures.py --out /tmp/img  # somewhere else

Every figure is drawn from a simulated schedule (the simulator is the one judge), so the
pictures in the README can always be rebuilt from the code and never drift from it. A
generator that is missing or fails is reported and skipped; the others are still drawn.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optpipe.errors import OptPipeError  # noqa: E402
from optpipe.problem import Problem, uniform_problem  # noqa: E402
from optpipe.simulator import SimResult, simulate  # noqa: E402
from optpipe.viz import plot_comparison, plot_gantt  # noqa: E402

DEVICES, MICROBATCHES = 8, 32
GANTTS = {"1f1b": "gantt_1f1b_8x32.png", "zb-h1": "gantt_zbh1_8x32.png"}
COMPARED = ["gpipe", "1f1b", "zb-h1", "zb-v"]
OFFLOAD = ("pipeoffload", "gantt_pipeoffload_8x32.png")
#: Budget for the offload figure, in microbatches' worth of kept activations over the
#: static bytes: 1F1B keeps 8 on the first device, so with 6 something must move to host
#: (and, on the cost-model problem, the offload heuristic still fits it).
OFFLOAD_BUDGET_MICROBATCHES = 6


def preset_problem() -> Problem:
    """The headline cost-model problem: GPT-3 13B on H100 80GB, pp8, 32 microbatches."""
    from optpipe.costmodel import build_problem

    return build_problem("gpt3-13b", "h100-80gb", stages=DEVICES, microbatches=MICROBATCHES)


def toy_problem() -> Problem:
    """Uniform stages, F:B:W = 1 : 1 : 0.6 ms, 1 GiB kept per microbatch, 8 GiB budget."""
    return uniform_problem(DEVICES, MICROBATCHES, forward=1e-3, backward_input=1e-3,
                           backward_weight=0.6e-3, p2p=0.05e-3, activation=1 << 30,
                           budget=float(8 << 30), name="uniform 8x32")


def simulated(name: str, problem: Problem) -> SimResult | None:
    """Generate and simulate ``name``; None (with a note on stderr) when it is unavailable."""
    try:
        from optpipe.generators import generate

        return simulate(problem, generate(name, problem))
    except (ImportError, OptPipeError, NotImplementedError, KeyError) as exc:
        print(f"skipping {name}: {exc}", file=sys.stderr)
        return None


def shrink(path: Path) -> None:
    """Re-save a PNG with a 256-colour palette: about 2.5x smaller, no visible change.

    These files live in git and are regenerated often; the library itself writes
    full-colour PNGs.
    """
    from PIL import Image

    with Image.open(path) as image:
        palette = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT,
                                                dither=Image.Dither.NONE)
    palette.save(path, optimize=True)


def context(problem: Problem) -> str:
    """Short description of the problem for figure titles."""
    return problem.name if problem.meta.get("source") == "costmodel" else "uniform stages"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1]
                        / "docs" / "img", help="folder for the PNGs (default docs/img)")
    parser.add_argument("--uniform", action="store_true",
                        help="use the uniform toy problem instead of the cost-model preset")
    args = parser.parse_args(argv)
    make: Callable[[], Problem] = toy_problem if args.uniform else preset_problem
    problem = make()
    written: list[Path] = []

    for name, filename in GANTTS.items():
        result = simulated(name, problem)
        if result is not None:
            plot_gantt(result, args.out / filename,
                       title=f"{result.schedule.name} — {context(problem)}")
            written.append(args.out / filename)

    results = [r for r in (simulated(n, problem) for n in COMPARED) if r is not None]
    if results:
        plot_comparison(results, args.out / "compare_8x32.png",
                        title=f"Schedules compared — {context(problem)}")
        written.append(args.out / "compare_8x32.png")

    name, filename = OFFLOAD
    tight = problem.activation_budget(OFFLOAD_BUDGET_MICROBATCHES)
    result = simulated(name, tight)
    if result is not None:
        if not result.fits:
            print(f"note: {name} does not fit the tight budget; the figure says so",
                  file=sys.stderr)
        plot_gantt(result, args.out / filename,
                   title=f"{result.schedule.name} — {context(problem)}, tight budget")
        written.append(args.out / filename)

    for path in written:
        shrink(path)
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
    return 0 if written else 1


if __name__ == "__main__":
    raise SystemExit(main())
