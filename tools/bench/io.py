"""``cachepipe bench io SRC --cache-dir DIR``: what each cache level buys when the source is
on a slow network share (the seed's Fig. 9), side by side in one run.

The source is always read through ``cachepipe slowfs`` (at its defaults, NOTE [slowfs
profile]: 1 ms per request, 100 MB/s shared, an EFS-like share; ``--source-*`` change
them), and the same epochs are loaded by ``cached_dataloader`` (same workers, batch, crop
and augmentation) from three caches of the same mounted tree:

- ``none``: no cache, every sample read from the share, decoded and resized every epoch
  (``use_l1=False``, no L2: the naive loader of Fig. 9);
- ``l1``: the L1 mirror only (raw bytes on local disk; decode + resize every epoch);
- ``l1+l2``: L1 and L2 (the L2 the cache flags name, the embedded Redis by default;
  ``--also-l2 URL`` adds one row per other store, e.g. ``shm://``: NOTE [L2 side by side]).

The caches are warmed first (``cachepipe.warmup``: the one pass over the share that fills
L1 and L2; its source MB/s is reported). Each loader runs one untimed epoch (worker start),
then ``--rounds`` rounds of ``--epochs`` epochs are timed, interleaved across the caches,
and each row is the median round. ``io_ms_per_image`` is what Fig. 9 calls I/O: the time
the workers wait for their samples (share or L1 read, and the decode + resize that a
decoded L2 saves), summed over workers, per image; ``images_per_s`` is the loader's
end-to-end rate. ``io_reduction`` and ``speedup`` are the per-round ratios against
``none`` (median over rounds). The share's counters (slowfs ``--stats``) show what each
level still reads from it: ``share_reads_per_image``.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

from tools.bench.harness import Result
from tools.bench.harness.stats import median_ratio, median_run
from tools.cli import UsageError

__all__ = ["configure", "run"]

COLUMNS = ("cache", "l2", "images_per_s", "speedup", "io_ms_per_image", "io_reduction", "source_reads_per_image",
           "l1_hits_per_image", "l2_hits_per_image", "seconds")
TARGETS = {"io_reduction": 10.0, "speedup": 2.0}  # the seed's Fig. 9: I/O over 10x less, throughput ~2x


def configure(parser: argparse.ArgumentParser) -> None:
    from tools.bench.harness.data import add_dataset_flags
    from tools.bench.harness.l2 import add_l2_compare
    from tools.bench.harness.slow_source import add_source_flags
    from tools.cache_flags import add_cache_arguments

    add_cache_arguments(parser)  # SRC (a dataset root holding train/ uses SRC/train), --cache-dir, the L2 ...
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size")
    parser.add_argument("--size", type=int, default=112, help="crop size")
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs per cache and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each row is the median round")
    add_dataset_flags(parser, image_px=320)
    add_source_flags(parser)
    add_l2_compare(parser)


def _check(args: argparse.Namespace) -> int:
    from tools.cache_flags import cache_sizes_from_args

    try:
        (cache_size,) = cache_sizes_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for flag in ("workers", "batch_size", "size", "epochs", "rounds"):
        if getattr(args, flag) < (0 if flag == "workers" else 1):
            raise UsageError(f"--{flag.replace('_', '-')} must be >= {0 if flag == 'workers' else 1}, got "
                             f"{getattr(args, flag)}")
    if args.no_l2:
        raise UsageError("--no-l2: the benchmark compares no cache, L1 and L1 + L2; it needs an L2")
    return cache_size


def run(args: argparse.Namespace) -> Result:
    from cachepipe.slowfs import SlowProfile
    from cachepipe.slowfs.mount import fuse_missing
    from tools.bench.harness.data import source_root
    from tools.bench.harness.slow_source import slowfs_mount, source_profile

    cache_size = _check(args)
    profile = source_profile(args) or SlowProfile()
    missing = fuse_missing()
    if missing is not None:
        raise UsageError(f"the source is read through cachepipe slowfs, which needs FUSE: {missing}")
    root = source_root(args)
    if not root.is_dir():
        raise UsageError(f"SRC {args.source}: not a directory (--make-dataset N writes a demo dataset there)")
    with slowfs_mount(root, profile) as mount:
        result = _run(args, mount, cache_size)
    totals = mount.stats().get("totals", {})
    result.notes = [*result.notes, f"the share served {totals.get('opens', 0)} opens, {totals.get('reads', 0)} "
                                   f"reads, {totals.get('bytes', 0) / 1e6:.1f} MB in all (slowfs --stats)"]
    return result


def _configs(args, mnt: Path, cache_size: int):
    """(name, CacheConfig) of each cache measured, all of the mounted tree."""
    from tools.bench.harness.l2 import compared_l2
    from tools.cache_flags import cache_config

    base = cache_config(args, mnt, cache_size)
    none = dataclasses.replace(base, cache_dir=os.path.join(base.cache_dir, "no-cache"), l2=False, use_l1=False)
    return [("none", none), ("l1", dataclasses.replace(base, l2=False))], compared_l2(args, base)


def _run(args, mount, cache_size: int) -> Result:
    import torch

    from cachepipe import TwoLevelCache
    from cachepipe.warmup import warmup
    from tools.bench.harness.l2 import describe_l2

    torch.set_num_threads(1)
    plain, compared = _configs(args, mount.path, cache_size)
    with compared as l2_configs:
        caches = {name: TwoLevelCache(c) for name, c in plain}
        for k, c in enumerate(l2_configs):
            caches["l1+l2" if k == 0 else f"l1+l2 ({c.l2.kind} {k})"] = TwoLevelCache(c)
        n = len(caches["none"])
        notes = [f"source {mount.profile.describe()} (cachepipe slowfs over {Path(args.source).absolute()}); "
                 f"{n} images, {caches['none'].manifest.total_bytes / n / 1024:.0f} KiB per file on average"]
        for name, cache in caches.items():
            if name.startswith("l1+l2"):
                t = time.perf_counter()
                r = warmup(cache, workers=max(1, args.workers), progress=False, require_full=True)
                dt = time.perf_counter() - t
                read = (f"{r['bytes_read'] / 1e6 / dt:.1f} MB/s from the share" if r["bytes_read"]
                        else "from the warm L1")
                notes.append(f"warm-up of {name} ({describe_l2(cache.config)}): {dt:.1f} s, {read}")
            cache.close()
        runs = _rounds(args, caches)
    rows = []
    for name, cache in caches.items():
        row = {"cache": name, "l2": describe_l2(cache.config) if name.startswith("l1+l2") else "-",
               **median_run(runs[name], "images_per_s"), "images_per_s_all": [r["images_per_s"] for r in runs[name]],
               "io_ms_per_image_all": [r["io_ms_per_image"] for r in runs[name]],
               "speedup": median_ratio(runs[name], runs["none"], "images_per_s"),
               "io_reduction": median_ratio(runs["none"], runs[name], "io_ms_per_image"),
               "workers": args.workers, "batch_size": args.batch_size, "size": args.size, "cache_size": cache_size,
               "epochs": args.epochs, "rounds": args.rounds, "images": n, "source_latency_ms": mount.profile.latency_ms,
               "source_metadata_latency_ms": mount.profile.metadata_s * 1e3, "source_mbps": mount.profile.mbps}
        rows.append(row)
    best = next(r for r in rows if r["cache"] == "l1+l2")
    met = all(best[k] >= v for k, v in TARGETS.items())
    notes.append(f"targets (the seed's Fig. 9): I/O per image >= {TARGETS['io_reduction']:g}x less and images/s "
                 f">= {TARGETS['speedup']:g}x with L1 + L2 than with no cache: "
                 f"{'met' if met else 'MISSED'} ({best['io_reduction']:.1f}x, {best['speedup']:.2f}x)")
    return Result(rows, COLUMNS, notes=notes,
                  headline=f"L1+L2 on an EFS-like share: I/O per image {best['io_reduction']:.0f}x less, "
                           f"{best['speedup']:.1f}x images/s vs no cache")


def _measure(loader, epochs: int, epoch: int) -> tuple[dict, int]:
    t0, wait0, hits0 = time.perf_counter(), loader.cache_wait_s, dict(loader.cache_hits)
    images = 0
    for e in range(epoch, epoch + epochs):
        loader.set_epoch(e)
        for _, labels in loader:
            images += len(labels)
    seconds = time.perf_counter() - t0
    hits = {k: (loader.cache_hits[k] - hits0[k]) / images for k in loader.cache_hits}
    return {"images_per_s": images / seconds, "io_ms_per_image": 1e3 * (loader.cache_wait_s - wait0) / images,
            "source_reads_per_image": hits.get("source_reads", 0.0), "l1_hits_per_image": hits.get("l1_hits", 0.0),
            "l2_hits_per_image": hits.get("l2_hits", 0.0), "seconds": seconds}, epoch + epochs


def _rounds(args, caches: dict) -> dict[str, list[dict]]:
    """One untimed epoch per loader, then interleaved timed rounds."""
    from loaders import cached_dataloader

    loaders = {name: cached_dataloader(cache.config.source, cache=cache, batch_size=args.batch_size, train=True,
                                       size=args.size, workers=args.workers, cache_size=cache.config.cache_size,
                                       seed=0)
               for name, cache in caches.items()}
    epochs = dict.fromkeys(loaders, 0)
    runs: dict[str, list[dict]] = {name: [] for name in loaders}
    try:
        for name, loader in loaders.items():
            _, epochs[name] = _measure(loader, 1, epochs[name])
        for r in range(args.rounds):
            for name, loader in loaders.items():
                got, epochs[name] = _measure(loader, args.epochs, epochs[name])
                runs[name].append(got)
                print(f"round {r + 1}/{args.rounds} {name}: {got['images_per_s']:.0f} images/s, "
                      f"I/O {got['io_ms_per_image']:.2f} ms per image", flush=True)
    finally:
        for loader in loaders.values():
            loader.close()
    return runs
