"""Colours of the pictures: one place, so every figure speaks the same visual language.

Action colours come from the Okabe–Ito palette, chosen because its eight colours stay
distinguishable under the common forms of colour-vision deficiency and in greyscale
print. Later chunks of interleaved / V-shaped schedules reuse their op's colour mixed with
white, so "what kind of work" stays readable at a glance and the chunk is a second, weaker
cue. Per-device memory curves use an ordered, perceptually uniform map (viridis) because
device index is ordered and memory usually falls with it in a pipeline.
"""

from __future__ import annotations

from matplotlib import colormaps
from matplotlib.colors import to_hex, to_rgb

from optpipe.schedule import Op

#: Okabe–Ito colours, by op. Orange and vermillion (B and BW) are the closest pair; the
#: two rarely appear in the same schedule and their labels differ anyway.
OP_COLORS: dict[Op, str] = {
    Op.F: "#0072B2",        # blue
    Op.B: "#E69F00",        # orange
    Op.W: "#009E73",        # bluish green
    Op.BW: "#D55E00",       # vermillion
    Op.OFFLOAD: "#CC79A7",  # reddish purple
    Op.RELOAD: "#56B4E9",   # sky blue
}

#: Legend text, by op: short name first, so the letter on the chart is easy to match.
OP_LABELS: dict[Op, str] = {
    Op.F: "F forward",
    Op.B: "B input grad",
    Op.W: "W weight grad",
    Op.BW: "BW backward (B+W)",
    Op.OFFLOAD: "offload (d2h)",
    Op.RELOAD: "reload (h2d)",
}

IDLE_FACE = "#f4f4f4"     # background of a compute row: what shows through is a bubble
IDLE_HATCH = "#bdbdbd"    # the hatch lines drawn on it
LANE_FACE = "#f7f7f7"     # background of a host-link row (idle there is not a bubble)
BOX_EDGE = "white"        # thin separators between adjacent boxes
OVER_BUDGET = "#D55E00"   # text colour for "over budget" warnings
BUDGET_LINE = "#444444"   # one shared budget line when all devices have the same budget
INK = "#222222"           # main text
MUTED = "#666666"         # secondary text (lane names, subtitles)


def lighten(color: str, amount: float) -> str:
    """Mix ``color`` with white; ``amount`` 0 keeps it, 1 gives white."""
    r, g, b = to_rgb(color)
    return to_hex((r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount))


def op_color(op: Op, chunk: int = 0, chunks: int = 1) -> str:
    """Colour of a box: the op's colour, lighter for each later chunk of the device."""
    base = OP_COLORS[op]
    if chunks <= 1 or chunk == 0:
        return base
    return lighten(base, 0.5 * chunk / (chunks - 1))


def text_color(background: str) -> str:
    """Black or white, whichever reads better on ``background`` (WCAG relative luminance)."""
    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in to_rgb(background))
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "black" if luminance > 0.22 else "white"


def device_colors(devices: int) -> list[str]:
    """One colour per device along viridis, stopping before its pale yellow end (invisible on white)."""
    cmap = colormaps["viridis"]
    if devices == 1:
        return [to_hex(cmap(0.35))]
    return [to_hex(cmap(0.82 * d / (devices - 1))) for d in range(devices)]
