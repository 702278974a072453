"""Fill L1 and L2 ahead of training, in parallel worker processes.

NOTE [warm-up partitions]
With ``num_nodes`` M, node R decodes into L2 the samples ``i`` with ``i % M == R`` (the
keys still land on whatever shard rendezvous hashing picks), so M nodes warm L2 in
parallel without overlap. L1 is a per-node local disk mirror: by default (``l1_scope
="all"``) each node mirrors the whole source; ``"partition"`` mirrors only its part.
Work is found by asking each level what it lacks (LMDB keys, pipelined EXISTS), so a
killed run resumes where it stopped and a finished one has nothing to do.

NOTE [corrupt files]
A file is recorded in ``<fingerprint>/corrupt.json`` only when a stable read (NOTE
[stable reads] in ``source.py``) of bytes that match the manifest's size and mtime does
not decode. A file that cannot be read (after retries), or that changed since the scan,
is reported as such and simply stays missing from the levels: the next warm-up tries it
again. Recorded files are re-checked by every warm-up: their L1 entries are dropped,
they are read from the source again, and a file that now decodes is cleared from the
record and cached. So a restored file never stays "corrupt".
"""
from __future__ import annotations

import json
import multiprocessing
import sys
import time
from collections import Counter
from collections.abc import Callable

from cachepipe.capacity import check_l1_space, estimate_sample_bytes, l2_shortfalls
from cachepipe.decode import decode_and_resize
from cachepipe.errors import CorruptSampleError, L1FullError
from cachepipe.l2_codec import encode_sample
from cachepipe.private_files import write_private

__all__ = ["L2TooSmallError", "known_corrupt", "plan_warmup", "warm_chunk", "warmup"]

_SUMMED = ("l1_written", "l2_written", "bytes_read", "l2_write_errors")


class L2TooSmallError(MemoryError):
    """L2 cannot hold the partition; the message says how much memory it needs."""


def _corrupt_path(cache):
    return cache.l1_path.parent / "corrupt.json"


def known_corrupt(cache) -> set[int]:
    """Indices found undecodable by earlier warm-ups of this fingerprint."""
    try:
        with open(_corrupt_path(cache)) as f:
            return set(json.load(f))
    except (OSError, ValueError):
        return set()


def _save_corrupt(cache, indices: set[int]) -> None:
    write_private(_corrupt_path(cache), json.dumps(sorted(indices)).encode())


def plan_warmup(cache, *, node_rank: int = 0, num_nodes: int = 1, l1_scope: str = "all",
                limit: int | None = None):
    """Return ``(l1_todo, l2_todo)``: sorted indices missing from L1 and from L2
    (among the first ``limit`` samples when given), plus, in both, this node's known
    corrupt files, which every warm-up re-checks (NOTE [corrupt files]).

    Raises:
        ValueError: bad partition arguments or ``l1_scope``.
        L2UnavailableError: a shard cannot be reached.
    """
    if num_nodes < 1 or not 0 <= node_rank < num_nodes:
        raise ValueError(f"need 0 <= node_rank < num_nodes, got {node_rank=} {num_nodes=}")
    if l1_scope not in ("all", "partition"):
        raise ValueError(f"l1_scope must be one of 'all', 'partition'; got {l1_scope!r}")
    n = len(cache) if limit is None else min(limit, len(cache))
    part = list(range(node_rank, n, num_nodes))
    bad = {i for i in known_corrupt(cache) if i < n and i % num_nodes == node_rank}
    l1_todo: list[int] = []
    if cache.l1 is not None:
        present = cache.l1.present() - bad
        l1_todo = [i for i in (range(n) if l1_scope == "all" else part) if i not in present]
    l2_todo = cache.store.missing(part) if cache.store is not None else []
    return l1_todo, sorted(set(l2_todo) | bad)


def warm_chunk(cache, indices: list[int], l2_indices: list[int]) -> dict:
    """Mirror ``indices`` into L1 and decode ``l2_indices`` into L2 (one batch each).

    Returns:
        Counts (``done``, ``l1_written``, ``l2_written``, ``bytes_read``,
        ``l2_write_errors``) and index lists: ``corrupt`` (stable, unchanged bytes that do
        not decode), ``unreadable`` (read errors after retries), ``changed`` (the file
        differs from the manifest), ``decoded``.

    Raises:
        L1FullError: the L1 map or disk is full.
    """
    before = Counter(cache.counters)
    cache._open()
    raw = cache._read_raw(indices, strict_l1=True)
    changed = set(cache._raw.changed)
    corrupt, unreadable, encoded = [], [], []
    for i in l2_indices:
        data = raw[i]
        if isinstance(data, OSError):
            unreadable.append(i)
            continue
        if i in changed:
            continue
        try:
            encoded.append((i, encode_sample(i, decode_and_resize(data, cache.config.cache_size, index=i))))
        except CorruptSampleError:
            corrupt.append(i)
    l2_written = cache.store.put_many(encoded) if encoded and cache.store is not None else 0
    after = cache.counters
    return {"done": len(indices), "l1_written": after["l1_writes"] - before["l1_writes"],
            "l2_written": l2_written, "bytes_read": after["source_bytes"] - before["source_bytes"],
            "l2_write_errors": after["l2_write_errors"] - before["l2_write_errors"],
            "corrupt": corrupt, "unreadable": unreadable, "changed": sorted(changed),
            "decoded": [i for i, _ in encoded]}


def _names(manifest, indices: set[int]) -> list[str]:
    return [manifest.relpaths[i] for i in sorted(indices)]


