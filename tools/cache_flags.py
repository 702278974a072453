"""The cache flags, defined once for ``cachepipe warmup``, ``stats``, ``train`` and ``bench cache``,
and resolved once into a :class:`cachepipe.CacheConfig` that is handed down.

Only argparse here (no torch), so ``warmup`` and ``stats`` start fast.
"""
from __future__ import annotations

import argparse

from cachepipe.config import CacheConfig
from cachepipe.l2.spec import L2Spec, resolve_l2
from cachepipe.server.embedded import parse_memory
from cachepipe.server.idle_watch import DEFAULT_IDLE_MINUTES
from cachepipe.two_level import TwoLevelCache

__all__ = ["DEFAULT_CACHE_DIR", "add_cache_arguments", "cache_config", "cache_from_args", "cache_sizes_from_args",
           "check_args", "idle_seconds", "l2_from_args"]

DEFAULT_CACHE_DIR = "cachepipe-cache"  # train's --cache-dir when none is given


def add_cache_arguments(parser: argparse.ArgumentParser, *, source: bool = True) -> None:
    """Add ``--cache-dir --l2 (alias --redis) --redis-cluster --no-l2 --replicas --prefix
    --l2-memory --l2-servers --l2-idle --timeout --source-timeout --share-manifest --l1-size --max-file-size
    --follow-external-links``.

    Args:
        parser: the command's parser.
        source: also add ``SRC --cache-size --rescan --verify-files`` (commands that open
            one source at the sizes given) and make ``--cache-dir`` required; ``train``
            (False) reads the splits of its ``--data`` at its recipe's sizes, and its
            ``--cache-dir`` defaults to ``./cachepipe-cache``.
    """
    if source:
        parser.add_argument("source", metavar="SRC", help="ImageFolder root: SRC/<class>/<image file>")
    parser.add_argument("--cache-dir", required=source, default=None,
                        help="local directory for the manifests, the L1 LMDB mirror and the embedded Redis"
                             + ("" if source else f" (default: ./{DEFAULT_CACHE_DIR}; --demo: DEMO_DIR/cache)"))
    from cachepipe.l2.registry import registered_schemes

    parser.add_argument("--l2", "--redis", dest="l2", action="append", metavar="URL", default=None,
                        help="an L2 store, repeatable (--redis is its old name): shm:// (this node's memory, "
                             "/dev/shm/cachepipe-<uid>; shm:///path another tmpfs directory), redis://host:port/db "
                             "or unix:///path.sock (Redis shards, one per node in node order), "
                             "redis-cluster://host:port (a Redis Cluster); schemes: "
                             + " ".join(registered_schemes()) + "; unset: the embedded Redis in --cache-dir")
    parser.add_argument("--redis-cluster", metavar="URL", default=None,
                        help="a Redis Cluster seed node, redis://host:port (same as "
                             "--l2 redis-cluster://host:port)")
    parser.add_argument("--no-l2", action="store_true", help="use no L2 (L1 + source only)")
    if source:
        parser.add_argument("--cache-size", default=None, metavar="N[,N...]",
                            help="shorter side of cached samples in pixels; a list such as 128,256 "
                                 "for several sizes, each under its own L2 namespace (warmup: "
                                 "warmed in that order; bench cache: one size). Default: 256; "
                                 "stats: every size found in L2")
    parser.add_argument("--replicas", type=int, default=1,
                        help="copies of every L2 value on distinct shards")
    parser.add_argument("--prefix", default="cachepipe", help="first part of every L2 key")
    parser.add_argument("--l2-memory", default=None,
                        help="maxmemory of the embedded Redis, or the size of an shm:// store, e.g. 4gb, 512mb, "
                             "25%%; unset: keep a running server's (the store's recorded size), else the last one "
                             "given for --cache-dir, else 25%% of RAM")
    parser.add_argument("--l2-servers", type=int, default=None, metavar="N",
                        help="embedded redis-server processes, reads spread over them by key (docs/cache.md, "
                             "sizing); unset: one per 8 cores; use the same for warmup and train")
    parser.add_argument("--l2-idle", default=None, metavar="MINUTES",
                        help="an embedded redis-server started by this command stops by itself after this many "
                             "minutes without a client (and when its cache dir is deleted); 0: never; unset: "
                             f"{DEFAULT_IDLE_MINUTES:g}")
    parser.add_argument("--timeout", type=float, default=1.0, help="Redis socket timeout in seconds")
    parser.add_argument("--source-timeout", type=float, default=60.0, metavar="S",
                        help="seconds one source file read may take before it is tried again on a fresh thread "
                             "(twice, then the sample is unreadable): a stalled NFS costs this, never a hang")
    parser.add_argument("--l1-size", default=None, metavar="SIZE",
                        help="LMDB map size of the L1 mirror (e.g. 64gb); unset: from the source's file count "
                             "and bytes (docs/cache.md, L1); a full L1 says how much it needs")
    parser.add_argument("--max-file-size", default="1gb", metavar="SIZE",
                        help="the largest source file read for one sample (e.g. 1gb, 512mb); a larger one is "
                             "a bad sample, never read (skipped in training, listed as corrupt by warmup)")
    if source:
        parser.add_argument("--rescan", action="store_true",
                            help="rescan the source instead of reusing the saved manifest")
    parser.add_argument("--share-manifest", action="store_true",
                        help="publish the scan in the shared L2 (Redis URLs, cluster) and take another node's "
                             "from it: one scan per job, not per node (verified against this node's view)")
    parser.add_argument("--follow-external-links", action="store_true",
                        help="follow symlinks in the source that point outside it (default: skip them "
                             "with a warning); pass it to warmup and train alike")
    if source:
        parser.add_argument("--verify-files", action="store_true",
                            help="stat every file to decide whether the saved manifest is current "
                                 "(catches files edited in place; otherwise directories only)")


