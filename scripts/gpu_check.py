#!/usr/bin/env python
"""One-GPU check of the runtime: every stage in one process, real CUDA streams.

    python scripts/gpu_check.py                # on a machine with a CUDA GPU
    python scripts/gpu_check.py --device cpu   # the same logic on the CPU (a dry run)

Reports, each from a measurement on this machine:

1. correctness on the GPU: every generator's schedule and the offload variants, GPT and
   MLP in float64, pipelined gradients vs one plain backward (max abs diff < 1e-10),
   offloaded microbatches really leaving the GPU (their storages empty at RELOAD);
2. F/B/W times per stage (CUDA events) of a larger GPT, from ``optpipe.runtime.profile``;
3. host-link bandwidth: one large pinned copy each way, and what OFFLOAD/RELOAD reach;
4. whether offload copies overlap compute: per variant (no offload, every non-last
   stage offloaded, half of it, with each RELOAD issued one compute action early, and
   with every OFFLOAD held back: the device waits for its copy, ``wait``)
   the step time, the copy time, and the exposed copy time (copies with no compute);
5. peak memory against the plan: the runtime's accounting per (logical) device against
   the simulator on the profiled problem, and ``torch.cuda.max_memory_allocated``;
6. the planned arena (``arena=True``) on the GPU: gradients equal the plain runner's for
   the schedules of ``tests/test_runtime_arena.py`` (offload included: real side streams
   reusing arena slots), and on the model of [2] the real reserved and allocated peaks
   and the step time, arena against the caching allocator alone;
7. NCCL: the correctness runs of [1] again as real processes under NCCL, for each world
   size in ``--nccl`` (default 1: one GPU gives one rank its own GPU; ``--nccl 2`` on one
   GPU asks whether NCCL lets two ranks share it, and reports its answer).

Without a GPU it prints why and exits 0, so it can sit in any script.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _merged(intervals) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _overlap(a, b) -> float:
    """Length of the intersection of two merged interval lists."""
    total = i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def copy_figures(record) -> dict[str, float]:
    """Copy time (d2h/h2d lanes, summed), the wall time some copy ran, and the part of
    that with no compute action running: the copy time the step could not hide."""
    compute = _merged((a.start, a.end) for a in record.actions if a.lane == "compute")
    copies = [(a.start, a.end) for a in record.actions if a.lane != "compute"]
    busy = _merged(copies)
    busy_time = sum(end - start for start, end in busy)
    return {"copy": sum(end - start for start, end in copies), "copy_wall": busy_time,
            "exposed": busy_time - _overlap(busy, compute),
            "compute": sum(end - start for start, end in compute)}


def prefetched(schedule, ahead: int = 1):
    """``schedule`` with every RELOAD issued ``ahead`` compute actions earlier on its
    device (never before its OFFLOAD): the copy can then run under that compute."""
    from optpipe.schedule import Op, Schedule

    lists = []
    for acts in schedule.actions:
        acts = list(acts)
        for reload in [a for a in acts if a.op is Op.RELOAD]:
            k = acts.index(reload)
            floor = next(i for i, a in enumerate(acts) if a.op is Op.OFFLOAD
                         and (a.stage, a.microbatch) == (reload.stage, reload.microbatch))
            to, moved = k, 0
            while moved < ahead and to - 1 > floor:
                to -= 1
                moved += acts[to].op not in (Op.OFFLOAD, Op.RELOAD)
            acts.insert(to, acts.pop(k))
        lists.append(acts)
    return Schedule(f"{schedule.name}+prefetch{ahead}", schedule.stages, schedule.devices,
                    schedule.microbatches, list(schedule.placement), lists,
                    dict(schedule.provenance)).validate()


def gpt_config(args):
    """The GPT of sections 2, 4 and 6."""
    from optpipe.runtime import GPTConfig

    return GPTConfig.from_preset("tiny-gpt", layers=args.layers, hidden=args.hidden,
                                 ffn_hidden=4 * args.hidden, heads=max(1, args.hidden // 64),
                                 seq_len=args.seq_len, vocab=50304)


def arena_check(args, device, config) -> bool:
    """Section 6: ``arena=True`` on this device, correctness then real peaks."""
    import gc

    from optpipe.generators import generate
    from optpipe.problem import uniform_problem
    from optpipe.runtime import GPT, OptPipeRunner, gpt_batch, gpt_loss
    from optpipe.runtime.measure import parse_dtype
    from optpipe.runtime.verify import build_case, with_offload
    from optpipe.units import format_bytes

    problem = uniform_problem(4, 4)
    cases = {"1f1b": generate("1f1b", problem), "zb-h1": generate("zb-h1", problem),
             "1f1b+offload": with_offload(generate("1f1b", problem)),
             "pipeoffload(tight)": generate("pipeoffload", problem.activation_budget(1.5))}
    ok, worst, failing = True, 0.0, []
    for kind in ("gpt", "mlp"):
        for name, schedule in cases.items():
            model, loss_fn, x, y = build_case(kind, schedule.stages, batch=8)
            plain = OptPipeRunner(model, schedule, loss_fn, device=device)
            loss_plain = plain.step(x, y)
            reference = {n: p.grad.clone() for n, p in model.named_parameters()}
            runner = OptPipeRunner(model, schedule, loss_fn, device=device, arena=True)
            for _ in range(3):
                loss = runner.step(x, y)
                diff = max((p.grad - reference[n]).abs().max().item()
                           for n, p in model.named_parameters())
                worst = max(worst, diff)
                stats = runner.arena_stats()
                if (diff >= 1e-10 or abs(loss - loss_plain) >= 1e-10 or runner.leftover
                        or any(s.live or s.outside_peak for s in stats.values())):
                    failing.append(f"{kind} {name}: diff {diff:.1e}, leftover "
                                   f"{runner.leftover}, stats {stats}")
                    break
            store = runner.arena_store
            if store is None or store.planned_entries == 0:
                failing.append(f"{kind} {name}: no planned entries")
    print(f"[6] arena on {device}: 8 schedule x model cases x 3 steps, worst grad diff "
          f"{worst:.1e}, {len(failing)} failing")
    for line in failing:
        print(f"    FAIL {line}")
    ok &= not failing
    if device.type != "cuda":
        return ok
    torch.manual_seed(0)
    model = GPT(config).to(parse_dtype(args.dtype))
    x, y = gpt_batch(config, args.micro_batch_size * args.microbatches)
    problem = uniform_problem(args.stages, args.microbatches)
    print(f"    {args.stages} logical devices on one GPU, the model of [2]: peaks of the "
          f"step after the plan (weights and grads included)")
    for name in ("1f1b", "zb-h1", "1f1b+offload"):
        schedule = (with_offload(generate("1f1b", problem)) if name == "1f1b+offload"
                    else generate(name, problem))
        for arena in (False, True):
            runner = OptPipeRunner(model, schedule, gpt_loss, device=device, arena=arena)
            for _ in range(2):                        # the arena plans after step 1 or 2
                runner.step(x, y)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            steps = []
            for _ in range(3):
                runner.step(x, y, record=True)
                steps.append(runner.last_record.makespan)
            reserved = torch.cuda.max_memory_reserved()
            allocated = torch.cuda.max_memory_allocated()
            arena_bytes = (sum(s.arena_bytes for s in runner.arena_stats().values())
                           if arena else 0)
            print(f"    {name:14s} arena={str(arena):5s} step {statistics.median(steps) * 1e3:6.1f}"
                  f" ms, max reserved {format_bytes(reserved)}, max allocated "
                  f"{format_bytes(allocated)}"
                  + (f", arenas {format_bytes(arena_bytes)}" if arena else ""))
            del runner
            gc.collect()
            torch.cuda.empty_cache()
    return ok


def nccl_check(worlds: list[int], device: str) -> bool:
    """Section 7: [1]'s gradient check as ``world`` real processes under NCCL (gloo on
    the CPU in a dry run). Ranks beyond the GPU count share GPUs round-robin, which NCCL
    may refuse: that answer is reported, not counted as a failure of optpipe."""
    from optpipe.runtime.launch import run_workers
    from optpipe.runtime.verify import MODELS, verify_worker

    backend = "nccl" if device == "cuda" else "gloo"
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    ok = True
    for world in worlds:
        try:
            per_rank = run_workers(verify_worker, world, 4, MODELS, None, 60.0, device,
                                   backend=backend, timeout=90.0)
        except Exception as exc:  # report NCCL's own words, whatever they are
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            shared = world > gpus > 0
            print(f"[7] {backend}, {world} ranks on {gpus or 'no'} GPU(s): did not run"
                  f"{' (ranks share a GPU)' if shared else ''}: {lines[-1] if lines else exc}")
            ok &= shared
            continue
        ok &= report_runs(f"[7] {backend}, {world} ranks on {gpus or 'no'} GPU(s)",
                          [r for rank in per_rank for r in rank], "rank x schedule x model")
    return ok


def report_runs(label: str, reports: list[dict], what: str, offload: bool = False) -> bool:
    """Print one line for :func:`verify_worker` reports and a FAIL line per failing run;
    whether all passed (gradients and loss within 1e-10, nothing left filed, and with
    ``offload`` every offloaded microbatch moved and emptied)."""
    bad = [r for r in reports if r["grad_diff"] >= 1e-10 or r["loss_diff"] >= 1e-10
           or r["leftover"]
           or (offload and (not r["offload_moved"] or not r["offload_emptied"]))]
    worst = max(r["grad_diff"] for r in reports)
    print(f"{label}: {len(reports)} {what} runs, worst grad diff {worst:.1e}, "
          f"{len(bad)} failing")
    for r in bad:
        rank = "" if r["rank"] is None else f"rank {r['rank']} "
        print(f"    FAIL {rank}{r['model']} {r['schedule']}: {r}")
    return not bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--nccl", type=int, nargs="*", default=[1], metavar="WORLD",
                        help="world sizes of the NCCL runs (default 1; none: skip)")
    parser.add_argument("--only-nccl", action="store_true", help="run section 7 alone")
    parser.add_argument("--only-arena", action="store_true", help="run section 6 alone")
    args = parser.parse_args()

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: torch {torch.__version__} sees no CUDA GPU "
              f"(built with CUDA {torch.version.cuda}); nothing to check on this machine.")
        return 0
    device = torch.device(args.device)
    if args.device == "cpu":  # a dry run of the logic: small enough for a laptop
        args.layers, args.hidden, args.seq_len, args.micro_batch_size = 4, 64, 32, 1
        args.dtype = "float32"
    else:
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}")

    from dataclasses import asdict

    from optpipe.generators import generate
    from optpipe.runtime import GPT, OptPipeRunner, gpt_batch, gpt_loss
    from optpipe.runtime.measure import parse_dtype
    from optpipe.runtime.profile import measure_host_bandwidth, profile_gpt
    from optpipe.runtime.verify import verify_worker, with_offload
    from optpipe.simulator import simulate
    from optpipe.units import format_bytes

    ok = True
    if args.only_nccl:
        return 0 if nccl_check(args.nccl, args.device) else 1
    if args.only_arena:
        return 0 if arena_check(args, device, gpt_config(args)) else 1
    # 1. correctness ------------------------------------------------------------
    for devices in (2, 4):
        reports = verify_worker(None, devices, microbatches=4, device=args.device)
        ok &= report_runs(f"[1] {devices} logical devices", reports, "schedule x model",
                          offload=True)

    # 2. F/B/W/BW times ----------------------------------------------------------
    config = gpt_config(args)
    problem = profile_gpt(config, args.stages, args.microbatches,
                          micro_batch_size=args.micro_batch_size, dtype=args.dtype,
                          device=args.device, repeats=3)
    print(f"[2] model {args.layers} x {args.hidden}, seq {args.seq_len}, "
          f"{args.micro_batch_size} seq/microbatch, {args.dtype}, partition "
          f"{problem.meta['partition']}")
    for s in range(problem.stages):
        print(f"    stage {s}: F {problem.forward[s] * 1e3:7.2f} ms  B "
              f"{problem.backward_input[s] * 1e3:7.2f} ms  W "
              f"{problem.backward_weight[s] * 1e3:7.2f} ms  BW "
              f"{problem.bw_time(s) * 1e3:7.2f} ms  kept "
              f"{format_bytes(problem.activation[s])}/microbatch (B frees "
              f"{format_bytes(problem.freed_by_b[s])})")

    # 3. host link -----------------------------------------------------------------
    d2h, h2d = measure_host_bandwidth(device)
    print(f"[3] host link, one 32 MiB copy: d2h {d2h / 1e9:.1f} GB/s, h2d {h2d / 1e9:.1f} GB/s;"
          f" achieved by OFFLOAD/RELOAD: d2h {problem.d2h_bandwidth / 1e9:.1f} GB/s, h2d "
          f"{problem.h2d_bandwidth / 1e9:.1f} GB/s")

    # 4. overlap ---------------------------------------------------------------------
    torch.manual_seed(0)
    model = GPT(config).to(parse_dtype(args.dtype))
    x, y = gpt_batch(config, args.micro_batch_size * args.microbatches)
    base = generate("1f1b", problem)
    variants = {"1f1b": base, "1f1b+offload": with_offload(base),
                "1f1b+offload x0.5": with_offload(base, 0.5),
                "1f1b+offload+prefetch": prefetched(with_offload(base)),
                "1f1b+offload+wait": with_offload(base, wait=True)}
    times = {}
    records = {}
    for label, schedule in variants.items():
        runner = OptPipeRunner(model, schedule, gpt_loss, device=device)
        runner.step(x, y)
        steps = []
        for _ in range(3):
            runner.step(x, y, record=True)
            steps.append(runner.last_record)
        times[label] = statistics.median(r.makespan for r in steps)
        records[label] = steps[-1]
        del runner
    print("[4] offload on one GPU (all logical devices share one compute stream): step, "
          "copy time, exposed copy time (no compute running)")
    for label, record in records.items():
        f = copy_figures(record)
        moved = sum(a.moved for a in record.actions if a.op == "OFFLOAD")
        extra = times[label] - times["1f1b"]
        print(f"    {label:24s} step {times[label] * 1e3:6.1f} ms ({extra * 1e3:+6.1f}), "
              f"compute {f['compute'] * 1e3:6.1f} ms, moved {format_bytes(moved)} each way, "
              f"copies {f['copy'] * 1e3:6.1f} ms (wall {f['copy_wall'] * 1e3:6.1f}), "
              f"exposed {f['exposed'] * 1e3:6.1f} ms")

    # 5. memory vs plan ------------------------------------------------------------
    for label, schedule in variants.items():
        record = records[label]
        sim = simulate(problem, schedule)
        planned = [p - s for p, s in zip(sim.peak_memory, problem.static)]
        if planned == record.peak_activation:
            same = "equal"
        elif all(m <= p for m, p in zip(record.peak_activation, planned)):
            same = "below plan: copies finished before the next F, the plan assumes not"
        else:
            same = "ABOVE PLAN"
            ok = False
        print(f"[5] {label}: kept-activation peak per device measured "
              f"{[format_bytes(b) for b in record.peak_activation]} vs plan "
              f"{[format_bytes(b) for b in planned]} ({same})")
        if args.device == "cuda":
            print(f"    torch.cuda.max_memory_allocated during the step: "
                  f"{format_bytes(record.cuda_peak[0])} (weights+grads "
                  f"{format_bytes(sum(record.static))}, all logical devices on this GPU)")
    ok &= arena_check(args, device, config)
    ok &= nccl_check(args.nccl, args.device)
    print("gpu_check: all correctness checks passed" if ok else "gpu_check: FAILURES above")
    print(f"config: {asdict(config)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
