"""Parsing and formatting of human units: bytes, seconds and bandwidths.

Inside optpipe every time is a float in seconds and every size an int in bytes. People
type ``80GB``, ``80GiB``, ``512MiB``, ``18.5ms`` or ``25GB/s``; this module is the one
place that turns those into numbers and back, and the one place that rejects anything
else with a message showing an accepted form.
"""

from __future__ import annotations

import math
import re

from optpipe.errors import OptPipeError

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"

_BYTE_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}

_TIME_UNITS: dict[str, float] = {
    "s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0,
}


def _split(text: str, what: str, example: str) -> tuple[float, str]:
    match = re.fullmatch(_NUMBER + r"\s*([a-zA-Zµ/]*)", text.strip())
    if not match:
        raise OptPipeError(f"cannot read {what} {text!r}; write it like {example}")
    return float(match.group(1)), match.group(2)


def parse_bytes(value: str | int | float, what: str = "size") -> int:
    """Return a byte count from ``80GB`` (decimal), ``80GiB`` (binary) or a plain number."""
    example = "'80GB', '80GiB' or '512MiB'"
    if isinstance(value, bool):
        raise OptPipeError(f"cannot read {what} {value!r}; write it like {example}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        number, unit = _split(value, what, example)
    factor = _BYTE_UNITS.get(unit.lower())
    if factor is None or not math.isfinite(number) or number < 0:
        raise OptPipeError(f"cannot read {what} {value!r}; write it like {example}")
    return int(round(number * factor))


def parse_budget_flag(text: str, flag: str) -> int:
    """A memory budget given on the command line (``--mem``): like :func:`parse_bytes`,
    but a plain number below 1 MiB is refused — ``--mem 80`` means 80 bytes, where the
    user meant 80 GB, and would only report that nothing fits."""
    count = parse_bytes(text, flag)
    number, unit = _split(text, flag, "'80GB'")
    if not unit and count < 2**20:
        raise OptPipeError(f"{flag} {text!r} has no unit, so it means {count} bytes; "
                           f"write the unit, e.g. {flag} {number:g}GB or {number:g}GiB")
    return count


def parse_seconds(value: str | int | float, what: str = "time") -> float:
    """Return seconds from ``18.5ms``, ``1.2s``, ``300us`` or a plain number of seconds."""
    example = "'18.5ms', '1.2s' or '300us'"
    if isinstance(value, bool):
        raise OptPipeError(f"cannot read {what} {value!r}; write it like {example}")
    if isinstance(value, (int, float)):
        number, unit = float(value), "s"
    else:
        number, unit = _split(value, what, example)
        unit = unit or "s"
    factor = _TIME_UNITS.get(unit.lower() if unit != "µs" else unit)
    if factor is None or not math.isfinite(number) or number < 0:
        raise OptPipeError(f"cannot read {what} {value!r}; write it like {example}")
    return number * factor


def parse_bandwidth(value: str | int | float, what: str = "bandwidth") -> float:
    """Return bytes per second from ``25GB/s``, ``24GiB/s`` or a plain number of bytes/s."""
    example = "'25GB/s' or '24GiB/s'"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise OptPipeError(f"{what} must be positive, got {value!r}; write it like {example}")
        return float(value)
    if not isinstance(value, str) or not value.strip().lower().endswith("/s"):
        raise OptPipeError(f"cannot read {what} {value!r}; write it like {example}")
    per_second = parse_bytes(value.strip()[:-2], what)
    if per_second <= 0:
        raise OptPipeError(f"{what} must be positive, got {value!r}; write it like {example}")
    return float(per_second)


def format_bytes(count: float) -> str:
    """Binary-prefixed size for people: ``1.50 GiB``."""
    sign = "-" if count < 0 else ""
    count = abs(count)
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= factor:
            return f"{sign}{count / factor:.2f} {unit}"
    return f"{sign}{int(count)} B"


def format_seconds(seconds: float) -> str:
    """Time for people: ``18.52 ms``."""
    if seconds >= 1.0:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"
