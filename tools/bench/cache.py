"""``cachepipe bench cache SRC --cache-dir DIR``: source vs L1 vs L2 read throughput, side by side.

Levels, each delivering the same decoded ``(H, W, 3)`` samples:
- ``source``: read the file (evicted from the OS page cache first with
  ``posix_fadvise(DONTNEED)`` unless ``--warm-source``) + decode + resize;
- ``l1``: read the bytes from the LMDB mirror + decode + resize;
- ``l2``: ``TwoLevelCache.get_many`` served entirely by Redis (MGET + header check + copy).
Each level runs single-process and with ``W`` worker processes (started before the clock
starts); levels are interleaved round-robin ``--repeat`` times and the median run is kept. ``mb_per_s`` counts the bytes the level delivers (file bytes for source/L1,
L2 values for L2); ``out_mb_per_s`` the decoded pixels, comparable across levels.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import time

from tools.bench.harness import Result
from tools.bench.harness.stats import median_run
from tools.cli import UsageError

__all__ = ["configure", "run"]

LEVELS = ("source", "l1", "l2")
_CACHE = None


def configure(parser: argparse.ArgumentParser) -> None:
    from tools.cache_flags import add_cache_arguments

    add_cache_arguments(parser)
    parser.add_argument("--workers", default=f"1,{min(4, os.cpu_count() or 1)}",
                        help="comma-separated worker process counts to measure (1 and min(4, CPU count))")
    parser.add_argument("--samples", type=int, default=2000,
                        help="samples read per measurement (the first N of the manifest)")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per get_many / task")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds; levels are interleaved round-robin and the median is kept")
    parser.add_argument("--warm-source", action="store_true",
                        help="let source reads hit the OS page cache (otherwise each file is evicted first)")


def _init(cache) -> None:
    global _CACHE
    _CACHE = cache
    cache._open()


def _read_batch(args) -> tuple[int, int, int]:
    """Read one batch at ``level``; returns (samples, level bytes, decoded bytes)."""
    from cachepipe.decode import decode_and_resize

    level, batch, cold = args
    cache, size = _CACHE, _CACHE.config.cache_size
    level_bytes = out_bytes = 0
    if level == "l2":
        before = cache.counters["l2_hits"]
        arrays = cache.get_many(batch)
        if cache.counters["l2_hits"] - before != len(batch):
            raise RuntimeError("L2 did not hold every benchmarked sample; run cachepipe warmup first")
        level_bytes = sum(a.nbytes + 32 for a in arrays)
        return len(batch), level_bytes, sum(a.nbytes for a in arrays)
    if level == "l1":
        values, _ = cache.l1.get_many(batch)
        if any(v is None for v in values):
            raise RuntimeError("L1 did not hold every benchmarked sample; run cachepipe warmup first")
    else:
        values = []
        for i in batch:
            with open(cache.manifest.path(i), "rb") as f:
                if cold:
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                values.append(f.read())
    for i, data in zip(batch, values):
        level_bytes += len(data)
        out_bytes += decode_and_resize(data, size, index=i).nbytes
    return len(batch), level_bytes, out_bytes


def _measure(pool, cache, level: str, batches: list, cold: bool) -> dict:
    t0 = time.perf_counter()
    tasks = [(level, b, cold) for b in batches]
    results = pool.map(_read_batch, tasks, chunksize=1) if pool else [_read_batch(t) for t in tasks]
    dt = time.perf_counter() - t0
    n, level_bytes, out_bytes = (sum(r[k] for r in results) for k in range(3))
    return {"samples": n, "seconds": dt, "samples_per_s": n / dt, "mb_per_s": level_bytes / 2**20 / dt,
            "out_mb_per_s": out_bytes / 2**20 / dt}


def run(args: argparse.Namespace) -> Result:
    from cachepipe.warmup import warmup
    from tools.bench.harness.l2 import describe_l2
    from tools.cache_flags import cache_from_args, cache_sizes_from_args

    try:
        workers = sorted({int(w) for w in args.workers.split(",")})
        if min(workers) < 1:
            raise ValueError
    except ValueError:
        raise UsageError(f"--workers wants positive ints, got {args.workers!r}") from None
    try:
        if len(cache_sizes_from_args(args)) > 1:
            raise ValueError(f"--cache-size {args.cache_size}: the benchmark takes one size")
        cache = cache_from_args(args)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if not cache.config.l2.enabled:
        raise UsageError("the benchmark needs an L2 (drop --no-l2)")
    n = min(args.samples, len(cache))
    print(f"warming the cache for {n} of {len(cache)} samples ...", flush=True)
    warmup(cache, workers=max(workers), progress=False, limit=n, require_full=True)
    batches = [list(range(s, min(n, s + args.batch_size))) for s in range(0, n, args.batch_size)]
    l2 = describe_l2(cache.config)
    rows = []
    ctx = multiprocessing.get_context("spawn")
    for w in workers:
        pool = ctx.Pool(w, initializer=_init, initargs=(cache,)) if w > 1 else None
        if pool is None:
            _init(cache)
        else:  # start the workers and open their handles before timing
            pool.map(_read_batch, [("l2", batches[0][:1], False)] * w, chunksize=1)
        try:
            runs: dict[str, list[dict]] = {level: [] for level in LEVELS}
            for level in LEVELS:
                _measure(pool, cache, level, batches[:2], False)  # warm code paths
            for _ in range(max(1, args.repeat)):  # interleaved: load changes hit every level alike
                for level in LEVELS:
                    runs[level].append(_measure(pool, cache, level, batches, not args.warm_source))
            by_level = {lv: median_run(r, "samples_per_s") for lv, r in runs.items()}
            for level in LEVELS:
                row = {"level": level, "workers": w, **by_level[level], "cache_size": cache.config.cache_size,
                       "l2": l2}
                row["speedup_vs_source"] = row["samples_per_s"] / by_level["source"]["samples_per_s"]
                rows.append(row)
        finally:
            if pool is not None:
                pool.close()
                pool.join()
    cache.close()
    best = max((r for r in rows if r["level"] == "l2"), key=lambda r: r["workers"])
    source = "page-cached" if args.warm_source else "evicted from the page cache before each read"
    return Result(rows, ["level", "workers", "samples_per_s", "mb_per_s", "out_mb_per_s", "speedup_vs_source"],
                  notes=[f"{n} samples, cache_size {cache.config.cache_size}, L2 {l2}, source {source}"],
                  headline=f"L2 {best['speedup_vs_source']:.1f}x source decode + resize at {best['workers']} workers")
