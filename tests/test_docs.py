"""The benchmark scripts' tables have a place to go.

Each script in ``scripts/`` writes its measured table into a doc between two marker
comments (``scripts/docblock.py``) and stops with a message when the markers are not
there — after running for up to an hour. So a doc edit that moves or drops a block
(as when the optimizer's log moved to ``docs/optimizer-log.md``) must move the
script's target with it; this reads every script's markers and doc statically, without
running or importing it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))


def _doc_path(node: ast.expr) -> Path | None:
    """``ROOT / "docs" / "name.md"`` as a path under the repository, else None."""
    parts: list[str] = []
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        if not isinstance(node.right, ast.Constant) or not isinstance(node.right.value, str):
            return None
        parts.insert(0, node.right.value)
        node = node.left
    if not (isinstance(node, ast.Name) and node.id == "ROOT") or not parts:
        return None
    path = ROOT.joinpath(*parts)
    return path if path.suffix == ".md" else None


def _markers_and_docs(script: Path) -> tuple[list[tuple[str, str]], set[Path]]:
    """Pairs of marker strings the script assigns together, and every doc path it
    names (``ROOT / "docs" / ...``) anywhere in its code."""
    tree = ast.parse(script.read_text(), filename=str(script))
    pairs, docs = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            values = node.value.elts
            if len(values) == 2 and all(isinstance(v, ast.Constant) and isinstance(v.value, str)
                                        and ("<!--" in v.value or "-->" in v.value)
                                        for v in values):
                pairs.append((values[0].value, values[1].value))
        if isinstance(node, ast.BinOp):
            path = _doc_path(node)
            if path is not None:
                docs.add(path)
    return pairs, docs


WRITERS = [(s, pairs, docs) for s in SCRIPTS for pairs, docs in [_markers_and_docs(s)]
           if pairs]


def test_the_scripts_that_write_tables_are_found() -> None:
    # a change to how scripts name their markers or docs must not empty this check
    names = {s.name for s, _, _ in WRITERS}
    assert {"bench_solver.py", "bench_relaxation.py", "bench_memplan.py",
            "bench_runtime.py"} <= names


@pytest.mark.parametrize("script,pairs,docs", WRITERS, ids=[s.name for s, _, _ in WRITERS])
def test_every_scripts_markers_are_in_its_doc_once_and_in_order(script, pairs, docs) -> None:
    assert len(docs) == 1, f"{script.name} names {len(docs)} docs: {sorted(map(str, docs))}"
    doc = docs.pop()
    text = doc.read_text()
    for start, end in pairs:
        assert text.count(start) == 1, f"{start!r} is in {doc.name} {text.count(start)} times"
        assert text.count(end) == 1, f"{end!r} is in {doc.name} {text.count(end)} times"
        assert text.index(start) < text.index(end), f"{end!r} comes before {start!r}"
