"""``cachepipe train --demo``: the whole system on one CPU machine in a few minutes.

Steps: make a small demo dataset if absent (``tools.demo_dataset.make_dataset``),
start the embedded Redis and warm the two-level cache, then train the ``demo`` recipe
on 4 local processes arranged as 2 nodes x 2 workers (gloo) with ``hitopk`` + MSTopK,
printing one table row per epoch.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

__all__ = ["DEMO_NODES", "DEMO_LOCAL_SIZE", "run_demo", "prepare_cache", "stop_embedded"]

DEMO_NODES, DEMO_LOCAL_SIZE = 2, 2


def prepare_cache(data: Path, cache_dir: Path, redis: list[str] | None, cache_size: int) -> tuple[str, tuple | None]:
    """Warm the two-level cache (both splits) and return ``(loader kind, redis URLs)``.

    With ``redis`` None the embedded Redis server is started in ``cache_dir`` (it keeps
    running for the training processes; NOTE [embedded server] in ``cachepipe.embedded``).
    """
    from cachepipe import TwoLevelCache
    from cachepipe.warmup import warmup

    start = time.perf_counter()
    counts = []
    for split in ("train", "val"):
        with TwoLevelCache(data / split, cache_dir, redis=list(redis) if redis else None,
                           cache_size=cache_size) as cache:
            report = warmup(cache, workers=1, progress=False)
            counts.append(report["samples"])
    print(f"demo: warmed L1 (LMDB) + L2 (Redis) with {counts[0]} train + {counts[1]} val samples at "
          f"{cache_size} px in {time.perf_counter() - start:.1f} s ({cache_dir})")
    return "torch", tuple(redis) if redis else None


def stop_embedded(cache_dir: Path) -> None:
    """Stop the embedded Redis server the demo started in ``cache_dir``."""
    from cachepipe import EmbeddedRedis

    EmbeddedRedis(cache_dir).stop()


def run_demo(args: argparse.Namespace, recipe) -> int:
    """Run the demo described in the module docstring; returns the exit status."""
    from tools.demo_dataset import make_dataset
    from trainer.launch import launch_local
    from trainer.loop import run_rank
    from trainer.progress import describe_run, final_line, resume_command
    from trainer.run_config import RunConfig

    base = Path(args.demo_dir)
    data = Path(args.data) if args.data else base / "data"
    if not (data / "train").is_dir():
        start = time.perf_counter()
        make_dataset(data, classes=args.demo_classes, per_class=args.demo_per_class,
                     val_per_class=args.demo_val_per_class, size=recipe.train.cache_size, seed=0)
        print(f"demo: wrote the dataset to {data} in {time.perf_counter() - start:.1f} s")
    cache_dir = Path(args.cache_dir) if args.cache_dir else base / "cache"
    if args.loader == "memory":
        loader, redis = "memory", None
    else:
        loader, redis = prepare_cache(data, cache_dir, args.redis, recipe.train.cache_size)
    out = Path(args.out) if args.out else base / "run"
    cfg = RunConfig(recipe=recipe, data=str(data), out=str(out), loader=loader, cache_dir=str(cache_dir),
                    redis=redis, ckpt_every=args.ckpt_every, resume=args.resume, nodes=DEMO_NODES,
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
        if loader != "memory" and not redis:
            stop_embedded(cache_dir)
    if args.stop_after_steps and (not rows or rows[-1]["epoch"] < recipe.total_epochs - 1):
        print(f"demo: to resume: {resume_command(args, str(out))}")
    elif rows:
        print("demo: " + final_line(rows, time.perf_counter() - start, out))
    return 0
