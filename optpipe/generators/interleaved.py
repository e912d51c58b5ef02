"""Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM), fused backward.

Each device holds ``v`` model chunks (stage ``s`` on device ``s mod D``), so the pipeline
fills ``v`` times faster and the bubble shrinks by ``v``: with uniform stages and no
latency the makespan is ``M(F+B+W) + (D-1)(F+B+W)/v`` (F, B, W being the *base*
per-device times; the simulator splits them over the chunks).

Megatron walks microbatches in groups of D: forwards go chunk 0 of the group, chunk 1 of
the group, ..., then the next group; backwards the same with chunks reversed. Device d
warms up with ``2(D-d-1) + (v-1)D`` forwards, then alternates one forward and one
backward. Megatron requires ``M % D == 0``; here other M are accepted by building the
order for M rounded up to a multiple of D and dropping the phantom microbatches (see
:func:`interleaved_orders`), at the price of some extra bubble in the last group. Warm-up
is capped at the total work, so small M degrades to all forwards, then all backwards, on
the first devices.
"""

from __future__ import annotations

from optpipe.errors import OptPipeError
from optpipe.generators.base import Order, build, require_base
from optpipe.problem import Problem
from optpipe.schedule import Schedule, interleaved_placement


def _virtual_sequence(devices: int, chunks: int, microbatches: int, backward: bool
                      ) -> list[tuple[int, int]]:
    """(chunk, microbatch) in the order Megatron runs them on every device."""
    sequence = []
    for first in range(0, microbatches, devices):
        group = range(first, min(first + devices, microbatches))
        order = range(chunks - 1, -1, -1) if backward else range(chunks)
        sequence += [(c, m) for c in order for m in group]
    return sequence


def interleaved_orders(devices: int, chunks: int, microbatches: int) -> list[Order]:
    """Per-device orders; stage of chunk c on device d is ``c * devices + d``.

    When D does not divide M the orders are built for M rounded up to a multiple of D
    and the phantom microbatches are then dropped: removing actions (and their
    dependencies) from a deadlock-free set of orders cannot create a cyclic wait, whereas
    simply shortening the last group can (its warm-up then reaches into forwards that
    wait on the last device's backward).
    """
    padded = -(-microbatches // devices) * devices
    forward = _virtual_sequence(devices, chunks, padded, backward=False)
    backward = _virtual_sequence(devices, chunks, padded, backward=True)
    total = len(forward)
    orders = []
    for d in range(devices):
        warmup = min(total, 2 * (devices - d - 1) + (chunks - 1) * devices)
        order: Order = [("F", c * devices + d, m) for c, m in forward[:warmup]]
        for k in range(total - warmup):
            c, m = forward[warmup + k]
            order.append(("F", c * devices + d, m))
            c, m = backward[k]
            order.append(("BW", c * devices + d, m))
        for c, m in backward[total - warmup:]:
            order.append(("BW", c * devices + d, m))
        orders.append([a for a in order if a[2] < microbatches])
    return orders


def chunks_problem(chunks: object) -> str | None:
    """Why ``chunks`` is not a usable chunk count, or None when it is."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 2:
        return (f"interleaved-1f1b needs chunks to be an integer of at least 2, got "
                f"{chunks!r} (one chunk per device is plain 1f1b)")
    return None


def interleaved_1f1b(problem: Problem, chunks: int = 2) -> Schedule:
    """Megatron's interleaved 1F1B with ``chunks`` model chunks per device (default 2)."""
    require_base(problem, "interleaved-1f1b")
    reason = chunks_problem(chunks)
    if reason:
        raise OptPipeError(reason)
    placement = interleaved_placement(problem.devices, chunks)
    return build("interleaved-1f1b", placement, problem.microbatches,
                 interleaved_orders(problem.devices, chunks, problem.microbatches),
                 chunks=chunks)
