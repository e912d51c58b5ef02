"""Point-to-point traffic between pipeline ranks, posted early and never deadlocking.

Every rank knows the whole schedule, so it knows every message it will receive, from
whom, and in which order its peer sends them. That gives the scheme:

* A message is identified by (kind, receiving stage, microbatch): the activation F
  sends downstream, or the input gradient B/BW sends upstream. Sends are ``isend``
  posted the moment the tensor exists and are never waited on during the step (only
  reaped when done, and all waited for at its end).
* Receives are ``irecv`` posted ahead, per incoming *channel* (one directed pair of
  ranks) in exactly the order the peer sends on it: by default every receive of the
  step is posted when the step starts; with a window, the next ones are posted as
  earlier ones are consumed, always in channel order.
* On gloo each message carries a unique tag, so matching never depends on order. On
  NCCL, which ignores tags and matches in order per communicator, each directed pair
  gets its own communicator, so in-order posting per channel is all matching needs and
  a receive waiting in one direction can never block a send in the other.

With sends never blocking and receives matched per channel, a rank only ever waits for
data that the schedule's dependencies guarantee will be produced, so any schedule the
simulator accepts (no cyclic wait) runs without deadlock. Every wait has a timeout; a
failure becomes an :class:`~optpipe.errors.OptPipeError` naming this rank, the peer and
the action that waited.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist

from optpipe.errors import OptPipeError
from optpipe.schedule import Action, Op, Schedule

ACT, GRAD = 0, 1


@dataclass(frozen=True)
class Message:
    """One tensor crossing a stage boundary, named by the stage that consumes it."""

    kind: int          # ACT (forward activation) or GRAD (input gradient)
    stage: int         # the stage that receives and uses it
    microbatch: int

    def describe(self) -> str:
        what = "activation" if self.kind == ACT else "output gradient"
        return f"the {what} for stage {self.stage}, microbatch {self.microbatch}"

    def tag(self, stages: int, microbatches: int) -> int:
        return (self.kind * stages + self.stage) * microbatches + self.microbatch


def produced_message(action: Action, stages: int) -> Message | None:
    """The message an action sends to a neighbouring stage, if any."""
    s, m = action.stage, action.microbatch
    if action.op is Op.F and s < stages - 1:
        return Message(ACT, s + 1, m)
    if action.op in (Op.B, Op.BW) and s > 0:
        return Message(GRAD, s - 1, m)
    return None


def needed_message(action: Action, stages: int) -> Message | None:
    """The message an action needs from a neighbouring stage, if any."""
    s, m = action.stage, action.microbatch
    if action.op is Op.F and s > 0:
        return Message(ACT, s, m)
    if action.op in (Op.B, Op.BW) and s < stages - 1:
        return Message(GRAD, s, m)
    return None


def source_stage(message: Message) -> int:
    return message.stage - 1 if message.kind == ACT else message.stage + 1


def channel_orders(schedule: Schedule) -> dict[tuple[int, int], list[Message]]:
    """(src device, dst device) -> the messages on that channel, in the sender's order."""
    orders: dict[tuple[int, int], list[Message]] = {}
    for src, actions in enumerate(schedule.actions):
        for action in actions:
            message = produced_message(action, schedule.stages)
            if message is None:
                continue
            dst = schedule.placement[message.stage]
            if dst != src:
                orders.setdefault((src, dst), []).append(message)
    return orders


_GROUPS: dict[tuple[Any, ...], Any] = {}


def subgroup(ranks: list[int], purpose: str) -> Any:
    """A process group over ``ranks`` (global ranks), created once per purpose and reused.

    Every rank of the world must call this in the same order (``new_group`` is
    collective); runners built one after another reuse their groups instead of opening
    new connections each time.
    """
    world = dist.group.WORLD
    key = (purpose, tuple(ranks))
    cached = _GROUPS.get(key)
    if cached is None or cached[0] is not world:   # new world after a re-init: new group
        cached = (world, dist.new_group(list(ranks)))
        _GROUPS[key] = cached
    return cached[1]


