"""A model of PyTorch's CUDA caching allocator, replaying an allocation trace.

Why: a schedule's "peak memory" counts live bytes, but PyTorch reserves more than that —
requests are rounded, carved out of larger segments, and a freed block can only be
reused by a request that fits in it. This model reproduces the rules of
``c10/cuda/CUDACachingAllocator.cpp`` (one stream, default settings) so that the
fragmentation of a schedule's trace can be measured without a GPU, and compared with
the planned arena (:mod:`optpipe.memory.planner`). The rules, with the constants checked
against the PyTorch source (see ``docs/memory.md``):

* every request is rounded up to a multiple of ``kMinBlockSize`` = 512 bytes;
* requests of at most ``kSmallSize`` = 1 MiB use the small pool, whose segments are
  ``kSmallBuffer`` = 2 MiB; larger requests use the large pool, whose segments are
  ``kLargeBuffer`` = 20 MiB for requests under ``kMinLargeAlloc`` = 10 MiB and the
  request rounded up to ``kRoundLarge`` = 2 MiB otherwise;
* a request takes the smallest free block of its pool that fits (ties: lowest address);
  with expandable segments a free block followed by unmapped address space counts, for
  this choice, as its size plus that space (``get_free_block``'s ``expandable_size``),
  so a larger free hole is taken before the free end of the mapped range;
* the block is split when the remainder is at least 512 bytes (small pool) or more than
  1 MiB (large pool); the request keeps the low addresses;
* a freed block merges with free neighbours of the same segment;
* segments are never returned, except when a new segment would exceed ``capacity``:
  then every fully free segment is released and the request retried (out of memory if
  it still does not fit).

With ``expandable_segments=True`` (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``)
each pool is one virtual segment that grows by mapping pages of 2 MiB (small pool) or
20 MiB (large pool) at its end; every split remainder of at least 512 bytes is kept; on
out-of-memory the whole pages inside free blocks are unmapped.

Reported: peak reserved bytes (segments or mapped pages), peak allocated bytes (rounded
blocks handed out), peak requested bytes (the trace's own live bytes) and
fragmentation = 1 − peak allocated / peak reserved.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import Any

from optpipe.errors import OptPipeError
from optpipe.memory.trace import Trace

K_MIN_BLOCK_SIZE = 512            # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1048576            # kSmallSize: largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2097152          # kSmallBuffer: "small" allocations are packed in 2 MiB blocks
K_LARGE_BUFFER = 20971520         # kLargeBuffer: "large" allocations may be packed in 20 MiB
K_MIN_LARGE_ALLOC = 10485760      # kMinLargeAlloc: 1..10 MiB requests use kLargeBuffer
K_ROUND_LARGE = 2097152           # kRoundLarge: round up large allocations to 2 MiB

_ADDRESS_SPACE = 1 << 50          # virtual range of one expandable segment (effectively unbounded)


class AllocatorOOM(OptPipeError):
    """The modelled allocator could not serve a request within ``capacity``."""


def round_size(size: int) -> int:
    """``round_size``: at least 512 bytes, in multiples of 512."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment a new cudaMalloc gets for a rounded request."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


class _Block:
    """A range of one segment: allocated, free (cached) or, for expandable segments,
    unmapped address space."""

    __slots__ = ("ptr", "size", "state", "prev", "next", "small", "segment")

    def __init__(self, ptr: int, size: int, state: str, small: bool, segment: int) -> None:
        self.ptr, self.size, self.state, self.small, self.segment = ptr, size, state, small, segment
        self.prev: _Block | None = None
        self.next: _Block | None = None


