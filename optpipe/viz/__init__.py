"""Pictures and traces of simulated schedules.

``plot_gantt`` and ``plot_comparison`` draw PNG / SVG / PDF figures with matplotlib;
``chrome_trace`` and ``write_chrome_trace`` export Chrome trace-event JSON for Perfetto or
chrome://tracing. Imports are lazy so that exporting a trace (or importing optpipe.viz at
all) does not pay for loading matplotlib.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "plot_gantt": "optpipe.viz.gantt",
    "plot_comparison": "optpipe.viz.compare_plot",
    "chrome_trace": "optpipe.viz.chrome",
    "write_chrome_trace": "optpipe.viz.chrome",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'optpipe.viz' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = sorted(_EXPORTS)
