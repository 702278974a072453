"""``cachepipe bench loader --emulate MxN@MBIT --locality node,global``: L2 reads on an emulated cluster.

M network namespaces joined by links limited to MBIT Mbit/s (``tools.cluster``), one
``redis-server`` per node (``tools.emulated_job.node_servers``), each node's L2 partition
warmed by ``cachepipe warmup`` run on that node (``warm_node``: its own L1 directory), then for every
locality mode a job of M x N ranks (``tools.bench.loader_rank``) reading training epochs
through ``cached_dataloader``. Each job reads one untimed epoch, then ``--epochs`` timed
ones between barriers; ``images_per_s`` counts the images of all ranks over rank 0's
timed span. ``inter_node_bytes_per_image`` is what every node's link sent during the
whole job (the kernel's counters), divided by all the images the job read.
"""
from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

__all__ = ["check_batch", "run"]

COLUMNS = ("locality", "exchange_fraction", "nodes", "local_size", "mbit", "images_per_s", "images_per_s_per_node",
           "inter_node_bytes_per_image", "l2_hit_rate", "seconds")
REDIS_PORT = 6416  # this benchmark's own port on every node's address
RENDEZVOUS_PORT = 29716


def check_batch(images: int, ranks: int, batch_size: int) -> None:
    """Refuse a set too small for one batch per rank (every loader drops the last,
    partial batch), before any cache is warmed or worker started.

    Raises:
        UsageError: names ``--batch-size`` and the set's size.
    """
    from tools.cli import UsageError

    if batch_size < 1 or images // ranks < batch_size:
        raise UsageError(f"--batch-size {batch_size}: SRC has {images} images, "
                         + (f"{images // ranks} per rank of {ranks}, " if ranks > 1 else "")
                         + "not one full batch; lower --batch-size or use a larger SRC")


def _rank_argv(root: str, cache_dir: Path, urls: list[str], args, locality: str, out: Path):
    from tools.emulated_job import redis_flags

    def argv(rank: int) -> list[str]:
        node = rank // args.local_size
        cmd = [sys.executable, "-m", "tools.bench.loader_rank", root, "--cache-dir", str(cache_dir / f"node{node}"),
               "--locality", locality, "--exchange-fraction", str(args.exchange_fraction),
               "--batch-size", str(args.batch_size), "--workers", str(args.workers), "--size", str(args.size),
               "--cache-size", str(args.cache_size), "--dtype", args.dtype, "--epochs", str(args.epochs),
               "--out", str(out / f"rank{rank}.json"), *redis_flags(urls)]
        return cmd
    return argv


def run(args) -> int:
    from cachepipe import Manifest
    from tools.demo_dataset import make_dataset
    from tools.bench.table import format_table, machine_description, write_json
    from tools.cluster import EmulatedCluster, require_netns
    from tools.emulated_job import launch, link_bytes, node_servers, parse_emulate, warm_node

    emu = parse_emulate(args.emulate)  # NOTE [emulate flag]: MBIT required here
    nodes, args.local_size, mbit = emu.nodes, emu.local_size, emu.mbit
    localities = [m.strip() for m in args.locality.split(",") if m.strip()]
    bad = sorted(set(localities) - {"node", "global"})
    if bad or not localities:
        raise ValueError(f"--locality wants a comma-separated subset of node,global; got {args.locality!r}")
    if not 0 <= args.exchange_fraction <= 1:
        raise ValueError(f"--exchange-fraction must be in [0, 1]; got {args.exchange_fraction}")
    require_netns()
    src = Path(args.src)
    if not src.exists() and args.make_dataset:
        make_dataset(src, classes=args.classes, per_class=args.make_dataset, val_per_class=0, size=args.image_px)
    root = str((src / "train" if (src / "train").is_dir() else src).resolve())
    check_batch(len(Manifest.scan(root)), nodes * args.local_size, args.batch_size)  # before any node starts
    cache_dir = Path(args.cache_dir).resolve()
    work = cache_dir / "emulated"
    rows = []
    with EmulatedCluster(nodes=nodes, inter_mbit=mbit, tag=f"i16{uuid.uuid4().hex[:3]}") as cluster:
        with node_servers(cluster, [work / f"redis{k}" for k in range(nodes)], maxmemory=args.node_memory,
                          port=REDIS_PORT) as servers:
            urls = [s.url for s in servers]
            for k in range(nodes):  # each node warms its L1 and its share of L2, as on a real cluster
                warm_node(cluster, k, root, cache_dir / f"node{k}", urls, args.cache_size)
            for r in range(args.rounds):
                for j, locality in enumerate(localities):
                    out = work / f"round{r}-{locality}"
                    out.mkdir(parents=True, exist_ok=True)
                    before = link_bytes(cluster)
                    launch(cluster, _rank_argv(root, cache_dir, urls, args, locality, out), local_size=args.local_size,
                           port=RENDEZVOUS_PORT + j, log_dir=out, timeout=1800)
                    after = link_bytes(cluster)
                    ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(nodes * args.local_size)]
                    sent = sum(a["tx"] - b["tx"] for a, b in zip(after, before))
                    images = sum(x["images"] for x in ranks)
                    seconds = ranks[0]["seconds"]
                    rate = sum(x["timed_images"] for x in ranks) / seconds
                    reads = sum(x["l2_hits"] + x["l1_hits"] + x["source_reads"] for x in ranks)
                    rows.append({"locality": locality, "round": r,
                                 "exchange_fraction": args.exchange_fraction if locality == "node" else None,
                                 "nodes": nodes, "local_size": args.local_size, "mbit": mbit,
                                 "images_per_s": rate, "images_per_s_per_node": rate / nodes,
                                 "inter_node_bytes_per_image": sent / images, "inter_node_bytes": sent,
                                 "images": images, "l2_hit_rate": sum(x["l2_hits"] for x in ranks) / max(reads, 1),
                                 "seconds": seconds, "batch_size": args.batch_size, "workers": args.workers,
                                 "size": args.size, "cache_size": args.cache_size, "dtype": args.dtype})
                    print(f"round {r + 1}/{args.rounds} {locality}: {rate:.0f} images/s, "
                          f"{sent / images / 1024:.1f} KiB/image across nodes")
    summary = []
    for locality in localities:
        mine = sorted((row for row in rows if row["locality"] == locality), key=lambda row: row["images_per_s"])
        summary.append(dict(mine[len(mine) // 2], rounds=len(mine),
                            images_per_s_all=[row["images_per_s"] for row in mine],
                            inter_node_bytes_per_image_all=[row["inter_node_bytes_per_image"] for row in mine]))
    by = {row["locality"]: row for row in summary}
    if "node" in by and "global" in by:
        g, n = by["global"], by["node"]
        n["speedup_vs_global"] = n["images_per_s"] / g["images_per_s"]
        n["bytes_vs_global"] = n["inter_node_bytes_per_image"] / g["inter_node_bytes_per_image"]
    both = ("speedup_vs_global", "bytes_vs_global") if "node" in by and "global" in by else ()
    print(format_table(summary, COLUMNS + both))
    print(f"machine: {machine_description()}")
    if args.json:
        write_json(args.json, summary)
    return 0
