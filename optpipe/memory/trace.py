"""Allocation traces: which buffers a device holds, how large, and when.

A trace is a list of :class:`Buffer` records — an id, a size in bytes and a half-open
lifetime ``[start, end)`` — with optional tags (``device``, ``stage``, ``microbatch``,
``kind``, ``layer``, ``tensor``). Two buffers may share addresses only when their
lifetimes do not overlap; a buffer that ends at ``t`` and one that starts at ``t`` do not
overlap, which is the accounting's rule "releases before allocations at equal times".

Everything in the memory core reads this one format: the caching-allocator model
replays it, the planner packs it, the validator checks plans against it. Traces come
from three places:

* a simulated schedule (:func:`traces_from_simulation`): every activation buffer each
  device keeps, with byte amounts taken from :func:`optpipe.memory.accounting.memory_delta`
  so that the trace's peak of live bytes is exactly the simulator's peak minus static
  bytes;
* MiniMalloc's CSV format ``id,lower,upper,size`` (:func:`read_minimalloc_csv`);
* a JSON file: ``{"format": "optpipe-trace", "buffers": [...]}`` or a bare list of
  ``{"id", "size", "start", "end", "tags"}`` objects (:func:`trace_from_json`).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from optpipe.errors import OptPipeError

if TYPE_CHECKING:  # pragma: no cover
    from optpipe.problem import Problem
    from optpipe.schedule import Schedule
    from optpipe.simulator import SimResult

FORMAT = "optpipe-trace"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Buffer:
    """One allocation: ``size`` bytes live on the half-open interval ``[start, end)``."""

    id: str
    size: int
    start: float
    end: float
    tags: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def duration(self) -> float:
        return self.end - self.start

    def overlaps(self, other: "Buffer") -> bool:
        """True when both are live at some moment (half-open: touching ends do not count)."""
        return self.start < other.end and other.start < self.end

    def to_json(self) -> dict[str, Any]:
        item: dict[str, Any] = {"id": self.id, "size": self.size, "start": self.start,
                                "end": self.end}
        if self.tags:
            item["tags"] = dict(self.tags)
        return item


@dataclass
class Trace:
    """The buffers of one device (or one instance), in the order they were recorded."""

    buffers: list[Buffer]
    name: str = "trace"
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for buf in self.buffers:
            if buf.id in seen:
                raise OptPipeError(f"trace '{self.name}': buffer id {buf.id!r} appears twice; "
                                   f"ids must be unique")
            seen.add(buf.id)
            if buf.size < 0:
                raise OptPipeError(f"trace '{self.name}': buffer {buf.id!r} has negative size "
                                   f"{buf.size}")
            if not (math.isfinite(buf.start) and math.isfinite(buf.end)) or buf.end < buf.start:
                raise OptPipeError(f"trace '{self.name}': buffer {buf.id!r} has lifetime "
                                   f"[{buf.start}, {buf.end}); the end must not precede the "
                                   f"start")

    def __len__(self) -> int:
        return len(self.buffers)

    def __iter__(self):
        return iter(self.buffers)

    @property
    def total_bytes(self) -> int:
        return sum(b.size for b in self.buffers)

    def live_profile(self) -> list[tuple[float, int]]:
        """``(time, live bytes from that time on)`` at every time the live set changes."""
        events: dict[float, int] = {}
        for b in self.buffers:
            if b.size and b.end > b.start:
                events[b.start] = events.get(b.start, 0) + b.size
                events[b.end] = events.get(b.end, 0) - b.size
        level, curve = 0, []
        for when in sorted(events):
            level += events[when]
            curve.append((when, level))
        return curve

    def peak_live(self) -> int:
        """Most bytes live at once: a lower bound on any arena that holds the trace."""
        return max((level for _, level in self.live_profile()), default=0)

    def select(self, **tags: Any) -> "Trace":
        """The buffers whose tags match every given ``key=value`` (e.g. ``device=0``)."""
        keep = [b for b in self.buffers if all(b.tags.get(k) == v for k, v in tags.items())]
        suffix = ",".join(f"{k}={v}" for k, v in tags.items())
        return Trace(keep, name=f"{self.name}[{suffix}]", meta=dict(self.meta))

    # ----------------------------------------------------------------- writing
    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": FORMAT_VERSION, "name": self.name,
                "meta": self.meta, "buffers": [b.to_json() for b in self.buffers]}

    def save(self, path: str | Path) -> None:
        """Write JSON (``.json``) or MiniMalloc CSV (``.csv``; times must be integers)."""
        path = Path(path)
        if path.suffix.lower() == ".csv":
            path.write_text(self.to_minimalloc_csv())
        else:
            path.write_text(json.dumps(self.to_json(), indent=1) + "\n")

    def to_minimalloc_csv(self) -> str:
        """MiniMalloc's ``id,lower,upper,size``; float times are replaced by their ranks."""
        times = sorted({t for b in self.buffers for t in (b.start, b.end)})
        integral = all(float(t).is_integer() for t in times)
        rank = {t: (int(t) if integral else i) for i, t in enumerate(times)}
        out = io.StringIO()
        out.write("id,lower,upper,size\n")
        for b in self.buffers:
            out.write(f"{b.id},{rank[b.start]},{rank[b.end]},{b.size}\n")
        return out.getvalue()


