"""``cachepipe bench source``: the source-side costs of issue 44 on an emulated NFS share.

NOTE [bench source]
Four checks, each on a ``cachepipe slowfs`` share (NOTE [slowfs profile]) over a tree the
benchmark builds under ``--dir`` (reused when complete), each row a measured figure and its
target:

- ``scan``: a cold ``Manifest.scan`` of a ``--scan-files`` tree of hard links (NOTE [scale
  trees]) with ``--scan-metadata-latency-ms`` per metadata call, in a process of its own
  (its seconds and peak RSS, ``wait4``), beside what the share's calls would take one at a
  time (``serial_s``: calls x latency). Targets: under 30 s, under 100 MB (NOTE [scan in
  flight]).
- ``warmup``: an L1-only warm-up (no decode: the share is measured, not the CPU) of
  ``--warm-files`` random files of ``--file-kb`` KiB from a share capped at ``--mbps``:
  source MB/s (10**6 bytes) and its fraction of the cap. Target: >= 80 % (NOTE [reads in
  flight]).
- ``two nodes``: two emulated nodes (a cache dir and an ``shm://`` store each) warm up for
  node-local sampling from one share; the share's ``--stats`` count each file's opens.
  Targets: every file opened once in all, each node's L1 exactly its partition (NOTE [L1
  holds what the node reads]).
- ``chmod -R``: an L1 warmed from the share, the tree behind it ``chmod -R``'ed, a second
  warm-up (a rescan): at most one open of each file and no L1 growth (NOTE [metadata-only
  changes]).
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tools.bench.harness import Result
from tools.cli import UsageError

__all__ = ["configure", "run"]

COLUMNS = ("check", "measured", "target", "met", "detail")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "cachepipe-bench-source"),
                        help="where the trees and caches are built (reused when complete)")
    parser.add_argument("--scan-files", default="100k", help="files of the scanned tree (10k, 100k, 1.28M)")
    parser.add_argument("--scan-threads", type=int, default=32, help="the scan's calls in flight (scan_threads)")
    parser.add_argument("--scan-metadata-latency-ms", type=float, default=1.0,
                        help="milliseconds per metadata call of the scan's share")
    parser.add_argument("--latency-ms", type=float, default=1.0, help="milliseconds per read call of the shares")
    parser.add_argument("--mbps", type=float, default=100.0, help="the warm-up share's bandwidth (MB/s)")
    parser.add_argument("--warm-files", type=int, default=2000, help="files of the warm-up's tree")
    parser.add_argument("--file-kb", type=int, default=100, help="KiB per file of the warm-up's tree")
    parser.add_argument("--node-files", type=int, default=1000, help="files of the two-node and chmod trees")
    parser.add_argument("--checks", default="scan,warmup,nodes,chmod", help="which checks to run")


def run(args: argparse.Namespace) -> Result:
    from cachepipe.slowfs import SlowProfile
    from cachepipe.slowfs.mount import fuse_missing
    from tools.bench.parts import source_measure as sm
    from tools.bench.parts.scale_tree import parse_count

    checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    bad = sorted(set(checks) - {"scan", "warmup", "nodes", "chmod"})
    if bad or not checks:
        raise UsageError(f"--checks: unknown {bad or 'none given'}; valid: scan, warmup, nodes, chmod")
    missing = fuse_missing()
    if missing is not None:
        raise UsageError(f"the shares are cachepipe slowfs mounts, which need FUSE: {missing}")
    try:
        scan_files = parse_count(args.scan_files)
        share = SlowProfile(latency_ms=args.latency_ms, mbps=args.mbps)
        scan_share = SlowProfile(latency_ms=args.latency_ms, mbps=args.mbps,
                                 metadata_latency_ms=args.scan_metadata_latency_ms)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    rows, notes = [], [f"shares: cachepipe slowfs, {share.describe()} (the scan's: {scan_share.describe()})"]
    if "scan" in checks:
        s = sm.measure_scan(work, scan_files, args.scan_threads, scan_share)
        rows += [_row("scan seconds", s["seconds"], "< 30 s", s["seconds"] < 30,
                      f"{s['files']:,} files, {s['threads']} in flight; the share's {s['metadata_calls']:,} calls "
                      f"one at a time: {s['serial_s']:.0f} s", s),
                 _row("scan peak RSS (MB)", s["peak_rss_mb"], "< 100 MB", s["peak_rss_mb"] < 100,
                      "the scanning process (wait4 ru_maxrss)", {})]
    if "warmup" in checks:
        w = sm.measure_warmup(work, args.warm_files, args.file_kb * 1024, share)
        rows.append(_row("warm-up MB/s (L1)", w["mb_per_s"], f">= {0.8 * args.mbps:g} (80 %)", w["fraction"] >= 0.8,
                         f"{w['mb']:.0f} MB, {w['files']} files of {w['file_kb']:.0f} KiB in {w['seconds']:.1f} s: "
                         f"{100 * w['fraction']:.0f} % of the share's {args.mbps:g} MB/s", w))
    if "nodes" in checks:
        t = sm.measure_two_nodes(work, args.node_files, share)
        ok = t["max_opens_per_file"] == 1 and t["files_opened"] == t["files"] and t["only_partition"]
        rows.append(_row("two nodes: opens per file", t["opens"] / t["files"], "1 (each file once per job)", ok,
                         f"{t['opens']} opens of {t['files']} files (max {t['max_opens_per_file']}); L1 "
                         f"{t['l1'][0]} + {t['l1'][1]} entries = partitions {t['partition'][0]} + "
                         f"{t['partition'][1]} ({'exactly' if t['only_partition'] else 'NOT only'} each node's)", t))
    if "chmod" in checks:
        c = sm.measure_metadata_change(work, args.node_files, share)
        ok = c["max_opens_per_file"] <= 1 and c["l1_mb_after"] <= c["l1_mb_before"] and c["new_fingerprint"]
        rows.append(_row("chmod -R: opens per file", c["opens"] / c["files"], "<= 1, L1 not larger", ok,
                         f"{c['opens']} opens of {c['files']} files (max {c['max_opens_per_file']}); L1 "
                         f"{c['l1_mb_before']:.2f} MB before, {c['l1_mb_after']:.2f} MB after; {c['reused']} "
                         f"entries kept, {c['replaced']} replaced, {c['l1_written']} written", c))
    met = sum(r["met"] for r in rows)
    return Result(rows, COLUMNS, notes=notes,
                  headline=f"{met} of {len(rows)} source targets met on an emulated NFS share"
                           + "".join(f"; {r['check']} {_fmt(r['measured'])}" for r in rows[:3]))


def _row(check: str, measured: float, target: str, met: bool, detail: str, data: dict) -> dict:
    return {"check": check, "measured": round(float(measured), 3), "target": target, "met": bool(met),
            "detail": detail, **{k: v for k, v in data.items() if k not in ("check", "measured", "target", "met")}}


def _fmt(v: float) -> str:
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