def _reason(exc: BaseException) -> str:
    """The first line of a backend error, without gloo's source-file prefix."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line.split("] ", 1)[-1][:200]


def wait_work(work: Any, timeout: float | None, describe: Callable[[str], str]) -> None:
    """Wait for a torch.distributed work item; a failure becomes one OptPipeError line.

    ``timeout=None`` (NCCL) waits the stream way — the CPU runs on and NCCL's own
    watchdog, set by ``init_process_group(timeout=...)``, catches a hang — because a
    timed wait would block the CPU until the GPU has the data, and with it all overlap.
    """
    started = time.monotonic()
    try:
        if timeout is None:
            work.wait()
            return
        ok = work.wait(timeout=timedelta(seconds=timeout))
    except Exception as exc:  # gloo raises on timeout and on a closed connection
        limit = f"timeout {timeout:g}s" if timeout is not None else "the group's timeout"
        raise OptPipeError(describe(f"failed after {time.monotonic() - started:.1f}s "
                                    f"({limit}): {_reason(exc)}")) from None
    if ok is False:
        raise OptPipeError(describe(f"timed out after {timeout:g}s"))


@dataclass
class _Send:
    """An isend in flight and what it keeps alive."""

    work: Any
    tensor: torch.Tensor
    key: int                                  # storage key of the tensor being read
    message: Message
    dst: int
    release: torch.UntypedStorage | None = None

    def done(self) -> None:
        if self.release is not None:
            self.release.resize_(0)
            self.release = None


class P2P:
    """The sends and receives of one rank for one schedule."""

    def __init__(self, schedule: Schedule, rank: int, group: Any, device: torch.device,
                 timeout: float | None, window: int | None) -> None:
        self.schedule = schedule
        self.rank = rank
        self.group = group
        self.device = device
        self.timeout = timeout
        self.window = window
        self.global_rank = [dist.get_global_rank(group, d) if group is not dist.group.WORLD
                            else d for d in range(schedule.devices)]
        orders = channel_orders(schedule)
        self.incoming = {src: msgs for (src, dst), msgs in orders.items() if dst == rank}
        self.source = {msg: src for src, msgs in self.incoming.items() for msg in msgs}
        self.channel_group: dict[tuple[int, int], Any] = {}
        backend = dist.get_backend(group)
        if backend == "nccl":
            # One communicator per directed pair (created in the same order everywhere).
            for pair in sorted(orders):
                ranks = sorted(self.global_rank[d] for d in pair)
                new = subgroup(ranks, f"p2p {self.global_rank[pair[0]]}->"
                                      f"{self.global_rank[pair[1]]}")
                if rank in pair:
                    self.channel_group[pair] = new
        self.shapes: Callable[[Message], tuple[torch.Size, torch.dtype]] | None = None
        self.posted: dict[Message, tuple[Any, torch.Tensor]] = {}
        self.next_post: dict[int, int] = {}
        self.sends: list[_Send] = []

    def _group(self, src: int, dst: int) -> Any:
        return self.channel_group.get((src, dst), self.group)

    # ------------------------------------------------------------------ steps
    def begin_step(self, shapes: Callable[[Message], tuple[torch.Size, torch.dtype]]) -> None:
        """Post the step's first receives (all of them unless a window is set)."""
        self.shapes = shapes
        self.posted.clear()
        self.next_post = {src: 0 for src in self.incoming}
        for src in self.incoming:
            self._post(src, self.window if self.window is not None else len(self.incoming[src]))

    def _post(self, src: int, count: int) -> None:
        msgs = self.incoming[src]
        S, M = self.schedule.stages, self.schedule.microbatches
        while count > 0 and self.next_post[src] < len(msgs):
            msg = msgs[self.next_post[src]]
            shape, dtype = self.shapes(msg)
            buffer = torch.empty(shape, dtype=dtype, device=self.device)
            try:
                work = dist.irecv(buffer, src=self.global_rank[src],
                                  group=self._group(src, self.rank), tag=msg.tag(S, M))
            except Exception as exc:
                raise OptPipeError(f"rank {self.rank}: cannot post the receive of "
                                   f"{msg.describe()} from rank {src} ({_reason(exc)}); is "
                                   f"rank {src} alive? After a failed step the runner "
                                   f"cannot be reused") from None
            self.posted[msg] = (work, buffer)
            self.next_post[src] += 1
            count -= 1

    def recv(self, message: Message, action: Action) -> torch.Tensor:
        """Wait for ``message`` (needed by ``action``) and return its tensor."""
        src = self.source[message]
        while message not in self.posted:   # windowed: post up to it, in channel order
            self._post(src, 1)
        work, buffer = self.posted.pop(message)
        wait_work(work, self.timeout, lambda why: (
            f"rank {self.rank}: {action} waited for {message.describe()} from rank {src} and "
            f"{why}; is rank {src} alive and running the same schedule?"))
        if self.window is not None:
            self._post(src, 1)
        return buffer

    def send(self, message: Message, tensor: torch.Tensor,
             release: torch.UntypedStorage | None = None) -> None:
        """Post ``tensor`` to the rank of ``message.stage``; never waits.

        ``release``: a storage nothing on this rank needs any more once the send is
        done (a stage output that no graph saved); it is emptied then, so the memory
        really is free even though the output tensor object lives on until backward.
        """
        dst = self.schedule.placement[message.stage]
        S, M = self.schedule.stages, self.schedule.microbatches
        tensor = tensor.detach().contiguous()
        try:
            work = dist.isend(tensor, dst=self.global_rank[dst],
                              group=self._group(self.rank, dst), tag=message.tag(S, M))
        except Exception as exc:
            raise OptPipeError(f"rank {self.rank}: cannot send {message.describe()} to rank "
                               f"{dst}: {_reason(exc)}; is rank {dst} alive?") from None
        self.sends.append(_Send(work, tensor, tensor.untyped_storage()._cdata, message, dst,
                                release))

    # -------------------------------------------------------- in-flight sends
    def reap(self) -> None:
        """Forget finished sends (so their tensors can be freed)."""
        if self.sends:
            still = []
            for send in self.sends:
                if send.work.is_completed():
                    send.done()
                else:
                    still.append(send)
            self.sends = still

    def busy(self, keys: Iterable[int]) -> set[int]:
        """Which of these storage keys an unfinished send still reads."""
        self.reap()
        keys = set(keys)
        return {s.key for s in self.sends if s.key in keys}

    def wait_storages(self, keys: Iterable[int]) -> None:
        """Wait for the sends reading these storages (safe only if receives are posted)."""
        keys = set(keys)
        for send in list(self.sends):
            if send.key in keys:
                self._wait_send(send)
        self.reap()

    def _wait_send(self, send: "_Send") -> None:
        wait_work(send.work, self.timeout, lambda why: (
            f"rank {self.rank}: sending {send.message.describe()} to rank {send.dst} {why}; "
            f"is rank {send.dst} alive and running the same schedule?"))

    def finish_step(self) -> None:
        """Wait for every send of the step (each peer posted its receives for them)."""
        for send in self.sends:
            self._wait_send(send)
            send.done()
        self.sends.clear()
        if self.posted:  # cannot happen for a valid schedule: every receive is consumed
            left = ", ".join(m.describe() for m in self.posted)
            raise OptPipeError(f"rank {self.rank}: the step ended with receives never used "
                               f"({left})")


class LocalMailbox:
    """Messages between stages that live in the same process: a dict, no copies."""

    def __init__(self) -> None:
        self.box: dict[Message, torch.Tensor] = {}

    def put(self, message: Message, tensor: torch.Tensor) -> None:
        self.box[message] = tensor

    def take(self, message: Message) -> torch.Tensor:
        return self.box.pop(message)

    def has(self, message: Message) -> bool:
        return message in self.box
