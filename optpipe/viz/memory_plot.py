"""Memory over time per device, as step curves under the Gantt chart.

The curves are the simulator's ``memory_timeline`` verbatim (static bytes plus kept
activations), extended flat to the end of the makespan, so the peak a reader sees is the
peak the simulator checked against the budget. The legend sits in headroom reserved
above the highest value, so it never covers a curve.
"""

from __future__ import annotations

import math

from matplotlib.axes import Axes

from optpipe.simulator import SimResult
from optpipe.units import format_bytes
from optpipe.viz import colors
from optpipe.viz.layout import TimeScale, axes_points, byte_unit

LEGEND_FONT = 7.0
MAX_COLUMNS = 9


def memory_panel_inches(devices: int) -> float:
    """Panel height: enough for the curves plus a legend of one or two lines."""
    return 1.9 if devices <= 8 else 2.2


def draw_memory(ax: Axes, result: SimResult, scale: TimeScale) -> None:
    """Step curve per device, budget line(s), y axis in a unit chosen by magnitude."""
    finite = [b for b in result.budget if math.isfinite(b)]
    top = max(list(result.peak_memory) + finite + [1])
    factor, unit = byte_unit(top)
    end = result.start_time + result.makespan
    palette = colors.device_colors(len(result.memory_timeline))
    for d, curve in enumerate(result.memory_timeline):
        xs = [scale(t) for t, _ in curve] + [scale(end)]
        ys = [level / factor for _, level in curve] + [curve[-1][1] / factor]
        ax.step(xs, ys, where="post", color=palette[d], linewidth=1.2, label=f"device {d}",
                zorder=3)
    entries = len(result.memory_timeline)
    if finite:
        entries += 1
        if len(finite) == len(result.budget) and len(set(finite)) == 1:
            ax.axhline(finite[0] / factor, color=colors.BUDGET_LINE, linestyle="--",
                       linewidth=1.0, label=f"budget {format_bytes(finite[0])}", zorder=2)
        else:
            for d, b in enumerate(result.budget):
                if math.isfinite(b):
                    ax.axhline(b / factor, color=palette[d], linestyle="--", linewidth=0.8,
                               alpha=0.8, zorder=2,
                               label="budget (dashed, per device)" if d == 0 else None)
    columns = min(entries, MAX_COLUMNS)
    lines = math.ceil(entries / columns)
    _, height_pt = axes_points(ax)
    headroom = (lines * LEGEND_FONT * 1.45 + 8.0) / height_pt
    low = min(level for curve in result.memory_timeline for _, level in curve)
    # static bytes usually dwarf activations: zoom onto the part that moves, unless the
    # curves already span most of the range (then zero is the honest floor)
    bottom = max(0.0, low - 0.12 * (top - low)) if low > 0.3 * top else 0.0
    span = (top - bottom) / factor
    ax.set_ylim(bottom / factor, bottom / factor + span / (1.0 - headroom) * 1.02)
    ax.legend(loc="upper right", ncol=columns, fontsize=LEGEND_FONT, frameon=False,
              handlelength=1.5, columnspacing=1.1, borderaxespad=0.3, borderpad=0.2)
    ax.set_ylabel(f"memory ({unit})", fontsize=8.5, color=colors.INK)
    ax.tick_params(labelsize=8, color=colors.MUTED)
    ax.grid(axis="y", color="#e6e6e6", linewidth=0.6, zorder=0)
    ax.grid(axis="x", color="#efefef", linewidth=0.5, zorder=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color(colors.MUTED)
