"""``cachepipe warmup SRC --cache-dir DIR``: fill L1 (LMDB mirror) and L2 (Redis) before training.

``--cache-size 128,256`` warms each size in turn (L1 is shared; each size has its own L2
namespace). When L2 cannot hold this node's partition, as many samples as fit are cached
and kept (NOTE [fixed L2 subset] in ``cachepipe/warmup.py``) and the coverage is reported.

Exit status: 0 done (corrupt files are listed; L2 may hold a fixed subset), 1 corrupt
files with ``--strict``, L2 writes that failed, or files that could not be read (after
retries; the next run tries them again), 2 bad usage (flag values, URL schemes, a ``--json``
path that cannot be written: checked before the work, NOTE [output paths checked first]), 3
missing or invalid source, 4 unreachable Redis or a command its ACL refuses (an embedded
server this warm-up started is stopped again), 5 L2 too small with ``--require-full``
(the message says how much memory it needs), 6 L1 disk or map full, or the cache dir
cannot be written.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["configure", "main"]

EXIT_CORRUPT, EXIT_USAGE, EXIT_SOURCE, EXIT_REDIS, EXIT_L2_SMALL, EXIT_L1_FULL = 1, 2, 3, 4, 5, 6


def configure(parser: argparse.ArgumentParser) -> None:
    from tools.cache_flags import add_cache_arguments
    from tools.writable import add_json_flag

    add_cache_arguments(parser)
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                        help="parallel worker processes (min(8, CPU count))")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="samples per LMDB transaction / Redis pipeline")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank (L2 partition)")
    parser.add_argument("--num-nodes", type=int, default=1, help="number of nodes sharing L2")
    parser.add_argument("--locality", choices=["global", "node"], default="global",
                        help="how training draws samples (train's --locality): node-local sampling reads only "
                             "this node's partition, so L1 mirrors only that (default: global, all of it)")
    parser.add_argument("--l1-scope", choices=["all", "partition"], default=None,
                        help="mirror the whole source into L1, or only this node's partition (default: as "
                             "--locality)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any file is corrupt")
    parser.add_argument("--require-full", action="store_true",
                        help="exit 5 when L2 cannot hold this node's whole partition (checked before "
                             "writing); without it, as many samples as fit are cached")
    add_json_flag(parser, "the summary too")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def fail(message: str, code: int) -> int:
    print(f"cachepipe warmup: error: {message}", file=sys.stderr)
    return code


def _coverage(r: dict, node: str) -> str:
    cached, total = r["l2_cached"], r["l2_cached"] + r["l2_uncached"]
    line = f"L2 holds {cached}/{total} samples of {node} at {r['cache_size']} px ({100 * r['l2_coverage']:.1f} %)"
    if r["l2_uncached"]:
        line += (f"; {r['l2_uncached']} did not fit and are read from L1 (a fixed subset: "
                 f"more L2 memory and another warmup raise it)")
    if r.get("l2_stale_keys"):
        line += (f"; {r['l2_stale_keys']} L2 keys of older versions of this source "
                 f"({', '.join(r['stale_fingerprints'])}) take room: cachepipe drop frees them")
    return line


def _l1_line(r: dict, node: str) -> str:
    """What L1 holds and why (NOTE [L1 holds what the node reads] in cachepipe/warmup.py)."""
    if r["partition"] == r["samples"]:
        return "L1: the whole source (one node)"
    if r["l1_scope"] == "partition":
        return (f"L1: {node}'s partition only ({r['partition']} files; --locality {r['locality']}: the file "
                f"server serves each file once per job)")
    return (f"L1: the whole source ({r['samples']} files; --locality {r['locality']}: every node reads every file, "
            f"so the file server serves each once per node; --locality node mirrors the partition only)")


def _adopted(r: dict) -> str:
    """The mirror a metadata-only change kept (NOTE [metadata-only changes] in cachepipe/l1_reuse.py)."""
    a = r.get("l1_adopted")
    if not a:
        return ""
    return (f"\n  L1: kept the mirror of {a['from']} ({a['entries']} entries; the source's metadata changed): "
            f"{a['checked']} files with a new identity read once, {a['reused']} unchanged, {a['replaced']} "
            f"changed and stored anew, {a['dropped']} unreadable")


def _summary(r: dict, node: str, l2: bool) -> str:
    return _summary_lines(r, node, l2) + _adopted(r)


def _summary_lines(r: dict, node: str, l2: bool) -> str:
    if r["nothing_to_do"] and not (r["recovered"] or r["unreadable"] or r["changed"]):
        if not r["l2_uncached"]:
            line = (f"warmup: nothing to do: L1 and L2 already hold all {r['partition']} samples of "
                    f"{node} at {r['cache_size']} px ({r['samples']} in total, fingerprint "
                    f"{r['fingerprint']})")
        else:
            line = f"warmup: nothing to do at {r['cache_size']} px: {_coverage(r, node)}"
        line += f"; checked in {r['seconds']:.2f} s"
        if r["known_corrupt"]:
            line += f"; {len(r['known_corrupt'])} known corrupt file(s) re-checked, still corrupt"
        return line
    lines = [f"warmup: {r['samples']} samples, {r['partition']} in {node}, {r['cache_size']} px "
             f"(fingerprint {r['fingerprint']})", f"  {_l1_line(r, node)}",
             f"  L1 written: {r['l1_written']} entries   L2 written: {r['l2_written']} entries",
             f"  read {r['bytes_read'] / 2**20:.2f} MB from the source in {r['seconds']:.2f} s "
             f"({r['mb_per_s']:.2f} MB/s)"]
    if l2:
        lines.append(f"  {_coverage(r, node)}")
    if r["l2_bytes_per_sample"]:
        lines.append(f"  L2 memory: ~{r['l2_bytes_per_sample'] / 1024:.1f} KiB per sample at "
                     f"{r['cache_size']} px (growth of the shards' used_memory)")
    if r["l2_write_errors"]:
        lines.append(f"  L2 write errors: {r['l2_write_errors']} (see warnings above)")
    for key, title in (("corrupt", "corrupt files"),
                       ("recovered", "formerly corrupt files that now decode (cached)"),
                       ("unreadable", "unreadable files (not cached; retried next run)"),
                       ("changed", "files changed since the scan (not cached; rescan)")):
        if key == "corrupt" or r[key]:
            lines.append(f"  {title}: {len(r[key])}")
            why = r.get("unreadable_reasons", {}) if key == "unreadable" else {}
            lines += [(f"    {p!r}" if not p.isprintable() else f"    {p}") + (f": {why[p]}" if p in why else "")
                      for p in r[key][:20]]
            if len(r[key]) > 20:
                lines.append(f"    ... and {len(r[key]) - 20} more (see --json)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from tools.cache_flags import cache_sizes_from_args, check_args, l2_from_args
    from tools.writable import check_writable, write_output

    check_writable(args.json, "--json")  # NOTE [output paths checked first]
    try:
        check_args(args)
        sizes = cache_sizes_from_args(args)
        if args.num_nodes > 1 and l2_from_args(args).is_embedded:
            raise ValueError("--num-nodes > 1 needs an L2 placed by node (--l2 URL of each node's Redis ..., "
                             "--redis-cluster URL, or --l2 shm:// on every node): the embedded server is private "
                             "to one node")
    except ValueError as exc:
        return fail(str(exc), EXIT_USAGE)
    reports: list[dict] = []
    code = 0
    for size in sizes:
        code = _warm_one(args, size, reports)
        if code:
            break
    if args.json and reports:
        write_output(args.json, json.dumps(reports[0] if len(sizes) == 1 else reports, indent=1), "--json")
    return code


def _warm_one(args: argparse.Namespace, size: int, reports: list) -> int:
    """Warm one cache size and print its summary; returns a non-zero exit status on failure."""
    from tools.cache_flags import cache_from_args

    try:
        cache = cache_from_args(args, size)
    except (FileNotFoundError, NotADirectoryError, ValueError) as exc:
        return fail(str(exc), EXIT_SOURCE)
    except OSError as exc:  # read-only or full cache dir, or a share that went away (NOTE [source gone])
        from cachepipe.source.gone import source_error

        gone = source_error(exc, args.source)
        if gone is not None:
            return fail(str(gone), EXIT_SOURCE)
        return fail(f"cannot write the cache dir {args.cache_dir}: {exc}", EXIT_L1_FULL)
    code = _warm(args, size, reports, cache)
    if code == EXIT_REDIS and cache.started_server:  # never leave a server we started and cannot use
        cache.embedded_group().stop()
    return code


def _warm(args: argparse.Namespace, size: int, reports: list, cache) -> int:
    from cachepipe.errors import L1FullError, L2UnavailableError
    from cachepipe.server.idle_watch import DEFAULT_IDLE_MINUTES
    from cachepipe.warmup import L2TooSmallError, warmup

    node = f"node {args.node_rank} of {args.num_nodes}" if args.num_nodes > 1 else "this node"
    try:
        with cache:
            if cache.config.l2.enabled:
                try:
                    store = cache.store
                except (RuntimeError, FileNotFoundError, OSError) as exc:
                    return fail(f"cannot start the embedded Redis: {exc}", EXIT_REDIS)
                down = [r for r in store.shard_info() if not r["reachable"]]
                if down:
                    what = ("L2 shard {} refused INFO" if down[0].get("denied") else
                            "cannot use L2 store {}" if store.node_local else "cannot reach L2 shard {}")
                    return fail(f"{what.format(down[0]['url'])} ({down[0]['error']})"
                                + (f" and {len(down) - 1} more" if len(down) > 1 else ""), EXIT_REDIS)
            report = warmup(cache, workers=args.workers, node_rank=args.node_rank,
                            num_nodes=args.num_nodes, l1_scope=args.l1_scope, locality=args.locality,
                            batch_size=args.batch_size, progress=not args.quiet,
                            require_full=args.require_full)
    except L2UnavailableError as exc:
        return fail(str(exc), EXIT_REDIS)
    except L2TooSmallError as exc:
        return fail(f"{exc} (--require-full)", EXIT_L2_SMALL)
    except L1FullError as exc:
        return fail(exc.strerror or str(exc), EXIT_L1_FULL)
    except ValueError as exc:
        return fail(str(exc), EXIT_USAGE)
    reports.append(report)
    print(_summary(report, node, cache.config.l2.enabled))
    if report.get("l2_stale_keys"):
        print(f"  free the older versions' L2 keys first: cachepipe drop {args.source} --cache-dir {args.cache_dir}"
              + (" (with the same --l2 flags)" if args.l2 else "") + ", then warm up again")
    if cache.config.l2.is_embedded:
        print(f"  L2 is the embedded Redis at {', '.join(cache.embedded_group().urls)}; it keeps running for "
              f"training, until it has had no client for its --l2-idle minutes (default {DEFAULT_IDLE_MINUTES:g}; "
              f"stop it now with: cachepipe server stop --cache-dir {args.cache_dir})")
    if report["l2_write_errors"]:
        return fail(f"{report['l2_write_errors']} L2 writes failed (shard down or refused)",
                    EXIT_CORRUPT)
    if report["unreadable"]:
        from cachepipe.source.gone import SourceGoneError, check_source_alive

        try:
            check_source_alive(cache.config.source)  # NOTE [source gone]: the share ended mid-warm-up
        except SourceGoneError as gone:
            return fail(f"{gone} ({len(report['unreadable'])} file(s) were not read)", EXIT_SOURCE)
        return fail(f"{len(report['unreadable'])} file(s) could not be read, e.g. "
                    f"{report['unreadable'][0]!r}; run the warm-up again", EXIT_CORRUPT)
    if args.require_full and report["l2_uncached"]:
        return fail(f"{report['l2_uncached']} samples of {node} at {size} px did not fit in L2 "
                    f"({100 * report['l2_coverage']:.1f} % cached; --require-full): raise "
                    f"maxmemory (--l2-memory for the embedded server) or add shards", EXIT_L2_SMALL)
    if args.strict and report["corrupt"] + report.get("known_corrupt", []):
        return fail(f"{len(set(report['corrupt']) | set(report['known_corrupt']))} corrupt file(s) "
                    f"(--strict)", EXIT_CORRUPT)
    return 0

