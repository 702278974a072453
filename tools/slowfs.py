"""``cachepipe slowfs SRC MOUNTPOINT``: serve SRC read-only through FUSE as a slow network
file share would (NOTE [slowfs profile] in ``cachepipe/slowfs/profile.py``).

Runs in the foreground and prints ``mounted MOUNTPOINT`` once the mount serves; SIGINT or
SIGTERM unmounts and ends it (then ``--stats PATH`` is written). A mount left behind by a
slowfs killed with SIGKILL is cleared by the next slowfs on that mountpoint (NOTE [dead
slowfs mount]). Exit status: 0 after a clean unmount, 2 bad flags, SRC or mountpoint (one
line naming it), 1 FUSE is missing here (the line says how to install it) or the mount
failed.
"""
from __future__ import annotations

import argparse
import json
import sys

from tools.cli import UsageError

__all__ = ["add_profile_flags", "configure", "main", "profile_from_args"]


def add_profile_flags(parser, prefix: str = "") -> None:
    """``--latency-ms``, ``--mbps``, ``--metadata-latency-ms`` (with ``prefix``, e.g.
    ``source-``: the benchmarks' ``--source-latency-ms``...), defaults NOTE [slowfs profile]."""
    from cachepipe.slowfs.profile import DEFAULT_LATENCY_MS, DEFAULT_MBPS

    parser.add_argument(f"--{prefix}latency-ms", type=float, default=None if prefix else DEFAULT_LATENCY_MS,
                        metavar="L", help=f"milliseconds each read call (and metadata operation) waits "
                                          f"(default {DEFAULT_LATENCY_MS:g}: Amazon EFS General Purpose"
                                          f"{'; given, the source is mounted through slowfs' if prefix else ''})")
    parser.add_argument(f"--{prefix}mbps", type=float, default=None if prefix else DEFAULT_MBPS, metavar="B",
                        help=f"the share's bandwidth in MB/s, shared by all readers; 0: no cap (default "
                             f"{DEFAULT_MBPS:g}: EFS Bursting / Filestore Basic HDD)")
    parser.add_argument(f"--{prefix}metadata-latency-ms", type=float, default=None, metavar="M",
                        help="milliseconds of each lookup/stat, readdir, open (default: the latency)")


def profile_from_args(args: argparse.Namespace, prefix: str = ""):
    """The :class:`~cachepipe.slowfs.SlowProfile` of the flags (unset ones take their defaults).

    Raises:
        UsageError: a negative or non-finite rate (names the flag).
    """
    from cachepipe.slowfs import SlowProfile

    dest = prefix.replace("-", "_")
    values = {}
    for field in ("latency_ms", "mbps", "metadata_latency_ms"):
        value = getattr(args, dest + field)
        if value is not None and not 0 <= value < float("inf"):
            flag = f"--{prefix}{field.replace('_', '-')}"
            raise UsageError(f"{flag} {value:g}: must be a finite number >= 0")
        if value is not None:
            values[field] = value
    return SlowProfile(**values)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SRC", help="directory to serve, read-only")
    parser.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory to mount it on")
    add_profile_flags(parser)
    parser.add_argument("--stats", default=None, metavar="PATH",
                        help="on exit, write opens, read calls and bytes per file (and calls per operation) as "
                             "JSON to PATH")
    parser.add_argument("--stall-after", type=int, default=None, metavar="N", help=argparse.SUPPRESS)
    # ^ test hook: after N read calls every request hangs until slowfs ends (a server that stops answering)


def main(args: argparse.Namespace) -> int:
    from cachepipe.slowfs.mount import SlowFsError, fuse_missing, serve
    from tools.writable import check_writable, write_output

    profile = profile_from_args(args)
    if args.stall_after is not None and args.stall_after < 0:
        raise UsageError(f"--stall-after {args.stall_after}: must be >= 0")
    check_writable(args.stats, "--stats")
    missing = fuse_missing()
    if missing is not None:
        print(f"cachepipe slowfs: error: {missing}", file=sys.stderr)
        return 1
    print(f"slowfs: {args.source} at {args.mountpoint}: {profile.describe()}", flush=True)
    try:
        stats = serve(args.source, args.mountpoint, profile, stall_after=args.stall_after,
                      on_cleared=lambda m: print(f"slowfs: cleared the dead FUSE mount at {m} (a killed slowfs "
                                                 f"left it)", flush=True))
    except SlowFsError as exc:
        raise UsageError(str(exc)) from None
    print(f"unmounted {args.mountpoint}: {stats['totals']['opens']} opens, {stats['totals']['reads']} reads, "
          f"{stats['totals']['bytes']} bytes", flush=True)
    if args.stats:
        write_output(args.stats, json.dumps({"profile": vars(profile), **stats}, indent=1), "--stats")
    return 0
