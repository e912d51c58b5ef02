"""The runtime's own accounting of kept activations, through autograd's saved tensors.

What a pipeline stage keeps between its F and its backward is exactly what autograd
saves for backward. Every forward runs inside :meth:`ActivationTracker.capture`, a
``torch.autograd.graph.saved_tensors_hooks`` context that files each saved tensor under
its (stage, microbatch): the hook returns a small handle that autograd stores in place
of the tensor, and when autograd drops the handle (its graph node is freed) the bytes
leave the account. Storages are counted once however many views of them are saved;
parameters and buffers are static memory and are never counted.

The same store is what OFFLOAD and RELOAD move (:mod:`optpipe.runtime.offload`): they
act on whole storages, so every alias of a moved tensor sees the move.

:class:`DeviceLedger` turns the stores into per-device kept bytes with the rules of
:mod:`optpipe.memory.accounting`: F charges its bytes at its start, B/W/BW/OFFLOAD
release at their end, RELOAD charges at its issue; releases before allocations at equal
times. So the runtime's peak is directly comparable to the simulator's.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

ON_DEVICE, COPYING, ON_HOST, DROPPED = "device", "copying", "host", "dropped"


class Entry:
    """One saved storage: its bytes, its owner and where its data is now."""

    __slots__ = ("storage", "nbytes", "store", "refs", "state", "host", "event", "key",
                 "shared", "indices", "log", "mem", "buffer", "part", "slot_index", "slots")

    def __init__(self, storage: torch.UntypedStorage, store: "SavedStore", key: int) -> None:
        self.storage = storage
        self.nbytes = storage.nbytes()
        self.store = store
        self.refs = 0
        self.state = ON_DEVICE
        self.host: torch.Tensor | None = None
        self.event: Any = None
        self.key = key
        self.shared = False   # also saved by another (stage, microbatch): never moved
        self.indices: list[int] = []   # pack order of the handles that refer to it
        self.log: list[Any] | None = None   # measurement record (arena layout)
        # arena mode: the bytes live in ``mem`` (a uint8 view of the arena or a fallback
        # tensor), not in ``storage``; ``slots`` is the runner's ArenaStore
        self.mem: torch.Tensor | None = None
        self.buffer: tuple[int, str | None] | None = None
        self.part: str | None = None
        self.slot_index = -1
        self.slots: Any = None

    # device bytes, wherever they live (own storage or arena)
    def data(self) -> torch.Tensor:
        """A flat uint8 tensor over the entry's device bytes."""
        if self.slots is not None:
            assert self.mem is not None
            return self.mem
        return byte_view(self.storage)

    def resident(self) -> int:
        """Bytes really on device now."""
        if self.slots is not None:
            return 0 if self.mem is None else self.mem.numel()
        return 0 if self.storage is None else self.storage.nbytes()

    def empty_device(self) -> None:
        if self.slots is not None:
            self.slots.vacate(self)
        else:
            self.storage.resize_(0)

    def refill_device(self) -> None:
        if self.slots is not None:
            self.slots.place(self, self.store.device, self.slot_index)
        else:
            self.storage.resize_(self.nbytes)


def byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over all of ``storage``'s bytes."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(
        storage, 0, (storage.nbytes(),), (1,))


class _Handle:
    """What autograd keeps instead of a saved tensor; its death releases the bytes."""

    __slots__ = ("tensor", "entry", "tracker", "index", "meta")

    def __init__(self, tensor: torch.Tensor | None, entry: Entry,
                 tracker: "ActivationTracker", index: int, meta: Any = None) -> None:
        self.tensor = tensor
        self.entry = entry
        self.tracker = tracker
        self.index = index
        self.meta = meta      # arena mode: (dtype, size, stride, storage offset)

    def __del__(self) -> None:
        self.tracker._release(self.entry)


@dataclass
class SavedStore:
    """The saved storages of one (stage, microbatch) and their bytes on device and host."""

    stage: int
    microbatch: int
    device: int
    entries: dict[int, Entry] = field(default_factory=dict)
    device_bytes: int = 0
    host_bytes: int = 0
    accounted: int = 0       # bytes charged to the device ledger so far
    reload_event: Any = None  # CUDA: the copy a backward must wait for
    packed: int = 0           # saved tensors filed so far (their pack order)

    def live(self) -> list[Entry]:
        return list(self.entries.values())


