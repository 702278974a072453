"""``cachepipe stats SRC --cache-dir DIR``: how much of the source each cache level holds.

L2 is reported per cached size: every size found under the source's keys, or the sizes of
``--cache-size`` when given.

Exit status: 0, 2 bad flag values, 3 missing or invalid source, 4 L2 unreachable (the rest is still shown).
"""
from __future__ import annotations

import argparse
import json
import sys

__all__ = ["configure", "main"]


def configure(parser: argparse.ArgumentParser) -> None:
    from tools.cache_flags import add_cache_arguments
    from tools.writable import add_json_flag

    add_cache_arguments(parser)
    add_json_flag(parser, "the coverage", to_file=False)


def _mib(b: int) -> str:
    return f"{b / 2**20:.1f} MiB"


def format_coverage(c: dict) -> str:
    s, l1, l2 = c["source"], c["l1"], c["l2"]
    lines = [f"source  {s['root']}: {s['samples']} samples, {s['classes']} classes, "
             f"{_mib(s['bytes'])}, fingerprint {s['fingerprint']}",
             f"L1      {l1['entries']}/{s['samples']} ({l1['percent']:.1f} %), {_mib(l1['disk_bytes'])} "
             f"on disk at {l1['path']}" + (f"; {l1['error']}" if l1.get("error") else "")]
    if not l2["sizes"]:
        lines.append(f"L2      {l2['kind']}: " + ("could not be read (below)" if l2["error"] and l2["shards"]
                                                  else "nothing cached for this source"))
    for row in l2["sizes"]:
        of = f" of the {s['samples'] - row['known_corrupt']} that decode; {row['known_corrupt']} known corrupt " \
             f"(never cached; listed by warmup)" if row["known_corrupt"] else ""
        line = (f"L2      {l2['kind']} {row['size']} px: {row['present']}/{s['samples']} "
                f"({row['percent']:.1f} %{of}) under {row['namespace']}*")
        if row["partial"]:
            left = ", ".join(f"{count} of node {node}" for node, count in sorted(row["partial"].items()))
            line += f"; a fixed subset (warm-up left out {left}: read from L1)"
        lines.append(line)
    for sh in l2["shards"]:
        if sh["reachable"]:
            limit = _mib(sh["maxmemory"]) if sh["maxmemory"] else "no limit"
            lines.append(f"  shard {sh['url']}: {sh['keys']} keys, {_mib(sh['used_memory'])} used of "
                         f"{limit} ({sh['policy']})")
        else:
            lines.append(f"  shard {sh['url']}: {'refused' if sh.get('denied') else 'unreachable'} ({sh['error']})")
    if l2["error"]:
        lines.append(f"  {l2['error']}")
    stale = c.get("stale_fingerprints", [])
    if stale:
        lines.append(f"older versions of this source: {', '.join(stale)} (cachepipe drop frees their L2 keys "
                     f"and cache dir entries)")
    others = [fp for fp in c["other_fingerprints"] if fp not in stale]
    if others:
        lines.append(f"other namespaces in the cache dir (other sources): {', '.join(others)}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from tools.cache_flags import cache_from_args, cache_sizes_from_args, check_args
    from cachepipe.coverage import coverage
    from cachepipe.stale import stale_fingerprints

    try:
        check_args(args)
        sizes = cache_sizes_from_args(args, default=None)
    except ValueError as exc:
        print(f"cachepipe stats: error: {exc}", file=sys.stderr)
        return 2
    try:
        cache = cache_from_args(args, sizes[0] if sizes else 256, save_manifest=False)  # stats never writes
    except (FileNotFoundError, ValueError) as exc:
        print(f"cachepipe stats: error: {exc}", file=sys.stderr)
        return 3
    with cache:
        cov = coverage(cache, sizes)
        cov["stale_fingerprints"] = stale_fingerprints(cache)  # NOTE [stale namespaces]
    print(json.dumps(cov, indent=1) if args.json else format_coverage(cov))
    unreachable = cov["l2"]["error"] and "not running" not in cov["l2"]["error"]
    if unreachable or any(not sh["reachable"] for sh in cov["l2"]["shards"]):
        denied = "permission denied" in cov["l2"]["error"] or any(sh.get("denied") for sh in cov["l2"]["shards"])
        print(f"cachepipe stats: error: L2 {'refused a command' if denied else 'unreachable'}: "
              f"{cov['l2']['error'] or 'a shard is down'}", file=sys.stderr)
        return 4
    return 0
