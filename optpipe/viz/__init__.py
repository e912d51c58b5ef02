"""Pictures and traces of simulated schedules.

``plot_gantt`` and ``plot_comparison`` draw PNG / SVG / PDF figures with matplotlib;
``chrome_trace`` and ``write_chrome_trace`` export Chrome trace-event JSON for Perfetto or
chrome://tracing. Imports are lazy so that exporting a trace (or importing optpipe.viz at
all) does not pay for loading matplotlib.
"""

from __future__ import annotations

from optpipe._lazy import lazy_exports

_EXPORTS = {
    "plot_gantt": "optpipe.viz.gantt",
    "plot_comparison": "optpipe.viz.compare_plot",
    "chrome_trace": "optpipe.viz.chrome",
    "write_chrome_trace": "optpipe.viz.chrome",
}


__getattr__ = lazy_exports("optpipe.viz", _EXPORTS)

__all__ = sorted(_EXPORTS)
