"""OptPipeRunner: run any valid optpipe Schedule as a training step with torch.distributed.

The schedule decides everything about the order of work; the runner only executes it:

* the model is cut into ``schedule.stages`` stages (:mod:`optpipe.runtime.partition`);
  each rank builds only the stages that ``schedule.placement`` puts on its device;
* each rank runs exactly the actions of its device, in list order; sends are posted the
  moment their tensor exists, receives ahead of need (:mod:`optpipe.runtime.comm`);
* without a process group and without ``torch.distributed`` initialized, one process
  holds every stage and runs all devices' action lists interleaved in a valid order
  (guided by the simulator's start times), for debugging, profiling and one-GPU runs.

``loss = runner.step(inputs, targets)`` zeroes the local stages' gradients, splits the
batch into ``schedule.microbatches`` equal microbatches, runs the step and leaves in
every ``.grad`` the gradient of the mean microbatch loss — which equals the full-batch
loss's gradient for a mean-reduced loss. Tied parameters held by stages on different
ranks get their gradients summed across those ranks. The optimizer step is the user's.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from optpipe.errors import InvalidScheduleError, OptPipeError
from optpipe.problem import uniform_problem
from optpipe.runtime.activations import ActivationTracker, DeviceLedger
from optpipe.runtime.comm import (ACT, GRAD, LocalMailbox, Message, P2P, needed_message,
                                  subgroup, wait_work)
from optpipe.runtime.offload import Offloader
from optpipe.runtime.partition import StagePlan, split_model
from optpipe.runtime.record import LANES, Clock, MeasuredAction, StepRecord
from optpipe.runtime.stage import StageWorker
from optpipe.schedule import Action, Op, Schedule
from optpipe.simulator import COMPUTE, dependency_function, simulate

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
           torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]


def _none_busy(keys: set[int]) -> set[int]:
    return set()


def check_runnable(schedule: Schedule) -> list[tuple[int, Action]]:
    """Validate ``schedule`` and return one valid single-process execution order.

    The simulator (on a uniform problem) rejects schedules whose devices would wait on
    each other in a cycle, naming the actions — the runtime then never starts a step
    that could hang. The order follows the simulated start times among the actions that
    are ready, so a one-process run interleaves devices like a real pipeline.
    """
    schedule.validate()
    sim = simulate(uniform_problem(schedule.devices, schedule.microbatches, p2p=0.0),
                   schedule)
    start = {(r.device, r.action.key): r.start for r in sim.records}
    deps = dependency_function(schedule)

    pointer = [0] * schedule.devices
    done: set[tuple[Op, int, int]] = set()
    order: list[tuple[int, Action]] = []
    total = sum(len(acts) for acts in schedule.actions)
    while len(order) < total:
        best = None
        for d, acts in enumerate(schedule.actions):
            if pointer[d] < len(acts):
                a = acts[pointer[d]]
                if all(k in done for k in deps(a)):
                    key = (start[(d, a.key)], d)
                    if best is None or key < best[0]:
                        best = (key, d, a)
        if best is None:  # the simulator accepted it, so this cannot happen
            raise InvalidScheduleError(f"schedule '{schedule.name}' has no runnable order")
        _, d, a = best
        order.append((d, a))
        done.add(a.key)
        pointer[d] += 1
    return order


def schedule_fingerprint(schedule: Schedule, partition: Sequence[int]) -> int:
    """A 62-bit hash of what every rank must agree on: actions, placement, partition."""
    data = json.dumps([schedule.to_dict()["actions"], schedule.placement,
                       schedule.microbatches, list(partition)], separators=(",", ":"))
    return int(hashlib.sha256(data.encode()).hexdigest()[:15], 16)


class OptPipeRunner:
    """Execute a :class:`~optpipe.schedule.Schedule` as pipeline-parallel training steps.

    Parameters
    ----------
    model:
        an ``nn.Sequential`` or a model following the protocol of
        :mod:`optpipe.runtime.partition` (``pre`` / ``blocks`` / ``post``).
    schedule:
        any schedule the simulator accepts.
    loss_fn:
        ``loss_fn(output, target)`` of one microbatch, mean-reduced.
    partition:
        blocks per stage, or ``"compute"`` (default) / ``"params"`` for a balanced cut.
    device:
        where this rank's stages run; default: ``cuda:LOCAL_RANK`` under NCCL, else the
        model's device.
    process_group:
        the pipeline's group (one rank per schedule device, rank = device index);
        default: the world if ``torch.distributed`` is initialized, else one process.
    microbatches:
        optional check: the microbatch count the caller expects.
    timeout:
        seconds any single wait may take before it becomes an error.
    recv_window:
        receives posted ahead per incoming channel; ``None`` posts the whole step's at
        its start (most overlap; the default on CPU), ``"auto"`` picks ``None`` on CPU
        and 2 on CUDA (receive buffers are memory).
    broadcast_loss:
        return the loss on every rank (one small broadcast per step) instead of only on
        the rank of the last stage.
    free_after_b:
        after a split B, free the saved tensors that the stage's W will not read (learned
        from the stage's first W; see ``ActivationTracker.drop_after_b``), so B releases
        memory as zero-bubble schedules assume. Needs a deterministic stage forward.
    arena:
        ``None`` (default): kept activations stay where autograd made them. ``True``:
        measure the kept bytes on the first step(s), plan them with the memory planner
        over the simulated schedule and, from then on, copy every saved tensor into one
        :class:`~optpipe.memory.arena.Arena` per device at its planned offset
        (:mod:`optpipe.runtime.arena_store`). A dict ``{device: Plan}`` uses those plans
        (ids as :func:`~optpipe.memory.trace.traces_from_schedule` names them; the
        layout is still measured). See :meth:`arena_stats`.
    arena_spare:
        extra bytes at the end of each arena for storages the plan did not foresee.
    """

    def __init__(self, model: nn.Module, schedule: Schedule, loss_fn: LossFn | None = None,
                 partition: Sequence[int] | str | None = None,
                 device: torch.device | str | None = None, process_group: Any = None, *,
                 microbatches: int | None = None, timeout: float = 300.0,
                 recv_window: int | str | None = "auto", broadcast_loss: bool = True,
                 free_after_b: bool = True, arena: Any = None, arena_spare: int = 0) -> None:
        self.schedule = schedule
        self.order = check_runnable(schedule)
        if microbatches is not None and microbatches != schedule.microbatches:
            raise OptPipeError(f"schedule '{schedule.name}' is for {schedule.microbatches} "
                               f"microbatches but the runner was asked for {microbatches}; "
                               f"generate the schedule with {microbatches} microbatches")
        S, D = schedule.stages, schedule.devices
        self.plan: StagePlan = split_model(model, S, partition)
        self.loss_fn = loss_fn
        self.timeout = float(timeout)
        self.broadcast_loss = broadcast_loss
        self.free_after_b = free_after_b
        if arena is not None and arena is not True and arena is not False and \
                not isinstance(arena, dict):
            raise OptPipeError(f"arena must be None, True or a dict of plans per device, "
                               f"got {type(arena).__name__}")
        self.arena_mode = arena if arena not in (None, False) else None
        self.arena_spare = int(arena_spare)
        self.arena_store: Any = None
        self.arena_problem: Any = None
        self.arena_plans: dict[int, Any] = {}
        self._arena_measuring = False
        self._arena_steps = 0

        if process_group is not None and not dist.is_initialized():
            raise OptPipeError("a process_group was given but torch.distributed is not "
                               "initialized; call init_process_group first")
        if process_group is None and dist.is_available() and dist.is_initialized():
            process_group = dist.group.WORLD
        self.group = process_group
        self.distributed = process_group is not None
        if self.distributed:
            world = dist.get_world_size(process_group)
            if world != D:
                raise OptPipeError(f"schedule '{schedule.name}' is for {D} devices but the "
                                   f"process group has {world} ranks; launch {D} processes "
                                   f"or use a schedule for {world} devices")
            self.rank: int | None = dist.get_rank(process_group)
            self.local_devices = [self.rank]
            self.backend = dist.get_backend(process_group)
        else:
            self.rank = None
            self.local_devices = list(range(D))
            self.backend = None
        self.local_stages = [s for s in range(S) if schedule.placement[s] in self.local_devices]
        self.device = self._resolve_device(device)
        # NCCL waits are stream waits (see comm.wait_work); its watchdog handles hangs
        self.wait_timeout: float | None = None if self.backend == "nccl" else self.timeout
        for s in self.local_stages:
            self.plan.modules[s].to(self.device)

        self.tracker = ActivationTracker()
        self.workers = {s: StageWorker(self.plan.modules[s], S, schedule.microbatches, loss_fn,
                                       self.tracker) for s in self.local_stages}
        self.ledgers = {d: DeviceLedger() for d in self.local_devices}
        self.mailbox = LocalMailbox()
        if recv_window == "auto":
            recv_window = 2 if self.device.type == "cuda" else None
        if recv_window is not None and (not isinstance(recv_window, int) or recv_window < 1):
            raise OptPipeError(f"recv_window must be a positive integer, None or 'auto', got "
                               f"{recv_window!r}")
        self.p2p: P2P | None = None
        if self.distributed:
            self.p2p = P2P(schedule, self.rank, process_group, self.device, self.wait_timeout,
                           recv_window)
        self.offloader = Offloader(
            self.device,
            busy=self.p2p.busy if self.p2p else None,
            wait=self.p2p.wait_storages if self.p2p else None,
            can_wait=recv_window is None)
        self.clock = Clock(self.device)
        self.boundary: dict[int, tuple[torch.Size, torch.dtype]] = {}
        self._signature: Any = None
        self._targets: list[Any] = []
        self._inputs: list[Any] = []
        self._recording = False
        self._measured: list[MeasuredAction] = []
        self.last_record: StepRecord | None = None
        self.leftover: dict[tuple[int, int], int] = {}
        self.tied_groups: list[tuple[list[nn.Parameter], Any]] = []
        if self.distributed:
            self._check_same_plan()
            self._build_tied_groups()

    # ------------------------------------------------------------------ set-up
    def _resolve_device(self, device: torch.device | str | None) -> torch.device:
        if device is not None:
            return torch.device(device)
        if self.backend == "nccl":
            local = int(os.environ.get("LOCAL_RANK", self.rank % torch.cuda.device_count()))
            return torch.device("cuda", local)
        for s in self.local_stages:
            for p in self.plan.modules[s].parameters():
                return p.device
        return torch.device("cpu")

    def _collective_tensor(self, values: Sequence[int]) -> torch.Tensor:
        device = self.device if self.backend == "nccl" else torch.device("cpu")
        return torch.tensor(list(values), dtype=torch.int64, device=device)

    def _check_same_plan(self) -> None:
        """Every rank must run the same schedule and partition, or steps would hang."""
        mine = self._collective_tensor([schedule_fingerprint(self.schedule,
                                                             self.plan.partition)])
        world = self.schedule.devices
        everyone = [torch.zeros_like(mine) for _ in range(world)]
        work = dist.all_gather(everyone, mine, group=self.group, async_op=True)
        wait_work(work, self.wait_timeout, lambda why: (
            f"rank {self.rank}: comparing schedules with the other ranks {why}"))
        values = [int(t.item()) for t in everyone]
        if len(set(values)) > 1:
            odd = [r for r, v in enumerate(values) if v != values[0]]
            raise OptPipeError(f"rank {self.rank}: ranks {odd} run a different schedule or "
                               f"partition than rank 0; every rank must get the same "
                               f"schedule '{self.schedule.name}' and partition")

    def _build_tied_groups(self) -> None:
        """A group per set of ranks sharing a parameter (tied embeddings), same order everywhere."""
        by_ranks: dict[tuple[int, ...], list[nn.Parameter]] = {}
        for param, stages in self.plan.shared:
            ranks = tuple(sorted({self.schedule.placement[s] for s in stages}))
            if len(ranks) > 1:
                by_ranks.setdefault(ranks, []).append(param)
        for ranks, params in sorted(by_ranks.items()):
            members = [dist.get_global_rank(self.group, r) if self.group is not dist.group.WORLD
                       else r for r in ranks]
            group = subgroup(members, "tied")
            if self.rank in ranks:
                self.tied_groups.append((params, group))

    # ----------------------------------------------------------------- queries
    def parameters(self) -> Iterator[nn.Parameter]:
        """The parameters of this rank's stages (each once): what its optimizer updates."""
        seen: set[int] = set()
        for s in self.local_stages:
            for p in self.plan.modules[s].parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's parameters under their names in the original model."""
        for p in self.parameters():
            yield self.plan.names.get(id(p), f"param{id(p)}"), p

    @property
    def stage_modules(self) -> dict[int, nn.Module]:
        return {s: self.plan.modules[s] for s in self.local_stages}

    # -------------------------------------------------------------------- step
    def step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None = None,
             record: bool = False) -> float | None:
        """One training step over all microbatches; returns the mean microbatch loss.

        ``inputs`` is needed on the rank of stage 0 and ``targets`` on the rank of the
        last stage (other ranks may pass None). With ``record`` the step's measured
        actions and memory are in :attr:`last_record` on every rank.
        """
        S = self.schedule.stages
        self._inputs = self._split(inputs, "inputs") if 0 in self.local_stages else []
        self._targets = (self._split(targets, "targets") if S - 1 in self.local_stages
                         else [])
        for p in self.parameters():
            p.grad = None
        self.tracker.set_static(self.plan.modules[s] for s in self.local_stages)
        self.tracker.reset()
        self._arena_begin()
        for ledger in self.ledgers.values():
            ledger.reset()
        if self.distributed:
            self._ensure_shapes()
        self._recording = record
        self._measured = []
        if record:
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            if self.distributed:
                self._align()
        self.clock.start()
        started = time.perf_counter()
        if self.p2p is not None:
            self.p2p.begin_step(self._message_shape)
        try:
            if self.distributed:
                for action in self.schedule.actions[self.rank]:
                    self._execute(self.rank, action)
            else:
                for device, action in self.order:
                    self._execute(device, action)
            if self.p2p is not None:
                self.p2p.finish_step()
            for store in self.offloader.finish():
                self.ledgers[store.device].charge(store, self._mark())
            self._sum_tied_grads()
        finally:
            self._inputs, self._targets = [], []
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        step_time = time.perf_counter() - started
        self.leftover = self.tracker.leftover()
        self._arena_end()
        loss = self._loss()
        if record:
            self.last_record = self._build_record(step_time, loss)
        self._recording = False
        return loss

    def _split(self, batch: torch.Tensor | None, what: str) -> list[torch.Tensor]:
        M = self.schedule.microbatches
        if batch is None:
            raise OptPipeError(f"this rank runs stage "
                               f"{0 if what == 'inputs' else self.schedule.stages - 1} and "
                               f"needs the {what}")
        if not isinstance(batch, torch.Tensor):
            raise OptPipeError(f"{what} must be one tensor (batch first), got "
                               f"{type(batch).__name__}")
        size = batch.shape[0] if batch.dim() else 0
        if size == 0 or size % M:
            raise OptPipeError(f"a batch of {size} cannot be split into {M} equal "
                               f"microbatches (schedule '{self.schedule.name}'); use a batch "
                               f"size that is a multiple of {M}")
        # own copies: a microbatch is a view of the caller's batch, and what a stage saves
        # must be its own to offload (an OFFLOAD empties the storage)
        return [t.to(self.device, copy=True) for t in batch.split(size // M)]

    # --------------------------------------------------------------- shapes
    def _message_shape(self, message: Message) -> tuple[torch.Size, torch.dtype]:
        return self.boundary[message.stage - 1 if message.kind == ACT else message.stage]

    def _ensure_shapes(self) -> None:
        """Learn every stage-boundary shape once (a no-grad pass along the pipeline).

        Receives are posted before data exists, so their buffers' shapes must be known:
        the first step runs each local stage once without autograd (RNG state and train
        mode restored), passing the output shape to the next stage's rank. Later steps
        must use the same microbatch shape.
        """
        sig = (tuple(self._inputs[0].shape), self._inputs[0].dtype) if self._inputs else None
        if self._signature is not None:
            if sig is not None and sig != self._signature:
                raise OptPipeError(f"microbatch shape changed from {self._signature[0]} to "
                                   f"{sig[0]}; a runner keeps the shapes of its first step, "
                                   f"build a new runner for new shapes")
            return
        S = self.schedule.stages
        placement = self.schedule.placement
        outputs: dict[int, torch.Tensor] = {}
        sends = []
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            for s in self.local_stages:
                module = self.plan.modules[s]
                if s == 0:
                    x = self._inputs[0]
                elif placement[s - 1] == self.rank:
                    x = outputs[s - 1]
                else:
                    shape, dtype = self._recv_header(s, placement[s - 1])
                    self.boundary[s - 1] = (shape, dtype)
                    x = torch.zeros(shape, dtype=dtype, device=self.device)
                if s > 0 and not x.is_floating_point():
                    raise OptPipeError(f"stage {s} receives a {x.dtype} tensor; only stage 0 "
                                       f"may take non-float inputs (gradients flow through "
                                       f"every later boundary)")
                modes = [(m, m.training) for m in module.modules()]
                module.eval()
                try:
                    out = module(x)
                finally:
                    for m, mode in modes:
                        m.training = mode
                if not isinstance(out, torch.Tensor):
                    raise OptPipeError(f"stage {s} returned a {type(out).__name__}; a stage "
                                       f"boundary carries exactly one tensor")
                if s < S - 1:
                    self.boundary[s] = (out.shape, out.dtype)
                    outputs[s] = out
                    if placement[s + 1] != self.rank:
                        sends.append(self._send_header(s, placement[s + 1], out))
        for work, dst in sends:
            wait_work(work, self.wait_timeout, lambda why: (
                f"rank {self.rank}: sending a stage-boundary shape to rank {dst} {why}"))
        self._signature = sig if sig is not None else ("any",)

    def _header_tag(self, stage: int) -> int:
        S, M = self.schedule.stages, self.schedule.microbatches
        return 2 * S * M + stage

    def _send_header(self, stage: int, dst: int, out: torch.Tensor) -> tuple[Any, int]:
        if out.dim() > 8 or out.dtype not in _DTYPES:
            raise OptPipeError(f"stage {stage}'s output ({out.dtype}, {out.dim()} dims) cannot "
                               f"cross a stage boundary")
        header = [out.dim(), _DTYPES.index(out.dtype)] + list(out.shape) + [0] * (8 - out.dim())
        tensor = self._collective_tensor(header)
        work = dist.isend(tensor, dst=self._global(dst), group=self.group,
                          tag=self._header_tag(stage))
        return work, dst

    def _recv_header(self, stage: int, src: int) -> tuple[torch.Size, torch.dtype]:
        header = self._collective_tensor([0] * 10)
        work = dist.irecv(header, src=self._global(src), group=self.group,
                          tag=self._header_tag(stage - 1))
        wait_work(work, self.wait_timeout, lambda why: (
            f"rank {self.rank}: waiting for the output shape of stage {stage - 1} from rank "
            f"{src} {why}; is rank {src} alive and running the same schedule?"))
        values = header.tolist()
        return torch.Size(values[2:2 + values[0]]), _DTYPES[values[1]]

    def _global(self, device: int) -> int:
        if self.group is dist.group.WORLD:
            return device
        return dist.get_global_rank(self.group, device)

    # ----------------------------------------------------------------- actions
    def _mark(self) -> Any:
        return self.clock.mark() if self._recording else None

    def _take(self, message: Message, action: Action) -> torch.Tensor:
        if self.mailbox.has(message):
            return self.mailbox.take(message)
        if self.p2p is None or message not in self.p2p.source:
            raise OptPipeError(f"{action} needs {message.describe()}, which was never "
                               f"produced before it on this rank")  # excluded by check_runnable
        return self.p2p.recv(message, action)

    def _deliver(self, message: Message, tensor: torch.Tensor) -> None:
        dst = self.schedule.placement[message.stage]
        saved = message.kind == ACT and self.tracker.is_saved(tensor)
        if dst in self.local_devices:
            if message.kind == ACT:
                # the next stage's input must not share a storage this stage saved:
                # each (stage, microbatch) then owns what it keeps, and offloads alone
                tensor = tensor.detach().clone() if saved else tensor.detach()
            self.mailbox.put(message, tensor)
        else:
            release = None
            if message.kind == ACT and not saved:
                release = tensor.untyped_storage()
            self.p2p.send(message, tensor, release)

    def _execute(self, device: int, action: Action) -> None:
        S = self.schedule.stages
        s, m, op = action.stage, action.microbatch, action.op
        store = self.tracker.store(s, m, device)
        ledger = self.ledgers[device]
        lane = COMPUTE
        moved = 0
        left = -1
        self.tracker.phase = op.value
        slots = self.arena_store
        if op is Op.F:
            x = self._inputs[m] if s == 0 else self._take(Message(ACT, s, m), action)
            start = self._mark()
            if slots is not None:
                slots.begin_forward(device, s, m)
            out = self.workers[s].forward(m, x, self._targets[m] if s == S - 1 else None, store)
            if slots is not None and x.untyped_storage()._cdata in self.tracker.copied:
                x.untyped_storage().resize_(0)    # its bytes are in the arena now
            end = self._mark()
            delta = ledger.charge(store, start)
            if s < S - 1:
                self._deliver(Message(ACT, s + 1, m), out)
        elif op in (Op.B, Op.BW):
            needed = needed_message(action, S)
            grad = None if needed is None else self._take(needed, action)
            self.offloader.before_backward(store)
            start = self._mark()
            worker = self.workers[s]
            if op is Op.B:
                dx = worker.backward_input(m, grad)
                if self.free_after_b and s != 0:
                    self.tracker.drop_after_b(store, self.p2p.busy if self.p2p else _none_busy)
            else:
                dx = worker.backward_full(m, grad)
            if slots is not None:
                slots.end_action(device, op.value, s, m, self.tracker.drop_released)
            end = self._mark()
            delta = ledger.charge(store, end)
            if dx is not None and s > 0:
                self._deliver(Message(GRAD, s - 1, m), dx)
        elif op is Op.W:
            start = self._mark()
            if self.free_after_b and s != 0:
                with self.tracker.learn_w(store):
                    self.workers[s].backward_weight(m)
            else:
                self.workers[s].backward_weight(m)
            if slots is not None:
                slots.end_action(device, op.value, s, m, self.tracker.drop_released)
            end = self._mark()
            delta = ledger.charge(store, end)
        elif op is Op.OFFLOAD:
            lane = LANES[op]
            self.offloader.last_marks = (None, None)
            start = self._mark()
            moved = self.offloader.offload(store, action.fraction)
            if slots is not None:
                slots.after_offload(device, s, m)
            if action.wait:              # hold the device back until the copy has ended
                for changed in self.offloader.settle(store):
                    self.ledgers[changed.device].charge(changed, self._mark())
            end = self._mark()
            start, end = self._side_marks(start, end)
            delta = ledger.charge(store, end)
        else:  # RELOAD: charged at its issue
            lane = LANES[op]
            for changed in self.offloader.settle(store):
                self.ledgers[changed.device].charge(changed, self._mark())
            # what is really still on device: the storages' sizes, not the account
            left = sum(e.resident() for e in store.live())
            self.offloader.last_marks = (None, None)
            start = self._mark()
            if slots is not None:
                slots.begin_reload(device, s, m)
            moved = self.offloader.reload(store)
            end = self._mark()
            delta = ledger.charge(store, start)
            start, end = self._side_marks(start, end)
        for changed in self.offloader.poll():
            self.ledgers[changed.device].charge(changed, self._mark())
        self.tracker.phase = ""
        if self._recording:
            self._measured.append(MeasuredAction(device, op.value, s, m, start, end, lane,
                                                 action.fraction, delta, moved, left))

    def _side_marks(self, start: Any, end: Any) -> tuple[Any, Any]:
        """On CUDA a transfer's times are its copy events on the side stream."""
        first, last = self.offloader.last_marks
        if self._recording and first is not None and last is not None:
            return first, last
        return start, end

    # ------------------------------------------------------------------ arena
    def _arena_begin(self) -> None:
        """Arena mode: use the arena, or log this step's layout when it can be final."""
        self.tracker.slots = self.arena_store
        self._arena_measuring = False
        if self.arena_mode is None or self.arena_store is not None:
            return
        # the layout is final once every stage's first W has shown what B may free:
        # the second step of a split schedule (the same step on every rank)
        splits = any(a.op is Op.W for acts in self.schedule.actions for a in acts)
        self._arena_steps += 1
        if self.free_after_b and splits and self._arena_steps < 2:
            return
        self._arena_measuring = True
        self.tracker.logs = {}
        self.tracker.watch = {(s, 0) for s in self.local_stages}

    def _arena_end(self) -> None:
        if not self._arena_measuring:
            return
        from optpipe.runtime.arena_store import ArenaStore, StageLayout
        self.tracker.watch = set()
        layouts = {s: StageLayout.from_log(s, self.tracker.logs.get((s, 0), []))
                   for s in self.local_stages}
        self.tracker.logs = {}
        parts = {s: (l.b, l.w) for s, l in layouts.items()}
        if self.distributed:
            gathered: list[Any] = [None] * self.schedule.devices
            dist.all_gather_object(gathered, parts, group=self.group)
            parts = {s: v for piece in gathered for s, v in piece.items()}
        self.arena_problem = self._arena_problem(parts)
        if isinstance(self.arena_mode, dict):
            plans = {d: self.arena_mode[d] for d in self.local_devices}
        else:
            from optpipe.memory.planner import plan
            from optpipe.memory.trace import traces_from_schedule
            from optpipe.runtime.arena_store import PART_ALIGN
            traces = traces_from_schedule(self.arena_problem, self.schedule, per_layer=False)
            plans = {d: plan(traces[d], alignment=PART_ALIGN, workers=1, time_limit=5.0)
                     for d in self.local_devices}
        self.arena_plans = plans
        self.arena_store = ArenaStore(plans, layouts, self.device, spare=self.arena_spare)
        self._arena_measuring = False

    def _arena_problem(self, parts: dict[int, tuple[int, int]]) -> Any:
        """The measured problem: unit times, each stage's planned b and w part bytes."""
        from optpipe.problem import Problem
        S, D, M = self.schedule.stages, self.schedule.devices, self.schedule.microbatches
        b = [parts[s][0] for s in range(S)]
        w = [parts[s][1] for s in range(S)]
        return Problem(stages=S, microbatches=M, devices=D, forward=(1.0,) * S,
                       backward_input=(1.0,) * S, backward_weight=(1.0,) * S,
                       activation=tuple(x + y for x, y in zip(b, w)), freed_by_b=tuple(b),
                       freed_by_w=tuple(w),
                       static=tuple(self.static_bytes(d) for d in range(D)),
                       budget=(float("inf"),) * D, name=f"{self.schedule.name}.measured")

    def arena_stats(self) -> dict[int, Any]:
        """Arena mode: per local device, ``ArenaStats`` (reserved vs live bytes, peaks,
        unplanned requests) plus how many planned buffers and storages fell back."""
        if self.arena_store is None:
            return {}
        return self.arena_store.stats()

    # --------------------------------------------------------------- step end
    def _sum_tied_grads(self) -> None:
        for params, group in self.tied_groups:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                work = dist.all_reduce(p.grad, group=group, async_op=True)
                wait_work(work, self.wait_timeout, lambda why: (
                    f"rank {self.rank}: summing the gradient of a tied parameter {why}"))

    def _loss(self) -> float | None:
        S = self.schedule.stages
        owner = self.schedule.placement[S - 1]
        local = self.workers[S - 1].mean_loss() if S - 1 in self.workers else None
        if not self.distributed or not self.broadcast_loss:
            return None if local is None else float(local)
        tensor = (local.reshape(1).to(torch.float64) if local is not None
                  else torch.zeros(1, dtype=torch.float64))
        if self.backend == "nccl":
            tensor = tensor.to(self.device)
        work = dist.broadcast(tensor, src=self._global(owner), group=self.group, async_op=True)
        wait_work(work, self.wait_timeout, lambda why: (
            f"rank {self.rank}: receiving the loss from rank {owner} {why}"))
        return float(tensor.item())

    def _align(self) -> None:
        """Start recorded steps together, so every rank's clock has the same zero."""
        tensor = self._collective_tensor([0])
        work = dist.all_reduce(tensor, group=self.group, async_op=True)
        wait_work(work, self.wait_timeout, lambda why: (
            f"rank {self.rank}: starting a recorded step with the other ranks {why}"))

    def static_bytes(self, device: int) -> int:
        """Parameter plus gradient bytes of one device's stages (optimizer state excluded)."""
        seen: dict[int, nn.Parameter] = {}
        for s, d in enumerate(self.schedule.placement):
            if d == device:
                for p in self.plan.modules[s].parameters():
                    seen[id(p)] = p
        return 2 * sum(p.numel() * p.element_size() for p in seen.values())

    def _build_record(self, step_time: float, loss: float | None) -> StepRecord:
        sched = self.schedule
        actions = [MeasuredAction(a.device, a.op, a.stage, a.microbatch,
                                  self.clock.seconds(a.start), self.clock.seconds(a.end),
                                  a.lane, a.fraction, a.delta, a.moved, a.left)
                   for a in self._measured]
        events = {d: ledger.resolved(lambda mark: self.clock.seconds(mark)
                                     if mark is not None else 0.0)
                  for d, ledger in self.ledgers.items()}
        peaks = {d: ledger.peak() for d, ledger in self.ledgers.items()}
        cuda_peak = (torch.cuda.max_memory_allocated(self.device)
                     if self.device.type == "cuda" else 0)
        piece = {"actions": actions, "events": events, "peaks": peaks,
                 "cuda_peak": {d: cuda_peak for d in self.local_devices},
                 "step_time": step_time}
        pieces = [piece]
        if self.distributed:
            pieces = [None] * sched.devices
            dist.all_gather_object(pieces, piece, group=self.group)
        record = StepRecord(sched.name, sched.devices, sched.stages, sched.microbatches,
                            memory_events=[[] for _ in range(sched.devices)],
                            peak_activation=[0] * sched.devices,
                            static=[self.static_bytes(d) for d in range(sched.devices)],
                            cuda_peak=[0] * sched.devices, loss=loss)
        for p in pieces:
            record.actions.extend(p["actions"])
            for d, ev in p["events"].items():
                record.memory_events[d] = ev
            for d, peak in p["peaks"].items():
                record.peak_activation[d] = peak
            for d, value in p["cuda_peak"].items():
                record.cuda_peak[d] = value
            record.step_time = max(record.step_time, p["step_time"])
        record.actions.sort(key=lambda a: (a.start, a.device))
        return record