# --------------------------------------------------------------------- reading
def _number(value: Any, what: str, origin: str, integer: bool = False) -> float:
    if isinstance(value, bool):
        raise OptPipeError(f"{origin}: {what} {value!r} is not a number")
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        raise OptPipeError(f"{origin}: {what} {value!r} is not "
                           f"{'an integer' if integer else 'a number'}") from None
    if integer and isinstance(value, float) and not value.is_integer():
        raise OptPipeError(f"{origin}: {what} {value!r} is not an integer")
    return number


def read_minimalloc_csv(source: str | Path, name: str | None = None) -> Trace:
    """Read MiniMalloc's ``id,lower,upper,size`` CSV (a path, or the CSV text itself).

    Intervals are half-open ``[lower, upper)``, as in MiniMalloc. An optional
    ``alignment`` column is accepted and ignored (the planner takes one alignment).
    """
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source):
        path = Path(source)
        if not path.is_file():
            raise OptPipeError(f"trace file {str(path)!r} does not exist")
        text, origin = path.read_text(), f"trace file {str(path)!r}"
        name = name or path.name.split(".")[0]
    else:
        text, origin = str(source), "CSV trace"
    rows = list(csv.reader(io.StringIO(text)))
    rows = [r for r in rows if r and any(c.strip() for c in r)]
    if not rows:
        raise OptPipeError(f"{origin} is empty; expected a header 'id,lower,upper,size'")
    header = [c.strip().lower() for c in rows[0]]
    need = ("id", "lower", "upper", "size")
    if any(k not in header for k in need):
        raise OptPipeError(f"{origin} must start with the header 'id,lower,upper,size' "
                           f"(MiniMalloc format), got {','.join(rows[0])!r}")
    col = {k: header.index(k) for k in need}
    buffers = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) < len(header):
            raise OptPipeError(f"{origin}, line {line}: expected {len(header)} columns, "
                               f"got {len(row)}")
        where = f"{origin}, line {line}"
        lower = _number(row[col["lower"]].strip(), "lower", where, integer=True)
        upper = _number(row[col["upper"]].strip(), "upper", where, integer=True)
        size = _number(row[col["size"]].strip(), "size", where, integer=True)
        buffers.append(Buffer(id=row[col["id"]].strip(), size=int(size), start=lower,
                              end=upper))
    return Trace(buffers, name=name or "minimalloc")


def trace_from_json(data: Any, origin: str = "JSON trace") -> Trace:
    """Build a trace from ``{"format": "optpipe-trace", "buffers": [...]}`` or a bare list.

    Each buffer is ``{"id", "size", "start", "end"}`` with optional ``"tags"``; ``id``
    defaults to the position in the list.
    """
    name, meta = "trace", {}
    if isinstance(data, dict):
        if data.get("format") not in (None, FORMAT):
            raise OptPipeError(f"{origin} has format {data.get('format')!r}, expected "
                               f"{FORMAT!r}")
        if "buffers" not in data:
            raise OptPipeError(f"{origin} has no 'buffers' list")
        name = str(data.get("name", name))
        meta = dict(data.get("meta") or {})
        items = data["buffers"]
    else:
        items = data
    if not isinstance(items, list):
        raise OptPipeError(f"{origin} must be a list of buffers or an object with a "
                           f"'buffers' list")
    buffers = []
    for index, item in enumerate(items):
        where = f"{origin}, buffer #{index}"
        if not isinstance(item, dict):
            raise OptPipeError(f"{where} is not an object with id, size, start and end")
        missing = [k for k in ("size", "start", "end") if k not in item]
        if missing:
            raise OptPipeError(f"{where} lacks {', '.join(missing)}; each buffer needs "
                               f"size, start and end (half-open [start, end))")
        tags = item.get("tags") or {}
        if not isinstance(tags, dict):
            raise OptPipeError(f"{where}: 'tags' must be an object")
        buffers.append(Buffer(
            id=str(item.get("id", index)),
            size=int(_number(item["size"], "size", where, integer=True)),
            start=_number(item["start"], "start", where),
            end=_number(item["end"], "end", where), tags=tags))
    return Trace(buffers, name=name, meta=meta)


