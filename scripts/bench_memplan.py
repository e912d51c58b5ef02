"""Benchmark of the memory planner: the figures quoted in docs/memory.md.

Three tables, all measured on this machine when the script runs:

1. MiniMalloc's 11 "challenging" instances (``A..K.1048576.csv``, capacity 1,048,576):
   planned arena / capacity and wall time per instance, for the planner with two and
   with one worker, and for omnimalloc (``omni``, its default, and ``supermalloc``) when
   that package is installed.
2. Per-device traces of pipeline schedules of GPT presets (cost model, per-layer tensors):
   waste of PyTorch's caching allocator (default and expandable segments) versus the
   planned arena, both relative to the peak of live bytes.
3. Planning time of a full step (every device) of 8-stage, 64-microbatch schedules.

Usage: ``python scripts/bench_memplan.py [--data DIR] [--time-limit S] [--no-write]``.
The tables are printed and written into docs/memory.md between the bench markers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optpipe import costmodel  # noqa: E402
from optpipe.generators import generate  # noqa: E402
from optpipe.memory.caching_allocator import replay  # noqa: E402
from optpipe.memory.planner import plan  # noqa: E402
from optpipe.memory.trace import Trace, load_trace, traces_from_schedule  # noqa: E402
from optpipe.memory.validate import validate_plan  # noqa: E402

BEGIN, END = "<!-- bench_memplan:begin -->", "<!-- bench_memplan:end -->"
CAPACITY = 1048576


def _omnimalloc(trace: Trace, allocator: str) -> tuple[float, float] | None:
    """(peak / capacity, seconds) from omnimalloc, or None when it is not installed."""
    try:
        import omnimalloc as om
    except ImportError:
        return None
    allocs = [om.Allocation(b.id, b.size, int(b.start), int(b.end)) for b in trace]
    start = time.perf_counter()
    out = om.allocate(allocs, allocator=allocator)
    seconds = time.perf_counter() - start
    offsets = {str(a.id): int(a.offset) for a in out}
    peak = max(a.offset + a.size for a in out)
    validate_plan(trace, offsets, peak)  # judge its layout with our validator too
    return peak / CAPACITY, seconds


def minimalloc_table(data: Path, time_limit: float) -> list[str]:
    files = sorted(data.glob("*.1048576.csv"))
    if not files:
        return [f"(no MiniMalloc instances under {data})"]
    lines = [
        "| instance | buffers | peak live / cap. | planner, 2 workers | time | "
        "planner, 1 worker | time | omnimalloc omni | time | omnimalloc supermalloc | time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    worst = {2: 0.0, 1: 0.0}
    for path in files:
        trace = load_trace(path)
        row = [path.name.split(".")[0], str(len(trace)),
               f"{trace.peak_live() / CAPACITY:.4f}"]
        for workers in (2, 1):
            p = plan(trace, time_limit=time_limit, workers=workers)
            ratio = p.arena_size / CAPACITY
            worst[workers] = max(worst[workers], ratio)
            row += [f"{ratio:.4f}" + (" (opt.)" if p.optimal else ""), f"{p.wall_time:.2f} s"]
        for allocator in ("omni", "supermalloc"):
            got = _omnimalloc(trace, allocator)
            row += ["n/a", "-"] if got is None else [f"{got[0]:.4f}", f"{got[1]:.2f} s"]
        lines.append("| " + " | ".join(row) + " |")
        print(lines[-1], flush=True)
    lines.append("")
    lines.append(f"Worst planned arena / capacity: {worst[2]:.4f} with 2 workers, "
                 f"{worst[1]:.4f} with 1 worker (time limit {time_limit:g} s per instance; "
                 f"\"opt.\" = equal to the peak of live bytes, hence optimal).")
    return lines


def _offload_budget(problem):
    """The problem with the loosest budget (in microbatches of activations) under which
    the PipeOffload generator actually offloads."""
    for k in (problem.stages / 2, 3, 2, 1.5):
        budgeted = problem.activation_budget(k)
        if generate("pipeoffload", budgeted).offloads:
            return budgeted
    return problem.activation_budget(1.5)


def _pipeline_rows(model: str, stages: int, microbatches: int, time_limit: float,
                   workers: int) -> list[dict[str, Any]]:
    problem = costmodel.build_problem(model, "h100-80gb", stages=stages,
                                      microbatches=microbatches)
    cases = [("1f1b", problem), ("zb-h1", problem), ("interleaved-1f1b", problem),
             ("pipeoffload", _offload_budget(problem)), ("zb-v", problem)]
    rows = []
    for name, prob in cases:
        schedule = generate(name, prob)
        traces = traces_from_schedule(prob, schedule)
        live = reserved = expandable = planned = 0
        gaps, seconds = [], 0.0
        for t in traces:
            cache = replay(t)
            exp = replay(t, expandable_segments=True)
            p = plan(t, time_limit=time_limit, workers=workers)
            live += p.peak_live
            reserved += cache.peak_reserved
            expandable += exp.peak_reserved
            planned += p.arena_size
            gaps.append(p.arena_size / p.peak_live - 1 if p.peak_live else 0.0)
            seconds += p.wall_time
        rows.append({"model": model, "stages": stages, "microbatches": microbatches,
                     "schedule": name + (" (offloads)" if schedule.offloads else
                                         " (no offload)" if name == "pipeoffload" else ""),
                     "buffers": sum(len(t) for t in traces) // len(traces),
                     "caching_waste": reserved / live - 1, "expandable_waste": expandable / live - 1,
                     "plan_waste": planned / live - 1, "worst_gap": max(gaps),
                     "removed": 1 - (planned - live) / (reserved - live) if reserved > live else 1.0,
                     "seconds": seconds, "required": name != "zb-v"})
    return rows


def pipeline_table(time_limit: float, workers: int) -> list[str]:
    lines = [
        "| model | S x M | schedule | buffers / device | caching waste | expandable waste | "
        "plan waste | worst device: plan / peak live - 1 | caching waste removed | "
        "plan time (all devices) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    required = []
    for model, stages, microbatches in (("gpt3-1.3b", 4, 8), ("gpt3-13b", 8, 32)):
        for r in _pipeline_rows(model, stages, microbatches, time_limit, workers):
            lines.append(
                f"| {r['model']} | {r['stages']} x {r['microbatches']} | {r['schedule']}"
                f"{'' if r['required'] else ' (extra)'} | {r['buffers']} | "
                f"{r['caching_waste']:.2%} | {r['expandable_waste']:.2%} | "
                f"{r['plan_waste']:.3%} | {r['worst_gap']:.3%} | {r['removed']:.1%} | "
                f"{r['seconds']:.2f} s |")
            print(lines[-1], flush=True)
            if r["required"]:
                required.append(r)
    mean_removed = sum(r["removed"] for r in required) / len(required)
    worst = max(r["worst_gap"] for r in required)
    lines.append("")
    lines.append(f"Over the 1F1B, ZB-H1, interleaved-1F1B and offload rows: the plan removes "
                 f"{mean_removed:.1%} of the caching allocator's waste on average, and its "
                 f"worst device is {worst:.3%} above the peak of live bytes. Waste = "
                 f"reserved (or arena) / peak live bytes - 1, summed over devices.")
    return lines


def timing_table(workers: int) -> list[str]:
    lines = ["| schedule (gpt3-6.7b, 8 stages x 64 microbatches) | buffers / device | "
             "planning time, all 8 devices | worst device: plan / peak live - 1 |",
             "|---|---:|---:|---:|"]
    problem = costmodel.build_problem("gpt3-6.7b", "h100-80gb", stages=8, microbatches=64)
    for name in ("1f1b", "zb-h1", "interleaved-1f1b"):
        traces = traces_from_schedule(problem, generate(name, problem))
        start = time.perf_counter()
        plans = [plan(t, time_limit=10, workers=workers) for t in traces]
        seconds = time.perf_counter() - start
        gap = max(p.arena_size / p.peak_live - 1 for p in plans)
        lines.append(f"| {name} | {sum(len(t) for t in traces) // len(traces)} | "
                     f"{seconds:.2f} s | {gap:.3%} |")
        print(lines[-1], flush=True)
    return lines


def _cuda_peaks(trace: Trace) -> tuple[int, int]:
    """(max reserved, max allocated) of the real CUDA caching allocator replaying the
    trace with ``torch.empty`` (frees before allocations at equal times)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base_reserved = torch.cuda.memory_reserved()
    events = []
    for k, b in enumerate(trace.buffers):
        if b.size > 0 and b.end > b.start:
            events += [(b.start, 1, k), (b.end, 0, k)]
    live = {}
    for _, kind, k in sorted(events):
        if kind == 0:
            del live[k]
        else:
            live[k] = torch.empty(trace.buffers[k].size, dtype=torch.uint8, device="cuda")
    live.clear()
    return (torch.cuda.max_memory_reserved() - base_reserved,
            torch.cuda.max_memory_allocated())


