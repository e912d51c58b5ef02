"""Export a schedule in the CSV form PyTorch's own pipeline runtime reads.

``torch.distributed.pipelining.schedules._PipelineScheduleRuntime._load_csv(path,
format="compute_only")`` reads one row per rank with one cell per compute action:
``{stage}{type}{microbatch}`` where the type is ``F`` (forward), ``I`` (backward for
the input: our ``B``), ``W`` (backward for the weights) or ``B`` (full backward: our
``BW``), and an empty cell for an idle slot. PyTorch has no offload actions, so OFFLOAD
and RELOAD are left out (the exported schedule then keeps every activation on device).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from optpipe.schedule import Op, Schedule
from optpipe.simulator import COMPUTE, SimResult

_TORCH_TYPE = {Op.F: "F", Op.B: "I", Op.W: "W", Op.BW: "B"}


def torch_rows(schedule: Schedule, result: SimResult | None = None) -> list[list[str]]:
    """Cells per rank; with a simulation, idle gaps become empty cells.

    A slot is the shortest compute action, so a gap of k such actions is k empty cells.
    """
    if result is None:
        return [[f"{a.stage}{_TORCH_TYPE[a.op]}{a.microbatch}" for a in acts if a.op.is_compute]
                for acts in schedule.actions]
    compute = [r for r in result.records if r.lane == COMPUTE]
    slot = min((r.end - r.start for r in compute if r.end > r.start), default=1.0)
    rows: list[list[str]] = [[] for _ in range(schedule.devices)]
    clock = [result.start_time] * schedule.devices
    for rec in sorted(compute, key=lambda r: (r.device, r.start)):
        gap = rec.start - clock[rec.device]
        rows[rec.device].extend([""] * int(round(gap / slot - 1e-9)) if gap > 0 else [])
        a = rec.action
        rows[rec.device].append(f"{a.stage}{_TORCH_TYPE[a.op]}{a.microbatch}")
        clock[rec.device] = rec.end
    return rows


def to_torch_csv(schedule: Schedule, result: SimResult | None = None) -> str:
    """The CSV text (no header, one row per rank)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for row in torch_rows(schedule, result):
        writer.writerow(row)
    return buffer.getvalue()


def write_torch_csv(schedule: Schedule, path: str | Path, result: SimResult | None = None) -> None:
    Path(path).write_text(to_torch_csv(schedule, result))