def load_trace(path: str | Path) -> Trace:
    """Read a trace file: MiniMalloc CSV (``.csv``) or JSON (anything else)."""
    path = Path(path)
    if not path.is_file():
        raise OptPipeError(f"trace file {str(path)!r} does not exist")
    if path.suffix.lower() == ".csv":
        return read_minimalloc_csv(path)
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OptPipeError(f"trace file {str(path)!r} is neither MiniMalloc CSV (use a .csv "
                           f"name) nor valid JSON: {exc}") from None
    trace = trace_from_json(data, origin=f"trace file {str(path)!r}")
    if trace.name == "trace":
        trace.name = path.stem
    return trace


# ------------------------------------------------------ traces of a simulation
#: One transformer layer's kept activations in units of ``s*b*h`` bytes (Korthikanti et
#: al. 2022 with flash attention, GPT shapes: ffn = 4h, 2-byte tensors, 1-byte masks).
#: Tensors the weight gradient (W) needs are the inputs of the four linear layers; the
#: rest is released by the input-gradient pass (B).
LAYER_TENSORS_W: tuple[tuple[str, int], ...] = (
    ("qkv_in", 2), ("proj_in", 2), ("fc1_in", 2), ("fc2_in", 8))
LAYER_TENSORS_B: tuple[tuple[str, int], ...] = (
    ("ln1_in", 2), ("q", 2), ("k", 2), ("v", 2), ("attn_mask", 1), ("ln2_in", 2),
    ("gelu_in", 8), ("mlp_mask", 1))


