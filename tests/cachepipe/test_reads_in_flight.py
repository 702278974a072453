"""NOTE [reads in flight]: the warm-up and the loader's misses keep source reads in flight
across batches, read each file once, and return what a serial read returns."""
from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from cachepipe import TwoLevelCache
from cachepipe.source import reader
from cachepipe.warmup import warmup


@pytest.fixture
def slow_reads(monkeypatch):
    """Every source read takes 20 ms; counts reads per path and the most at once."""
    real = reader.read_stable
    lock = threading.Lock()
    state = {"now": 0, "most": 0, "reads": Counter()}

    def slow(path, *args, **kwargs):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            state["reads"][path] += 1
        time.sleep(0.02)
        try:
            return real(path, *args, **kwargs)
        finally:
            with lock:
                state["now"] -= 1

    monkeypatch.setattr(reader, "read_stable", slow)
    return state


def test_warmup_reads_the_next_batches_while_writing_one(source, tmp_path, slow_reads):
    with TwoLevelCache(source, tmp_path / "cache", redis=False) as cache:
        report = warmup(cache, batch_size=4, progress=False)
        assert report["l1_written"] == len(cache) == 24
        assert slow_reads["most"] > 4, "no read ran ahead of its batch"
        assert set(slow_reads["reads"].values()) == {1}  # every file read once
        values, _ = cache.l1.get_many(range(len(cache)))
        for i, data in enumerate(values):
            assert data == open(cache.manifest.path(i), "rb").read()


def test_a_batch_that_missed_starts_the_reads_of_the_next(source, tmp_path, slow_reads):
    with TwoLevelCache(source, tmp_path / "cache", redis=False, cache_size=32) as cache:
        assert cache.read_ahead([4, 5]) == 0  # nothing missed yet: no reads ahead
        cache.get_many([0, 1, 2, 3])  # misses, read from the source
        assert cache.read_ahead([0, 4, 5, 6, 7]) == 4  # 0 is in L1 now
        ahead = [cache.manifest.path(i) for i in (4, 5, 6, 7)]
        deadline = time.monotonic() + 5
        while not all(slow_reads["reads"][p] == 1 for p in ahead):  # they start before they are asked for
            assert time.monotonic() < deadline, "the reads ahead never started"
            time.sleep(0.01)
        cache.get_many([4, 5, 6, 7])
        assert set(slow_reads["reads"].values()) == {1}
        cache.get_many([0, 1])  # hits only
        assert cache.read_ahead([8, 9]) == 0


def test_requests_name_the_batch_their_worker_fetches_next():
    from loaders.sampler import ShardedBatchSampler

    sampler = ShardedBatchSampler(20, 4, shuffle=True, seed=3)
    sampler.read_ahead = 2  # two workers: batch k's worker fetches k + 2 next
    got = list(sampler)
    for k, request in enumerate(got):
        assert request.ahead == (list(got[k + 2]) if k + 2 < len(got) else [])
    import pickle

    assert pickle.loads(pickle.dumps(got[0])).ahead == got[0].ahead
