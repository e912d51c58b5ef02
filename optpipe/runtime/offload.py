"""OFFLOAD and RELOAD: moving one microbatch's saved activations to host memory and back.

They act on the storages filed by :class:`~optpipe.runtime.activations.ActivationTracker`:
OFFLOAD copies a storage's bytes into a host buffer and shrinks the device storage to
zero bytes (``UntypedStorage.resize_(0)``, as FSDP does for parameters); RELOAD grows
it again and copies the bytes back. Working on storages keeps every alias valid — the
autograd graph, views, the stage input — so nothing has to be re-wired.

On CPU the copies are synchronous, into a host pool of reusable buffers (real copies:
the "device" storage is emptied). On CUDA they run on two side streams (device-to-host,
host-to-device) into pinned buffers, ordered with events: an OFFLOAD waits for the
compute stream's work so far, its device memory is freed only when the copy is done
(checked at every action boundary); a RELOAD allocates on the compute stream at its
issue and the backward that needs it waits for its copy event.

A storage that an in-flight send is still reading is never emptied: the runner either
waits for that send (when every receive of the step was posted up front, so the wait
cannot deadlock) or leaves the storage on device until the send is done.
"""

from __future__ import annotations

from typing import Callable

import torch

from optpipe.runtime.activations import (COPYING, ON_DEVICE, ON_HOST, Entry, SavedStore)




class HostPool:
    """Reusable host buffers keyed by size; pinned when they back a CUDA device."""

    def __init__(self, pin: bool = False) -> None:
        self.pin = pin
        self.free: dict[int, list[torch.Tensor]] = {}
        self.allocated = 0   # bytes of host buffers ever created (the pool's footprint)
        self.in_use = 0

    def take(self, nbytes: int) -> torch.Tensor:
        stack = self.free.get(nbytes)
        if stack:
            buffer = stack.pop()
        else:
            buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
            self.allocated += nbytes
        self.in_use += nbytes
        return buffer

    def give(self, buffer: torch.Tensor) -> None:
        self.in_use -= buffer.numel()
        self.free.setdefault(buffer.numel(), []).append(buffer)


class Offloader:
    """Moves stores between device and host; one per runner (per device)."""

    def __init__(self, device: torch.device,
                 busy: Callable[[set[int]], set[int]] | None = None,
                 wait: Callable[[set[int]], None] | None = None,
                 can_wait: bool = True) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.pool = HostPool(pin=self.cuda)
        self.copying: list[Entry] = []            # device copy still held
        self.returning: list[tuple[object, torch.Tensor]] = []  # (event, host) after reload
        self._busy = busy or (lambda keys: set())
        self._wait = wait or (lambda keys: None)
        self.can_wait = can_wait
        self.last_marks: tuple[object, object] = (None, None)  # CUDA: copy start/end events
        if self.cuda:
            self.d2h = torch.cuda.Stream(device)
            self.h2d = torch.cuda.Stream(device)

    @staticmethod
    def _event(stream: "torch.cuda.Stream") -> "torch.cuda.Event":
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    # ---------------------------------------------------------------- offload
    def offload(self, store: SavedStore, fraction: float = 1.0) -> int:
        """Start moving ``fraction`` of ``store``'s device bytes to host; bytes chosen.

        Whole storages move, in the order they were saved, until at least ``fraction``
        of the bytes are chosen.
        """
        entries = [e for e in store.live() if e.state == ON_DEVICE and not e.shared]
        target = fraction * sum(e.nbytes for e in entries)
        chosen, moved = [], 0
        for entry in entries:
            if fraction < 1.0 and moved >= target:
                break
            chosen.append(entry)
            moved += entry.nbytes
        if not chosen:
            return 0
        if self.cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.d2h):
                self.d2h.wait_event(ready)
                self.last_marks = (self._event(self.d2h), None)
                for entry in chosen:
                    entry.host = self.pool.take(entry.nbytes)
                    entry.host.copy_(entry.data(), non_blocking=True)
                done = self._event(self.d2h)
                self.last_marks = (self.last_marks[0], done)
            for entry in chosen:
                entry.state, entry.event = COPYING, done
        else:
            for entry in chosen:
                entry.host = self.pool.take(entry.nbytes)
                entry.host.copy_(entry.data())
                entry.state, entry.event = COPYING, None
            if self.can_wait:
                self._wait({e.key for e in chosen})
        self.copying.extend(chosen)
        self.poll()
        return moved

    def poll(self) -> list[SavedStore]:
        """Free the device side of finished copies no send still reads; the stores freed."""
        if not self.copying and not self.returning:
            return []
        changed: list[SavedStore] = []
        busy = self._busy({e.key for e in self.copying}) if self.copying else set()
        still = []
        for entry in self.copying:
            if entry.state != COPYING:
                continue
            done = entry.event is None or entry.event.query()
            if done and entry.key not in busy:
                self._free_device(entry)
                if entry.store not in changed:
                    changed.append(entry.store)
            else:
                still.append(entry)
        self.copying = still
        keep = []
        for event, host in self.returning:
            if event.query():
                self.pool.give(host)
            else:
                keep.append((event, host))
        self.returning = keep
        return changed

    def _free_device(self, entry: Entry) -> None:
        store = entry.store
        entry.empty_device()
        entry.state = ON_HOST
        store.device_bytes -= entry.nbytes
        store.host_bytes += entry.nbytes

    # ----------------------------------------------------------------- reload
    def settle(self, store: SavedStore) -> list[SavedStore]:
        """Let ``store``'s offload copies finish (a RELOAD depends on its OFFLOAD's end)."""
        for entry in store.live():
            if entry.state == COPYING and entry.event is not None:
                entry.event.synchronize()
        return self.poll()

    def reload(self, store: SavedStore) -> int:
        """Bring ``store``'s offloaded bytes back; returns the bytes re-allocated on device."""
        self.poll()
        back = 0
        compute = torch.cuda.current_stream(self.device) if self.cuda else None
        allocated = torch.cuda.Event() if self.cuda else None
        moving = []
        for entry in store.live():
            if entry.state == COPYING:          # never left: cancel the move
                if entry.event is not None:
                    entry.event.synchronize()
                self.pool.give(entry.host)
                entry.host, entry.state = None, ON_DEVICE
                self.copying = [e for e in self.copying if e is not entry]
            elif entry.state == ON_HOST:
                entry.refill_device()
                store.host_bytes -= entry.nbytes
                store.device_bytes += entry.nbytes
                entry.state = ON_DEVICE
                back += entry.nbytes
                moving.append(entry)
        if not moving:
            return back
        if self.cuda:
            allocated.record(compute)
            with torch.cuda.stream(self.h2d):
                self.h2d.wait_event(allocated)
                first = self._event(self.h2d)
                for entry in moving:
                    entry.data().copy_(entry.host, non_blocking=True)
                done = self._event(self.h2d)
                self.last_marks = (first, done)
            for entry in moving:
                self.returning.append((done, entry.host))
                entry.host = None
            store.reload_event = done
        else:
            for entry in moving:
                entry.data().copy_(entry.host)
                self.pool.give(entry.host)
                entry.host = None
        return back

    def before_backward(self, store: SavedStore) -> None:
        """Make the compute stream wait for ``store``'s reload copies (CUDA only)."""
        if store.reload_event is not None:
            torch.cuda.current_stream(self.device).wait_event(store.reload_event)
            store.reload_event = None

    def finish(self) -> list[SavedStore]:
        """At step end: every copy done, every host buffer back in the pool."""
        if self.cuda:
            self.d2h.synchronize()
            self.h2d.synchronize()
        return self.poll()
