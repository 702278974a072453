"""Issue 17: a DataLoader worker killed mid-epoch (real SIGKILL) does not end the run.

The loader restarts its workers and requests the lost batches again (NOTE [restarting
dead workers]); the epoch it yields is identical to one without the kill.
"""
from __future__ import annotations

import os
import signal

import pytest
import torch

from loaders import cached_dataloader


def _epoch(loader, kill_after: int | None = None) -> list:
    loader.set_epoch(1)
    got = []
    for x, y in loader:
        got.append((x.clone(), y.clone()))
        if len(got) == kill_after:
            victim = loader.loader._iterator._workers[0]  # our own child process
            os.kill(victim.pid, signal.SIGKILL)
    return got


def test_a_killed_worker_is_replaced_and_the_epoch_is_unchanged(source, cache_dir, redis_server):
    kwargs = dict(batch_size=2, train=True, size=32, cache_size=40, cache_dir=cache_dir, redis=[redis_server.url],
                  seed=5)
    reference = cached_dataloader(source, workers=0, **kwargs)
    loader = cached_dataloader(source, workers=2, **kwargs)
    try:
        want = _epoch(reference)
        with pytest.warns(RuntimeWarning, match="restarting the loader's workers"):
            got = _epoch(loader, kill_after=2)
        assert len(got) == len(want) == 12
        for (xa, ya), (xb, yb) in zip(got, want):
            assert torch.equal(ya, yb) and torch.equal(xa, xb)
        assert len(_epoch(loader)) == 12  # the new workers serve the next epoch too
    finally:
        loader.close()
        reference.close()
