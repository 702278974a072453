"""Fill L1 and L2 ahead of training, in parallel worker processes.

NOTE [warm-up partitions]
With ``num_nodes`` M, node R decodes into L2 the samples whose L2 shard is on node R:
the placement node-local sampling draws by (``store.node_of``, NOTE [placement] in
``cachepipe.l2.placement``), so the store must name one server per node, in node order
(M URLs, or M ``redis-cluster://`` URLs), or be node-local (``shm://`` on every node: the
homes are hashed over the M nodes). M nodes warm L2 in parallel without overlap,
each writing to its own server over no network, and the fixed subset a node caches when
L2 is too small (NOTE [fixed L2 subset]) is a subset of the samples its ranks draw with
``locality="node"``. L1 is a per-node local disk mirror of what the node reads (NOTE [L1
holds what the node reads]).
Work is found by asking each level what it lacks (LMDB keys, pipelined EXISTS), so a
killed run resumes where it stopped and a finished one has nothing to do; a finished one
knows it without N round trips (an L1 holding N entries, NOTE [completion record] in
``cachepipe/warm_record.py``). Every per-sample set is a numpy array.

NOTE [L1 holds what the node reads]
Under global sampling (``locality="global"``) every rank draws from every sample, so each
node mirrors the whole source (``l1_scope="all"``) and the file server serves each file
once per node (16 nodes: 16 reads of every file, 144 GB of disk per node for ImageNet).
Under node-local sampling (``locality="node"``) a node's ranks draw its partition, the
samples its L2 holds (plus the ~2 % exchanged each epoch, read from their home node's L2),
so it mirrors only that (``l1_scope="partition"``): the nodes' partitions are disjoint
and the file server serves each file once per job. ``l1_scope`` follows ``locality``
unless given; the report names it (``l1_scope``, and ``cachepipe warmup`` says it).

NOTE [corrupt files]
A file is recorded in ``<fingerprint>/corrupt.json`` only when a stable read (NOTE
[stable reads] in ``source/reader.py``) of bytes that match the manifest's identity does not
decode, or when the file is larger than one sample may be (NOTE [bounded reads]; it is
not read). A file that cannot be read (after retries), or that changed since the scan,
is reported as such and simply stays missing from the levels: the next warm-up tries it
again. A corrupt file's bytes stay in L1, which mirrors the source as it is: a file
fixed or restored since has another identity (NOTE [file identity]) and so another
fingerprint, so the bytes L1 holds under this one are the file's. Every warm-up re-checks
the recorded files by decoding those bytes again (read from the source when L1 lacks
them, as for a file too large to read) without writing anything for them: one that now
decodes (a Pillow release that reads it, a larger ``max_file_bytes``) is cleared from the
record and cached. Re-checks alone are "nothing to do" and write nothing.

NOTE [fixed L2 subset]
A source larger than L2 (ImageNet decoded at 256 px is ~300 GB) is cached in part: the
warm-up writes as many samples of this node's partition as the shards have room for,
each shard taking its samples in index order (``capacity.l2_fitting``), and they stay.
Training reads every sample once per epoch in a new order, so a policy that replaces
cached samples (LRU, or loaders writing their misses back) moves data in and out of L2
every epoch without raising the hit rate above the fraction that fits; a fixed subset
gives that fraction with no churn (CoorDL's MinIO policy, Mohan et al., VLDB 2021). The
warm-up records how many samples of its partition it left out for lack of room in the
hash ``<namespace>partial`` (field ``"<node_rank>/<num_nodes>"``) on every shard, and
clears its field once a later run covers the partition. A ``TwoLevelCache`` that finds
the hash non-empty never writes its misses to L2: they are read from L1 and decoded,
with no warning. Writes refused for ``maxmemory`` during the warm-up (the size estimate
was low, or a replica's node filled the room first) leave those samples out like the rest;
they are not errors. ``require_full`` (``--require-full``) refuses to start when the
partition does not fit, as before, and the CLI then exits 5.
"""
from __future__ import annotations

import errno
import multiprocessing
import sys
import time
from collections.abc import Callable
from itertools import islice

import numpy as np

from cachepipe.capacity import check_l1_space, estimate_sample_bytes, l2_fitting, l2_shortfalls
from cachepipe.coverage import evicting_shards, l2_used, warm_coverage
from cachepipe.errors import L1FullError, L2UnavailableError
from cachepipe.l1.corrupt_record import known_corrupt, save_corrupt
from cachepipe.l1.sizing import l1_disk_bytes
from cachepipe.l1_reuse import adopt_previous_l1
from cachepipe.warm_chunks import GROUP, pipelined, run_group, set_worker_cache, warm_chunk
from cachepipe.stale import stale_fingerprints, stale_l2_keys
from cachepipe.warm_record import is_complete, record_complete