def _split(amount: int, weights: Sequence[int]) -> list[int]:
    """``amount`` split in proportion to ``weights``, exactly (largest remainders)."""
    total = sum(weights)
    if amount <= 0 or total <= 0:
        return [0] * len(weights)
    parts = [amount * w // total for w in weights]
    order = sorted(range(len(weights)), key=lambda i: -(amount * weights[i] % total))
    for i in order[:amount - sum(parts)]:
        parts[i] += 1
    return parts


def _stage_layers(problem: "Problem", stage: int) -> tuple[list[int], int]:
    """Per-layer byte weights and the extra (embedding/head) bytes of one stage.

    Reads the cost model's ``meta`` (``layer_activation_bytes``, ``extra_activation_bytes``
    per base stage); for a problem split into chunks, each chunk gets an equal share of
    its device's layers. Only proportions matter: amounts are rescaled to the problem's
    exact bytes. ``([], 0)`` when the problem carries no layer breakdown.
    """
    layers = problem.meta.get("layer_activation_bytes")
    extras = problem.meta.get("extra_activation_bytes")
    if not isinstance(layers, list):
        return [], 0
    if problem.chunks == 1:
        if stage >= len(layers):
            return [], 0
        extra = int(extras[stage]) if isinstance(extras, list) and stage < len(extras) else 0
        return [int(x) for x in layers[stage]], extra
    placement = problem.meta.get("placement") or []
    if stage >= len(placement) or placement[stage] >= len(layers):
        return [], 0
    base = [int(x) for x in layers[placement[stage]]]
    count = max(1, round(len(base) / problem.chunks))
    return base[:count], 0


def _activation_pieces(problem: "Problem", stage: int, amount: int, part: str,
                       per_layer: bool) -> list[tuple[int, dict[str, Any]]]:
    """``amount`` bytes of one stage's kept activation cut into realistic tensors.

    ``part`` is ``"b"`` (released by B), ``"w"`` (released by W) or ``"all"``. Without a
    layer breakdown, or with ``per_layer=False``, one piece.
    """
    if amount <= 0:
        return []
    layers, extra = _stage_layers(problem, stage) if per_layer else ([], 0)
    if not layers:
        return [(amount, {})]
    tensors = {"b": LAYER_TENSORS_B, "w": LAYER_TENSORS_W,
               "all": LAYER_TENSORS_B + LAYER_TENSORS_W}[part]
    labels: list[dict[str, Any]] = []
    weights: list[int] = []
    unit = sum(w for _, w in tensors)
    for index, layer_bytes in enumerate(layers):
        for tensor, w in tensors:
            labels.append({"layer": index, "tensor": tensor})
            weights.append(layer_bytes * w // unit or 1)
    if extra:
        labels.append({"layer": "extra", "tensor": "embedding/head"})
        weights.append(extra)
    sizes = _split(amount, weights)
    return [(size, label) for size, label in zip(sizes, labels) if size > 0]


def traces_from_simulation(result: "SimResult", per_layer: bool = True) -> list[Trace]:
    """One trace per device: every activation buffer the simulated schedule keeps.

    A microbatch's kept activation on a stage lives from its F's start; the part that B
    releases ends at B's end, the rest at W's end (both at a fused BW's end). An
    OFFLOAD ends the offloaded share's life on the device at the OFFLOAD's end; the
    RELOAD brings a new buffer of that size to life at the RELOAD's issue. Byte amounts
    come from :func:`~optpipe.memory.accounting.memory_delta`, so at every moment the
    live bytes equal the simulator's memory minus static bytes.

    With ``per_layer`` and a cost-model problem (``meta['layer_activation_bytes']``),
    each amount is cut into per-layer, per-tensor buffers (see ``LAYER_TENSORS_*``)
    that add up to it exactly; otherwise there is one buffer per amount.
    """
    from optpipe.memory.accounting import memory_delta, transfer_bytes
    from optpipe.schedule import Op

    problem = result.problem
    rec: dict[tuple[Any, int, int], Any] = {}
    for r in result.records:
        rec[(r.action.op, r.action.stage, r.action.microbatch)] = r
    per_device: list[list[Buffer]] = [[] for _ in range(result.schedule.devices)]

    def add(device: int, stage: int, mb: int, kind: str, amount: int, start: float,
            end: float, part: str) -> None:
        for index, (size, label) in enumerate(
                _activation_pieces(problem, stage, amount, part, per_layer)):
            tags = {"device": device, "stage": stage, "microbatch": mb, "kind": kind, **label}
            ident = f"d{device}.s{stage}.m{mb}.{kind}" + (f".{index}" if label else "")
            per_device[device].append(Buffer(ident, size, start, end, tags))

    for (op, s, m), f in sorted(rec.items(), key=lambda kv: (kv[1].start, kv[0][1], kv[0][2])):
        if op is not Op.F:
            continue
        device = f.device
        kept = memory_delta(problem, f.action)[1]
        fused = rec.get((Op.BW, s, m))
        if fused is not None:
            parts = [("all", kept, fused.end)]
        else:
            b, w = rec[(Op.B, s, m)], rec[(Op.W, s, m)]
            parts = [("b", -memory_delta(problem, b.action)[1], b.end),
                     ("w", -memory_delta(problem, w.action)[1], w.end)]
        off = rec.get((Op.OFFLOAD, s, m))
        if off is None:
            for part, amount, end in parts:
                add(device, s, m, f"act_{part}", amount, f.start, end, part)
            continue
        reload = rec[(Op.RELOAD, s, m)]
        moved = transfer_bytes(problem, off.action)
        add(device, s, m, "offloaded", moved, f.start, off.end, "all")
        left = moved  # the reloaded share is released first by B, then by W
        for part, amount, end in parts:
            back = min(left, amount)
            left -= back
            add(device, s, m, f"reloaded_{part}", back, reload.issue, end, part)
            add(device, s, m, f"act_{part}", amount - back, f.start, end, part)
    return [Trace(bufs, name=f"{result.schedule.name}.device{d}",
                  meta={"device": d, "schedule": result.schedule.name,
                        "static": result.problem.static[d]})
            for d, bufs in enumerate(per_device)]


def traces_from_schedule(problem: "Problem", schedule: "Schedule",
                         per_layer: bool = True) -> list[Trace]:
    """Simulate ``schedule`` on ``problem`` and return one trace per device."""
    from optpipe.simulator import simulate

    return traces_from_simulation(simulate(problem, schedule), per_layer=per_layer)


def merge_traces(traces: Iterable[Trace], name: str = "merged") -> Trace:
    """All buffers of several traces in one (ids must already be distinct)."""
    return Trace([b for t in traces for b in t.buffers], name=name)