_WORKER_CACHE = None


def _init_worker(cache) -> None:
    global _WORKER_CACHE
    _WORKER_CACHE = cache


def _run_chunk(args) -> dict:
    return warm_chunk(_WORKER_CACHE, *args)


def warmup(cache, *, workers: int = 1, node_rank: int = 0, num_nodes: int = 1,
           l1_scope: str = "all", batch_size: int = 64, progress: bool = True,
           check_capacity: bool = True, on_progress: Callable[[int], None] | None = None,
           limit: int | None = None) -> dict:
    """Fill ``cache`` (a :class:`~cachepipe.TwoLevelCache`) for this node.

    Args:
        workers: parallel worker processes (1 = in this process).
        node_rank, num_nodes: this node's L2 partition (NOTE [warm-up partitions]).
        l1_scope: ``"all"`` or ``"partition"``.
        batch_size: samples per LMDB transaction / Redis pipeline.
        progress: show a tqdm bar on stderr.
        check_capacity: refuse to start when L1 disk or L2 memory is too small.
        on_progress: called with the number of samples finished after every batch.
        limit: only warm the first ``limit`` samples (benchmarks, smoke tests).

    Returns:
        Summary dict: ``samples``, ``partition``, ``l1_todo``, ``l2_todo``, ``l1_written``,
        ``l2_written``, ``bytes_read``, ``l2_write_errors``, ``corrupt`` (relpaths found
        corrupt for the first time), ``known_corrupt`` (relpaths still recorded after the
        re-check), ``recovered`` (recorded ones that now decode), ``unreadable`` and
        ``changed`` (relpaths not cached this time; see NOTE [corrupt files]),
        ``seconds``, ``mb_per_s``, ``nothing_to_do`` (no work but the re-checks).

    Raises:
        L2UnavailableError, L2TooSmallError, L1FullError, ValueError.
    """
    if workers < 1 or batch_size < 1:
        raise ValueError(f"workers and batch_size must be >= 1, got {workers=} {batch_size=}")
    if num_nodes > 1 and cache.config.redis is None:
        raise ValueError("num_nodes > 1 needs a shared L2 (Redis URLs or a cluster): "
                         "the embedded server is private to one node, so the other nodes' "
                         "partitions would never reach it")
    t0 = time.perf_counter()
    m = cache.manifest
    l1_todo, l2_todo = plan_warmup(cache, node_rank=node_rank, num_nodes=num_nodes,
                                   l1_scope=l1_scope, limit=limit)
    known = known_corrupt(cache)
    recheck = {i for i in known if i % num_nodes == node_rank} & set(l2_todo)
    report = {"samples": len(m), "partition": len(range(node_rank, len(m), num_nodes)),
              "fingerprint": m.fingerprint, "l1_todo": len(l1_todo), "l2_todo": len(l2_todo),
              "l1_written": 0, "l2_written": 0, "bytes_read": 0, "l2_write_errors": 0,
              "corrupt": [], "nothing_to_do": set(l1_todo) | set(l2_todo) <= recheck}
    if check_capacity and l1_todo:
        problem = check_l1_space(cache.l1_path, sum(m.sizes[i] for i in l1_todo))
        if problem:
            raise L1FullError(28, problem)
    if check_capacity and l2_todo:
        problems = l2_shortfalls(cache.store, l2_todo, estimate_sample_bytes(cache, l2_todo))
        if problems:
            raise L2TooSmallError("; ".join(problems))
    if recheck and cache.l1 is not None and cache._raw.l1_writable:
        cache.l1.delete(sorted(recheck))  # read them from the source again
    l2_set = set(l2_todo)
    work = sorted(set(l1_todo) | l2_set)
    chunks = [(c, [i for i in c if i in l2_set])
              for c in (work[s:s + batch_size] for s in range(0, len(work), batch_size))]
    found = {k: set() for k in ("corrupt", "unreadable", "changed", "decoded")}
    if chunks:
        from tqdm import tqdm

        bar = tqdm(total=len(work), unit="img", desc="warmup", disable=not progress,
                   file=sys.stderr, dynamic_ncols=True)
        if workers == 1 or len(chunks) == 1:
            results = (warm_chunk(cache, *c) for c in chunks)
            pool = None
        else:
            ctx = multiprocessing.get_context("spawn")
            pool = ctx.Pool(min(workers, len(chunks)), initializer=_init_worker, initargs=(cache,))
            results = pool.imap_unordered(_run_chunk, chunks)
        try:
            for r in results:
                for k in _SUMMED:
                    report[k] += r[k]
                for k, v in found.items():
                    v.update(r[k])
                bar.update(r["done"])
                if on_progress:
                    on_progress(r["done"])
        finally:
            bar.close()
            if pool is not None:
                pool.terminate()
                pool.join()
    recovered = recheck & (found["decoded"] | found["changed"])
    now_known = (known - recovered) | found["corrupt"]
    if now_known != known:
        _save_corrupt(cache, now_known)
    report["corrupt"] = _names(m, found["corrupt"] - known)
    report["known_corrupt"] = _names(m, {i for i in now_known if i % num_nodes == node_rank})
    report["recovered"] = _names(m, recovered)
    report["unreadable"] = _names(m, found["unreadable"])
    report["changed"] = _names(m, found["changed"])
    report["seconds"] = time.perf_counter() - t0
    report["mb_per_s"] = report["bytes_read"] / 2**20 / report["seconds"] if report["seconds"] else 0.0
    return report
