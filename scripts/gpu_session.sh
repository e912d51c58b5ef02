#!/usr/bin/env bash
# Every GPU check of optpipe in one short run, for a machine lent for a few minutes.
#
#   bash scripts/gpu_session.sh [OUTDIR]      # default: $OUT, else ./gpu_out
#
# Needs only torch (CUDA build), numpy, rich and matplotlib: no solver runs here.
# Writes one log per check into OUTDIR; each check has its own time limit, so one
# that hangs (NCCL refusing two ranks on one GPU, say) cannot starve the others.
set -u
out="${1:-${OUT:-gpu_out}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=python3

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
} 2>&1 | tee "$out/env.log"

step() {  # step NAME SECONDS COMMAND...: run with a limit, log, say how it ended
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  cat "$out/$name.log"
  echo "== $name: exit $rc after $((SECONDS - t0)) s (limit $limit s)" | tee -a "$out/$name.log"
}

# 1-6: correctness on the GPU, F/B/W times, host link, offload overlap, peak vs plan,
#      and the correctness runs again as one NCCL rank
step gpu_check 200 $py scripts/gpu_check.py
# the caching-allocator model against the real CUDA allocator
step memplan_cuda 60 $py scripts/bench_memplan.py --cuda
# `optpipe run` on the GPU in one process, with its measured Gantt chart
step run 60 $py -m optpipe.cli run --single-process --device cuda --model tiny-gpt \
  --stages 4 --microbatches 8 --schedule zb-h1 --dtype bfloat16 --steps 3 \
  --gantt "$out/run_gantt.png"
# two NCCL ranks on one GPU: does NCCL accept them? (reported either way)
step nccl2 75 $py scripts/gpu_check.py --only-nccl --nccl 2
