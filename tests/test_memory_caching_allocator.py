"""The caching-allocator model on hand-made traces whose answers follow from the rules of
c10/cuda/CUDACachingAllocator.cpp (see docs/memory.md)."""

from __future__ import annotations

import pytest

from optpipe.memory.caching_allocator import (K_LARGE_BUFFER, K_MIN_BLOCK_SIZE,
                                              K_SMALL_BUFFER, AllocatorOOM,
                                              CachingAllocator, allocation_size, replay,
                                              round_size)
from optpipe.memory.trace import Buffer, Trace

KiB, MiB = 2**10, 2**20


def trace(*items: tuple[int, float, float]) -> Trace:
    return Trace([Buffer(f"b{k}", size, start, end) for k, (size, start, end) in
                  enumerate(items)])


def test_constants_are_pytorchs():
    assert (K_MIN_BLOCK_SIZE, K_SMALL_BUFFER, K_LARGE_BUFFER) == (512, 2 * MiB, 20 * MiB)
    assert round_size(1) == 512 and round_size(513) == 1024 and round_size(1024) == 1024
    assert allocation_size(MiB) == 2 * MiB            # small pool
    assert allocation_size(MiB + 512) == 20 * MiB     # 1..10 MiB share 20 MiB segments
    assert allocation_size(10 * MiB) == 10 * MiB      # >= 10 MiB: rounded to 2 MiB
    assert allocation_size(11 * MiB) == 12 * MiB


def test_tiny_request_rounds_to_512_in_a_2mib_segment():
    stats = replay(trace((1, 0, 1)))
    assert (stats.peak_reserved, stats.peak_allocated, stats.peak_requested) == \
        (2 * MiB, 512, 1)
    assert stats.fragmentation == pytest.approx(1 - 512 / (2 * MiB))


def test_small_pool_packs_four_512k_requests_per_segment():
    stats = replay(trace(*[(512 * KiB, 0, 1)] * 5))
    assert stats.peak_reserved == 4 * MiB and stats.segments == 2
    assert stats.peak_allocated == 5 * 512 * KiB


def test_large_split_needs_more_than_1mib_left():
    alloc = CachingAllocator()
    alloc.malloc(19 * MiB)               # 20 MiB segment, 1 MiB left: not split
    assert alloc.allocated == 20 * MiB
    alloc2 = CachingAllocator()
    alloc2.malloc(18 * MiB + 512)        # 20 MiB segment, >1 MiB left: split
    assert alloc2.allocated == 18 * MiB + 512
    alloc2.malloc(MiB + 512)             # fits the remainder: no new segment
    assert alloc2.reserved == 20 * MiB and alloc2.segments == 1


def test_small_split_keeps_remainders_of_512_bytes():
    alloc = CachingAllocator()
    alloc.malloc(2 * MiB - 512)          # small? no: > 1 MiB is large pool
    assert alloc.reserved == 20 * MiB
    small = CachingAllocator()
    small.malloc(MiB)
    small.malloc(MiB - 512)
    small.malloc(512)                    # exactly the last 512 bytes of the segment
    assert small.reserved == 2 * MiB and small.allocated == 2 * MiB


def test_best_fit_picks_the_smallest_free_block():
    alloc = CachingAllocator()
    a = alloc.malloc(12 * MiB)           # own 12 MiB segment
    b = alloc.malloc(16 * MiB)           # own 16 MiB segment
    alloc.free(b)
    alloc.free(a)
    again = alloc.malloc(11 * MiB)       # both fit; the 12 MiB block is the best fit
    assert again == a and alloc.reserved == 28 * MiB
    assert alloc.allocated == 12 * MiB   # 1 MiB left is not split off


def test_freed_neighbours_merge_within_a_segment():
    alloc = CachingAllocator()
    blocks = [alloc.malloc(6 * MiB) for _ in range(3)]   # one 20 MiB segment
    assert alloc.reserved == 20 * MiB
    alloc.free(blocks[0])
    alloc.free(blocks[1])
    alloc.malloc(12 * MiB)               # the merged 12 MiB block serves it
    assert alloc.reserved == 20 * MiB and alloc.segments == 1