class ActivationTracker:
    """Files saved tensors per (stage, microbatch); one per runner."""

    def __init__(self) -> None:
        self.registry: dict[int, Entry] = {}
        self.stores: dict[tuple[int, int], SavedStore] = {}
        self.static_keys: set[int] = set()
        self._current: SavedStore | None = None
        self._lock = threading.RLock()
        # stage -> pack indices a W unpacks (learned from the stage's first W)
        self.needed_by_w: dict[int, set[int]] = {}
        self._learning: tuple[SavedStore, set[int]] | None = None
        # arena mode (optpipe.runtime.arena_store): where new saved storages go
        self.slots: Any = None
        self.phase = ""                     # the op running now (set by the runner)
        self.watch: set[tuple[int, int]] = set()          # (stage, mb) to log
        self.logs: dict[tuple[int, int], list[list[Any]]] = {}
        self._fresh: list[tuple[Entry, torch.UntypedStorage]] = []   # packed this F
        self.copied: set[int] = set()       # storages the last F copied into the arena
        self._next_key = -1

    # ----------------------------------------------------------------- set-up
    def set_static(self, modules: Iterable[nn.Module]) -> None:
        """Storages of parameters, buffers and tensor attributes: static, never activations."""
        keys = set()
        for module in modules:
            for sub in module.modules():
                tensors = list(sub.parameters(recurse=False)) + list(sub.buffers(recurse=False))
                tensors += [v for v in vars(sub).values() if isinstance(v, torch.Tensor)]
                for t in tensors:
                    keys.add(t.untyped_storage()._cdata)
        self.static_keys = keys

    def store(self, stage: int, microbatch: int, device: int = 0) -> SavedStore:
        key = (stage, microbatch)
        if key not in self.stores:
            self.stores[key] = SavedStore(stage, microbatch, device)
        return self.stores[key]

    @contextmanager
    def capture(self, store: SavedStore) -> Iterator[SavedStore]:
        """Run a forward with every saved tensor filed under ``store``."""
        previous, self._current = self._current, store
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield store
        finally:
            self._current = previous
            self._seal()

    def _seal(self) -> None:
        """Arena mode, end of F: re-key the copied entries (their own storages may now
        die, and a dead storage's key could be reused) and note what was copied."""
        self.copied = set()
        if not self._fresh:
            return
        with self._lock:
            for entry, original in self._fresh:
                self.copied.add(original._cdata)
                if self.registry.get(entry.key) is entry:
                    del self.registry[entry.key]
                entry.store.entries.pop(entry.key, None)
                entry.key = self._next_key
                self._next_key -= 1
                if entry.refs > 0:
                    self.registry[entry.key] = entry
                    entry.store.entries[entry.key] = entry
                entry.storage = None  # type: ignore[assignment]
            self._fresh = []

    # ------------------------------------------------------------------ hooks
    def _pack(self, tensor: torch.Tensor) -> Any:
        store = self._current
        if store is None or tensor.layout is not torch.strided or tensor.is_nested:
            return tensor
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.static_keys or storage.nbytes() == 0:
            return tensor
        with self._lock:
            entry = self.registry.get(key)
            created = entry is None
            if entry is None:
                entry = Entry(storage, store, key)
                self.registry[key] = entry
                store.entries[key] = entry
                store.device_bytes += entry.nbytes
                if (store.stage, store.microbatch) in self.watch:
                    entry.log = [store.packed, entry.nbytes, None]
                    self.logs.setdefault((store.stage, store.microbatch), []).append(
                        entry.log)
            elif entry.store is not store:
                if entry.state != ON_DEVICE:
                    raise RuntimeError(
                        f"stage {store.stage}, microbatch {store.microbatch} saves a tensor "
                        f"whose storage stage {entry.store.stage}, microbatch "
                        f"{entry.store.microbatch} has offloaded; a stage may only save "
                        f"tensors it computes, its input, and its modules' own tensors")
                entry.shared = True
            entry.refs += 1
            index = store.packed
            store.packed += 1
            entry.indices.append(index)
            if created and self.slots is not None:
                entry.slots = self.slots
                self.slots.place(entry, store.device, index)
                entry.mem.copy_(byte_view(storage))
                self._fresh.append((entry, storage))
        if entry.slots is not None:
            meta = (tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()),
                    tensor.storage_offset())
            return _Handle(None, entry, self, index, meta)
        # detached alias: keeping the tensor itself would tie a saved *output* to its own
        # grad_fn through this Python object, a cycle no collector can see
        return _Handle(tensor.detach(), entry, self, index)

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Handle):
            return packed
        entry = packed.entry
        if entry.state in (ON_HOST, DROPPED):
            store = entry.store
            if entry.state == DROPPED:
                raise RuntimeError(
                    f"W of stage {store.stage}, microbatch {store.microbatch} needs a saved "
                    f"tensor that was freed after its B (its first W did not need it); this "
                    f"stage's forward is not deterministic: use free_after_b=False")
            raise RuntimeError(
                f"a saved activation of stage {store.stage}, microbatch {store.microbatch} "
                f"is used while offloaded: the schedule needs a RELOAD before this backward")
        learning = packed.tracker._learning
        if learning is not None and learning[0] is entry.store:
            learning[1].add(packed.index)
        if packed.meta is not None:
            mem = entry.mem
            if mem is None:
                store = entry.store
                raise RuntimeError(
                    f"a saved activation of stage {store.stage}, microbatch "
                    f"{store.microbatch} is used after its arena buffer was released")
            dtype, size, stride, offset = packed.meta
            return torch.empty(0, dtype=dtype, device=mem.device).set_(
                mem.untyped_storage(), mem.storage_offset() // dtype.itemsize + offset,
                size, stride)
        return packed.tensor

    # ------------------------------------------- freeing what W does not need
    @contextmanager
    def learn_w(self, store: SavedStore) -> Iterator[None]:
        """Note which saved tensors the W of ``store`` unpacks (once per stage)."""
        if store.stage in self.needed_by_w:
            yield
            return
        seen: set[int] = set()
        self._learning = (store, seen)
        try:
            yield
        finally:
            self._learning = None
        self.needed_by_w[store.stage] = seen

    def drop_after_b(self, store: SavedStore, busy: Callable[[set[int]], set[int]]) -> int:
        """After B: empty the storages that the stage's W will not read; bytes freed.

        ``stage_backward_input`` keeps the whole graph for W, but W only runs the nodes
        from the weight-gradient "intermediates" to the weights: the stage's first W
        shows which saved tensors (by their order of saving, which is the same for every
        microbatch of a deterministic forward) it reads. Storages read by no such tensor
        are emptied at once, so B really releases memory, as zero-bubble schedules assume.
        """
        needed = self.needed_by_w.get(store.stage)
        if needed is None:
            return 0
        candidates = [e for e in store.live() if e.state == ON_DEVICE and not e.shared
                      and not any(i in needed for i in e.indices)]
        if not candidates:
            return 0
        in_flight = busy({e.key for e in candidates})
        freed = 0
        with self._lock:
            for entry in candidates:
                if entry.key in in_flight:
                    continue
                entry.empty_device()
                if entry.log is not None and entry.log[2] is None:
                    entry.log[2] = self.phase
                entry.state = DROPPED
                store.device_bytes -= entry.nbytes
                freed += entry.nbytes
        return freed

    def _release(self, entry: Entry) -> None:
        with self._lock:
            entry.refs -= 1
            if entry.refs > 0:
                return
            store = entry.store
            if self.registry.get(entry.key) is entry:
                del self.registry[entry.key]
            store.entries.pop(entry.key, None)
            if entry.log is not None and entry.log[2] is None:
                entry.log[2] = self.phase
            if entry.state == ON_HOST:
                store.host_bytes -= entry.nbytes
            elif entry.state != DROPPED:
                store.device_bytes -= entry.nbytes
            if entry.slots is not None:
                entry.slots.vacate(entry)
            entry.host = None
            entry.storage = None  # type: ignore[assignment]

    # ---------------------------------------------------------------- queries
    def drop_released(self, entry: Entry) -> None:
        """Arena mode: ``entry``'s buffer ended its planned life while still referenced."""
        with self._lock:
            if entry.state == ON_DEVICE:
                entry.store.device_bytes -= entry.nbytes
            entry.state = DROPPED

    def is_saved(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s storage is kept by some graph on this rank."""
        return tensor.untyped_storage()._cdata in self.registry

    def leftover(self) -> dict[tuple[int, int], int]:
        """(stage, microbatch) -> bytes still filed; empty after a clean step."""
        return {k: s.device_bytes + s.host_bytes for k, s in self.stores.items()
                if s.device_bytes or s.host_bytes}

    def reset(self) -> None:
        """Forget finished stores (called at step start; live ones are kept)."""
        self.stores = {k: s for k, s in self.stores.items() if s.entries}


@dataclass
class DeviceLedger:
    """Kept activation bytes of one device over a step, by the shared accounting rules.

    Charges arrive in execution order; each carries the clock mark of the moment the
    rule names (F's start, a release's end, RELOAD's issue), resolved into seconds only
    when a step is recorded.
    """

    events: list[tuple[Any, int]] = field(default_factory=list)
    level: int = 0
    top: int = 0

    def charge(self, store: SavedStore, mark: Any = None) -> int:
        """Settle ``store``'s change since its last charge; returns the delta in bytes."""
        delta = store.device_bytes - store.accounted
        store.accounted = store.device_bytes
        if delta:
            self.events.append((mark, delta))
            self.level += delta
            self.top = max(self.top, self.level)
        return delta

    def peak(self) -> int:
        return self.top

    def resolved(self, seconds: Any) -> list[tuple[float, int, int]]:
        """(seconds, 0 for a release / 1 for an allocation, delta) for every charge."""
        return [(seconds(mark), 0 if delta < 0 else 1, delta) for mark, delta in self.events]

    def reset(self) -> None:
        self.events.clear()
        self.top = self.level
