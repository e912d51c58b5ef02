"""Chrome trace-event JSON of a simulated schedule, for Perfetto and chrome://tracing.

A trace viewer is the right tool when a static picture is not: zooming into one
microbatch of a 16 × 64 schedule, measuring a gap, or lining the simulation up against a
measured run's trace. Layout: one process per device, with threads ``compute``, ``d2h``
and ``h2d`` in that order; one complete event (``"ph": "X"``) per action named like
``F3`` / ``BW12`` / ``OFFLOAD7``; memory per device as a counter (``"ph": "C"``) in MiB.
Times are microseconds from the schedule's first start, as the format requires.

Format reference: "Trace Event Format" (Google, the JSON Object Format with
``traceEvents``), which Perfetto's legacy JSON importer reads.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from optpipe.errors import OptPipeError
from optpipe.simulator import COMPUTE, D2H, H2D, SimResult
from optpipe.units import format_bytes
from optpipe.viz.tracks import chunk_index, has_transfers

LANES = (COMPUTE, D2H, H2D)       # thread order inside a device's process
US = 1e6                          # seconds → microseconds
MIB = float(2**20)


def _metadata(result: SimResult) -> list[dict[str, Any]]:
    """Process/thread names and sort order, so devices list top to bottom in order."""
    events: list[dict[str, Any]] = []
    lanes = [COMPUTE] + ([D2H, H2D] if has_transfers(result) else [])
    for d in range(result.schedule.devices):
        budget = result.budget[d]
        label = f"device {d}" + (f" (budget {format_bytes(budget)})"
                                 if math.isfinite(budget) else "")
        events.append({"name": "process_name", "ph": "M", "pid": d, "tid": 0,
                       "args": {"name": label}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": d, "tid": 0,
                       "args": {"sort_index": d}})
        for tid, lane in enumerate(LANES):
            if lane in lanes:
                events.append({"name": "thread_name", "ph": "M", "pid": d, "tid": tid,
                               "args": {"name": lane}})
                events.append({"name": "thread_sort_index", "ph": "M", "pid": d, "tid": tid,
                               "args": {"sort_index": tid}})
    return events


def chrome_trace(result: SimResult) -> dict[str, Any]:
    """The trace as a JSON-ready dict: ``traceEvents`` plus the headline figures.

    Exactly one ``X`` event per simulated action; ``ts``/``dur`` are the simulator's
    start and duration in microseconds, relative to ``result.start_time``.
    """
    origin = result.start_time
    chunk = chunk_index(result)
    events = _metadata(result)
    for rec in result.records:
        action = rec.action
        args: dict[str, Any] = {"stage": action.stage, "microbatch": action.microbatch,
                                "op": action.op.value}
        if result.schedule.chunks > 1:
            args["chunk"] = chunk[action.stage]
        if action.op.is_transfer:
            args["fraction"] = action.fraction
        events.append({
            "name": f"{action.op.value}{action.microbatch}",
            "cat": action.op.value,
            "ph": "X",
            "pid": rec.device,
            "tid": LANES.index(rec.lane),
            "ts": (rec.start - origin) * US,
            "dur": (rec.end - rec.start) * US,
            "args": args,
        })
    for d, curve in enumerate(result.memory_timeline):
        for when, level in curve:
            events.append({"name": "memory (MiB)", "ph": "C", "pid": d, "tid": 0,
                           "ts": (when - origin) * US, "args": {"allocated": level / MIB}})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "schedule": result.schedule.name,
            "devices": result.schedule.devices,
            "microbatches": result.schedule.microbatches,
            "makespan_s": result.makespan,
            "bubble_rate": result.bubble_rate,
            "peak_memory_bytes": list(result.peak_memory),
            "fits_budget": result.fits,
            "provenance": result.schedule.provenance,
        },
    }


def write_chrome_trace(result: SimResult, path: str | Path) -> Path:
    """Write :func:`chrome_trace` to ``path`` (``.json``); returns the path written."""
    path = Path(path)
    if path.suffix.lower() != ".json":
        raise OptPipeError(f"cannot write trace {str(path)!r}: a Chrome trace is JSON; "
                           f"name the file with .json (e.g. trace.json)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(result), default=str, separators=(",", ":")))
    return path
