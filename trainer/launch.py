"""Run a training function on N local processes (gloo) and fail fast when one dies.

``launch_local(fn, nprocs, *args)`` spawns ``nprocs`` processes with torchrun's
environment variables set (so ``Topology.from_env`` and the loop see a normal job) and
returns rank 0's result. If any rank raises, exits non-zero or is killed, the others are
terminated and ``WorkerFailed`` names the rank and the reason: the job never hangs on a
collective that a dead peer will not join.
"""
from __future__ import annotations

import datetime
import os
import queue
import signal
import socket
import time
import traceback

import torch.multiprocessing as mp

__all__ = ["WorkerFailed", "launch_local", "free_port"]


class WorkerFailed(RuntimeError):
    """A worker process failed; ``rank`` and ``reason`` say which and why."""

    def __init__(self, rank: int, reason: str):
        super().__init__(f"rank {rank} failed: {reason}")
        self.rank, self.reason = rank, reason


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, nprocs, local_size, port, threads, fn, args, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nprocs),
                      LOCAL_RANK=str(rank % local_size), LOCAL_WORLD_SIZE=str(local_size),
                      GROUP_RANK=str(rank // local_size))
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        dist.init_process_group("gloo", rank=rank, world_size=nprocs, timeout=datetime.timedelta(minutes=10))
        try:
            results.put((rank, True, fn(rank, nprocs, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        last = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        results.put((rank, False, (last, traceback.format_exc())))


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


# Errors a rank raises because a *peer* went away; they are symptoms, not causes.
_PEER_SYMPTOMS = ("Connection reset", "Connection closed", "Broken pipe", "connection refused", "gloo")


def _root_cause(procs, results, values: dict, reports: list, grace: float = 2.0) -> WorkerFailed:
    """After a first failure, collect reports for ``grace`` seconds and blame the root cause:
    a rank that died without a report (crash, kill), else one whose error is not a lost
    peer connection, else the first report."""
    end = time.monotonic() + grace
    while time.monotonic() < end:
        try:
            rank, ok, value = results.get(timeout=0.1)
        except queue.Empty:
            continue
        if ok:
            values[rank] = value
        else:
            reports.append((rank, value[0]))
    reported = {r for r, _ in reports}
    for r, p in enumerate(procs):
        if r not in values and r not in reported and p.exitcode not in (None, 0):
            return WorkerFailed(r, _describe_exit(p.exitcode))
    for r, reason in reports:
        if not any(s.lower() in reason.lower() for s in _PEER_SYMPTOMS):
            return WorkerFailed(r, reason)
    if reports:
        return WorkerFailed(*reports[0])
    r = next(r for r, p in enumerate(procs) if r not in values and p.exitcode is not None)
    return WorkerFailed(r, _describe_exit(procs[r].exitcode))


def launch_local(fn, nprocs: int, *args, local_size: int | None = None, threads: int = 1, timeout: float | None = None):
    """Run ``fn(rank, world_size, *args)`` in ``nprocs`` spawned processes; return rank 0's value.

    Args:
        fn: module-level function (it is pickled by reference).
        nprocs: number of processes (>= 1).
        local_size: processes per emulated node (sets LOCAL_RANK / LOCAL_WORLD_SIZE);
            default ``nprocs``.
        threads: torch intra-op threads per process.
        timeout: seconds before the whole job is stopped; None = no limit.

    Raises:
        WorkerFailed: when any rank fails (the first failure is reported).
        ValueError: for nprocs < 1 or a local_size that does not divide nprocs.
    """
    local_size = local_size or nprocs
    if nprocs < 1 or nprocs % local_size:
        raise ValueError(f"need nprocs >= 1 divisible by local_size; got {nprocs=}, {local_size=}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, nprocs, local_size, port, threads, fn, args, results), daemon=False)
             for r in range(nprocs)]
    for p in procs:
        p.start()
    values, deadline = {}, None if timeout is None else time.monotonic() + timeout
    try:
        while len(values) < nprocs:
            try:
                rank, ok, value = results.get(timeout=0.5)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in values and p.exitcode is not None]
                if dead:
                    raise _root_cause(procs, results, values, []) from None
                if deadline is not None and time.monotonic() > deadline:
                    raise WorkerFailed(min(set(range(nprocs)) - set(values)), f"no result after {timeout:.0f} s")
                continue
            if not ok:
                raise _root_cause(procs, results, values, [(rank, value[0])])
            values[rank] = value
    finally:
        for p in procs:
            if p.is_alive() and len(values) < nprocs:
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return values[0]
