"""Source reads with a deadline: a file system that stops answering costs a timeout, never
a hang.

NOTE [stalled source]
A network file system can stall: the server is gone or overloaded, and a ``read`` waits
in the kernel (an NFS hard mount waits forever, a dead FUSE server until it is killed)
where no Python code can interrupt it. So every source read runs on a daemon thread of
:class:`TimedPool` and the caller waits for it with a deadline (``timeout`` seconds from
the moment the read started, ``CacheConfig.source_timeout``, ``--source-timeout``,
default 60): past it the read is counted (``source_timeouts``), warned about once, and
tried again on a fresh thread (the stuck thread is retired: it ends whenever its call
returns, and being a daemon it never holds up the process's exit, as a
``ThreadPoolExecutor`` worker would). After ``attempts`` tries the file is an
``OSError(ETIMEDOUT)``: one unreadable sample, which training replaces (NOTE [bad samples
reported once] in ``loaders/folder.py``) and the warm-up retries next time. The default
is generous because one read of a large file at a share's bandwidth can take seconds.
"""
from __future__ import annotations

import errno
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait

__all__ = ["DEFAULT_SOURCE_TIMEOUT_S", "TimedPool"]

DEFAULT_SOURCE_TIMEOUT_S = 60.0  # NOTE [stalled source]


class _Task:
    __slots__ = ("future", "fn", "args", "started", "worker")

    def __init__(self, fn: Callable, args: tuple) -> None:
        self.future: Future = Future()
        self.fn, self.args = fn, args
        self.started: float | None = None
        self.worker: int | None = None


class TimedPool:
    """Daemon threads running calls with a deadline each (NOTE [stalled source]).

    Args:
        threads: calls in flight at once.
        timeout: seconds a call may run before it is abandoned and tried again.
        attempts: tries per call before it becomes ``OSError(ETIMEDOUT)``.
        name: the threads' name.
    """

    def __init__(self, threads: int, timeout: float = DEFAULT_SOURCE_TIMEOUT_S, attempts: int = 2,
                 name: str = "cachepipe-read") -> None:
        if threads < 1 or attempts < 1 or not timeout > 0:
            raise ValueError(f"threads and attempts must be >= 1 and timeout > 0, got {threads}, {attempts}, "
                             f"{timeout}")
        self.timeout, self.attempts, self.name = float(timeout), attempts, name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._retired: set[int] = set()
        self._live = 0
        for _ in range(threads):
            self._spawn()

    def _spawn(self) -> None:
        with self._lock:
            self._live += 1
        threading.Thread(target=self._work, name=self.name, daemon=True).start()

    def _work(self) -> None:
        me = threading.get_ident()
        while True:
            task = self._queue.get()
            if task is None:
                break
            task.worker, task.started = me, time.monotonic()
            try:
                task.future.set_result(task.fn(*task.args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                task.future.set_exception(exc)
            with self._lock:
                if me in self._retired:  # replaced while it was stuck: leave
                    self._retired.discard(me)
                    self._live -= 1
                    return
        with self._lock:
            self._live -= 1

    def _submit(self, fn: Callable, args: tuple) -> _Task:
        task = _Task(fn, args)
        self._queue.put(task)
        return task

    def start(self, fn: Callable, args: tuple) -> _Task:
        """Start ``fn(*args)`` now; pass the task to :meth:`map` (``started``) for its result."""
        return self._submit(fn, args)

    def map(self, fn: Callable, calls: Sequence[tuple], *, on_timeout: Callable[[tuple, int], None] | None = None,
            describe: Callable[[tuple], str] = str, started: dict | None = None) -> list:
        """``[fn(*args) for args in calls]`` in parallel, each with the deadline.

        Args:
            fn: the call (its exceptions are re-raised here, the first in order).
            calls: the argument tuples.
            on_timeout: called with ``args`` and the attempt (1, 2, ...) each time a call
                runs past the deadline.
            describe: names a call in the ``OSError`` of one that never finished (its path).
            started: position -> the :meth:`start` task of that call, already running.

        Returns:
            Each call's result, or ``OSError(ETIMEDOUT)`` for one that ran past the deadline
            ``attempts`` times.
        """
        started = started or {}
        tasks = [started.get(k) or self._submit(fn, args) for k, args in enumerate(calls)]
        tries = [1] * len(tasks)
        results: list = [None] * len(tasks)
        pending = set(range(len(tasks)))
        poll = min(self.timeout / 4, 1.0)
        while pending:
            futures = {tasks[i].future: i for i in pending}
            done, _ = wait(futures, timeout=poll)
            for f in done:
                i = futures[f]
                pending.discard(i)
                results[i] = f.result()
            now = time.monotonic()
            for i in sorted(pending):
                task = tasks[i]
                if task.started is None or now - task.started <= self.timeout:
                    continue
                self._retire(task.worker)
                if on_timeout is not None:
                    on_timeout(calls[i], tries[i])
                if tries[i] >= self.attempts:
                    pending.discard(i)
                    results[i] = OSError(errno.ETIMEDOUT, f"no answer within {self.timeout:g} s, {tries[i]} "
                                                          f"tries: the file system stalls", describe(calls[i]))
                else:
                    tries[i] += 1
                    tasks[i] = self._submit(fn, calls[i])
        return results

    def _retire(self, worker: int | None) -> None:
        """Replace a thread stuck in a call (it leaves when the call returns)."""
        with self._lock:
            if worker is None or worker in self._retired:
                return
            self._retired.add(worker)
        self._spawn()

    def close(self) -> None:
        """Let the threads end (a stuck one ends when its call returns)."""
        with self._lock:
            live = self._live
        for _ in range(live):
            self._queue.put(None)

