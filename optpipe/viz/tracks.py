"""Which tracks a picture of a schedule has, and which chunk each stage is: no drawing here.

Kept free of matplotlib so the trace exporter can share it without loading a plotting
library, and so the Gantt chart and the trace always agree on rows and chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

from optpipe.simulator import COMPUTE, D2H, H2D, SimResult

#: Heights in row units (a compute row is 1). Boxes leave a gap so rows stay separate.
COMPUTE_BOX = 0.8
LANE_ROW = 0.48
LANE_BOX = 0.4
GROUP_GAP = 0.3          # between devices, only when host-link rows are shown


@dataclass(frozen=True)
class Row:
    """One horizontal track of the chart: a device's compute stream or one of its channels."""

    device: int
    lane: str
    center: float
    box: float               # height of the boxes drawn on it, in row units


def has_transfers(result: SimResult) -> bool:
    """True when the schedule moved activations over a host link (so lanes deserve rows)."""
    return any(r.lane != COMPUTE for r in result.records)


def layout_rows(devices: int, lanes: bool) -> tuple[list[Row], float]:
    """Rows top to bottom (device 0 first) and the total height in row units.

    With ``lanes`` every device gets its d2h and h2d rows, even one that moves nothing,
    so all device groups have the same shape and read alike.
    """
    rows: list[Row] = []
    y = 0.0
    for d in range(devices):
        rows.append(Row(d, COMPUTE, y + 0.5, COMPUTE_BOX))
        y += 1.0
        if lanes:
            for lane in (D2H, H2D):
                rows.append(Row(d, lane, y + LANE_ROW / 2, LANE_BOX))
                y += LANE_ROW
            if d < devices - 1:
                y += GROUP_GAP
    return rows, y


def chunk_index(result: SimResult) -> dict[int, int]:
    """Stage → its chunk on its device (0 for the device's first stage in model order)."""
    placement = result.schedule.placement
    index: dict[int, int] = {}
    for d in set(placement):
        for c, stage in enumerate(sorted(s for s, p in enumerate(placement) if p == d)):
            index[stage] = c
    return index