@dataclass
class AllocatorStats:
    """What a replay measured; bytes."""

    peak_reserved: int
    peak_allocated: int
    peak_requested: int
    segments: int              # cudaMalloc calls (or page mappings for expandable segments)
    cache_flushes: int         # out-of-memory retries that released cached segments
    oom: str | None = None     # id of the buffer that did not fit within capacity
    expandable_segments: bool = False

    @property
    def fragmentation(self) -> float:
        """1 − peak allocated / peak reserved (0 when nothing was reserved)."""
        return 1.0 - self.peak_allocated / self.peak_reserved if self.peak_reserved else 0.0

    @property
    def waste(self) -> int:
        """Reserved bytes beyond the trace's peak of live (requested) bytes."""
        return self.peak_reserved - self.peak_requested

    def to_json(self) -> dict[str, Any]:
        return {"peak_reserved": self.peak_reserved, "peak_allocated": self.peak_allocated,
                "peak_requested": self.peak_requested, "fragmentation": self.fragmentation,
                "segments": self.segments, "cache_flushes": self.cache_flushes,
                "oom": self.oom, "expandable_segments": self.expandable_segments}


class CachingAllocator:
    """The allocator's state for one device and one stream.

    ``malloc(size)`` returns a handle (the block's address) and ``free(handle)`` gives it
    back; ``reserved``, ``allocated`` and their peaks follow PyTorch's statistics of the
    same names.
    """

    def __init__(self, capacity: int | None = None, expandable_segments: bool = False) -> None:
        self.capacity = capacity
        self.expandable = expandable_segments
        self.pools: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # free (size, ptr)
        self.blocks: dict[int, _Block] = {}            # every block by its address
        self.reserved = self.allocated = 0
        self.peak_reserved = self.peak_allocated = 0
        self.segments = self.cache_flushes = 0
        self._next_ptr = K_LARGE_BUFFER                # fake device addresses, increasing
        self._page = {True: K_SMALL_BUFFER, False: K_LARGE_BUFFER}
        self._es_head: dict[bool, _Block] = {}         # first block of each expandable pool

    # -------------------------------------------------------------- free lists
    def _cache(self, block: _Block) -> None:
        block.state = "free"
        insort(self.pools[block.small], (block.size, block.ptr))

    def _uncache(self, block: _Block) -> None:
        pool = self.pools[block.small]
        pool.pop(bisect_left(pool, (block.size, block.ptr)))

    def _best_fit(self, small: bool, size: int) -> _Block | None:
        """``get_free_block``: the first free block of the (size, address) order that fits.

        With expandable segments PyTorch then walks up that order while the next block's
        ``expandable_size`` (its size plus the unmapped range right after it, which it
        could grow into) is smaller than the current one's. Why it matters: the free
        block at the end of the mapped range is then passed over for any larger free
        hole, so the end stays free for big requests; taking the end instead (plain best
        fit) leaves a later big request less room there, and it maps more pages (one
        20 MiB page too many on zb-h1's device 1, against the real allocator on an H200).
        """
        pool = self.pools[small]
        at = bisect_left(pool, (size, -1))
        if at == len(pool):
            return None
        if self.expandable:
            while at + 1 < len(pool) and self._expandable_size(pool[at + 1][1]) < \
                    self._expandable_size(pool[at][1]):
                at += 1
        block = self.blocks[pool[at][1]]
        self._uncache(block)
        return block

    def _expandable_size(self, ptr: int) -> int:
        """``get_free_block``'s ``expandable_size``: the free block's size plus that of an
        unmapped block right after it (the room it could be grown into).

        Only the unmapped tail's size differs from PyTorch (``_ADDRESS_SPACE`` here, 1 1/8
        of the device memory there); either way it dwarfs every other candidate, so the
        walk takes the same steps.
        """
        block = self.blocks[ptr]
        nxt = block.next
        return block.size + (nxt.size if nxt is not None and nxt.state == "unmapped" else 0)

    # ----------------------------------------------------------------- malloc
    def malloc(self, size: int) -> int:
        """Serve a request of ``size`` bytes; raise :class:`AllocatorOOM` past capacity."""
        rounded = round_size(size)
        small = rounded <= K_SMALL_SIZE
        block = self._best_fit(small, rounded)
        if block is None:
            block = self._grow(small, rounded)
            if block is None:
                self._release_cached()
                block = self._grow(small, rounded)
            if block is None:
                raise AllocatorOOM(f"out of memory: {size} bytes requested with "
                                   f"{self.reserved} reserved of capacity {self.capacity}")
        remaining = block.size - rounded
        split = remaining >= K_MIN_BLOCK_SIZE if (small or self.expandable) \
            else remaining > K_SMALL_SIZE
        if split:
            rest = _Block(block.ptr + rounded, remaining, "free", small, block.segment)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = rounded
            self.blocks[rest.ptr] = rest
            self._cache(rest)
        block.state = "allocated"
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block.ptr

    def _fits(self, extra: int) -> bool:
        return self.capacity is None or self.reserved + extra <= self.capacity

    def _grow(self, small: bool, size: int) -> _Block | None:
        """A new segment (``cudaMalloc``) or newly mapped pages; None past capacity."""
        if self.expandable:
            return self._grow_expandable(small, size)
        alloc = allocation_size(size)
        if not self._fits(alloc):
            return None
        block = _Block(self._next_ptr, alloc, "free", small, self._next_ptr)
        self._next_ptr += alloc + K_LARGE_BUFFER
        self.blocks[block.ptr] = block
        self.segments += 1
        self._reserve(alloc)
        return block

    def _reserve(self, amount: int) -> None:
        self.reserved += amount
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _grow_expandable(self, small: bool, size: int) -> _Block | None:
        """Map pages so that a free run of at least ``size`` bytes exists; return it.

        Like ``find_expandable_block``: the lowest-address unmapped range, joined with a
        free block right before it, that has room.
        """
        if small not in self._es_head:
            base = self._next_ptr
            self._next_ptr += _ADDRESS_SPACE
            head = _Block(base, _ADDRESS_SPACE, "unmapped", small, base)
            self.blocks[base] = head
            self._es_head[small] = head
        page = self._page[small]
        block: _Block | None = self._es_head[small]
        while block is not None:
            if block.state == "unmapped":
                start = block.prev if block.prev is not None and block.prev.state == "free" \
                    else block
                room, walk = 0, start
                while walk is not None and walk.state != "allocated" and room < size:
                    room += walk.size
                    walk = walk.next
                if room >= size:
                    return self._map_run(start, size, page)
            block = block.next
        return None

    def _map_run(self, start: _Block, size: int, page: int) -> _Block | None:
        """Map whole pages of the unmapped blocks in the run from ``start`` until the run
        holds ``size`` bytes; return the run as one free block (out of the free list)."""
        pieces, room, walk = [], 0, start
        while room < size and walk is not None:
            if walk.state == "unmapped":
                take = min(walk.size, -(-(size - room) // page) * page)
                pieces.append((walk, take))
                room += take
            else:
                room += walk.size
            walk = walk.next
        if not self._fits(sum(take for _, take in pieces)):
            return None
        for block, take in pieces:
            if take < block.size:  # the rest stays unmapped address space
                rest = _Block(block.ptr + take, block.size - take, "unmapped", block.small,
                              block.segment)
                rest.prev, rest.next = block, block.next
                if block.next is not None:
                    block.next.prev = rest
                block.next = rest
                block.size = take
                self.blocks[rest.ptr] = rest
            self.segments += 1
            self._reserve(take)
            block.state = "free"
            self._cache(self._coalesce(block))
        merged = self.blocks[start.ptr]
        self._uncache(merged)
        return merged

    def _coalesce(self, block: _Block) -> _Block:
        """Merge ``block`` (free, not in a free list) with free neighbours; return it."""
        prev = block.prev
        if prev is not None and prev.state == "free":
            self._uncache(prev)
            self._absorb(prev, block)
            block = prev
        nxt = block.next
        if nxt is not None and nxt.state == "free":
            self._uncache(nxt)
            self._absorb(block, nxt)
        return block

    def _absorb(self, block: _Block, nxt: _Block) -> None:
        """Merge ``nxt`` (right after ``block``) into ``block``."""
        block.size += nxt.size
        block.next = nxt.next
        if nxt.next is not None:
            nxt.next.prev = block
        del self.blocks[nxt.ptr]

    # ------------------------------------------------------------------- free
    def free(self, ptr: int) -> None:
        """Return a block: it merges with free neighbours and goes back to its pool."""
        block = self.blocks.get(ptr)
        if block is None or block.state != "allocated":
            raise ValueError(f"free of unknown or free block {ptr}")
        self.allocated -= block.size
        block.state = "free"
        self._cache(self._coalesce(block))

    def _release_cached(self) -> None:
        """``release_cached_blocks``: give back every fully free segment (or, with
        expandable segments, unmap the whole pages inside free blocks)."""
        self.cache_flushes += 1
        for small in (True, False):
            for _, ptr in list(self.pools[small]):
                block = self.blocks[ptr]
                if self.expandable:
                    self._unmap_pages(block)
                elif block.prev is None and block.next is None:
                    self._uncache(block)
                    del self.blocks[ptr]
                    self.reserved -= block.size

    def _unmap_pages(self, block: _Block) -> None:
        page, base = self._page[block.small], block.segment
        lo = base + -(-(block.ptr - base) // page) * page
        hi = base + (block.ptr + block.size - base) // page * page
        if hi <= lo:
            return
        self._uncache(block)
        pieces = [(block.ptr, lo, "free"), (lo, hi, "unmapped"),
                  (hi, block.ptr + block.size, "free")]
        prev, nxt = block.prev, block.next
        del self.blocks[block.ptr]
        made = []
        for a, b, state in pieces:
            if b > a:
                piece = _Block(a, b - a, state, block.small, block.segment)
                self.blocks[a] = piece
                made.append(piece)
        for left, right in zip(made, made[1:]):
            left.next, right.prev = right, left
        made[0].prev, made[-1].next = prev, nxt
        if prev is not None:
            prev.next = made[0]
        else:
            self._es_head[block.small] = made[0]
        if nxt is not None:
            nxt.prev = made[-1]
        for piece in made:
            if piece.state == "free":
                self._cache(piece)
        # merge unmapped neighbours so the address space stays tidy
        middle = next(p for p in made if p.state == "unmapped")
        if middle.next is not None and middle.next.state == "unmapped":
            self._absorb(middle, middle.next)
        if middle.prev is not None and middle.prev.state == "unmapped":
            self._absorb(middle.prev, middle)
        self.reserved -= hi - lo


def replay(trace: Trace, capacity: int | None = None,
           expandable_segments: bool = False) -> AllocatorStats:
    """Run ``trace`` through the allocator model; frees before mallocs at equal times.

    Requests at the same moment are served in the trace's order. With ``capacity``, a
    request that cannot fit ends the replay and its buffer id is reported as ``oom``.
    """
    events = []
    for index, b in enumerate(trace.buffers):
        if b.end > b.start:
            events.append((b.start, 1, index))
            events.append((b.end, 0, index))
    events.sort()
    alloc = CachingAllocator(capacity, expandable_segments)
    handles: dict[int, int] = {}
    live = peak_live = 0
    oom = None
    for _, kind, index in events:
        buf = trace.buffers[index]
        if buf.size == 0:  # PyTorch serves empty tensors without touching the allocator
            continue
        if kind == 0:
            if index in handles:
                alloc.free(handles.pop(index))
            live -= buf.size
            continue
        live += buf.size
        peak_live = max(peak_live, live)
        try:
            handles[index] = alloc.malloc(buf.size)
        except AllocatorOOM:
            oom = buf.id
            break
    return AllocatorStats(peak_reserved=alloc.peak_reserved,
                          peak_allocated=alloc.peak_allocated, peak_requested=peak_live,
                          segments=alloc.segments, cache_flushes=alloc.cache_flushes,
                          oom=oom, expandable_segments=expandable_segments)
