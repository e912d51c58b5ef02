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


def test_expandable_best_fit_passes_over_the_free_end_of_the_mapped_range():
    """``get_free_block`` in CUDACachingAllocator.cpp, with expandable segments: after
    ``pool.blocks.lower_bound`` finds the smallest free block that fits, it walks up the
    (size, address) order while ``expandable_size(*next) < expandable_size(*it)``, where
    ``expandable_size(b) = b->size + (b->next && !b->next->mapped ? b->next->size : 0)``.
    The free block at the end of the mapped pages counts with all the unmapped address
    space after it, so any larger free hole is taken first and the end is kept for
    requests that need to grow into new pages. Plain best fit would put the 4 MiB request
    in the 8 MiB end and need two new pages for the 26 MiB one (60 MiB reserved)."""
    alloc = CachingAllocator(expandable_segments=True)
    a = alloc.malloc(10 * MiB)           # page 0: [0, 10) allocated
    alloc.malloc(2 * MiB)                # [10, 12); [12, 20) free, then unmapped space
    alloc.free(a)                        # a 10 MiB hole, kept off the end by the 2 MiB block
    assert alloc.malloc(4 * MiB) == a    # the hole, not the smaller 8 MiB free end
    alloc.malloc(26 * MiB)               # 8 MiB free end + 18 MiB: one new page
    assert alloc.reserved == 40 * MiB
    # the same through replay: 10 MiB freed at t=1, then 4 MiB at t=2 and 26 MiB at t=3
    stats = replay(trace((10 * MiB, 0, 1), (2 * MiB, 0, 9), (4 * MiB, 2, 9),
                         (26 * MiB, 3, 9)), expandable_segments=True)
    assert (stats.peak_reserved, stats.peak_allocated) == (40 * MiB, 32 * MiB)


# (trace, expandable_segments) -> (max_memory_reserved, max_memory_allocated) of the real
# CUDA caching allocator (torch 2.11.0+cu130 on an H200, scripts/bench_memplan.py --cuda)
CUDA_PEAKS = {
    ("1f1b.device0", False): (3623878656, 3439329280),
    ("1f1b.device1", False): (2717908992, 2566914048),
    ("zb-h1.device0", False): (3602907136, 3455169536),
    ("zb-h1.device1", False): (3548381184, 3396381696),
    ("interleaved-1f1b.device0", False): (5477761024, 4729224192),
    ("interleaved-1f1b.device1", False): (4076863488, 3850371072),
    ("1f1b.device0", True): (3439329280, 3439329280),
    ("1f1b.device1", True): (2579496960, 2566914048),
    ("zb-h1.device0", True): (3445620736, 3439405056),
    ("zb-h1.device1", True): (3384803328, 3372303360),
    ("interleaved-1f1b.device0", True): (4739563520, 4729224192),
    ("interleaved-1f1b.device1", True): (3858759680, 3850371072),
}


def cuda_problem():
    """The problem whose traces ran on the H200: interleaved 1F1B on an even split of
    each device's figures, as the cost model gave before its chunk profiles (search
    revision 5); ``scripts/bench_memplan.py --cuda`` replays the same."""
    from dataclasses import replace

    from optpipe import costmodel

    return replace(costmodel.build_problem("gpt3-1.3b", "h100-80gb", stages=4,
                                           microbatches=8), chunk_profiles=())


@pytest.fixture(scope="module")
def schedule_traces() -> dict[str, Trace]:
    """The traces of ``cuda_table()`` in scripts/bench_memplan.py, by name."""
    from optpipe.generators import generate
    from optpipe.memory.trace import traces_from_schedule

    problem = cuda_problem()
    traces = []
    for name in ("1f1b", "zb-h1", "interleaved-1f1b"):
        traces += traces_from_schedule(problem, generate(name, problem))[:2]
    return {t.name: t for t in traces}


def test_zb_h1_device1_expandable_matches_cuda(schedule_traces):
    """The row that plain best fit got one 20 MiB page too high (3405774848): the four
    3.2 MiB act_b buffers of microbatch 3 must go into the 19.2 MiB hole at the start of
    the large pool, not the 18.4 MiB free end, which the 18.3 MiB act_w buffers that
    follow then grow from (``get_free_block``'s ``expandable_size`` walk)."""
    stats = replay(schedule_traces["zb-h1.device1"], expandable_segments=True)
    assert (stats.peak_reserved, stats.peak_allocated) == (3384803328, 3372303360)


@pytest.mark.parametrize("name,expandable", sorted(CUDA_PEAKS))
def test_schedule_traces_match_the_cuda_allocator(schedule_traces, name, expandable):
    stats = replay(schedule_traces[name], expandable_segments=expandable)
    assert (stats.peak_reserved, stats.peak_allocated) == CUDA_PEAKS[name, expandable]
