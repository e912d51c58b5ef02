"""Kept activations in one planned arena per device (``OptPipeRunner(..., arena=True)``).

How it works:

1. **Measure.** The first step whose layout is final (the first step for fused
   schedules; the second for split B/W ones, once the stage's first W has shown what
   B may free) runs as usual while the tracker logs, for microbatch 0 of every local
   stage, each saved storage in pack order: its bytes and the action during which it
   left the device. Storages freed during a B form the stage's ``b`` part, the rest its
   ``w`` part. Each storage gets a 64-byte aligned offset inside its part and each part
   is rounded up to 256 bytes: :class:`StageLayout`.
2. **Plan.** The part sizes become a :class:`~optpipe.problem.Problem` (unit times,
   ``activation = b + w``, ``freed_by_b = b``, ``freed_by_w = w``, the runner's static
   bytes), whose simulated schedule gives one trace per device
   (:func:`~optpipe.memory.trace.traces_from_schedule`, ``per_layer=False``); the
   planner places every buffer (alignment 256). The plan's arena then is, when the plan
   is optimal, exactly the simulator's peak minus static bytes on that problem.
3. **Run.** One :class:`~optpipe.memory.arena.Arena` per device. At F the runner takes
   the (stage, microbatch)'s planned buffer(s); the pack hook copies each new saved
   storage into its planned place and autograd keeps a small handle; unpack returns a
   view of the arena with the saved tensor's shape, strides and offset. B, W, BW end a
   buffer's life as the trace says; OFFLOAD copies the bytes to host and frees the
   ``offloaded`` buffer once its copies are done; RELOAD takes the ``reloaded_*``
   buffers and copies back. Anything the layout did not foresee (another size, an
   unknown pack index, a partial offload, a planned buffer still overlapped by a live
   one) goes to :meth:`Arena.allocate` — the spare bytes by online best fit, else a
   tensor of its own — and is counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import torch

from optpipe.memory.arena import Arena, ArenaStats
from optpipe.memory.planner import Plan
from optpipe.memory.validate import PlanError

if TYPE_CHECKING:  # pragma: no cover
    from optpipe.runtime.activations import Entry

ENTRY_ALIGN = 64     # offset of a saved storage inside its part
PART_ALIGN = 256     # part sizes and plan alignment


def round_up(n: int, a: int) -> int:
    return -(-n // a) * a


@dataclass
class StageLayout:
    """Where each saved storage of one stage's microbatch goes, by first pack index."""

    stage: int
    slots: dict[int, tuple[int, str, int]] = field(default_factory=dict)  # idx -> (bytes, part, offset)
    b: int = 0
    w: int = 0

    @property
    def total(self) -> int:
        return self.b + self.w

    @classmethod
    def from_log(cls, stage: int, log: Iterable[list[Any]]) -> "StageLayout":
        """``log``: [first pack index, bytes, op during which it left the device]."""
        layout = cls(stage)
        fill = {"b": 0, "w": 0}
        for index, nbytes, left_in in log:
            if left_in not in ("B", "W", "BW"):
                continue        # freed during F, or never: not planned
            part = "b" if left_in == "B" else "w"
            layout.slots[index] = (nbytes, part, fill[part])
            fill[part] += round_up(nbytes, ENTRY_ALIGN)
        layout.b = round_up(fill["b"], PART_ALIGN)
        layout.w = round_up(fill["w"], PART_ALIGN)
        return layout


