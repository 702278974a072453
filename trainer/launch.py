"""Run a training function on N local processes (gloo) and fail fast when one dies.

``launch_local(fn, nprocs, *args)`` starts ``nprocs`` processes with torchrun's
environment variables set (so ``Topology.from_env`` and the loop see a normal job) and
returns rank 0's result. If any rank raises, exits non-zero or is killed, the others are
terminated and ``WorkerFailed`` names the rank and the reason: the job never hangs on a
collective that a dead peer will not join.

NOTE [ranks end with their launcher]: ranks left running after their launcher is gone
go on training and writing checkpoints into the same ``--out``, where a resumed run
would race them. So (1) while the launcher waits, SIGTERM, SIGINT and SIGHUP become
:class:`Stopped` in it (:func:`stop_on_signals`): its ``finally`` sends SIGTERM to the
ranks it started (their ``Process`` handles, nothing else), waits for them and kills
those still there after 10 s; (2) a rank turns SIGTERM into :class:`Stopped` too, so
its own ``finally`` blocks close loader workers, shared-memory segments and the
process group; (3) a rank asks the kernel for SIGTERM when its parent dies
(``PR_SET_PDEATHSIG``, Linux; its parent is the launcher's fork server, NOTE [forked
ranks]) and watches the launcher itself (its pid and start time, twice a second), which
covers a launcher killed with SIGKILL; a rank exits at once if the launcher is already gone. Ranks started
by torchrun are torchrun's to manage: none of this applies to them.

NOTE [forked ranks]: ranks are forked from a fork server that imported torch and the
project once (``multiprocessing``'s ``forkserver``, with a preload), not spawned: a
spawned rank spends 1-2 s of CPU importing torch before it trains, times every rank of
every job. The fork server only forks (one thread, no process group, no CUDA), so a rank
starts as clean as a spawned one; it takes the launcher's environment, working
directory and umask as they are when the job starts (``_entry``), not the fork server's, which may
have started for an earlier job of the same process. And it takes the start method a new
interpreter has (``fork`` here), not ``forkserver``, which ``multiprocessing`` hands every
child of a fork server: with it each rank started a fork server of its own (preload
``__main__``, no torch) for its loader workers, which then imported torch afresh, and a rank
killed by SIGKILL left that fork server, a worker and its resource tracker behind.
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import multiprocessing
import os
import queue
import signal
import socket
import threading
import time
import traceback

import torch.multiprocessing as mp

from comm.shm_names import start_time

__all__ = ["Stopped", "WorkerFailed", "launch_local", "free_port", "stop_on_signals", "rank_context",
           "as_new_process", "current_umask", "die_with_launcher"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1
# what every rank imports anyway: loaded once, in the fork server (NOTE [forked ranks]);
# torch._dynamo: torch.optim imports it when a rank builds its optimizer, ~1 s of CPU each
_PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "comm", "trainer", "loaders", "cachepipe")


def rank_context(*extra: str):
    """The multiprocessing context ranks are started from: a fork server that imported
    torch and the project once (NOTE [forked ranks]), and ``extra`` modules (those holding
    the rank functions). One fork server serves a process: the first call's preload counts."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([*_PRELOAD, *extra])
    return ctx


class WorkerFailed(RuntimeError):
    """A worker process failed; ``rank`` and ``reason`` say which and why."""

    def __init__(self, rank: int, reason: str):
        super().__init__(f"rank {rank} failed: {reason}")
        self.rank, self.reason = rank, reason


class Stopped(KeyboardInterrupt):
    """A stop signal arrived (NOTE [ranks end with their launcher]); ``signum`` says which.
    A ``KeyboardInterrupt``, so that no ``except Exception`` swallows a request to stop."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals(signals=STOP_SIGNALS):
    """Raise :class:`Stopped` in the main thread on the first of ``signals``; later ones are
    ignored until the block ends (its clean-up is not cut short). The previous handlers
    are restored afterwards. Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = []

    def handler(signum, frame):
        if not fired:
            fired.append(signum)
            raise Stopped(signum)

    old = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def current_umask() -> int:
    """This process's umask, read without setting it (as ``os.umask`` would)."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)


def die_with_launcher(launcher: int) -> None:
    """Ask for SIGTERM when the parent (the launcher's fork server) dies (NOTE [ranks end
    with their launcher]); exit now if the launcher is already gone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the launcher's own clean-up still applies
        return
    started = start_time(launcher)
    if started is None:
        os._exit(128 + int(signal.SIGTERM))
    threading.Thread(target=_watch_launcher, args=(launcher, started), daemon=True, name="launcher-watch").start()


