"""``cachepipe train --demo``: the whole system on one CPU machine in a few minutes.

Steps: make a small demo dataset if absent (``tools.demo_dataset.make_dataset``),
start the embedded Redis and warm the two-level cache, then train the ``demo`` recipe
on 4 local processes arranged as 2 nodes x 2 workers (gloo) with ``hitopk`` + MSTopK,
printing one table row per epoch.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

__all__ = ["DEMO_NODES", "DEMO_LOCAL_SIZE", "run_demo", "prepare_cache", "stop_embedded"]

DEMO_NODES, DEMO_LOCAL_SIZE = 2, 2


def prepare_cache(cache) -> None:
    """Warm the two-level cache that ``cache`` (a ``CacheConfig`` whose source is the data
    root) describes, for both splits.

    With an embedded ``cache.l2`` the embedded Redis server is started in the cache dir (it keeps
    running for the training processes; NOTE [embedded server] in ``cachepipe.server.embedded``).
    """
    from cachepipe import TwoLevelCache
    from cachepipe.warmup import warmup

    start = time.perf_counter()
    counts = []
    for split in ("train", "val"):
        with TwoLevelCache(dataclasses.replace(cache, source=Path(cache.source) / split)) as level:
            counts.append(warmup(level, workers=1, progress=False)["samples"])
    print(f"demo: warmed L1 (LMDB) + L2 ({cache.l2.kind}) with {counts[0]} train + {counts[1]} val samples at "
          f"{cache.cache_size} px in {time.perf_counter() - start:.1f} s ({cache.cache_dir})")


def stop_embedded(cache_dir: str | Path) -> None:
    """Stop the embedded Redis server the demo started in ``cache_dir``."""
    from cachepipe.server.embedded_group import EmbeddedGroup

    EmbeddedGroup.found(cache_dir).stop()


def run_demo(args: argparse.Namespace, recipe) -> int:
    """Run the demo described in the module docstring; returns the exit status."""
    from tools.cache_flags import cache_config
    from tools.demo_dataset import make_dataset
    from tools.resume import resume_command
    from trainer.launch import launch_local
    from trainer.loop import run_rank
    from trainer.progress import describe_run, final_line
    from trainer.run_config import RunConfig

    base = Path(args.demo_dir)
    data = Path(args.data) if args.data else base / "data"
    if not (data / "train").is_dir():
        start = time.perf_counter()
        make_dataset(data, classes=args.demo_classes, per_class=args.demo_per_class,
                     val_per_class=args.demo_val_per_class, size=recipe.train.cache_size, seed=0)
        print(f"demo: wrote the dataset to {data} in {time.perf_counter() - start:.1f} s")
    cache = cache_config(args, data, recipe.train.cache_size, cache_dir=base / "cache")
    loader = "memory" if args.loader == "memory" else "torch"
    if loader != "memory":
        prepare_cache(cache)
    out = Path(args.out) if args.out else base / "run"
    cfg = RunConfig(recipe=recipe, data=str(data), out=str(out), loader=loader, cache=cache,
                    ckpt_every=args.ckpt_every, resume=args.resume, nodes=DEMO_NODES,
                    local_size=DEMO_LOCAL_SIZE, device="cpu", stop_after_steps=args.stop_after_steps,
                    ddp=args.ddp, on_error=args.on_error, allow_changes=args.allow_changes,
                    overwrite=args.overwrite or not args.out,  # the demo's own run/ is scratch
                    ranks_per_machine=DEMO_NODES * DEMO_LOCAL_SIZE)
    nprocs = DEMO_NODES * DEMO_LOCAL_SIZE
    print("demo: " + describe_run(recipe, workers=f"{nprocs} workers as {DEMO_NODES} nodes x {DEMO_LOCAL_SIZE}",
                                  loader=loader), flush=True)
    start = time.perf_counter()
    try:
        rows = launch_local(run_rank, nprocs, cfg, local_size=DEMO_LOCAL_SIZE, threads=1)
    finally:
        if loader != "memory" and cache.l2.is_embedded:
            stop_embedded(cache.cache_dir)
    if args.stop_after_steps and (not rows or rows[-1]["epoch"] < recipe.total_epochs - 1):
        print(f"demo: to resume: {resume_command(args, str(out))}")
    elif rows:
        print("demo: " + final_line(rows, time.perf_counter() - start, out))
    return 0
