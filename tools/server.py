"""``cachepipe server {start,stop,status} --cache-dir DIR``: the embedded Redis servers of a cache dir.

Exit status: 0; 1 for ``status`` when no server runs or ``stop`` when none ran (or it
could not be stopped); 2 for a ``--cache-dir`` that is not a directory or whose server
directory (``redis/``, ``redis-N/``) is a symbolic link, or a bad ``--l2-memory``, ``--l2-servers`` or
``--l2-idle``; 4 when it cannot start. ``stop`` and ``status`` never create the cache
directory.
"""
from __future__ import annotations

import argparse
import json
import sys

__all__ = ["configure", "main"]


def configure(parser: argparse.ArgumentParser) -> None:
    from tools.writable import add_json_flag

    parser.add_argument("action", choices=["start", "stop", "status"], help="what to do")
    parser.add_argument("--cache-dir", required=True, help="the cache directory")
    parser.add_argument("--l2-memory", default=None,
                        help="maxmemory for start, e.g. 4gb, 25%%; unset: keep a running "
                             "server's, else the last one given for this cache dir, else 25%% of RAM")
    parser.add_argument("--l2-servers", type=int, default=None, metavar="N",
                        help="servers to start (NOTE [a node's L2]); unset: one per 8 cores. stop and status "
                             "act on every server of the cache dir")
    parser.add_argument("--l2-idle", default=None, metavar="MINUTES",
                        help="servers started now stop by themselves after this many minutes without a client "
                             "(and when the cache dir is deleted); 0: never; unset: 60")
    add_json_flag(parser, "the status", to_file=False)


def main(args: argparse.Namespace) -> int:
    import os

    from cachepipe.server.embedded import parse_memory

    from cachepipe.server.embedded_group import EmbeddedGroup, default_l2_servers, max_l2_servers
    from tools.cache_flags import idle_seconds
    from tools.cli import UsageError

    if os.path.exists(args.cache_dir) and not os.path.isdir(args.cache_dir):
        raise UsageError(f"--cache-dir {args.cache_dir} is not a directory; name the cache directory")
    if os.path.isdir(args.cache_dir):  # NOTE [private cache files]: a server dir that is a link is never followed
        for entry in sorted(os.listdir(args.cache_dir)):
            path = os.path.join(args.cache_dir, entry)
            if (entry == "redis" or entry.startswith("redis-")) and os.path.islink(path):
                raise UsageError(f"--cache-dir {args.cache_dir}: {path} is a symbolic link (to {os.readlink(path)}); "
                                 f"cachepipe never follows a link inside its cache dir: remove it")
    if args.action == "start":
        if args.l2_servers is not None and args.l2_servers < 1:
            raise UsageError(f"--l2-servers must be >= 1, got {args.l2_servers}")
        if args.l2_servers is not None and args.l2_servers > max_l2_servers():  # NOTE [a group's memory]
            raise UsageError(f"--l2-servers {args.l2_servers}: at most {max_l2_servers()} on this machine "
                             f"(the default's cap of 8, or one per core)")
        try:
            idle = idle_seconds(args.l2_idle)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        group = EmbeddedGroup(args.cache_dir, args.l2_servers or default_l2_servers(), idle=idle)
        try:
            if args.l2_memory is not None:
                parse_memory(args.l2_memory)
        except ValueError as exc:
            print(f"cachepipe server: error: {exc}", file=sys.stderr)
            return 2
        try:
            started = group.start(args.l2_memory)
        except (RuntimeError, FileNotFoundError, ValueError, OSError) as exc:
            print(f"cachepipe server: error: {exc}", file=sys.stderr)
            return 4
        for server in group.servers:
            st = server.status()
            print(f"{'started' if started else 'already running'}: pid {st['pid']}, {server.url}, "
                  f"maxmemory {st['maxmemory'] / 2**20:.0f} MiB")
        return 0
    group = EmbeddedGroup.found(args.cache_dir)
    if args.action == "stop":  # a missing cache dir is not created, a read-only one is fine
        try:
            stopped = group.stop()
        except OSError as exc:
            print(f"cachepipe server: error: cannot stop the embedded Redis of {args.cache_dir}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return 1
        if stopped:
            print(f"stopped the embedded Redis of {args.cache_dir} ({len(group.servers)} server(s))")
            return 0
        print(f"no embedded Redis was running for {args.cache_dir}")
        return 1
    states = [server.status() for server in group.servers]
    if args.json:
        print(json.dumps(states[0] if len(states) == 1 else states, indent=1))
    for server, st in zip(group.servers, states):
        if args.json:
            break
        if st["running"]:
            print(f"running: pid {st['pid']}, {server.url}, {st['keys']} keys, "
                  f"{st['used_memory'] / 2**20:.1f} MiB used of {st['maxmemory'] / 2**20:.0f} MiB")
        else:
            print(f"not running ({server.url})")
    return 0 if all(st["running"] for st in states) else 1
