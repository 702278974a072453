"""``cachepipe server {start,stop,status} --cache-dir DIR``: the embedded Redis of a cache dir.

Exit status: 0; 1 for ``status`` when no server runs or ``stop`` when none ran; 2 for a
bad ``--l2-memory``; 4 when it cannot start.
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
                             "server's, else the last one given for this cache dir, else 25%% of RAM")
    parser.add_argument("--json", action="store_true", help="print the status as JSON")


def main(args: argparse.Namespace) -> int:
    from cachepipe.embedded import EmbeddedRedis, parse_memory

    server = EmbeddedRedis(args.cache_dir)
    if args.action == "start":
        try:
            if args.l2_memory is not None:
                parse_memory(args.l2_memory)
        except ValueError as exc:
            print(f"cachepipe server: error: {exc}", file=sys.stderr)
            return 2
        try:
            started = server.start(args.l2_memory)
        except (RuntimeError, FileNotFoundError, ValueError, OSError) as exc:
            print(f"cachepipe server: error: {exc}", file=sys.stderr)
            return 4
        st = server.status()
        print(f"{'started' if started else 'already running'}: pid {st['pid']}, {server.url}, "
              f"maxmemory {st['maxmemory'] / 2**20:.0f} MiB")
        return 0
    if args.action == "stop":
        if server.stop():
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
