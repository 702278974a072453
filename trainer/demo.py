"""``cachepipe train --demo``: the whole system on one CPU machine in a few minutes.

Steps: make a small demo dataset if absent (``cachepipe.demo_data.make_dataset``),
start the embedded Redis and warm the two-level cache, then train the ``demo`` recipe
on 4 local processes arranged as 2 nodes x 2 workers (gloo) with ``hitopk`` + MSTopK,
printing one table row per epoch.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

__all__ = ["DEMO_NODES", "DEMO_LOCAL_SIZE", "run_demo", "prepare_cache"]

DEMO_NODES, DEMO_LOCAL_SIZE = 2, 2


def prepare_cache(data: Path, cache_dir: Path, redis: list[str] | None, cache_size: int) -> tuple[str, tuple | None]:
    """Warm the two-level cache for ``data`` and return ``(loader kind, redis URLs)``.

    Falls back to the in-memory loader (and says so) when this checkout has no cached
    loader yet.
    """
    try:
        import loaders

        cached = getattr(loaders, "cached_dataloader", None)
    except ImportError:  # pragma: no cover
        cached = None
    if cached is None:
        print("demo: loaders.cached_dataloader is not in this checkout; reading through the in-memory loader")
        return "memory", None
    from cachepipe import TwoLevelCache  # noqa: F401 - the cache package is required here
    from tools.warmup import warm

    start = time.perf_counter()
    urls = warm(data, cache_dir=cache_dir, redis=redis, cache_size=cache_size)
    print(f"demo: cache warmed in {time.perf_counter() - start:.1f} s ({cache_dir})")
    return "torch", tuple(urls) if urls else (tuple(redis) if redis else None)


def _available(comm_name: str) -> bool:
    try:
        import comm

        return comm_name == "dense" or hasattr(comm, "GradientExchanger")
    except ImportError:  # pragma: no cover
        return False


def run_demo(args: argparse.Namespace, recipe) -> int:
    """Run the demo described in the module docstring; returns the exit status."""
    from cachepipe.demo_data import make_dataset
    from trainer.launch import launch_local
    from trainer.loop import run_rank
    from trainer.recipes import override
    from trainer.run_config import RunConfig

    base = Path(args.demo_dir)
    data = Path(args.data) if args.data else base / "data"
    if not (data / "train").is_dir():
        start = time.perf_counter()
        make_dataset(data, classes=args.demo_classes, per_class=args.demo_per_class,
                     val_per_class=args.demo_val_per_class, size=recipe.train.cache_size, seed=0)
        print(f"demo: wrote the dataset to {data} in {time.perf_counter() - start:.1f} s")
    cache_dir = Path(args.cache_dir) if args.cache_dir else base / "cache"
    loader, redis = prepare_cache(data, cache_dir, args.redis, recipe.train.cache_size)
    if args.loader != "torch":  # an explicit choice wins
        loader = args.loader
    missing = sorted({p.comm for p in recipe.phases if not _available(p.comm)})
    if missing:
        print(f"demo: {missing} not in this checkout (needs comm.GradientExchanger); using dense")
        recipe = override(recipe, comm="dense")
    out = Path(args.out) if args.out != "runs/train" else base / "run"
    cfg = RunConfig(recipe=recipe, data=str(data), out=str(out), loader=loader, cache_dir=str(cache_dir),
                    redis=redis, ckpt_every=args.ckpt_every, resume=args.resume, nodes=DEMO_NODES,
                    local_size=DEMO_LOCAL_SIZE, device="cpu", stop_after_steps=args.stop_after_steps)
    nprocs = DEMO_NODES * DEMO_LOCAL_SIZE
    phase = recipe.phases[0]
    print(f"demo: {recipe.model.name}, {recipe.total_epochs} epochs at {phase.size} px, {nprocs} workers as "
          f"{DEMO_NODES} nodes x {DEMO_LOCAL_SIZE}, comm {phase.comm}"
          + (f" (density {phase.density}, {phase.selector})" if phase.comm != "dense" else "") + f", loader {loader}")
    start = time.perf_counter()
    rows = launch_local(run_rank, nprocs, cfg, local_size=DEMO_LOCAL_SIZE, threads=1)
    if rows:
        print(f"demo: final top-1 {rows[-1]['val_top1']:.1f}%, top-5 {rows[-1]['val_top5']:.1f}% in "
              f"{time.perf_counter() - start:.0f} s; metrics in {out / 'metrics.jsonl'} "
              f"(plot: cachepipe report {out})")
    return 0
