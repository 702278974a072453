"""``cachepipe server {start,stop,status} --cache-dir DIR``: the embedded Redis of a cache dir.

Exit status: 0; 1 for ``status`` when no server runs or ``stop`` when none ran (or it
could not be stopped); 2 for a ``--cache-dir`` that is not a directory; 4 when it cannot
start. ``stop`` and ``status`` never create the cache directory.
"""
from __future__ import annotations

import argparse
import json
import sys

__all__ = ["configure", "main"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["start", "stop", "status"], help="what to do")
    parser.add_argument("--cache-dir", required=True, help="the cache directory")
    parser.add_argument("--l2-memory", default=None,
                        help="maxmemory for start, e.g. 4gb, 25%%; unset: keep a running "
                             "server's, else 25%% of RAM")
    parser.add_argument("--json", action="store_true", help="print the status as JSON")


def main(args: argparse.Namespace) -> int:
    import os

    from cachepipe.embedded import EmbeddedRedis
    from tools.cli import UsageError

    if os.path.exists(args.cache_dir) and not os.path.isdir(args.cache_dir):
        raise UsageError(f"--cache-dir {args.cache_dir} is not a directory; name the cache directory")
    server = EmbeddedRedis(args.cache_dir)
    if args.action == "start":
        try:
            started = server.start(args.l2_memory)
        except (RuntimeError, FileNotFoundError, ValueError, OSError) as exc:
            print(f"cachepipe server: error: {exc}", file=sys.stderr)
            return 4
        st = server.status()
        print(f"{'started' if started else 'already running'}: pid {st['pid']}, {server.url}, "
              f"maxmemory {st['maxmemory'] / 2**20:.0f} MiB")
        return 0
    if args.action == "stop":  # a missing cache dir is not created, a read-only one is fine
        try:
            stopped = server.stop()
        except OSError as exc:
            print(f"cachepipe server: error: cannot stop the embedded Redis of {args.cache_dir}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return 1
        if stopped:
            print(f"stopped the embedded Redis of {args.cache_dir}")
            return 0
        print(f"no embedded Redis was running for {args.cache_dir}")
        return 1
    st = server.status()
    if args.json:
        print(json.dumps(st, indent=1))
    elif st["running"]:
        print(f"running: pid {st['pid']}, {server.url}, {st['keys']} keys, "
              f"{st['used_memory'] / 2**20:.1f} MiB used of {st['maxmemory'] / 2**20:.0f} MiB")
    else:
        print(f"not running ({server.url})")
    return 0 if st["running"] else 1
