#!/usr/bin/env python
"""Runtime figures: overhead against PyTorch's own 1F1B, and measured vs predicted steps.

    python scripts/bench_runtime.py            # measure, print, write into docs/runtime.md
    python scripts/bench_runtime.py --quick    # fewer steps (a smoke run)
    python scripts/bench_runtime.py --no-write # print only

1. Overhead. The same GPT, the same partition, the same microbatches on 4 gloo
   processes; each iteration runs one step of ``torch.distributed.pipelining``'s
   ``Schedule1F1B`` and one of ``OptPipeRunner`` with optpipe's ``1f1b`` schedule, in
   alternating order, each timed as the slowest rank's time inside ``step()`` after a
   barrier. Reported: medians and their ratio (target <= 1.05).
2. Prediction. The model is profiled (``optpipe.runtime.profile``), the simulator
   predicts each schedule's makespan on that problem, and the schedule is run on real
   processes; reported: measured step (first start to last end, median of the recorded
   steps) against the prediction (target within 15%). A chunked schedule (the solved
   one may use the V placement) is predicted on a profile of the model cut into the
   schedule's stages with the runner's partition (one problem stage per chunk, each
   measured), not on an even split of the base profile. A second prediction uses the
   per-action durations measured *during* the run (same data, same processes) to
   separate what the simulator's model of ordering and waiting explains from how much
   slower each action ran when the processes share the CPU cores.

Every figure printed comes from this run on this machine; nothing is typed in.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optpipe.runtime.launch import run_workers  # noqa: E402

DOC = ROOT / "docs" / "runtime.md"
BEGIN, END = "<!-- bench_runtime:begin -->", "<!-- bench_runtime:end -->"


# ---------------------------------------------------------------- overhead
def overhead_worker(rank: int, world: int, shape: dict, microbatches: int, iters: int) -> dict:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from optpipe.generators import generate
    from optpipe.problem import uniform_problem
    from optpipe.runtime import GPT, GPTConfig, OptPipeRunner, gpt_batch, gpt_loss

    torch.manual_seed(0)
    config = GPTConfig.from_preset("tiny-gpt", **shape["config"])
    model = GPT(config)
    x, y = gpt_batch(config, shape["mbs"] * microbatches)
    ours = OptPipeRunner(model, generate("1f1b", uniform_problem(world, microbatches)),
                         gpt_loss)
    stage = PipelineStage(ours.plan.modules[rank], rank, world, torch.device("cpu"))
    theirs = Schedule1F1B(stage, microbatches, loss_fn=gpt_loss)

    def run_theirs() -> None:
        if rank == 0:
            theirs.step(x, return_outputs=False)
        elif rank == world - 1:
            theirs.step(target=y, losses=[], return_outputs=False)
        else:
            theirs.step(return_outputs=False)

    def run_ours() -> None:
        ours.step(x, y)

    times: dict[str, list[float]] = {"torch": [], "optpipe": []}
    warmup = 2
    for i in range(warmup + iters):
        pair = [("torch", run_theirs), ("optpipe", run_ours)]
        for name, fn in (pair if i % 2 == 0 else pair[::-1]):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            if i >= warmup:
                times[name].append(took.item())
    ratios = [o / t for o, t in zip(times["optpipe"], times["torch"])]
    return ({k: statistics.median(v) for k, v in times.items()}
            | {"ratio": statistics.median(ratios), "partition": ours.plan.partition})


# -------------------------------------------------------------- prediction
def profile(shape: dict, stages: int, microbatches: int, threads: int, processes: int,
            placement: list[int] | None = None, p2p: float | None = None):
    """The profiled problem; with ``placement`` (a chunked schedule's), per chunk: the
    model cut into ``len(placement)`` stages with the runner's partition for it."""
    from optpipe.runtime import GPTConfig
    from optpipe.runtime.profile import measure_p2p, profile_gpt

    config = GPTConfig.from_preset("tiny-gpt", **shape["config"])
    problem = profile_gpt(config, len(placement) if placement else stages, microbatches,
                          micro_batch_size=shape["mbs"], processes=processes,
                          threads=threads, repeats=3, placement=placement)
    if p2p is None:
        p2p = measure_p2p(problem.meta["boundary_bytes"])
    return replace(problem, p2p=p2p), config


def in_run_problem(problem, run, schedule):
    """The problem with F/B/W (and fused BW) times replaced by the medians measured
    during the run.

    ``problem`` is the one the schedule was predicted on (for a chunked schedule the
    per-chunk profile); a base problem is split first for a chunked schedule, so that
    each of the schedule's stages gets its own measured times.
    """
    base = problem if schedule.stages == problem.stages else problem.split(schedule.placement)
    S = schedule.stages
    per = {op: [[] for _ in range(S)] for op in ("F", "B", "W", "BW")}
    for record in run.records:
        for a in record.actions:
            if a.op in per:
                per[a.op][a.stage].append(a.end - a.start)
    for s in range(S):
        if not per["B"][s]:  # fused backward: split BW by the profile's B:W ratio
            share = base.backward_input[s] / max(1e-12, base.backward_input[s]
                                                 + base.backward_weight[s])
            per["B"][s] = [t * share for t in per["BW"][s]]
            per["W"][s] = [t * (1 - share) for t in per["BW"][s]]
    forward = tuple(statistics.median(v) for v in per["F"])
    b = tuple(statistics.median(v) for v in per["B"])
    w = tuple(statistics.median(v) for v in per["W"])
    # the fused time this run measured (not the profile's), B + W where none ran
    fused = (tuple(statistics.median(per["BW"][s]) if per["BW"][s] else b[s] + w[s]
                   for s in range(S)) if any(per["BW"]) else None)
    if fused is not None and not all(t > 0 for t in fused):
        fused = None
    return replace(base, forward=forward, backward_input=b, backward_weight=w,
                   backward_fused=fused)


def predict_rows(shape: dict, stages: int, microbatches: int, steps: int,
                 solve_seconds: float) -> list[dict]:
    from optpipe.generators import generate
    from optpipe.runtime.measure import RunSpec, compare, is_chunked, measure_schedule
    from optpipe.simulator import simulate

    threads = max(1, (os.cpu_count() or 1) // stages)
    problem, config = profile(shape, stages, microbatches, threads, processes=1)
    loaded, _ = profile(shape, stages, microbatches, threads, processes=stages)
    schedules = [generate("1f1b", problem), generate("zb-h1", problem)]
    try:
        from optpipe.optimizer import solve

        solved = solve(problem, time_limit=solve_seconds, progress=False).schedule
        found = solved.provenance.get("name", solved.name)
        solved.name = f"solve ({solved.provenance.get('status', '?')}: {found})"
        schedules.append(solved)
    except Exception as exc:  # the optimizer is another part; report, do not hide
        print(f"note: no solved schedule ({type(exc).__name__}: {exc})", file=sys.stderr)
    rows = []
    for schedule in schedules:
        chunked = is_chunked(schedule)
        if chunked:   # every chunk measured, cut as the runner will cut the model
            placement = list(schedule.placement)
            plain, _ = profile(shape, stages, microbatches, threads, 1, placement,
                               p2p=problem.p2p)
            under_load, _ = profile(shape, stages, microbatches, threads, stages,
                                    placement, p2p=loaded.p2p)
        else:
            plain, under_load = problem, loaded
        spec = RunSpec(config=asdict(config), schedule=schedule.to_dict(),
                       micro_batch_size=shape["mbs"], steps=steps, warmup=1,
                       partition=plain.meta["partition"])
        run = measure_schedule(spec, threads=threads)
        figures = compare(run, schedule, plain)
        plan = simulate(under_load, schedule)
        cores = os.cpu_count() or 1
        rows.append({"stages": stages, "schedule": schedule.name,
                     "measured": figures["measured_step"],
                     "predicted": figures["simulated_step"],
                     "loaded": plan.makespan,
                     "core_bound": max(plan.makespan, sum(plan.device_busy) / cores),
                     "in_run": simulate(in_run_problem(plain, run, schedule),
                                        schedule).makespan,
                     "peak_equal": figures["measured_peak"] == figures["simulated_peak"],
                     "chunked": chunked, "prediction": figures["prediction"]})
    return rows


# ------------------------------------------------------------------ report
def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
            f"torch {torch.__version__}, load average {load:.1f} at start")


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def report(overhead: list[dict], prediction: list[dict], info: str, command: str) -> str:
    lines = [f"Measured by `{command}` on {info}.", "",
             "**Overhead** (4 gloo processes, same model, partition and microbatches; the "
             "slowest rank's `step()` time, the two runtimes alternating step by step; "
             "medians, and the median of the paired per-iteration ratios):", "",
             "| model | microbatches | torch Schedule1F1B | OptPipeRunner 1f1b | "
             "ratio (paired) |",
             "|---|---|---|---|---|"]
    for row in overhead:
        lines.append(f"| {row['label']} | {row['microbatches']} | {ms(row['torch'])} | "
                     f"{ms(row['optpipe'])} | {row['ratio']:.2f} |")
    lines += ["", "**Prediction** (measured step = first start to last end, median of the "
                  "recorded steps, against the simulator's makespan on three problems: the "
                  "plain profile (one process), the profile *under load* (as many profiling "
                  "processes at once as the pipeline has ranks) and the *in-run* action "
                  "durations of this very run):", "",
              "| stages | schedule | measured | profile | error | under load | error | "
              "in-run | error | under load, capped by cores | error | peak = plan |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def err(measured: float, predicted: float) -> str:
        return f"{measured / predicted - 1:+.0%}"

    for row in prediction:
        peak = "yes" if row["peak_equal"] else "no"
        name = row["schedule"] + (" *" if row["chunked"] else "")
        lines.append(f"| {row['stages']} | {name} | {ms(row['measured'])} | "
                     f"{ms(row['predicted'])} | {err(row['measured'], row['predicted'])} | "
                     f"{ms(row['loaded'])} | {err(row['measured'], row['loaded'])} | "
                     f"{ms(row['in_run'])} | {err(row['measured'], row['in_run'])} | "
                     f"{ms(row['core_bound'])} | {err(row['measured'], row['core_bound'])} | "
                     f"{peak} |")
    lines += ["", "\\* chunked schedule (V or interleaved): the profile and the profile "
                  "under load are per-chunk profiles, the model cut into the schedule's "
                  "stages with the runner's partition and each stage measured (not an even "
                  "split of the base profile); in-run takes each chunk's own durations. "
                  "*Capped by cores*: max(makespan, total busy time / CPU cores) - the "
                  "simulator assumes one independent device per stage, but here all ranks "
                  "share the machine's cores."]
    return "\n".join(lines) + "\n"


def write_doc(text: str) -> None:
    from docblock import replace_between

    doc = DOC.read_text() if DOC.exists() else ""
    inner = text.rstrip("\n")
    DOC.write_text(replace_between(doc, BEGIN, END, inner) or
                   f"{doc.rstrip()}\n\n## Measured figures\n\n{BEGIN}\n{inner}\n{END}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations and steps")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/runtime.md")
    args = parser.parse_args()
    info = machine()
    iters, steps = (4, 2) if args.quick else (20, 4)
    shapes = [
        {"label": "tiny-gpt (4 x 64, seq 32, 1 seq/mb)", "mbs": 1, "config": {}},
        {"label": "gpt 8 x 128, seq 64, 2 seq/mb", "mbs": 2,
         "config": {"layers": 8, "hidden": 128, "ffn_hidden": 512, "heads": 4, "seq_len": 64}},
    ]
    overhead = []
    for shape in shapes:
        result = run_workers(overhead_worker, 4, shape, 8, iters, threads=1)[0]
        overhead.append({"label": shape["label"], "microbatches": 8, **result})
        print(f"overhead {shape['label']}: torch {ms(result['torch'])}, optpipe "
              f"{ms(result['optpipe'])}, paired ratio {result['ratio']:.2f}", flush=True)
    prediction = []
    for stages in (2, 4):
        for row in predict_rows(shapes[1], stages, 8, steps, solve_seconds=20.0):
            prediction.append(row)
            print(f"prediction {stages} stages {row['schedule']}: measured "
                  f"{ms(row['measured'])}, profile {ms(row['predicted'])}, under load "
                  f"{ms(row['loaded'])}, in-run {ms(row['in_run'])}", flush=True)
    command = "python scripts/bench_runtime.py" + (" --quick" if args.quick else "")
    text = report(overhead, prediction, info, command)
    print()
    print(text)
    if not args.no_write:
        write_doc(text)
        print(f"wrote the table into {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