class ArenaStore:
    """The arenas of this rank's devices and where each kept storage lives in them."""

    def __init__(self, plans: dict[int, Plan], layouts: dict[int, StageLayout],
                 device: torch.device, spare: int = 0) -> None:
        self.plans = plans
        self.layouts = layouts
        self.arenas = {d: Arena(plan, device, spare=spare) for d, plan in plans.items()}
        self.regions: dict[tuple[int, int], dict[str, tuple[int, str, int]]] = {}
        self.occupants: dict[tuple[int, str], set[int]] = {}   # live buffer -> entry ids
        self.entries: dict[int, "Entry"] = {}
        self.fallback_buffers = 0     # planned buffers that could not be taken
        self.unplanned_entries = 0    # storages placed outside the plan
        self.planned_entries = 0      # storages placed at planned offsets

    # ---------------------------------------------------------------- buffers
    @staticmethod
    def _prefix(device: int, stage: int, mb: int) -> str:
        return f"d{device}.s{stage}.m{mb}."

    def _take(self, device: int, ident: str) -> bool:
        try:
            self.arenas[device].tensor(ident)
        except PlanError:
            self.fallback_buffers += 1
            return False
        self.occupants[(device, ident)] = set()
        return True

    def _release(self, device: int, ident: str, drop: Any) -> None:
        ids = self.occupants.pop((device, ident), None)
        if ids is None:
            return
        for eid in ids:                 # still referenced past its planned life
            entry = self.entries.pop(eid, None)
            if entry is not None:
                entry.mem = None
                drop(entry)
        self.arenas[device].release(ident)

    def _open(self, device: int, stage: int, mb: int, kinds: tuple[str, str, str]) -> None:
        """Take the planned buffers for new storages: ``kinds`` = (all, b, w) ids."""
        offsets = self.plans[device].offsets
        p = self._prefix(device, stage, mb)
        layout = self.layouts.get(stage)
        regions: dict[str, tuple[int, str, int]] = {}
        whole, b, w = (p + k for k in kinds)
        partial = kinds[0] == "offloaded" and any(
            p + k in offsets for k in ("act_all", "act_b", "act_w"))
        if layout is not None and not partial:
            if whole in offsets:
                if self._take(device, whole):
                    regions = {"b": (device, whole, 0), "w": (device, whole, layout.b)}
            else:
                if b in offsets and self._take(device, b):
                    regions["b"] = (device, b, 0)
                if w in offsets and self._take(device, w):
                    regions["w"] = (device, w, 0)
        self.regions[(stage, mb)] = regions

    def begin_forward(self, device: int, stage: int, mb: int) -> None:
        offsets = self.plans[device].offsets
        p = self._prefix(device, stage, mb)
        first = "offloaded" if p + "offloaded" in offsets else "act_all"
        self._open(device, stage, mb, (first, "act_b", "act_w"))

    def begin_reload(self, device: int, stage: int, mb: int) -> None:
        self._open(device, stage, mb, ("reloaded_all", "reloaded_b", "reloaded_w"))

    def after_offload(self, device: int, stage: int, mb: int) -> None:
        """Free the ``offloaded`` buffer if no copy still reads it."""
        ident = self._prefix(device, stage, mb) + "offloaded"
        if not self.occupants.get((device, ident), True):
            self._release(device, ident, lambda e: None)

    def end_action(self, device: int, op: str, stage: int, mb: int, drop: Any) -> None:
        """B / W / BW end the life of the buffers the trace ends with them."""
        kinds = {"B": ("b",), "W": ("w",), "BW": ("b", "w", "all")}.get(op, ())
        p = self._prefix(device, stage, mb)
        for part in kinds:
            for k in (f"act_{part}", f"reloaded_{part}"):
                self._release(device, p + k, drop)

    # ---------------------------------------------------------------- storages
    def place(self, entry: "Entry", device: int, index: int) -> None:
        """Give ``entry`` its device bytes (``entry.mem``), planned when it can be."""
        store = entry.store
        layout = self.layouts.get(store.stage)
        slot = layout.slots.get(index) if layout is not None else None
        if slot is not None and entry.part is None:
            entry.part = slot[1]
        region = self.regions.get((store.stage, store.microbatch), {})
        fits = False
        if slot is not None and slot[0] == entry.nbytes and entry.part in region:
            dev, ident, base = region[entry.part]
            fits = base + slot[2] + entry.nbytes <= self.plans[dev].sizes[ident]
        if fits:
            at = self.plans[dev].offsets[ident] + base + slot[2]
            entry.mem = self.arenas[dev].storage[at:at + entry.nbytes]
            entry.buffer = (dev, ident)
            self.occupants[(dev, ident)].add(id(entry))
            self.planned_entries += 1
        else:
            entry.mem = self.arenas[device].allocate([entry.nbytes], torch.uint8)
            entry.buffer = (device, None)
            self.unplanned_entries += 1
        entry.slot_index = index
        self.entries[id(entry)] = entry

    def vacate(self, entry: "Entry") -> None:
        """``entry``'s device bytes are no longer needed (moved, dropped or released)."""
        if entry.mem is None or entry.buffer is None:
            return
        dev, ident = entry.buffer
        if ident is None:
            self.arenas[dev].free(entry.mem)
        else:
            ids = self.occupants.get((dev, ident))
            if ids is not None:
                ids.discard(id(entry))
                if not ids and ident.endswith("offloaded"):
                    self._release(dev, ident, lambda e: None)
        self.entries.pop(id(entry), None)
        entry.mem = None
        entry.buffer = None

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict[int, ArenaStats]:
        return {d: arena.stats() for d, arena in self.arenas.items()}
