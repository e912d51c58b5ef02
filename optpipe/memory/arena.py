"""The arena: a plan made real on a device, for the runtime.

Why: the planner (:mod:`optpipe.memory.planner`) fits every activation buffer of a step
into one block of ``plan.arena_size`` bytes. :class:`Arena` allocates that block once —
one ``uint8`` tensor per device — and hands out views at the planned offsets, so the
step never asks PyTorch's caching allocator for those buffers and never fragments.

The API is deliberately small:

``Arena(plan, device="cuda:0", spare=0)``
    allocates ``plan.arena_size + spare`` bytes.
``arena.tensor(buffer_id, shape, dtype)``
    the planned buffer as a tensor view (marks it live). With ``check=True`` (default)
    it raises :class:`~optpipe.memory.validate.PlanError` if a live planned buffer
    overlaps it — the runtime is then not following the schedule the plan was made for.
``arena.release(buffer_id)``
    marks it dead (its bytes are reused by later planned buffers).
``arena.allocate(shape, dtype)`` / ``arena.free(tensor)``
    requests the plan does not know: placed by online best fit in the ``spare`` bytes
    at the end of the arena, or, when they do not fit, in a tensor of their own outside
    it (counted as ``outside`` bytes).
``arena.stats()``
    reserved versus live bytes, now and at peak.

Offsets must suit the dtypes used: plan with ``alignment`` of at least the largest
element size (256 suits every CUDA kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from optpipe.errors import OptPipeError
from optpipe.memory.planner import OnlineBestFit, Plan
from optpipe.memory.validate import PlanError


@dataclass
class ArenaStats:
    """Bytes: ``reserved`` = arena + live outside tensors; ``live`` = bytes in use."""

    arena_bytes: int
    reserved: int
    live: int
    peak_reserved: int
    peak_live: int
    planned_live: int
    unplanned_live: int
    outside_live: int
    outside_peak: int
    unplanned_requests: int

    @property
    def fragmentation(self) -> float:
        """1 − peak live / peak reserved."""
        return 1.0 - self.peak_live / self.peak_reserved if self.peak_reserved else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "fragmentation": self.fragmentation}


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count * dtype.itemsize


class Arena:
    """One device's planned buffers in one ``uint8`` tensor (see the module docstring)."""

    def __init__(self, plan: Plan, device: str | torch.device = "cpu", spare: int = 0,
                 check: bool = True) -> None:
        if spare < 0:
            raise OptPipeError(f"spare bytes must not be negative, got {spare}")
        self.plan = plan
        self.device = torch.device(device)
        self.check = check
        self.storage = torch.empty(plan.arena_size + spare, dtype=torch.uint8,
                                   device=self.device)
        self._spare_base = plan.arena_size
        self._spare = OnlineBestFit(spare, alignment=max(plan.alignment, 256)) if spare else None
        self._live_planned: dict[str, tuple[int, int]] = {}
        self._unplanned: dict[int, tuple[str, int, int | torch.Tensor]] = {}
        self._planned_live = self._unplanned_live = self._outside_live = 0
        self._peak_live = self._peak_reserved = self._outside_peak = 0
        self._requests = 0
        self._note()

    # ---------------------------------------------------------------- planned
    def tensor(self, buffer_id: str, shape: Sequence[int] | None = None,
               dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """The planned buffer ``buffer_id`` as a view of ``shape`` and ``dtype``."""
        if buffer_id not in self.plan.offsets:
            raise OptPipeError(f"buffer {buffer_id!r} is not in the plan for "
                               f"'{self.plan.trace_name}'; use allocate() for unplanned "
                               f"tensors")
        offset, planned = self.plan.offsets[buffer_id], self.plan.sizes[buffer_id]
        shape = [planned // dtype.itemsize] if shape is None \
            else list(shape)
        nbytes = _nbytes(shape, dtype)
        if nbytes > planned:
            raise OptPipeError(f"buffer {buffer_id!r} was planned for {planned} bytes but "
                               f"{nbytes} are requested")
        itemsize = dtype.itemsize
        if offset % itemsize:
            raise OptPipeError(f"buffer {buffer_id!r} sits at offset {offset}, not a "
                               f"multiple of {itemsize} bytes ({dtype}); plan with "
                               f"alignment >= {itemsize}")
        if buffer_id in self._live_planned:
            raise PlanError(f"buffer {buffer_id!r} is already live")
        if self.check:
            for other, (lo, hi) in self._live_planned.items():
                if lo < offset + nbytes and offset < hi:
                    raise PlanError(
                        f"buffer {buffer_id!r} at [{offset}, {offset + nbytes}) overlaps "
                        f"live buffer {other!r} at [{lo}, {hi}); the run does not follow "
                        f"the schedule the plan was made for")
        self._live_planned[buffer_id] = (offset, offset + nbytes)
        self._planned_live += nbytes
        self._note()
        return self.storage[offset:offset + nbytes].view(dtype).view(shape)

    def release(self, buffer_id: str) -> None:
        """The planned buffer is dead; its bytes may be handed out again."""
        span = self._live_planned.pop(buffer_id, None)
        if span is None:
            raise OptPipeError(f"release of buffer {buffer_id!r}, which is not live")
        self._planned_live -= span[1] - span[0]

    # -------------------------------------------------------------- unplanned
    def allocate(self, shape: Sequence[int], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """A tensor the plan did not foresee: best fit in the spare bytes, else outside."""
        nbytes = _nbytes(shape, dtype)
        self._requests += 1
        offset = self._spare.allocate(nbytes) if self._spare is not None and nbytes else None
        if offset is not None:
            at = self._spare_base + offset
            out = self.storage[at:at + nbytes].view(dtype).view(list(shape))
            self._unplanned[out.data_ptr()] = ("spare", nbytes, offset)
            self._unplanned_live += nbytes
        else:
            out = torch.empty(list(shape), dtype=dtype, device=self.device)
            self._unplanned[out.data_ptr()] = ("outside", nbytes, out)
            self._outside_live += nbytes
            self._outside_peak = max(self._outside_peak, self._outside_live)
        self._note()
        return out

    def free(self, tensor: torch.Tensor) -> None:
        """Give back a tensor from :meth:`allocate`."""
        entry = self._unplanned.pop(tensor.data_ptr(), None)
        if entry is None:
            raise OptPipeError("free of a tensor that allocate() did not hand out")
        where, nbytes, handle = entry
        if where == "spare":
            assert self._spare is not None and isinstance(handle, int)
            self._spare.free(handle)
            self._unplanned_live -= nbytes
        else:
            self._outside_live -= nbytes

    # ------------------------------------------------------------------ stats
    def _note(self) -> None:
        live = self._planned_live + self._unplanned_live + self._outside_live
        self._peak_live = max(self._peak_live, live)
        self._peak_reserved = max(self._peak_reserved, self.storage.numel() + self._outside_live)

    def stats(self) -> ArenaStats:
        live = self._planned_live + self._unplanned_live + self._outside_live
        return ArenaStats(
            arena_bytes=self.storage.numel(),
            reserved=self.storage.numel() + self._outside_live, live=live,
            peak_reserved=self._peak_reserved, peak_live=self._peak_live,
            planned_live=self._planned_live, unplanned_live=self._unplanned_live,
            outside_live=self._outside_live, outside_peak=self._outside_peak,
            unplanned_requests=self._requests)
