"""NOTE [one scan per node]: ranks that start together scan the source once."""
from __future__ import annotations

import multiprocessing
import os
import time

from cachepipe.source.manifest import Manifest


def _rank(root, cache_dir, log, barrier, rescan, out):
    real_scan = Manifest.scan.__func__

    def counted(cls, *args, **kwargs):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.3)  # a slow file system: the others arrive while it scans
        return real_scan(cls, *args, **kwargs)

    Manifest.scan = classmethod(counted)
    barrier.wait()
    out.put(Manifest.load_or_scan(root, cache_dir, rescan=rescan).fingerprint)


def _ranks(root, cache_dir, log, n, rescan=False):
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(root, cache_dir, log, barrier, rescan, out)) for _ in range(n)]
    for p in procs:
        p.start()
    prints = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return prints


def test_ranks_of_a_node_wait_for_one_scan(source, tmp_path):
    for d, _, _ in os.walk(source):  # an old tree: a saved scan of it is trusted (NOTE [manifest reuse])
        os.utime(d, (time.time() - 3600,) * 2)
    log = tmp_path / "scans.log"
    prints = _ranks(str(source), str(tmp_path / "cache"), log, 4)
    assert len(set(prints)) == 1
    assert len(log.read_text().split()) == 1  # one scan; three ranks loaded it
    prints = _ranks(str(source), str(tmp_path / "cache"), log, 4, rescan=True)
    assert len(set(prints)) == 1
    assert len(log.read_text().split()) == 2  # rescan: one more scan, taken by the ranks that waited