def _watch_launcher(launcher: int, started: int) -> None:
    """SIGTERM this rank when its launcher is gone (NOTE [ranks end with their launcher]):
    the fork server, the rank's parent, outlives a launcher killed with SIGKILL while any
    rank it forked is alive, so the parent-death signal alone would not come."""
    while start_time(launcher) == started:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)  # this process, into Stopped and its clean-up


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_new_process() -> None:
    """In a process forked from the fork server: take the start method a new interpreter has
    (NOTE [forked ranks]), not the fork server's."""
    multiprocessing.set_start_method(None, force=True)


def _entry(rank, nprocs, local_size, port, threads, launcher, environ, cwd, umask, fn, args, results):
    die_with_launcher(launcher)
    as_new_process()
    os.chdir(cwd)  # the launcher's now, not the fork server's (NOTE [forked ranks])
    os.umask(umask)  # likewise: a job started with umask 077 writes private checkpoints
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nprocs),
                      LOCAL_RANK=str(rank % local_size), LOCAL_WORLD_SIZE=str(local_size),
                      GROUP_RANK=str(rank // local_size))
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        with stop_on_signals((signal.SIGTERM,)):
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
    """After a first failure, collect reports for up to ``grace`` seconds (until every rank
    has reported or ended) and blame the root cause: a rank that died without a report
    (crash, kill), else one whose error is not a lost peer connection, else the first report."""
    end = time.monotonic() + grace
    while time.monotonic() < end:
        try:
            rank, ok, value = results.get(timeout=0.1)
        except queue.Empty:
            # an ended rank's report is in the pipe before its exit (the queue's feeder is
            # joined at exit), so an empty queue with every rank accounted for is final
            accounted = set(values) | {r for r, _ in reports}
            if all(r in accounted or p.exitcode is not None for r, p in enumerate(procs)):
                break
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
    """Run ``fn(rank, world_size, *args)`` in ``nprocs`` processes (NOTE [forked ranks]); return rank 0's value.

    Args:
        fn: module-level function (it is pickled by reference).
        nprocs: number of processes (>= 1).
        local_size: processes per emulated node (sets LOCAL_RANK / LOCAL_WORLD_SIZE);
            default ``nprocs``.
        threads: torch intra-op threads per process.
        timeout: seconds before the whole job is stopped; None = no limit.

    Raises:
        WorkerFailed: when any rank fails (the first failure is reported).
        Stopped: SIGTERM, SIGINT or SIGHUP arrived; every rank was stopped first (NOTE
            [ranks end with their launcher]).
        ValueError: for nprocs < 1 or a local_size that does not divide nprocs.
    """
    local_size = local_size or nprocs
    if nprocs < 1 or nprocs % local_size:
        raise ValueError(f"need nprocs >= 1 divisible by local_size; got {nprocs=}, {local_size=}")
    ctx = rank_context()
    results = ctx.Queue()
    port = free_port()
    job = (os.getpid(), dict(os.environ), os.getcwd(), current_umask())
    procs = [ctx.Process(target=_entry, args=(r, nprocs, local_size, port, threads, *job, fn, args, results),
                         daemon=False) for r in range(nprocs)]
    with stop_on_signals():
        return _run(procs, results, nprocs, timeout)


def _run(procs, results, nprocs: int, timeout: float | None):
    """Start ``procs``, collect their results; stop every one still running on the way out."""
    values, deadline = {}, None if timeout is None else time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
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
            if p.pid is not None and p.is_alive() and len(values) < nprocs:
                p.terminate()
        for p in procs:
            if p.pid is None:  # never started
                continue
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return values[0]
