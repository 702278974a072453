"""One loader measurement in a fresh process: ``python -m tools.bench.parts.scale_probe loader ...``.

It prints one JSON line: the rank's memory beyond the interpreter (after its imports) once
``cached_dataloader`` is built, the construction time, the time to the first batch and the
workers' memory then and after ``--batches`` batches, the mean time per batch, and the
time to draw an epoch's order (the median of five). Only the public API is used, so the same probe measures
any version of cachepipe (the figures before and after a change).
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

from tools.bench.harness.proc_memory import memory

__all__ = ["loader_probe", "main"]


def _worker_memory(loader) -> list[dict]:
    it = loader.loader._iterator
    return [memory(w.pid) for w in getattr(it, "_workers", [])]


def loader_probe(source: str, cache_dir: str, *, context: str, workers: int, batches: int, batch_size: int,
                 size: int, cache_size: int) -> dict:
    """Build a training loader of ``source`` and take ``batches`` batches (see the module doc)."""
    import loaders  # noqa: F401  (imported before the baseline: the interpreter's share)
    import torch  # noqa: F401

    gc.collect()
    base = memory()
    t0 = time.perf_counter()
    loader = loaders.cached_dataloader(source, batch_size=batch_size, train=True, size=size, workers=workers,
                                       cache_dir=cache_dir, cache_size=cache_size,
                                       multiprocessing_context=context if workers else None)
    construct = time.perf_counter() - t0
    gc.collect()
    built = memory()
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    at_first = _worker_memory(loader)
    epoch, t0 = 0, time.perf_counter()
    for _ in range(batches - 1):
        try:
            next(it)
        except StopIteration:
            epoch += 1
            loader.set_epoch(epoch)
            it = iter(loader)
            next(it)
    per_batch = (time.perf_counter() - t0) / max(1, batches - 1)
    after = _worker_memory(loader)
    rank = memory()
    draw = getattr(loader.sampler, "order", loader.sampler.indices)  # the array where there is one
    times = []
    for e in range(epoch + 1, epoch + 6):  # the median of 5 epochs' orders: one draw is noise-bound
        loader.set_epoch(e)
        t0 = time.perf_counter()
        draw()
        times.append(time.perf_counter() - t0)
    shuffle = statistics.median(times)
    loader.close()
    return {"context": context, "workers": workers, "construct_s": construct, "first_batch_s": first,
            "per_batch_s": per_batch, "shuffle_s": shuffle, "batches": batches,
            "rank_built": {k: built[k] - base[k] for k in base}, "rank_after": {k: rank[k] - base[k] for k in base},
            "worker_first": at_first, "worker_after": after}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.parts.scale_probe")
    sub = p.add_subparsers(dest="what", required=True)
    lp = sub.add_parser("loader", help="build a cached_dataloader and take batches")
    lp.add_argument("source")
    lp.add_argument("--cache-dir", required=True)
    lp.add_argument("--context", default="fork", choices=["fork", "spawn", "forkserver"])
    lp.add_argument("--workers", type=int, default=2)
    lp.add_argument("--batches", type=int, default=1000)
    lp.add_argument("--batch-size", type=int, default=64)
    lp.add_argument("--size", type=int, default=32)
    lp.add_argument("--cache-size", type=int, default=32)
    a = p.parse_args(argv)
    print(json.dumps(loader_probe(a.source, a.cache_dir, context=a.context, workers=a.workers, batches=a.batches,
                                  batch_size=a.batch_size, size=a.size, cache_size=a.cache_size)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