__all__ = ["L2TooSmallError", "known_corrupt", "node_partition", "pipelined", "plan_warmup", "warm_chunk",
           "warmup"]

LOCALITIES = ("global", "node")  # as loaders.locality spells them
_SUMMED = ("l1_written", "l2_written", "l2_full", "bytes_read", "l2_write_errors")


class L2TooSmallError(MemoryError):
    """L2 cannot hold the partition; the message says how much memory it needs."""


def node_partition(cache, *, node_rank: int = 0, num_nodes: int = 1, limit: int | None = None) -> np.ndarray:
    """The sorted indices (among the first ``limit`` when given) that node ``node_rank`` of
    ``num_nodes`` warms into L2: all with one node, else those whose L2 shard is on it
    (NOTE [warm-up partitions]); a sample no live shard holds is in no partition.

    Raises:
        ValueError: bad partition arguments.
        LocalityError: more than one node, but the store cannot place samples on them (not
            one Redis URL per node; the message says what to pass).
    """
    if num_nodes < 1 or not 0 <= node_rank < num_nodes:
        raise ValueError(f"need 0 <= node_rank < num_nodes, got {node_rank=} {num_nodes=}")
    n = len(cache) if limit is None else min(limit, len(cache))
    if num_nodes == 1:
        return np.arange(n, dtype=np.int64)
    from cachepipe.l2.placement import LocalityError

    store = cache.store
    if store is None:
        raise LocalityError(f"{num_nodes} nodes warm the samples held by their own L2, so they need one Redis URL "
                            f"per node, in node order (--l2 URL of node 0's server ...), or --l2 shm://, but the "
                            f"cache has no L2")
    return np.flatnonzero(store.node_of(np.arange(n, dtype=np.int64), num_nodes) == node_rank)  # raises LocalityError