def cuda_table() -> list[str]:
    """The model against the real allocator (needs a GPU): reserved and allocated peaks."""
    import torch

    if not torch.cuda.is_available():
        return ["(no CUDA device: the model was not compared with the real allocator)"]
    # the traces compared on the H200 (2026-11-30, docs/gpu.md): interleaved 1F1B on an
    # even split of each device's figures, as before the cost model's chunk profiles
    problem = replace(costmodel.build_problem("gpt3-1.3b", "h100-80gb", stages=4,
                                              microbatches=8), chunk_profiles=())
    traces = []
    for name in ("1f1b", "zb-h1", "interleaved-1f1b"):
        traces += traces_from_schedule(problem, generate(name, problem))[:2]
    lines = ["| trace | expandable | model reserved | CUDA reserved | model allocated | "
             "CUDA allocated |", "|---|---|---:|---:|---:|---:|"]
    for expandable in (False, True):
        try:
            torch.cuda.memory._set_allocator_settings(
                f"expandable_segments:{'True' if expandable else 'False'}")
        except Exception as exc:  # an older torch cannot switch at run time
            lines.append(f"| (could not set expandable_segments={expandable}: {exc}) |"
                         " | | | | |")
            continue
        for t in traces:
            model = replay(t, expandable_segments=expandable)
            reserved, allocated = _cuda_peaks(t)
            lines.append(f"| {t.name} | {expandable} | {model.peak_reserved} | {reserved} | "
                         f"{model.peak_allocated} | {allocated} |")
            print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / ".." / "shared" / "data" / "minimalloc",
                        help="folder of the MiniMalloc CSV files (default ../shared/data/minimalloc)")
    parser.add_argument("--time-limit", type=float, default=10.0,
                        help="planning time limit per trace, seconds (default 10)")
    parser.add_argument("--workers", type=int, default=2, help="planner workers (default 2)")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/memory.md")
    parser.add_argument("--cuda", action="store_true",
                        help="only compare the allocator model with the real CUDA allocator "
                             "(needs a GPU; prints, writes nothing)")
    args = parser.parse_args(argv)
    if args.cuda:
        print("\n".join(cuda_table()))
        return 0
    header = (f"Measured by `python scripts/bench_memplan.py` on {os.cpu_count()} CPU cores, "
              f"{time.strftime('%Y-%m-%d')}.")
    parts = [header, "", "**MiniMalloc challenging instances**", ""]
    parts += minimalloc_table(args.data.resolve(), args.time_limit)
    parts += ["", "**Pipeline schedules: caching allocator vs plan**", ""]
    parts += pipeline_table(args.time_limit, args.workers)
    parts += ["", "**Planning time of a full step**", ""]
    parts += timing_table(args.workers)
    text = "\n".join(parts)
    print()
    print(text)
    if not args.no_write:
        doc = ROOT / "docs" / "memory.md"
        from docblock import replace_between

        body = doc.read_text() if doc.exists() else f"{BEGIN}\n{END}\n"
        doc.write_text(replace_between(body, BEGIN, END, text) or
                       f"{body}\n{BEGIN}\n{text}\n{END}\n")
        print(f"\nwritten to {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
