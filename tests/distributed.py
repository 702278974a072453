"""Run a function in real multi-process ``torch.distributed`` groups (gloo on CPU).

``run_distributed(fn, world_size, *args)`` spawns ``world_size`` processes; each calls
``fn(rank, world_size, *args)`` inside an initialised default process group and the
return values come back as a list ordered by rank. A failure or hang in any rank fails
the test with that rank's traceback. ``fn`` must be a module-level function.
"""
from __future__ import annotations

import os
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.redis_servers import free_port

__all__ = ["run_distributed"]


def _worker(rank, world_size, port, fn, args, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    try:
        import torch

        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        try:
            queue.put((rank, True, fn(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))


def run_distributed(fn, world_size: int, *args, timeout: float = 180.0) -> list:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, queue), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    errors: list[str] = []
    try:
        for _ in range(world_size):
            rank, ok, value = queue.get(timeout=timeout)
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
