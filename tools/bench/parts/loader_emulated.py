"""``cachepipe bench loader --emulate MxN[@MBIT] --locality node,global``: L2 reads on an emulated cluster.

M network namespaces joined by links limited to MBIT Mbit/s (``tools.bench.harness.cluster``),
one ``redis-server`` per node (``tools.bench.harness.redis.node_servers``), each node's L2
partition warmed by ``cachepipe warmup`` run on that node (``warm_node``: its own L1
directory), then for every locality mode a job of M x N ranks (``tools.bench.ranks.loader``) reading training epochs
through ``cached_dataloader``. Each job reads one untimed epoch, then ``--epochs`` timed
ones between barriers; ``images_per_s`` counts the images of all ranks over rank 0's
timed span. ``inter_node_bytes_per_image`` is what every node's link sent during the
whole job (the kernel's counters), divided by all the images the job read.
"""
from __future__ import annotations

import uuid
from pathlib import Path

from tools.bench.harness import Result
from tools.bench.harness.stats import median_run
from tools.cli import UsageError

__all__ = ["check_batch", "run_emulated"]

COLUMNS = ("locality", "exchange_fraction", "nodes", "local_size", "mbit", "images_per_s", "images_per_s_per_node",
           "inter_node_bytes_per_image", "l2_hit_rate", "seconds")
REDIS_PORT = 6416  # this benchmark's own port on every node's address


def check_batch(images: int, ranks: int, batch_size: int) -> None:
    """Refuse a set too small for one batch per rank (every loader drops the last,
    partial batch), before any cache is warmed or worker started.

    Raises:
        UsageError: names ``--batch-size`` and the set's size.
    """
    if batch_size < 1 or images // ranks < batch_size:
        raise UsageError(f"--batch-size {batch_size}: SRC has {images} images, "
                         + (f"{images // ranks} per rank of {ranks}, " if ranks > 1 else "")
                         + "not one full batch; lower --batch-size or use a larger SRC")


def _spec(root: str, cache_dir: Path, urls: list[str], args, locality: str) -> dict:
    return {"root": root, "cache_dir": str(cache_dir), "urls": urls, "local_size": args.emulation.local_size,
            "locality": locality, "exchange_fraction": args.exchange_fraction, "batch_size": args.batch_size,
            "workers": args.workers, "size": args.size, "cache_size": args.cache_size, "dtype": args.dtype,
            "epochs": args.epochs}


def run_emulated(args) -> Result:
    """``bench loader --emulate``: every locality mode of ``--locality`` in interleaved rounds."""
    from cachepipe import Manifest
    from tools.bench.harness.cluster import EmulatedCluster
    from tools.bench.harness.data import source_root
    from tools.bench.harness.flags import choices
    from tools.bench.harness.jobs import launch, link_bytes
    from tools.bench.harness.ranks import rank_argv, read_rank_results
    from tools.bench.harness.redis import node_servers, warm_node
    from tools.cache_flags import cache_sizes_from_args

    emu = args.emulation
    if emu.mbit is None:
        raise UsageError("--emulate: this benchmark measures the link; give MxN@MBIT")
    if args.l2 or args.redis_cluster or args.no_l2:
        raise UsageError("--emulate starts one Redis per node; drop --l2/--redis/--redis-cluster/--no-l2")
    localities = choices("--locality", args.locality, ("node", "global"))
    if not 0 <= args.exchange_fraction <= 1:
        raise UsageError(f"--exchange-fraction must be in [0, 1]; got {args.exchange_fraction}")
    (args.cache_size,) = cache_sizes_from_args(args)
    root = str(source_root(args).resolve())
    check_batch(len(Manifest.scan(root)), emu.world, args.batch_size)  # before any node starts
    cache_dir = Path(args.cache_dir).resolve()
    work = cache_dir / "emulated"
    rows = []
    with EmulatedCluster(nodes=emu.nodes, inter_mbit=emu.mbit, tag=f"i16{uuid.uuid4().hex[:3]}",
                         burst_bytes=emu.burst) as cluster:
        with node_servers(cluster, [work / f"redis{k}" for k in range(emu.nodes)], maxmemory=args.node_memory,
                          port=REDIS_PORT) as servers:
            urls = [s.url for s in servers]
            for k in range(emu.nodes):  # each node warms its L1 and its share of L2, as on a real cluster
                warm_node(cluster, k, root, cache_dir / f"node{k}", urls, args.cache_size)
            for r in range(args.rounds):
                for locality in localities:
                    out = work / f"round{r}-{locality}"
                    argv = rank_argv("tools.bench.ranks.loader", _spec(root, cache_dir, urls, args, locality), out)
                    before = link_bytes(cluster)
                    launch(cluster, lambda rank: argv, local_size=emu.local_size, log_dir=out, timeout=emu.timeout)
                    after = link_bytes(cluster)
                    ranks = read_rank_results(out, per_rank=True)
                    sent = sum(a["tx"] - b["tx"] for a, b in zip(after, before))
                    images = sum(x["images"] for x in ranks)
                    seconds = ranks[0]["seconds"]
                    rate = sum(x["timed_images"] for x in ranks) / seconds
                    reads = sum(x["l2_hits"] + x["l1_hits"] + x["source_reads"] for x in ranks)
                    rows.append({"locality": locality, "round": r,
                                 "exchange_fraction": args.exchange_fraction if locality == "node" else None,
                                 "nodes": emu.nodes, "local_size": emu.local_size, "mbit": emu.mbit,
                                 "images_per_s": rate, "images_per_s_per_node": rate / emu.nodes,
                                 "inter_node_bytes_per_image": sent / images, "inter_node_bytes": sent,
                                 "images": images, "l2_hit_rate": sum(x["l2_hits"] for x in ranks) / max(reads, 1),
                                 "seconds": seconds, "batch_size": args.batch_size, "workers": args.workers,
                                 "size": args.size, "cache_size": args.cache_size, "dtype": args.dtype})
                    print(f"round {r + 1}/{args.rounds} {locality}: {rate:.0f} images/s, "
                          f"{sent / images / 1024:.1f} KiB/image across nodes", flush=True)
    summary = []
    for locality in localities:
        mine = [row for row in rows if row["locality"] == locality]
        summary.append(dict(median_run(mine, "images_per_s"), rounds=len(mine),
                            images_per_s_all=[row["images_per_s"] for row in mine],
                            inter_node_bytes_per_image_all=[row["inter_node_bytes_per_image"] for row in mine]))
    by = {row["locality"]: row for row in summary}
    columns, headline = COLUMNS, None
    if "node" in by and "global" in by:
        g, n = by["global"], by["node"]
        n["speedup_vs_global"] = n["images_per_s"] / g["images_per_s"]
        n["bytes_vs_global"] = n["inter_node_bytes_per_image"] / g["inter_node_bytes_per_image"]
        columns = COLUMNS + ("speedup_vs_global", "bytes_vs_global")
        headline = (f"node-local sampling {n['speedup_vs_global']:.1f}x global's images/s, "
                    f"{n['bytes_vs_global']:.2f}x its bytes across nodes")
    return Result(summary, columns, notes=[f"{emu.describe()}, one Redis per node"], headline=headline)
