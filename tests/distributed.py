"""Run a function in real multi-process ``torch.distributed`` groups (gloo on CPU).

``run_distributed(fn, world_size, *args)`` starts ``world_size`` processes; each calls
``fn(rank, world_size, *args)`` inside an initialised default process group and the
return values come back as a list ordered by rank. A failure or hang in any rank fails
the test with that rank's traceback. ``fn`` must be a module-level function.

NOTE [forkserver ranks]: every rank is a fresh process, as under ``spawn`` (no state left
over from another test), but it is forked from a fork server that imported torch and the
project's packages once per test session (``mp_context()``), so a rank starts in tens of
milliseconds instead of the 1-2 s of CPU a spawned interpreter spends importing torch
(times the ranks of every group the suite starts; four multi-rank test files: 43 s ->
17 s, docs/benchmarks/history/test-suite.md "Test suite time"). The fork server
never runs a test or a collective, so its children start as clean as spawned ones (one
thread, no process group); each rank takes the test process's current environment,
working directory and ``sys.path``, as a spawned one would.
"""
from __future__ import annotations

import os
import pickle
import traceback

import torch.distributed as dist

from tests.redis_servers import free_port

__all__ = ["run_distributed", "mp_context", "next_result", "start_ranks"]

def mp_context():
    """The multiprocessing context for test ranks: the launcher's fork server, which has torch
    and the project preloaded (``trainer.launch.rank_context``), with this module too."""
    from trainer.launch import rank_context

    return rank_context("tests.distributed")


def _worker(rank, world_size, port, fn, args, queue, environ=None):
    if environ is not None:  # the test process's environment now, not the fork server's
        os.environ.clear()
        os.environ.update(environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    try:
        import torch

        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        try:
            # NOTE [results by value]: pickled here with the plain pickler, so tensors travel
            # as bytes; put as they are, torch's queue would share their storage through
            # this process, which may have exited before the parent reads them
            # (FileNotFoundError in the parent's get: seen under load).
            queue.put((rank, True, pickle.dumps(fn(rank, world_size, *args))))
        except BaseException:
            # NOTE [the cause first]: a failed rank's report is in the pipe before its process
            # group closes, and the closing is what fails the ranks still waiting on it
            # ("Connection closed by peer"): the parent reads the cause before its echoes.
            queue.put((rank, False, traceback.format_exc()))
            queue.close()
            queue.join_thread()
        finally:
            dist.destroy_process_group()
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))


def start_ranks(fn, world_size: int, args: tuple):
    """Start ``world_size`` daemon ranks running ``fn``; returns ``(processes, result queue)``
    (each rank puts ``(rank, ok, pickled value or traceback)``: read them with :func:`next_result`)."""
    ctx = mp_context()
    queue = ctx.Queue()
    port = free_port()
    environ = dict(os.environ)
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, queue, environ), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    return procs, queue


def next_result(queue, timeout: float) -> tuple:
    """The next ``(rank, ok, value or traceback)`` a rank of :func:`start_ranks` put."""
    rank, ok, value = queue.get(timeout=timeout)
    return rank, ok, pickle.loads(value) if ok else value


def run_distributed(fn, world_size: int, *args, timeout: float = 180.0) -> list:
    procs, queue = start_ranks(fn, world_size, args)
    results: dict[int, object] = {}
    errors: list[str] = []
    try:
        for _ in range(world_size):
            rank, ok, value = next_result(queue, timeout)
            if ok:
                results[rank] = value
            else:
                errors.append(f"rank {rank} failed:\n{value}")
                break
    except Exception as exc:  # queue.Empty on timeout
        errors.append(f"distributed run timed out after {timeout}s ({type(exc).__name__}); "
                      f"finished ranks: {sorted(results)}")
    finally:
        for p in procs:
            p.join(timeout=10 if not errors else 1)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world_size)]
