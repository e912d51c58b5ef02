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
4. whether offload copies overlap compute: the share of the d2h/h2d copy time during
   which a compute action was running, and the step time with and without offload;
5. peak memory against the plan: the runtime's accounting per (logical) device against
   the simulator on the profiled problem, and ``torch.cuda.max_memory_allocated``.

Without a GPU it prints why and exits 0, so it can sit in any script.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def overlap_share(record) -> float:
    """Share of transfer time (d2h/h2d lanes) during which some compute action ran."""
    compute = sorted((a.start, a.end) for a in record.actions if a.lane == "compute")
    covered = total = 0.0
    for a in record.actions:
        if a.lane == "compute" or a.end <= a.start:
            continue
        total += a.end - a.start
        for start, end in compute:
            lo, hi = max(start, a.start), min(end, a.end)
            if hi > lo:
                covered += hi - lo
    return covered / total if total > 0 else float("nan")


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
    from optpipe.runtime import GPT, GPTConfig, OptPipeRunner, gpt_batch, gpt_loss
    from optpipe.runtime.measure import parse_dtype
    from optpipe.runtime.profile import measure_host_bandwidth, profile_gpt
    from optpipe.runtime.verify import verify_worker, with_offload
    from optpipe.simulator import simulate
    from optpipe.units import format_bytes

    ok = True
    # 1. correctness ------------------------------------------------------------
    for devices in (2, 4):
        reports = verify_worker(None, devices, microbatches=4, device=args.device)
        bad = [r for r in reports if r["grad_diff"] >= 1e-10 or r["loss_diff"] >= 1e-10
               or r["leftover"] or not r["offload_moved"] or not r["offload_emptied"]]
        worst = max(r["grad_diff"] for r in reports)
        print(f"[1] {devices} logical devices: {len(reports)} schedule x model runs, worst "
              f"grad diff {worst:.1e}, {len(bad)} failing")
        for r in bad:
            print(f"    FAIL {r['model']} {r['schedule']}: {r}")
        ok &= not bad

    # 2. F/B/W/BW times ----------------------------------------------------------
    config = GPTConfig.from_preset("tiny-gpt", layers=args.layers, hidden=args.hidden,
                                   ffn_hidden=4 * args.hidden, heads=max(1, args.hidden // 64),
                                   seq_len=args.seq_len, vocab=50304)
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
    times = {}
    records = {}
    for label, schedule in (("1f1b", base), ("1f1b+offload", with_offload(base))):
        runner = OptPipeRunner(model, schedule, gpt_loss, device=device)
        runner.step(x, y)
        steps = []
        for _ in range(3):
            runner.step(x, y, record=True)
            steps.append(runner.last_record)
        times[label] = statistics.median(r.makespan for r in steps)
        records[label] = steps[-1]
        del runner
    share = overlap_share(records["1f1b+offload"])
    print(f"[4] step {times['1f1b'] * 1e3:.1f} ms without offload, "
          f"{times['1f1b+offload'] * 1e3:.1f} ms with every non-last stage offloaded; "
          f"{share:.0%} of the copy time overlapped compute")

    # 5. memory vs plan ------------------------------------------------------------
    for label, schedule in (("1f1b", base), ("1f1b+offload", with_offload(base))):
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
    print("gpu_check: all correctness checks passed" if ok else "gpu_check: FAILURES above")
    print(f"config: {asdict(config)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
