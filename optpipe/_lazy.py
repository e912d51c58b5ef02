"""Lazy re-exports for package ``__init__`` modules.

``import optpipe`` (or ``optpipe.viz``, ``optpipe.runtime``) must not pay for torch,
matplotlib or the solvers until a name that needs them is used; PEP 562's module
``__getattr__`` gives that, and this helper builds it once for every package.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` importing ``exports[name]`` on first use of ``name``."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
