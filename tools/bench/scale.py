"""``cachepipe bench scale --files 10k,100k,1.28M``: every per-N cost of a data set, and its growth.

For each file count it builds an ImageFolder tree (NOTE [scale trees] in
``tools/bench/parts/scale_tree.py``: 1,000 class folders of hard links, each tree its own inodes) and
measures, each figure in a process of its own (``tools/bench/parts/scale_measure.py``): a full scan
(``stats`` with no saved manifest) and its peak RSS, the warm-up's rate and its workers'
memory, a second warm-up ("nothing to do"), ``stats`` after it, the saved manifest's
size, and per start method a training loader: its construction, the rank's memory beyond
the interpreter once built and after ``--batches`` batches, the first batch, the workers'
USS / PSS / RSS and anonymous memory after them, the time per batch and to draw an epoch's
order. (A warm-up worker's USS counts the LMDB pages it alone wrote, file pages the kernel
drops at will: its anonymous memory is what it costs.) Then the growth
exponent of every figure between consecutive sizes (1: linear in N; a cost per batch
should stay near 0). ``--l1-files`` adds the L1 check: a tree of 1.5 KB files warmed into
L1 alone, which must not fill its map (NOTE [L1 map size]). The issue-43 targets at
1,281,167 files are in ``docs/cache.md`` ("At ImageNet scale").
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tools.bench.harness import Result
from tools.cli import UsageError

__all__ = ["configure", "run"]

COLUMNS = ("files", "scan_s", "stats_s", "warmup_again_s", "construct_fork_s", "rank_rss_fork_mb",
           "first_batch_fork_s", "first_batch_spawn_s", "worker_uss_fork_mb", "worker_uss_spawn_mb",
           "per_batch_fork_ms", "manifest_mb")
GROWTH = ("scan_s", "scan_rss_mb", "stats_s", "warmup_again_s", "manifest_mb", "construct_fork_s",
          "rank_rss_after_fork_mb", "first_batch_spawn_s", "worker_uss_fork_mb", "worker_uss_spawn_mb",
          "warmup_worker_anon_mb", "per_batch_fork_ms", "shuffle_s")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", default="10k,100k,1.28M",
                        help="file counts, comma-separated (10k, 100k, 1.28M = ImageNet's 1,281,167)")
    parser.add_argument("--dir", default="/tmp/cachepipe-bench-scale",
                        help="where the trees (kept and reused) and their caches (made afresh) go")
    parser.add_argument("--image-px", type=int, default=48, help="side of each class's JPEG (48 px: ~2.7 KB)")
    parser.add_argument("--cache-size", type=int, default=32, help="shorter side cached in L2, and the crop")
    parser.add_argument("--workers", type=int, default=2, help="warm-up and loader worker processes")
    parser.add_argument("--batches", type=int, default=1000, help="batches a loader takes before its memory is read")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per batch")
    parser.add_argument("--contexts", default="fork,spawn", help="loader start methods (fork, spawn, forkserver)")
    parser.add_argument("--l1-files", default="100k", help="files of 1.5 KB in the L1 check (0: none)")


def run(args: argparse.Namespace) -> Result:
    from tools.bench.harness.flags import choices
    from tools.bench.parts.scale_measure import growth_rows, l1_check, measure_tree, summary_row
    from tools.bench.parts.scale_tree import build_tree, parse_count

    try:
        counts = [parse_count(t) for t in args.files.split(",") if t.strip()]
        l1_files = 0 if args.l1_files.strip() == "0" else parse_count(args.l1_files)
    except ValueError as exc:
        raise UsageError(f"--files/--l1-files: {exc}") from None
    contexts = tuple(choices("--contexts", args.contexts, ("fork", "spawn", "forkserver")))
    if not counts or sorted(set(counts)) != counts:
        raise UsageError(f"--files {args.files!r}: give increasing file counts, e.g. 10k,100k,1.28M")
    if args.image_px < 8 or args.cache_size < 8 or args.workers < 1 or args.batches < 2 or args.batch_size < 1:
        raise UsageError("need --image-px >= 8, --cache-size >= 8, --workers >= 1, --batches >= 2, --batch-size >= 1")
    base = Path(args.dir)
    rows = []
    for n in counts:
        tree = build_tree(base / f"tree-{n}-{args.image_px}px", n, side=args.image_px)
        print(f"{n} files: measuring", flush=True)
        r = measure_tree(tree, base / f"work-{n}", cache_size=args.cache_size, workers=args.workers,
                         batches=args.batches, batch_size=args.batch_size, contexts=contexts,
                         log=lambda msg, n=n: print(f"  {n}: {msg}", flush=True))
        rows.append(summary_row(n, r))
    tables = [("growth exponent between sizes (1 = linear in N)", growth_rows(rows, list(GROWTH)),
               ["from", "to", *GROWTH])] if len(rows) > 1 else []
    notes = [f"trees: 1,000 class folders of hard links to one {args.image_px} px JPEG each; L2 the embedded "
             f"Redis at {args.cache_size} px; {args.workers} workers; loaders take {args.batches} batches of "
             f"{args.batch_size}; memory in MB (1e6 bytes), a rank's beyond its interpreter and imports"]
    if l1_files:
        tree = build_tree(base / f"tree-{l1_files}-32px", l1_files, side=32)
        check = l1_check(tree, base / f"work-l1-{l1_files}")
        tables.append((f"L1 check: {l1_files} files of ~1.5 KB warmed into L1 alone",
                       [{"files": l1_files, **check}], ["files", "rc", "entries", "seconds", "error"]))
        notes.append(f"L1 check: {'filled' if check['rc'] == 0 else 'FAILED'} "
                     f"({check['entries']}/{l1_files} entries){'; ' + check['error'] if check['error'] else ''}")
    last = rows[-1]
    return Result(rows, COLUMNS, notes=notes, tables=tables,
                  headline=f"{last['files']:,} files: loader built in {last.get('construct_fork_s', 0):.2f} s, "
                           f"a spawn worker's first batch in {last.get('first_batch_spawn_s', 0):.1f} s, "
                           f"stats in {last['stats_s']:.1f} s")
