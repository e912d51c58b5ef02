"""Command-line values the benchmark scripts share.

Why: fifteen scripts take problem sizes as ``SxM`` (stages x microbatches); each parsed
them by hand, and a mistyped size ended in a traceback. One parser says what is wrong.
"""

from __future__ import annotations


def parse_size(text: str) -> tuple[int, int]:
    """``"8x32"`` -> ``(8, 32)``; anything else exits with one line saying what a size
    looks like (a benchmark run is a command line: no traceback for a typo)."""
    parts = text.strip().lower().split("x")
    try:
        if len(parts) != 2:
            raise ValueError
        stages, microbatches = int(parts[0]), int(parts[1])
    except ValueError:
        raise SystemExit(f"error: {text!r} is not a size: stages x microbatches, e.g. "
                         f"8x32") from None
    if stages < 1 or microbatches < 1:
        raise SystemExit(f"error: {text!r}: stages and microbatches must be at least 1")
    return stages, microbatches


def budget_label(k: float) -> str:
    """A budget's name in the tables: ``0.5`` -> ``"S/2"``, ``1`` -> ``"S"``, ``2`` ->
    ``"2S"``, else ``"<k>S"`` (multiples of S microbatches' activations)."""
    return {0.5: "S/2", 1.0: "S", 2.0: "2S"}.get(k, f"{k:g}S")
