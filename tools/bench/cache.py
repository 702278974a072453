"""``cachepipe bench cache SRC --cache-dir DIR``: source vs L1 vs L2 read throughput, side by side.

Levels, each delivering the same decoded ``(H, W, 3)`` samples:
- ``source``: read the file (evicted from the OS page cache first with
  ``posix_fadvise(DONTNEED)`` unless ``--warm-source``) + decode + resize;
- ``l1``: read the bytes from the LMDB mirror + decode + resize;
- ``l2``: ``TwoLevelCache.get_many`` served entirely by L2 (the embedded Redis by default:
  MGET + header check + copy), one row per store with ``--also-l2`` (``shm://``: a view of
  this node's memory + header check + copy; NOTE [L2 side by side]).
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
_CACHES: list = []  # per process: the cache of each L2 measured (the first also serves source and L1)


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
    from tools.bench.harness.l2 import add_l2_compare
    from tools.bench.harness.slow_source import add_source_flags

    add_l2_compare(parser)
    add_source_flags(parser)


def _init(caches) -> None:
    global _CACHES
    _CACHES = caches
    for cache in caches:
        cache._open()


def _read_batch(args) -> tuple[int, int, int]:
    """Read one batch at ``level`` (of store ``k`` for L2); returns (samples, level bytes, decoded bytes)."""
    from cachepipe.decode import decode_and_resize

    (level, k), batch, cold = args
    cache, size = _CACHES[k], _CACHES[k].config.cache_size
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


def _measure(pool, level: tuple, batches: list, cold: bool) -> dict:
    t0 = time.perf_counter()
    tasks = [(level, b, cold) for b in batches]
    results = pool.map(_read_batch, tasks, chunksize=1) if pool else [_read_batch(t) for t in tasks]
    dt = time.perf_counter() - t0
    n, level_bytes, out_bytes = (sum(r[k] for r in results) for k in range(3))
    return {"samples": n, "seconds": dt, "samples_per_s": n / dt, "mb_per_s": level_bytes / 2**20 / dt,
            "out_mb_per_s": out_bytes / 2**20 / dt}


def run(args: argparse.Namespace) -> Result:
    from pathlib import Path

    from tools.bench.harness.l2 import compared_l2
    from tools.bench.harness.slow_source import slow_source

    with slow_source(args, Path(args.source).absolute()) as (src, where):  # NOTE [slow source flags]
        args.source = str(src)
        try:
            config, workers = _setup(args)
        except (FileNotFoundError, ValueError) as exc:
            raise UsageError(str(exc)) from None
        with compared_l2(args, config) as configs:
            result = _run(args, configs, workers)
    result.notes = [*result.notes, f"source read from: {where}"]
    return result


def _setup(args: argparse.Namespace):
    """The cache flags' config and the worker counts (raises ValueError, UsageError)."""
    from tools.cache_flags import cache_from_args, cache_sizes_from_args

    try:
        workers = sorted({int(w) for w in args.workers.split(",")})
        if min(workers) < 1:
            raise ValueError
    except ValueError:
        raise UsageError(f"--workers wants positive ints, got {args.workers!r}") from None
    if len(cache_sizes_from_args(args)) > 1:
        raise ValueError(f"--cache-size {args.cache_size}: the benchmark takes one size")
    cache = cache_from_args(args)
    cache.close()
    if not cache.config.l2.enabled:
        raise UsageError("the benchmark needs an L2 (drop --no-l2)")
    return cache.config, workers


def _run(args: argparse.Namespace, configs: list, workers: list[int]) -> Result:
    from cachepipe import TwoLevelCache
    from cachepipe.warmup import warmup
    from tools.bench.harness.l2 import describe_l2

    caches = [TwoLevelCache(c) for c in configs]
    n = min(args.samples, len(caches[0]))
    for cache in caches:  # the first from the source, the others from its L1
        print(f"warming {describe_l2(cache.config)} for {n} of {len(cache)} samples ...", flush=True)
        warmup(cache, workers=max(workers), progress=False, limit=n, require_full=True)
        cache.close()
    batches = [list(range(s, min(n, s + args.batch_size))) for s in range(0, n, args.batch_size)]
    levels = [("source", 0), ("l1", 0)] + [("l2", k) for k in range(len(caches))]
    where = [describe_l2(c.config) for c in caches]
    rows = []
    ctx = multiprocessing.get_context("spawn")
    for w in workers:
        pool = ctx.Pool(w, initializer=_init, initargs=(caches,)) if w > 1 else None
        if pool is None:
            _init(caches)
        else:  # start the workers and open their handles before timing
            pool.map(_read_batch, [(("l2", k), batches[0][:1], False) for k in range(len(caches))] * w, chunksize=1)
        try:
            runs: dict[tuple, list[dict]] = {level: [] for level in levels}
            for level in levels:
                _measure(pool, level, batches[:2], False)  # warm code paths
            for _ in range(max(1, args.repeat)):  # interleaved: load changes hit every level alike
                for level in levels:
                    runs[level].append(_measure(pool, level, batches, not args.warm_source))
            by_level = {lv: median_run(r, "samples_per_s") for lv, r in runs.items()}
            for level, k in levels:
                row = {"level": level, "store": where[k].split(":")[0] if level == "l2" else "-", "workers": w,
                       **by_level[level, k], "cache_size": caches[0].config.cache_size, "l2": where[k]}
                row["speedup_vs_source"] = row["samples_per_s"] / by_level["source", 0]["samples_per_s"]
                rows.append(row)
        finally:
            if pool is not None:
                pool.close()
                pool.join()
    for cache in caches:
        cache.close()
    top = max(r["workers"] for r in rows)
    best = [r for r in rows if r["level"] == "l2" and r["workers"] == top]
    source = "page-cached" if args.warm_source else "evicted from the page cache before each read"
    return Result(rows, ["level", "store", "workers", "samples_per_s", "mb_per_s", "out_mb_per_s",
                         "speedup_vs_source"],
                  notes=[f"{n} samples, cache_size {caches[0].config.cache_size}, L2 {'; '.join(where)}, "
                         f"source {source}"],
                  headline="L2 " + ", ".join(f"{r['speedup_vs_source']:.1f}x ({r['store']})" for r in best)
                           + f" source decode + resize at {top} workers")
