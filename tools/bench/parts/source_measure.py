"""The measurements of ``cachepipe bench source``: the scan, the warm-up's bandwidth, two
nodes' reads and a metadata-only change, each on a slowfs share (NOTE [bench source] in
``tools/bench/source.py``)."""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from tools.bench.harness.slow_source import slowfs_mount
from tools.bench.parts.scale_measure import run_command
from tools.bench.parts.scale_tree import build_tree

__all__ = ["build_blobs", "measure_metadata_change", "measure_scan", "measure_two_nodes", "measure_warmup"]

MB = 1e6
_SCAN = ("import sys, time\n"
         "from cachepipe.source.manifest import Manifest\n"
         "t = time.perf_counter()\n"
         "m = Manifest.scan(sys.argv[1], scan_threads=int(sys.argv[2]))\n"
         "print(len(m), time.perf_counter() - t)\n")


def build_blobs(root: str | os.PathLike, files: int, file_bytes: int, classes: int = 20) -> Path:
    """A tree of ``files`` files of ``file_bytes`` random bytes named like JPEGs (the L1
    mirror never decodes them), reused when complete."""
    root = Path(root)
    marker = root / ".complete"
    if marker.is_file() and marker.read_text() == f"{files} {file_bytes}":
        return root
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(0)
    for k in range(files):
        folder = root / f"c{k % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k:06d}.jpg").write_bytes(rng.integers(0, 256, file_bytes, dtype=np.uint8).tobytes())
    marker.write_text(f"{files} {file_bytes}")
    return root


def _opens(mount) -> tuple[dict, dict]:
    doc = mount.stats()
    return doc.get("files", {}), doc.get("totals", {})


def measure_scan(work: Path, files: int, threads: int, profile) -> dict:
    """A cold scan of a ``files``-file hard-link tree on slowfs, in a process of its own
    (seconds, peak RSS), and the share's metadata calls."""
    tree = build_tree(work / f"scan-{files}", files)
    with slowfs_mount(tree, profile) as mount:
        got = run_command([sys.executable, "-c", _SCAN, str(mount.path), str(threads)])
    if got["rc"]:
        raise RuntimeError(f"the scan failed: {got['stderr'][-500:]}")
    n, seconds = got["stdout"].split()
    ops = mount.stats().get("ops", {})
    calls = sum(ops.values())
    return {"files": int(n), "threads": threads, "seconds": float(seconds), "peak_rss_mb": got["max_rss"] / MB,
            "metadata_calls": calls, "serial_s": calls * profile.metadata_s, "ops": ops}


def _cache(source, cache_dir, l2=False, **kw):
    from cachepipe import TwoLevelCache

    return TwoLevelCache(source, cache_dir, l2, 32, **kw)


def measure_warmup(work: Path, files: int, file_bytes: int, profile) -> dict:
    """The warm-up of an L1 (no L2: the source's bandwidth, not the decode, is measured)
    from slowfs: source MB/s (10**6 bytes) against the share's cap."""
    from cachepipe.warmup import warmup

    tree = build_blobs(work / f"blobs-{files}x{file_bytes}", files, file_bytes)
    cache_dir = work / "warm-cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    with slowfs_mount(tree, profile) as mount:
        with _cache(mount.path, cache_dir) as cache:
            t = time.perf_counter()
            r = warmup(cache, progress=False)
            seconds = time.perf_counter() - t
            written = cache.l1.entries()
    shutil.rmtree(cache_dir, ignore_errors=True)
    mbps = r["bytes_read"] / MB / seconds
    return {"files": files, "file_kb": file_bytes / 1024, "seconds": seconds, "mb": r["bytes_read"] / MB,
            "mb_per_s": mbps, "share_mbps": profile.mbps, "fraction": mbps / profile.mbps, "l1_entries": written}


