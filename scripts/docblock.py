"""The benchmark scripts' one way of writing their tables into the docs.

Each measured table lives in a doc between two marker comments, and a script rewrites
only what lies between them, so the prose around a table is never touched by a re-run.
"""

from __future__ import annotations

from pathlib import Path


def replace_between(text: str, start: str, end: str, inner: str) -> str | None:
    """``text`` with what lies between the first ``start`` and the next ``end``
    replaced by ``inner`` (each marker on its own line around it), or None when the
    markers are not both there (the caller decides: append a block, or stop)."""
    i = text.find(start)
    j = text.find(end, i + len(start)) if i >= 0 else -1
    if j < 0:
        return None
    return f"{text[:i]}{start}\n{inner}\n{end}{text[j + len(end):]}"


def write_between(path: Path, start: str, end: str, inner: str) -> None:
    """Rewrite the block between ``start`` and ``end`` in the file at ``path``; stop
    with a message naming the markers when they are not there."""
    text = path.read_text()
    new = replace_between(text, start, end, inner)
    if new is None:
        raise SystemExit(f"no {start} ... {end} markers in {path}")
    path.write_text(new)
    print(f"\nwritten to {path}")


def publish(text: str, path: Path, start: str, end: str, write: bool = True) -> None:
    """Print a measured table, and unless told not to (``--no-write``), put it into
    its doc between its markers (:func:`write_between`)."""
    print(text)
    if write:
        write_between(path, start, end, text)