def test_holes_too_small_force_a_new_segment():
    # four 4 MiB blocks in one segment; free the 1st and 3rd: 8 MiB free but in 4 MiB holes
    items = [(4 * MiB, 0, 10), (4 * MiB, 0, 20), (4 * MiB, 0, 10), (4 * MiB, 0, 20),
             (6 * MiB, 15, 20)]
    stats = replay(trace(*items))
    assert stats.peak_requested == 16 * MiB
    assert stats.peak_reserved == 40 * MiB
    assert stats.peak_allocated == 16 * MiB


def test_blocks_of_different_segments_do_not_merge():
    alloc = CachingAllocator()
    a = alloc.malloc(10 * MiB)           # own 10 MiB segment
    b = alloc.malloc(10 * MiB)           # another
    alloc.free(a)
    alloc.free(b)
    alloc.malloc(20 * MiB)
    assert alloc.reserved == 40 * MiB


def test_frees_come_before_allocations_at_equal_times():
    stats = replay(trace((12 * MiB, 0, 5), (12 * MiB, 5, 9)))
    assert stats.peak_reserved == 12 * MiB


def test_out_of_memory_releases_free_segments_and_retries():
    alloc = CachingAllocator(capacity=40 * MiB)
    a, b = alloc.malloc(12 * MiB), alloc.malloc(12 * MiB)
    alloc.free(a)
    alloc.free(b)
    alloc.malloc(30 * MiB)               # 24 + 30 > 40: release both, then fit
    assert alloc.reserved == 30 * MiB and alloc.cache_flushes == 1


def test_out_of_memory_is_reported_by_replay():
    stats = replay(trace((30 * MiB, 0, 2), (20 * MiB, 1, 3)), capacity=40 * MiB)
    assert stats.oom == "b1"
    with pytest.raises(AllocatorOOM):
        CachingAllocator(capacity=MiB).malloc(100)


def test_expandable_segments_map_pages_of_the_pool():
    stats = replay(trace((100, 0, 1), (5 * MiB, 0, 1)), expandable_segments=True)
    assert stats.peak_reserved == 2 * MiB + 20 * MiB
    alloc = CachingAllocator(expandable_segments=True)
    blocks = [alloc.malloc(12 * MiB) for _ in range(3)]
    assert alloc.reserved == 40 * MiB    # 36 MiB in pages of 20 MiB
    for block in blocks:
        alloc.free(block)
    alloc.malloc(30 * MiB)               # one free run: no new pages
    assert alloc.reserved == 40 * MiB


def test_expandable_segments_avoid_the_hole_problem():
    items = [(4 * MiB, 0, 10), (4 * MiB, 0, 20), (4 * MiB, 0, 10), (4 * MiB, 0, 20),
             (6 * MiB, 15, 20)]
    stats = replay(trace(*items), expandable_segments=True)
    assert stats.peak_reserved == 40 * MiB  # 16 MiB used + 6 MiB at the end: two pages
    small = replay(trace(*[(4 * MiB, 0, 10)] * 5), expandable_segments=True)
    assert small.peak_reserved == 20 * MiB  # 20 MiB exactly, no waste


def test_expandable_out_of_memory_unmaps_free_pages():
    alloc = CachingAllocator(capacity=60 * MiB, expandable_segments=True)
    a = alloc.malloc(20 * MiB)           # page 0
    alloc.malloc(20 * MiB)               # page 1
    alloc.free(a)                        # page 0 free but mapped
    alloc.malloc(40 * MiB)               # 2 new pages would make 80 MiB: unmap page 0
    assert alloc.cache_flushes == 1
    assert alloc.reserved == 60 * MiB and alloc.peak_reserved == 60 * MiB
    # pinned between allocated blocks, a larger request has nowhere to go
    with pytest.raises(AllocatorOOM):
        alloc.malloc(30 * MiB)
