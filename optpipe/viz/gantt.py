"""Gantt chart of one simulated schedule, with an optional memory panel beneath it.

Everything drawn comes from a :class:`~optpipe.simulator.SimResult`: the chart never
re-derives times, so what you see is exactly what the simulator judged. A row per device
shows its compute stream; when the schedule offloads, two thin rows under each device show
its host-link channels (d2h for OFFLOAD, h2d for RELOAD). The compute rows carry a light
hatched background over the whole makespan, so every bubble shows as hatching between
boxes without a separate idle computation that could drift from the simulator's.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from optpipe.schedule import Op
from optpipe.simulator import COMPUTE, SimResult
from optpipe.viz import colors
from optpipe.viz.labels import figures, fit_text, shape
from optpipe.viz.layout import (Page, TimeScale, axes_points, header, output_format, save,
                                stack_panels, time_scale)
from optpipe.viz.memory_plot import draw_memory, memory_panel_inches
from optpipe.viz.tracks import Row, chunk_index, has_transfers, layout_rows

MIN_FONT = 4.5           # below this a microbatch number is not legible: leave it out
MAX_FONT = 8.0
DIGIT_EM = 0.62          # width of a digit in DejaVu Sans, in ems
PAD_PT = 2.5             # breathing room left and right of a number, in total


def _fit(chars: int, width_pt: float, height_pt: float) -> float:
    """Largest font size (capped) at which ``chars`` digits fit a box of the given size."""
    return min(MAX_FONT, 0.62 * height_pt, (width_pt - PAD_PT) / (DIGIT_EM * chars))


def label_sizes(boxes: dict[tuple[Op, str], list[tuple[float, float, str]]]) -> dict[
        tuple[Op, str], float | None]:
    """One font size per (op, lane): every number of a kind is written the same size.

    ``boxes`` maps (op, lane) to (width pt, height pt, label) of each box. A kind gets the
    size at which its longest label fits its median box, or None (no numbers at all) when
    that is illegibly small: numbering only 0-9 of a kind looked like noise. Compute kinds
    share the smallest of their sizes, so F, B and W numbers match.
    """
    sizes: dict[tuple[Op, str], float | None] = {}
    for key, items in boxes.items():
        widths = sorted(w for w, _, _ in items)
        width, height = widths[len(widths) // 2], items[0][1]
        size = _fit(max(len(label) for _, _, label in items), width, height)
        sizes[key] = size if size >= MIN_FONT else None
    shared = [size for key, size in sizes.items() if size is not None and key[1] == COMPUTE]
    for key, size in sizes.items():
        if size is not None and key[1] == COMPUTE:
            sizes[key] = min(shared)
    return sizes


def draw_timeline(ax: Axes, result: SimResult, scale: TimeScale, *, lanes: bool,
                  xmax: float | None = None, numbers: bool = True) -> set[Op]:
    """Draw the boxes of ``result`` on ``ax``; return the ops that appear (for a legend).

    ``ax`` must already have its final place on the page: text sizes are chosen from it.
    ``xmax`` (axis units) lets several charts share one time axis.
    """
    sched = result.schedule
    rows, height = layout_rows(sched.devices, lanes)
    where = {(r.device, r.lane): r for r in rows}
    end = scale(result.start_time + result.makespan)
    xmax = end if xmax is None else xmax
    xmax = xmax if xmax > 0 else 1.0          # an all-zero-time problem still gets an axis
    ax.set_xlim(0.0, xmax)
    ax.set_ylim(height, 0.0)

    for row in rows:  # backgrounds: hatched where a compute stream is idle
        bottom = row.center - row.box / 2
        if row.lane == COMPUTE:
            ax.add_patch(Rectangle((0.0, bottom), end, row.box, facecolor=colors.IDLE_FACE,
                                   edgecolor=colors.IDLE_HATCH, hatch="////", linewidth=0,
                                   zorder=1))
        else:
            ax.add_patch(Rectangle((0.0, bottom), end, row.box, facecolor=colors.LANE_FACE,
                                   linewidth=0, zorder=1))

    chunks = sched.chunks
    chunk_of = chunk_index(result)
    width_pt, height_pt = axes_points(ax)
    x_pt = width_pt / xmax
    y_pt = height_pt / height
    verts, faces, seen = [], [], set()
    boxes: dict[tuple[Op, str], list[tuple[float, float, str]]] = {}
    centers: list[tuple[tuple[Op, str], float, float, float, str, str]] = []
    for rec in result.records:
        row = where.get((rec.device, rec.lane))
        if row is None:
            continue
        op = rec.action.op
        seen.add(op)
        x0, w = scale(rec.start), scale.span(rec.end - rec.start)
        y0, y1 = row.center - row.box / 2, row.center + row.box / 2
        verts.append([(x0, y0), (x0 + w, y0), (x0 + w, y1), (x0, y1)])
        face = (colors.op_color(op, chunk_of[rec.action.stage], chunks)
                if op.is_compute else colors.OP_COLORS[op])
        faces.append(face)
        label = str(rec.action.microbatch)
        boxes.setdefault((op, rec.lane), []).append((w * x_pt, row.box * y_pt, label))
        centers.append(((op, rec.lane), x0 + w / 2, row.center, w * x_pt, label, face))
    ax.add_collection(PolyCollection(verts, facecolors=faces, edgecolors=colors.BOX_EDGE,
                                     linewidths=0.35, zorder=2))
    sizes = label_sizes(boxes) if numbers else {}
    for key, x, y, width, label, face in centers:
        size = sizes.get(key)
        # the tolerance absorbs float noise in widths of equal-length boxes
        if size is None or DIGIT_EM * len(label) * size + PAD_PT > width * 1.02:
            continue
        ax.text(x, y, label, ha="center", va="center_baseline", fontsize=size,
                color=colors.text_color(face), zorder=3, clip_on=True)

    _style_rows(ax, rows, sched.devices)
    return seen


def _style_rows(ax: Axes, rows: list[Row], devices: int) -> None:
    """Device names on compute rows, small grey lane names on channel rows, no box frame."""
    ax.set_yticks([r.center for r in rows])
    ax.set_yticklabels([f"device {r.device}" if r.lane == COMPUTE else r.lane for r in rows])
    small = devices > 8
    for label, row in zip(ax.get_yticklabels(), rows):
        if row.lane == COMPUTE:
            label.set_fontsize(7.5 if small else 8.5)
            label.set_color(colors.INK)
        else:
            label.set_fontsize(6)
            label.set_color(colors.MUTED)
    ax.tick_params(axis="y", length=0, pad=4)
    ax.tick_params(axis="x", labelsize=8, direction="out", length=3, color=colors.MUTED)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.spines["bottom"].set_color(colors.MUTED)


def legend_handles(ops: set[Op], chunks: int) -> list[Patch]:
    """Legend entries for the ops present, the chunk shades and what idle looks like."""
    handles = [Patch(facecolor=colors.OP_COLORS[op], edgecolor="none", label=colors.OP_LABELS[op])
               for op in Op if op in ops]
    if chunks > 1:
        grey = "#555555"
        handles += [Patch(facecolor=colors.lighten(grey, 0.5 * c / (chunks - 1)),
                          edgecolor="none", label=f"chunk {c + 1}" + (" (lighter)" if c else ""))
                    for c in range(chunks)]
    handles.append(Patch(facecolor=colors.IDLE_FACE, edgecolor=colors.IDLE_HATCH, hatch="////",
                         linewidth=0, label="idle (bubble)"))
    return handles


def place_legend(fig: Figure, ax: Axes, handles: list[Patch], lift: float = 0.0) -> None:
    """One row of legend entries above ``ax``, left-aligned with it, ``lift`` inches up."""
    box = ax.get_position()
    y = box.y1 + lift / fig.get_size_inches()[1]
    fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(box.x0, y),
               bbox_transform=fig.transFigure, ncol=len(handles), frameon=False, fontsize=8.5,
               handlelength=1.6, handleheight=1.0, columnspacing=1.4, borderaxespad=0.2,
               borderpad=0.1)


def chart_width(result: SimResult, floor: float = 11.0, ceiling: float = 24.0) -> float:
    """Page width (inches) that makes a forward box about 10 pt wide, within bounds.

    The forward is the unit people count schedules in; sizing by it keeps 8 × 32 charts
    near 15-19 inches (fine on screen and in a README) and lets 16 × 64 grow to the
    ceiling. Chunked schedules are sized by a device's whole forward (all its chunks), so
    halving the boxes does not double the page; their narrowest boxes lose their numbers.
    """
    forwards = sorted(r.end - r.start for r in result.records if r.action.op is Op.F)
    typical = forwards[len(forwards) // 2] if forwards else result.makespan
    typical *= result.schedule.chunks   # a device's whole forward: chunked charts stay sane
    boxes = result.makespan / typical if typical > 0 else 1.0
    return min(ceiling, max(floor, boxes * 10.0 / 72.0 + 1.2))


def row_inches(devices: int) -> float:
    """Height of one compute row: generous for a few devices, tighter for many."""
    return max(0.24, min(0.4, 3.0 / devices))


def plot_gantt(result: SimResult, path: str | Path | None = None, *, memory: bool = True,
               title: str | None = None, dpi: float = 150) -> Figure:
    """Draw ``result`` as a Gantt chart (plus memory over time) and save it to ``path``.

    The format follows the extension (``.png``, ``.svg`` or ``.pdf``); anything else raises
    :class:`~optpipe.errors.OptPipeError` before any drawing. Returns the figure so callers
    can adjust it or save more formats; ``path=None`` only returns it.
    """
    if path is not None:
        output_format(path)
    sched = result.schedule
    lanes = has_transfers(result)
    _, rows_height = layout_rows(sched.devices, lanes)
    unit = row_inches(sched.devices)
    heights = [rows_height * unit] + ([memory_panel_inches(sched.devices)] if memory else [])
    page = Page(width=chart_width(result), top=1.05)
    fig, axes = stack_panels(page, heights, gaps=[0.3])
    scale = time_scale(result.makespan, result.start_time)
    ops = draw_timeline(axes[0], result, scale, lanes=lanes)
    if memory:
        draw_memory(axes[1], result, scale)
        axes[0].tick_params(axis="x", labelbottom=False)
    axes[-1].set_xlabel(f"time ({scale.unit})", fontsize=9, color=colors.INK)
    place_legend(fig, axes[0], legend_handles(ops, sched.chunks))
    verdict, fits = fit_text(result)
    subtitle = f"{shape(result)} · {figures(result)}"
    header(fig, title or sched.name, subtitle, note=verdict, warn=not fits)
    save(fig, path, dpi)
    return fig
