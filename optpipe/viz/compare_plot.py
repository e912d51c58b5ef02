"""Several schedules stacked on one shared time axis, for side-by-side judgement.

Same box colours, same row layout and the same time scale in every panel: a shorter
schedule visibly ends earlier, and its bubbles are directly comparable. Each panel is
titled with the simulator's headline figures and whether the schedule fits its budget
(an over-budget schedule says so in the warning colour, never silently).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from optpipe.errors import OptPipeError
from optpipe.schedule import Op
from optpipe.simulator import SimResult
from optpipe.viz import colors
from optpipe.viz.gantt import (chart_width, draw_timeline, legend_handles, place_legend,
                               row_inches)
from optpipe.viz.labels import figures, fit_text, pipeline
from optpipe.viz.layout import (Page, TimeScale, header, output_format, save, stack_panels,
                                time_scale)
from optpipe.viz.tracks import has_transfers, layout_rows

PANEL_GAP = 0.5   # inches between panels: room for the next panel's title line


def plot_comparison(results: Sequence[SimResult], path: str | Path | None = None, *,
                    title: str | None = None, dpi: float = 150) -> Figure:
    """Draw every result in ``results`` as a Gantt panel on one shared time axis.

    Panels follow the given order (put the baseline first). The format follows the
    extension of ``path`` (``.png``, ``.svg``, ``.pdf``); ``path=None`` only returns the
    figure.
    """
    results = list(results)
    if not results:
        raise OptPipeError("nothing to compare: give at least one simulated schedule")
    if path is not None:
        output_format(path)
    longest = max(results, key=lambda r: r.makespan)
    devices = max(r.schedule.devices for r in results)
    unit = row_inches(devices) * (0.85 if len(results) > 2 else 1.0)
    lanes = [has_transfers(r) for r in results]
    heights = [layout_rows(r.schedule.devices, lane)[1] * unit for r, lane in zip(results, lanes)]
    page = Page(width=chart_width(longest), top=1.3)
    fig, axes = stack_panels(page, heights, gaps=[PANEL_GAP] * (len(results) - 1))
    base = time_scale(longest.makespan)
    xmax = base.span(longest.makespan)
    ops: set[Op] = set()
    for ax, result, lane in zip(axes, results, lanes):
        scale = TimeScale(result.start_time, base.factor, base.unit)
        ops |= draw_timeline(ax, result, scale, lanes=lane, xmax=xmax)
        _panel_title(ax, result)
        if ax is not axes[-1]:
            ax.tick_params(axis="x", labelbottom=False)
    axes[-1].set_xlabel(f"time ({base.unit})", fontsize=9, color=colors.INK)
    # the first panel's title sits between the legend and its chart: lift the legend over it
    place_legend(fig, axes[0], legend_handles(ops, max(r.schedule.chunks for r in results)),
                 lift=0.3)
    sizes = {pipeline(r) for r in results}
    subtitle = (sizes.pop() + " · " if len(sizes) == 1 else "") + "one shared time axis"
    header(fig, title or "Schedule comparison", subtitle)
    save(fig, path, dpi)
    return fig


def _panel_title(ax: Axes, result: SimResult) -> None:
    """Bold name, then the figures in grey; the budget verdict on the right.

    The figures are anchored to the name's bounding box (an annotation relative to
    another artist), so they follow it whatever its length and whatever the backend.
    """
    name = ax.annotate(result.schedule.name, xy=(0.0, 1.0), xycoords="axes fraction",
                       xytext=(0, 5), textcoords="offset points", ha="left", va="bottom",
                       fontsize=10, fontweight="bold", color=colors.INK)
    ax.annotate(figures(result), xy=(1.0, 0.0), xycoords=name, xytext=(10, 0),
                textcoords="offset points", ha="left", va="bottom", fontsize=8.5,
                color=colors.MUTED)
    verdict, fits = fit_text(result)
    ax.annotate(verdict, xy=(1.0, 1.0), xycoords="axes fraction", xytext=(0, 5),
                textcoords="offset points", ha="right", va="bottom", fontsize=8.5,
                color=colors.MUTED if fits else colors.OVER_BUDGET,
                fontweight="normal" if fits else "bold")
