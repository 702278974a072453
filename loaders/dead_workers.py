"""Recovering from a DataLoader worker that died (OOM killer, a stray SIGKILL).

NOTE [restarting dead workers]: torch notices a dead worker in two ways: a SIGCHLD
handler that raises ``RuntimeError`` in the main thread *wherever it happens to be* (in
the middle of a training step, a collective, ...), and a check of its workers each time
a batch does not arrive within 5 s, which raises from the loader's ``next()``. Only the
second can be recovered, so a loader with workers tells torch that its SIGCHLD handler is
already installed (``_SIGCHLD_handler_set``, a module flag of torch's ``signal_handling``;
it affects every DataLoader created in the process afterwards, which then detect dead
workers within 5 s the same way). When ``next()`` raises that a worker exited (or fails to
receive a batch whose shared memory only the dead worker could hand over), the loader
shuts the remaining workers down, starts new ones and asks again for every batch after the
last one it yielded: batches depend only on their request (NOTE [batch requests carry the
epoch state]), so the epoch goes on with exactly the batches it would have had. A loader
gives up (re-raises) after ``MAX_RESTARTS`` restarts in one pass.
"""
from __future__ import annotations

import time
import warnings

import torch.utils.data

__all__ = ["MAX_RESTARTS", "detect_in_next", "is_dead_worker", "shut_down"]

MAX_RESTARTS = 3


def detect_in_next() -> None:
    """Keep torch's SIGCHLD handler out, so a dead worker raises from ``next()`` (see NOTE)."""
    torch.utils.data._utils.signal_handling._SIGCHLD_handler_set = True


def is_dead_worker(exc: BaseException, loader: torch.utils.data.DataLoader) -> bool:
    """Whether ``exc`` (raised by ``next()``) comes from a worker that exited or was killed:
    torch's report of it, or a batch whose shared memory the dead worker can no longer hand over."""
    text = str(exc)
    if isinstance(exc, RuntimeError) and "DataLoader worker" in text:
        return "exited unexpectedly" in text or "killed by signal" in text
    if not isinstance(exc, (ConnectionError, EOFError, FileNotFoundError)):
        return False
    workers = getattr(loader._iterator, "_workers", ())
    deadline = time.monotonic() + 2.0  # a killed worker may not be reaped yet
    while not any(not w.is_alive() for w in workers):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def shut_down(loader: torch.utils.data.DataLoader, exc: BaseException, restarts: int) -> None:
    """Stop what is left of ``loader``'s workers so the next ``iter()`` starts new ones."""
    warnings.warn(f"{exc}; restarting the loader's workers ({restarts}/{MAX_RESTARTS}) and requesting the "
                  f"batches it lost again", RuntimeWarning, stacklevel=3)
    it = loader._iterator
    if it is not None:
        it._shutdown_workers()
    loader._iterator = None