def measure_two_nodes(work: Path, files: int, profile) -> dict:
    """Two emulated nodes (their own cache dirs and ``shm://`` stores, one share) warm up
    for node-local sampling: the share's opens per file and each node's L1 against its
    partition."""
    from cachepipe.warmup import node_partition, warmup

    tree = build_tree(work / f"nodes-{files}", files, classes=10, side=64)
    base = work / "two-nodes"
    shutil.rmtree(base, ignore_errors=True)
    out = {"files": files, "nodes": 2, "l1": [], "partition": [], "only_partition": True}
    parts, shm = [], [Path(f"/dev/shm/cachepipe-source-{os.getpid()}-node{rank}") for rank in (0, 1)]
    with slowfs_mount(tree, profile) as mount:
        for rank in (0, 1):
            store = f"shm://{shm[rank]}"
            with _cache(mount.path, base / f"node{rank}", [store], l2_memory=64 << 20) as cache:
                warmup(cache, node_rank=rank, num_nodes=2, locality="node", progress=False)
                part = node_partition(cache, node_rank=rank, num_nodes=2)
                held = cache.l1.present()
                out["l1"].append(len(held))
                out["partition"].append(len(part))
                out["only_partition"] &= bool(np.array_equal(held, part))
                parts.append(set(part.tolist()))
    per_file, totals = _opens(mount)
    opens = [f["opens"] for f in per_file.values()]
    out.update(disjoint=not parts[0] & parts[1], covered=len(parts[0] | parts[1]) == files,
               files_opened=len(opens), opens=sum(opens), max_opens_per_file=max(opens, default=0),
               mb_read=totals.get("bytes", 0) / MB)
    for path in [base, *shm]:
        shutil.rmtree(path, ignore_errors=True)
    return out


def _l1_bytes(cache_dir: Path) -> int:
    return sum(f.stat().st_blocks * 512 for d in cache_dir.glob("*/l1*") if d.is_dir() for f in d.iterdir()
               if f.is_file())


def measure_metadata_change(work: Path, files: int, profile) -> dict:
    """Warm an L1 from slowfs, ``chmod -R`` the tree behind it, warm up again (a rescan):
    the share's opens per file in the second warm-up and the L1's bytes before and after."""
    from cachepipe.warmup import warmup

    tree = work / f"chmod-{files}"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(build_tree(work / f"nodes-{files}", files, classes=10, side=64), tree)  # its own inodes
    cache_dir = work / "chmod-cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    mnt = work / "chmod-mnt"  # the same mountpoint twice: the same root, so the new scan is a new version of it
    mnt.mkdir(exist_ok=True)
    with slowfs_mount(tree, profile, mountpoint=mnt) as mount:
        with _cache(mount.path, cache_dir) as cache:
            warmup(cache, progress=False)
            before, fp = _l1_bytes(cache_dir), cache.fingerprint
    for d, _, names in os.walk(tree):  # chmod -R go-rwx
        os.chmod(d, 0o700)
        for name in names:
            os.chmod(os.path.join(d, name), 0o600)
    with slowfs_mount(tree, profile, mountpoint=mnt) as mount:
        with _cache(mount.path, cache_dir, rescan=True) as cache:
            t = time.perf_counter()
            r = warmup(cache, progress=False)
            seconds = time.perf_counter() - t
            changed = cache.fingerprint != fp
            entries = cache.l1.entries()
    after = _l1_bytes(cache_dir)
    per_file, _ = _opens(mount)
    opens = [f["opens"] for f in per_file.values()]
    adopted = r["l1_adopted"] or {}
    shutil.rmtree(cache_dir, ignore_errors=True)
    shutil.rmtree(tree, ignore_errors=True)
    return {"files": files, "new_fingerprint": changed, "l1_mb_before": before / MB, "l1_mb_after": after / MB,
            "l1_entries": entries, "opens": sum(opens), "max_opens_per_file": max(opens, default=0),
            "reused": adopted.get("reused", 0), "replaced": adopted.get("replaced", 0),
            "l1_written": r["l1_written"], "seconds": seconds}
