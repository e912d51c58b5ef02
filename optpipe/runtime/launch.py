"""Starting the processes of a one-machine pipeline run (``optpipe run``, tests, benchmarks).

:func:`run_workers` spawns one process per pipeline device with
``torch.multiprocessing`` (spawn start method, so no thread pool or CUDA context is
inherited through fork), initializes ``torch.distributed`` in each (gloo on CPU, NCCL
when there is a GPU per rank), calls ``fn(rank, world, *args)`` and returns what every
rank's ``fn`` returned. A :class:`~optpipe.errors.OptPipeError` raised in a worker comes
back as the same one-line error in the caller; any other failure keeps its traceback.

Several machines are started with ``torchrun`` instead (see docs/runtime.md); the
runner itself only needs an initialized process group.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from optpipe.errors import OptPipeError


START_METHOD = "forkserver"
_PRELOAD = ["torch", "torch.distributed", "optpipe.runtime.runner"]
_preloaded = False


def _preload(mp: Any) -> None:
    """Have the fork server import torch and the runner once, before its first fork."""
    global _preloaded
    if not _preloaded:
        mp.set_forkserver_preload(_PRELOAD)
        _preloaded = True


def free_port() -> int:
    """A TCP port that was free a moment ago (for the rendezvous on 127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def default_backend(world: int) -> str:
    """NCCL when every rank can have its own GPU, gloo otherwise."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world:
        return "nccl"
    return "gloo"


def _quiet_barrier(seconds: float = 10.0) -> None:
    """Leave together: a rank that tears its connections down while a peer's gloo thread
    still reads from them can make that peer abort. A peer that is already gone (a test
    that kills one on purpose) only costs the wait."""
    import torch.distributed as dist

    try:
        dist.barrier(async_op=True).wait(timeout=timedelta(seconds=seconds))
    except Exception:
        pass


def _entry(rank: int, fn: Callable[..., Any], world: int, port: int, backend: str,
           folder: str, threads: int | None, timeout: float, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world))
    if threads:
        torch.set_num_threads(threads)
    if backend == "nccl":  # one GPU per rank; with fewer GPUs ranks share (NCCL may refuse)
        torch.cuda.set_device(rank % torch.cuda.device_count())
    outcome: dict[str, Any]
    try:
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout))
        try:
            outcome = {"result": fn(rank, world, *args)}
            _quiet_barrier()
        finally:
            try:
                dist.destroy_process_group()
            except Exception:  # a peer already gone: nothing left to tidy
                pass
    except OptPipeError as exc:
        outcome = {"error": str(exc)}
    except Exception:
        outcome = {"crash": traceback.format_exc()}
    with open(Path(folder) / f"rank{rank}.pkl", "wb") as handle:
        pickle.dump(outcome, handle)


def run_workers(fn: Callable[..., Any], world: int, *args: Any, backend: str | None = None,
                threads: int | None = None, timeout: float = 300.0,
                return_errors: bool = False) -> list[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` new processes; their return values.

    ``fn`` must be importable by name (a module-level function). ``threads`` sets
    ``torch.set_num_threads`` in each worker (default: the CPU cores shared out).
    With ``return_errors`` a rank's :class:`OptPipeError` is returned in its place and a
    rank that exited without a result (a test killing one on purpose) gives ``None``;
    otherwise the first error is raised.
    """
    import torch.multiprocessing as mp

    _preload(mp)
    backend = backend or default_backend(world)
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world)
    with tempfile.TemporaryDirectory(prefix="optpipe-run-") as folder:
        context = mp.start_processes(
            _entry, args=(fn, world, free_port(), backend, folder, threads, timeout, args),
            nprocs=world, join=False, start_method=START_METHOD)
        try:
            while not context.join():
                pass
        except mp.ProcessExitedException as exc:
            if not return_errors:
                raise OptPipeError(f"pipeline worker {exc.error_index} exited with code "
                                   f"{exc.exit_code} before finishing") from None
        results: list[Any] = []
        errors: list[str] = []
        for rank in range(world):
            path = Path(folder) / f"rank{rank}.pkl"
            if not path.exists():
                errors.append(f"pipeline worker {rank} exited without a result")
                results.append(None)
                continue
            with open(path, "rb") as handle:
                outcome = pickle.load(handle)
            if "crash" in outcome:
                raise RuntimeError(f"pipeline worker {rank} failed:\n{outcome['crash']}")
            if "error" in outcome:
                errors.append(outcome["error"])
                results.append(OptPipeError(outcome["error"]))
            else:
                results.append(outcome["result"])
        if errors and not return_errors:
            raise OptPipeError(errors[0])
        return results