def l2_from_args(args: argparse.Namespace) -> L2Spec:
    """The L2 the flags name, resolved once (NOTE [L2 resolved once]): the embedded servers
    (``--l2-servers``, ``--l2-memory``), none (``--no-l2``) or the store of the URLs.

    Raises:
        ValueError: conflicting flags, an unknown URL scheme (lists the registered ones), a
            bad server count or memory size.
    """
    return resolve_l2(_redis_setting(args), servers=args.l2_servers, memory=args.l2_memory,
                      idle=idle_seconds(args.l2_idle))


def idle_seconds(minutes) -> float | None:
    """``--l2-idle MINUTES`` in seconds (None: unset; NOTE [idle embedded server]).

    Raises:
        ValueError: not a finite number of minutes >= 0 (names the flag).
    """
    if minutes is None:
        return None
    try:
        value = float(minutes)
        if not 0 <= value < float("inf"):
            raise ValueError
    except ValueError:
        raise ValueError(f"--l2-idle {minutes!r}: expected minutes >= 0 (0: never stop)") from None
    return value * 60


def _redis_setting(args: argparse.Namespace) -> list[str] | None | bool:
    urls = list(args.l2 or [])
    if args.redis_cluster:
        hostport = args.redis_cluster.split("://", 1)[-1]
        urls.append(f"redis-cluster://{hostport}")
    if args.no_l2:
        if urls:
            raise ValueError("--no-l2 cannot be combined with --l2/--redis/--redis-cluster")
        return False
    return urls or None


def cache_config(args: argparse.Namespace, source, cache_size: int = 256, cache_dir=None) -> CacheConfig:
    """The :class:`CacheConfig` the flags describe for ``source`` at ``cache_size``
    (``cache_dir`` when ``--cache-dir`` is unset: default ``./cachepipe-cache``).

    Raises:
        ValueError: a bad flag value (URL scheme, replicas, memory size, timeout, ...).
    """
    return CacheConfig(source, args.cache_dir or cache_dir or DEFAULT_CACHE_DIR, l2_from_args(args), cache_size,
                       prefix=args.prefix, replicas=args.replicas, timeout=args.timeout,
                       source_timeout=getattr(args, "source_timeout", 60.0),
                       follow_external_links=args.follow_external_links,
                       share_manifest=getattr(args, "share_manifest", False),
                       max_file_bytes=_bytes(args.max_file_size, "--max-file-size"),
                       l1_map_size=None if args.l1_size is None else _bytes(args.l1_size, "--l1-size"))


def _bytes(text, flag: str) -> int:
    """Bytes of a size flag (Redis' units, as ``--l2-memory``, without ``%``)."""
    text = str(text)
    try:
        if "%" in text:
            raise ValueError
        return parse_memory(text)
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected a positive size such as 1gb or 512mb") from None


def cache_sizes_from_args(args: argparse.Namespace, default: tuple[int, ...] = (256,)) -> tuple[int, ...]:
    """The sizes of ``--cache-size`` (``"128,256"`` -> ``(128, 256)``), ``default`` when unset.

    Raises:
        ValueError: one line naming the flag (not a list of positive ints, or a repeat).
    """
    text = args.cache_size
    if text is None:
        return default
    try:
        sizes = tuple(int(part) for part in str(text).split(","))
    except ValueError:
        raise ValueError(f"--cache-size {text!r}: expected shorter sides in pixels separated by "
                         f"commas, e.g. 256 or 128,256") from None
    if min(sizes) < 1:
        raise ValueError(f"--cache-size {text!r}: sizes must be positive pixel counts")
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"--cache-size {text!r}: a size is listed twice")
    return sizes


def check_args(args: argparse.Namespace) -> None:
    """Validate the cache flags of a ``SRC`` command without touching the source or Redis.

    Raises:
        ValueError: a bad flag value (URL scheme, replicas, cache size, memory size...).
    """
    cache_config(args, args.source, cache_sizes_from_args(args)[0])


def cache_from_args(args: argparse.Namespace, cache_size: int | None = None, *,
                    save_manifest: bool = True) -> TwoLevelCache:
    """Open the :class:`TwoLevelCache` the flags describe, at ``cache_size`` (default: the
    one size of ``--cache-size``, or 256; ``save_manifest`` as there).

    Raises:
        FileNotFoundError, ValueError: as :class:`TwoLevelCache`; several ``--cache-size``
            values and no ``cache_size``.
    """
    if cache_size is None:
        sizes = cache_sizes_from_args(args)
        if len(sizes) > 1:
            raise ValueError(f"--cache-size {args.cache_size}: this command takes one size")
        cache_size = sizes[0]
    return TwoLevelCache(cache_config(args, args.source, cache_size),
                         verify="files" if args.verify_files else "dirs", rescan=args.rescan,
                         save_manifest=save_manifest)
