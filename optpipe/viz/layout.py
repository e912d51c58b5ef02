"""Shared plumbing of the figures: units on the axes, output files, the page layout.

Figures are built on a bare :class:`matplotlib.figure.Figure` rendered by Agg (or the PDF
/ SVG backends chosen by extension), never through ``pyplot``: no display is touched and
no global figure registry grows when a server or test renders hundreds of charts.

Panels are placed in *inches* rather than with a layout engine, because the Gantt chart
decides font sizes and whether a microbatch number fits inside a box from the box's size
on the page; that size must be known before drawing, and stay true after saving.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Annotation

from optpipe.errors import OptPipeError
from optpipe.viz.colors import INK, MUTED, OVER_BUDGET

#: Extensions we write, and the matplotlib format of each.
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


@dataclass(frozen=True)
class TimeScale:
    """How seconds map to the time axis: ``(t - origin) / factor`` in ``unit``."""

    origin: float
    factor: float
    unit: str

    def __call__(self, seconds: float) -> float:
        return (seconds - self.origin) / self.factor

    def span(self, seconds: float) -> float:
        """A duration (not a moment) on the axis."""
        return seconds / self.factor


def time_scale(makespan: float, origin: float = 0.0) -> TimeScale:
    """Milliseconds for ordinary steps, seconds for long ones, microseconds for tiny ones."""
    if makespan >= 10.0:
        return TimeScale(origin, 1.0, "s")
    if makespan >= 10e-3:
        return TimeScale(origin, 1e-3, "ms")
    return TimeScale(origin, 1e-6, "µs")


def byte_unit(largest: float) -> tuple[float, str]:
    """Binary unit in which ``largest`` reads as a number between 1 and 1024."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest >= factor:
            return float(factor), unit
    return 1.0, "B"


def output_format(path: str | Path) -> str:
    """The matplotlib format for ``path``; refuse anything we do not write, before drawing."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        shown = suffix or "(none)"
        raise OptPipeError(
            f"cannot write figure {str(path)!r}: unsupported extension {shown}; "
            f"use one of {', '.join(FORMATS)} (e.g. gantt.png)")
    return FORMATS[suffix]


def save(fig: Figure, path: str | Path | None, dpi: float) -> None:
    """Write ``fig`` to ``path`` (format from the extension), creating parent folders."""
    if path is None:
        return
    fmt = output_format(path)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # fixed metadata keeps SVG/PDF output byte-stable across runs (nice in git diffs)
    metadata = {"png": {"Software": "optpipe"}, "svg": {"Date": None},
                "pdf": {"CreationDate": None}}[fmt]
    fig.savefig(path, format=fmt, dpi=dpi, facecolor="white", metadata=metadata)


@dataclass(frozen=True)
class Page:
    """Margins of a figure in inches; panels are stacked between them top to bottom."""

    width: float
    left: float = 0.95
    right: float = 0.25
    top: float = 0.9
    bottom: float = 0.55


def stack_panels(page: Page, heights: list[float], gaps: list[float]) -> tuple[Figure, list[Axes]]:
    """A figure with one axes per entry of ``heights`` (inches), ``gaps[i]`` below panel i.

    The figure's height is whatever the panels, gaps and margins add up to, so a chart
    with more devices grows taller instead of squeezing its rows.
    """
    total = page.top + page.bottom + sum(heights) + sum(gaps[:len(heights) - 1])
    fig = Figure(figsize=(page.width, total))
    FigureCanvasAgg(fig)  # Agg, explicitly: never a GUI backend, whatever the environment
    axes: list[Axes] = []
    y = total - page.top
    for i, h in enumerate(heights):
        y -= h
        rect = (page.left / page.width, y / total,
                (page.width - page.left - page.right) / page.width, h / total)
        axes.append(fig.add_axes(rect, sharex=axes[0] if axes else None))
        if i < len(gaps):
            y -= gaps[i]
    return fig, axes


def axes_points(ax: Axes) -> tuple[float, float]:
    """Width and height of ``ax`` on the page in points (1/72 inch)."""
    fig = ax.get_figure()
    w_in, h_in = fig.get_size_inches()
    box = ax.get_position()
    return box.width * w_in * 72.0, box.height * h_in * 72.0


def header(fig: Figure, title: str, subtitle: str, *, note: str = "", warn: bool = False,
           top_in: float = 0.12) -> None:
    """Bold title, then a grey line of figures and an optional note after them.

    A ``warn`` note (e.g. "OVER budget …") is bold in the warning colour so a schedule
    that does not fit can never pass for one that does.
    """
    w_in, h_in = fig.get_size_inches()
    x = 0.2 / w_in
    fig.text(x, 1 - top_in / h_in, title, ha="left", va="top", fontsize=13,
             fontweight="bold", color=INK)
    if note and not warn:
        subtitle, note = f"{subtitle} · {note}", ""
    line = fig.text(x, 1 - (top_in + 0.3) / h_in, subtitle, ha="left", va="top",
                    fontsize=9.5, color=MUTED)
    if note:
        # a warning: anchored to the subtitle's box, so it follows it whatever its length
        fig.add_artist(Annotation(
            note, xy=(1.0, 0.0), xycoords=line, xytext=(6, 0),
            textcoords="offset points", ha="left", va="bottom", fontsize=9.5,
            color=OVER_BUDGET, fontweight="bold"))