def plan_warmup(cache, part: np.ndarray, *, l1_scope: str = "all", limit: int | None = None, node: str = "0/1",
                evicting: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(l1_todo, l2_todo)``: sorted indices missing from L1 (among the first
    ``limit`` samples when given) and from L2 (of the node's partition ``part``, from
    :func:`node_partition`), plus, in both, the partition's known corrupt files, which
    every warm-up re-checks (NOTE [corrupt files]). L1 is complete when it holds N entries
    and L2 when ``node``'s completion record holds (NOTE [completion record]); otherwise
    every key is asked for.

    Raises:
        ValueError: bad ``l1_scope``.
        L2UnavailableError: a shard cannot be reached.
    """
    if l1_scope not in ("all", "partition"):
        raise ValueError(f"l1_scope must be one of 'all', 'partition'; got {l1_scope!r}")
    n = len(cache) if limit is None else min(limit, len(cache))
    part = np.asarray(part, dtype=np.int64)
    bad = np.intersect1d(_known(cache), part)
    l1_todo = np.zeros(0, dtype=np.int64)
    if cache.l1 is not None and cache.l1.entries() < len(cache):  # an L1 holds one fingerprint's indices
        scope = np.arange(n, dtype=np.int64) if l1_scope == "all" else part
        l1_todo = np.setdiff1d(scope, cache.l1.present(), assume_unique=True)  # known corrupt included
    l2_todo = np.zeros(0, dtype=np.int64)
    if cache.store is not None and not is_complete(cache, node, part, bad, evicting or []):
        l2_todo = np.asarray(cache.store.missing(part.tolist()), dtype=np.int64)
    return l1_todo, np.union1d(l2_todo, bad)


def _known(cache) -> np.ndarray:
    return np.asarray(sorted(known_corrupt(cache)), dtype=np.int64)


def _names(manifest, indices) -> list[str]:
    return [manifest.relpath(i) for i in sorted(int(i) for i in indices)]


def warmup(cache, *, workers: int = 1, node_rank: int = 0, num_nodes: int = 1,
           l1_scope: str | None = None, locality: str = "global", batch_size: int = 64, progress: bool = True,
           check_capacity: bool = True, on_progress: Callable[[int], None] | None = None,
           limit: int | None = None, require_full: bool = False) -> dict:
    """Fill ``cache`` (a :class:`~cachepipe.TwoLevelCache`) for this node.

    Args:
        workers: parallel worker processes (1 = in this process).
        node_rank, num_nodes: this node's L2 partition (NOTE [warm-up partitions]).
        l1_scope: ``"all"`` or ``"partition"``; default: as ``locality`` (NOTE [L1 holds
            what the node reads]).
        locality: how training draws samples, ``"global"`` or ``"node"`` (node-local).
        batch_size: samples per LMDB transaction / Redis pipeline.
        progress: show a tqdm bar on stderr.
        check_capacity: refuse to start when the L1 disk is too small, and write to L2 only
            the fixed subset of the partition that fits (NOTE [fixed L2 subset]).
        on_progress: called with the number of samples finished after every batch.
        limit: only warm the first ``limit`` samples (benchmarks, smoke tests).
        require_full: refuse to start (``L2TooSmallError``) when L2 cannot hold the partition.

    Returns:
        Summary dict: ``samples``, ``partition``, ``l1_scope``, ``locality``, ``l1_adopted``
        (``None``, or what :func:`~cachepipe.l1_reuse.adopt_previous_l1` did: NOTE
        [metadata-only changes]), ``cache_size``, ``l1_todo``, ``l2_todo``,
        ``l1_written``, ``l2_written``, ``l2_cached`` / ``l2_uncached`` (samples of the
        partition in L2 / left out for lack of room), ``l2_coverage`` (their fraction in
        L2), ``l2_full`` (writes refused for maxmemory), ``l2_bytes_per_sample`` (growth of
        the shards' used memory per sample written, 0 when none), ``bytes_read``,
        ``l2_write_errors`` (other failed writes), ``corrupt`` (relpaths found
        corrupt for the first time), ``known_corrupt`` (relpaths still recorded after the
        re-check), ``recovered`` (recorded ones that now decode), ``unreadable`` and
        ``changed`` (relpaths not cached this time; see NOTE [corrupt files]),
        ``unreadable_reasons`` (relpath -> the read error),
        ``stale_fingerprints`` and ``l2_stale_keys`` (older versions of the source and their
        L2 keys, counted when samples did not fit: NOTE [stale namespaces]),
        ``seconds``, ``mb_per_s``, ``nothing_to_do`` (no work but the re-checks).

    Raises:
        L2UnavailableError, L2TooSmallError, L1FullError, ValueError.
    """
    if workers < 1 or batch_size < 1:
        raise ValueError(f"workers and batch_size must be >= 1, got {workers=} {batch_size=}")
    if num_nodes > 1 and cache.config.l2.is_embedded:
        raise ValueError("num_nodes > 1 needs a shared L2 (Redis URLs or a cluster): "
                         "the embedded server is private to one node, so the other nodes' "
                         "partitions would never reach it")
    if locality not in LOCALITIES:
        raise ValueError(f"locality must be one of {list(LOCALITIES)}; got {locality!r}")
    l1_scope = l1_scope or ("partition" if locality == "node" else "all")  # NOTE [L1 holds what the node reads]
    t0 = time.perf_counter()
    adopted = adopt_previous_l1(cache)  # NOTE [metadata-only changes]: before anything opens L1
    m = cache.manifest
    node = f"{node_rank}/{num_nodes}"
    part = node_partition(cache, node_rank=node_rank, num_nodes=num_nodes, limit=limit)
    evicting = evicting_shards(cache.store)  # warned once: they undo what is written
    if cache.config.use_l1 and cache.l1 is None:  # bypassed (NOTE [L1 guard]): its gaps cannot even be asked for
        why = "; ".join(cache.l1_problems) or f"L1 mirror {cache.l1_path} cannot be opened (see the warning above)"
        raise L1FullError(errno.ENOSPC, f"{why}: the warm-up needs a writable L1 (free space on its disk, or "
                          f"pass another --cache-dir)")
    l1_todo, l2_missing = plan_warmup(cache, part, l1_scope=l1_scope, limit=limit, node=node, evicting=evicting)
    known = known_corrupt(cache)
    recheck = np.intersect1d(_known(cache), l2_missing)
    if check_capacity and len(l1_todo):
        sizes = m.sizes[l1_todo]
        sizes = sizes[sizes <= cache.config.max_file_bytes]  # larger files are never stored (NOTE [bounded reads])
        problem = check_l1_space(cache.l1_path, l1_disk_bytes(len(sizes), int(sizes.sum())))  # NOTE [L1 map size]
        if problem:
            raise L1FullError(28, problem)
    l2_todo = l2_missing
    if check_capacity and len(l2_todo):
        per_sample = estimate_sample_bytes(cache, l2_todo, keep=workers == 1)  # kept for the chunks read here
        problems = l2_shortfalls(cache.store, l2_todo, per_sample)
        if problems and require_full:
            raise L2TooSmallError("; ".join(problems))
        if problems:
            l2_todo = np.asarray(l2_fitting(cache.store, l2_todo.tolist(), per_sample), dtype=np.int64)
    work = np.union1d(l1_todo, l2_todo)
    report = {"samples": len(m), "partition": len(part), "l1_scope": l1_scope, "locality": locality,
              "l1_adopted": adopted,
              "cache_size": cache.config.cache_size, "fingerprint": m.fingerprint,
              "l1_todo": len(l1_todo), "l2_todo": len(l2_todo), "l1_written": 0, "l2_written": 0,
              "l2_full": 0, "bytes_read": 0, "l2_write_errors": 0, "corrupt": [],
              "nothing_to_do": not len(np.setdiff1d(work, recheck, assume_unique=True))}
    used_before = l2_used(cache) if len(l2_todo) else 0
    in_l2 = np.isin(work, l2_todo)
    # what is read from the source: what L1 lacks, or everything without an L1 (NOTE [reads in flight])
    from_source = np.isin(work, l1_todo) if cache.config.use_l1 else np.ones(len(work), dtype=bool)
    chunks = ((work[s:s + batch_size].tolist(), work[s:s + batch_size][in_l2[s:s + batch_size]].tolist(),
               work[s:s + batch_size][from_source[s:s + batch_size]].tolist())
              for s in range(0, len(work), batch_size))  # made as the workers take them: no list of N
    count = -(-len(work) // batch_size)
    found = {k: set() for k in ("corrupt", "unreadable", "changed", "decoded")}  # "decoded": of ``recheck`` only
    recheck = set(recheck.tolist())
    why: dict[int, str] = {}  # what was wrong with each unreadable file
    if count:
        from tqdm import tqdm

        bar = tqdm(total=len(work), unit="img", desc="warmup", disable=not progress,
                   file=sys.stderr, dynamic_ncols=True)
        if workers == 1 or count == 1:
            results = pipelined(cache, chunks)
            pool = None
        else:
            ctx = multiprocessing.get_context("spawn")
            pool = ctx.Pool(min(workers, -(-count // GROUP)), initializer=set_worker_cache, initargs=(cache,))
            groups = iter(lambda: list(islice(chunks, GROUP)), [])
            results = (r for rs in pool.imap_unordered(run_group, groups) for r in rs)
        try:
            for r in results:
                for k in _SUMMED:
                    report[k] += r[k]
                for k, v in found.items():
                    v.update(recheck.intersection(r[k]) if k == "decoded" else r[k])
                why.update(r["why"])
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
        _written(save_corrupt, cache, now_known)
    report["corrupt"] = _names(m, found["corrupt"] - known)
    report["known_corrupt"] = _names(m, np.intersect1d(np.asarray(sorted(now_known), dtype=np.int64), part))
    report["recovered"] = _names(m, recovered)
    report["unreadable"] = _names(m, found["unreadable"])
    report["unreadable_reasons"] = {m.relpath(i): why[i] for i in sorted(found["unreadable"])}
    report["changed"] = _names(m, found["changed"])
    not_samples = now_known | found["unreadable"] | found["changed"]
    report.update(warm_coverage(cache, report, part, len(l2_missing), len(l2_missing) - len(l2_todo),
                                not_samples, evicting))
    report["l2_bytes_per_sample"] = ((l2_used(cache) - used_before) / report["l2_written"]
                                     if report["l2_written"] else 0.0)
    if cache.store is not None:
        cache.store.mark_partial(node, report["l2_uncached"])
        if not (report["l2_uncached"] or report["l2_write_errors"] or found["unreadable"] or found["changed"]
                or evicting):
            _written(record_complete, cache, node, part)  # NOTE [completion record]
    report["stale_fingerprints"], report["l2_stale_keys"] = _stale(cache) if report["l2_uncached"] else ([], 0)
    report["seconds"] = time.perf_counter() - t0
    if adopted:  # its reads are the warm-up's too
        report["bytes_read"] += adopted["bytes_read"]
    report["mb_per_s"] = report["bytes_read"] / 2**20 / report["seconds"] if report["seconds"] else 0.0
    return report


def _written(write, cache, *args) -> None:
    """``write(cache, *args)`` (a record in the cache dir); a full or read-only disk is ``L1FullError``."""
    try:
        write(cache, *args)
    except OSError as exc:
        raise L1FullError(exc.errno or errno.ENOSPC, f"cannot write a record in {cache.l1_path.parent}: "
                          f"{exc.strerror or exc}") from None


def _stale(cache) -> tuple[list[str], int]:
    """Older versions of the source and their L2 keys, which take the room that is missing
    (NOTE [stale namespaces]); none when they cannot be counted."""
    stale = stale_fingerprints(cache)
    try:
        return stale, stale_l2_keys(cache, stale)
    except L2UnavailableError:
        return stale, 0
