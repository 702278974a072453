"""``cachepipe train``: train an image model end to end from the cache.

Three ways to run:
- under torchrun (``RANK``/``WORLD_SIZE`` set): one rank per process, topology from
  torchrun's environment (or ``--nodes``/``--local-size``), NCCL on GPU, gloo on CPU;
- alone: ``--nprocs N`` local processes on gloo (default 1, in this process);
- ``--demo``: makes a small dataset if absent, starts the embedded Redis, warms the
  cache and trains the ``demo`` recipe on 4 CPU processes arranged as 2 nodes x 2.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["configure", "main"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", help="ImageFolder root with train/ and val/ (default with --demo: DEMO_DIR/data)")
    parser.add_argument("--recipe", default="dawnbench28",
                        help="shipped recipe name (dawnbench28, resnet50-90ep, demo) or a .yaml path")
    parser.add_argument("--out", default=None, help="run directory: metrics.jsonl and checkpoints/ (default: the --resume "
                        "directory, else runs/train; with --demo DEMO_DIR/run)")
    parser.add_argument("--cache-dir", default=None,
                        help="L1 LMDB mirror and embedded Redis directory (None: ./cachepipe-cache; --demo: DEMO_DIR/cache)")
    parser.add_argument("--redis", action="append", default=None, metavar="URL",
                        help="L2 Redis URL, repeat per node; default: the embedded server")
    parser.add_argument("--loader", default="torch", choices=["torch", "dali", "memory"],
                        help="torch: cached DataLoader; dali: DALI pipeline from the cache; memory: decode into RAM (no cache)")
    group = parser.add_argument_group("recipe overrides (every phase)")
    group.add_argument("--epochs", type=int, default=None, help="epochs of every phase (default: the recipe's)")
    group.add_argument("--comm", default=None,
                       help="gradient exchange of every phase: dense, hier, 2dtar, topk_ag, gtopk, hitopk, omgs")
    group.add_argument("--density", type=float, default=None, help="top-k density of every phase, in (0, 1]")
    group.add_argument("--selector", default=None, help="top-k selector of every phase: exact, dgc, mstopk")
    group.add_argument("--batch-size", type=int, default=None, help="per-worker batch size of every phase")
    group.add_argument("--size", type=int, default=None, help="training image size of every phase (px)")
    group.add_argument("--lr", type=float, default=None, help="optim.lr")
    group.add_argument("--model", default=None, help="model.name: resnet50, resnet18, resnet_small")
    group.add_argument("--amp", default=None, choices=["off", "bf16", "fp16"], help="train.amp (CUDA only)")
    group.add_argument("--seed", type=int, default=None, help="train.seed")
    group.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                       help="override any recipe field, e.g. optim.eta=0.002 or phases.0.size=112")
    parser.add_argument("--follow-external-links", action="store_true",
                        help="follow symlinks in the data that point outside it (default: skip them with a warning)")
    parser.add_argument("--on-error", default="skip", choices=["raise", "skip"],
                        help="a corrupt or unreadable sample: skip (default) warns, counts it (skip column) and "
                             "replaces it so every batch stays full; raise ends the run")
    parser.add_argument("--ckpt-every", type=int, default=0, help="also checkpoint every N steps (0: epoch ends only)")
    parser.add_argument("--resume", default=None, metavar="RUN_DIR",
                        help="continue from the newest intact checkpoint in RUN_DIR/checkpoints/ (default: none)")
    parser.add_argument("--overwrite", action="store_true",
                        help="let a new run replace the run in a non-empty --out (default: refuse it)")
    parser.add_argument("--allow-changes", action="store_true",
                        help="resume even if the recipe or flags (epochs, lr, density, comm, data, loader, ...) "
                             "differ from the checkpoint's; the changes are printed (default: refuse)")
    parser.add_argument("--nodes", type=int, default=None, help="nodes in the topology (default: from torchrun's environment)")
    parser.add_argument("--local-size", type=int, default=None, help="workers per node (default: LOCAL_WORLD_SIZE)")
    parser.add_argument("--nprocs", type=int, default=1, help="local worker processes when not under torchrun")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per local worker (0: cores / nprocs)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to train")
    parser.add_argument("--ddp", action="store_true",
                        help="exchange inside backward with DDP (sparse algorithms as a DDP comm hook) instead of "
                             "the standalone exchanger after backward (no omgs)")
    parser.add_argument("--stop-after-steps", type=int, default=0, help="checkpoint and stop at this global step (0: never)")
    demo = parser.add_argument_group("demo")
    demo.add_argument("--demo", action="store_true", help="run the self-contained CPU demo (4 workers, 2 nodes x 2)")
    demo.add_argument("--demo-dir", default="cachepipe-demo", help="where the demo keeps data/, cache/ and run/")
    demo.add_argument("--demo-classes", type=int, default=10, help="classes in the demo dataset")
    demo.add_argument("--demo-per-class", type=int, default=120, help="training images per class in the demo dataset")
    demo.add_argument("--demo-val-per-class", type=int, default=30, help="validation images per class in the demo dataset")


def _recipe(args, default_name: str | None = None):
    from trainer.recipes import load_recipe, override

    sets = list(args.set)
    for key, value in (("optim.lr", args.lr), ("model.name", args.model), ("train.amp", args.amp),
                       ("train.seed", args.seed)):
        if value is not None:
            sets.append(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}")
    return override(load_recipe(default_name or args.recipe), epochs=args.epochs, comm=args.comm,
                    density=args.density, selector=args.selector, batch_size=args.batch_size, size=args.size,
                    sets=sets)


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def _run_torchrun(cfg) -> int:
    import torch
    import torch.distributed as dist

    from trainer.loop import run_rank

    backend = "nccl" if torch.cuda.is_available() and cfg.device != "cpu" else "gloo"
    dist.init_process_group(backend)
    try:
        run_rank(dist.get_rank(), dist.get_world_size(), cfg)
    finally:
        dist.destroy_process_group()
    return 0


def _run_local(cfg, nprocs: int, threads: int) -> list[dict]:
    from trainer.launch import launch_local
    from trainer.loop import run_rank

    threads = threads or max(1, (os.cpu_count() or 1) // nprocs)
    if nprocs == 1:
        import torch

        torch.set_num_threads(threads)
        return run_rank(0, 1, cfg)
    local_size = cfg.local_size or (nprocs // cfg.nodes if cfg.nodes else nprocs)
    return launch_local(run_rank, nprocs, cfg, local_size=local_size, threads=threads)


def main(args: argparse.Namespace) -> int:
    from trainer.consensus import RankFailed
    from trainer.launch import WorkerFailed
    from trainer.run_config import RunConfig

    try:
        if args.demo:
            from trainer.demo import run_demo

            return run_demo(args, _recipe(args, "demo" if args.recipe == "dawnbench28" else None))
        if not args.data:
            raise ValueError("--data ROOT is required (or use --demo)")
        from trainer.data import check_data_root

        check_data_root(args.data)
        recipe = _recipe(args)
        out = args.out or args.resume or "runs/train"
        cfg = RunConfig(recipe=recipe, data=args.data, out=out, loader=args.loader, cache_dir=args.cache_dir,
                        redis=tuple(args.redis) if args.redis else None, ckpt_every=args.ckpt_every,
                        resume=args.resume, nodes=args.nodes, local_size=args.local_size, device=args.device,
                        stop_after_steps=args.stop_after_steps, ddp=args.ddp, on_error=args.on_error,
                        overwrite=args.overwrite, allow_changes=args.allow_changes,
                        follow_external_links=args.follow_external_links)
        if _under_torchrun():
            return _run_torchrun(cfg)
        _check_topology(args.nprocs, args.nodes, args.local_size)
        _run_local(cfg, args.nprocs, args.threads)
        print(f"metrics: {Path(cfg.out) / 'metrics.jsonl'}")
        return 0
    except (ValueError, WorkerFailed, RankFailed) as exc:
        print(f"cachepipe train: error: {exc}", file=sys.stderr)
        return 1


def _check_topology(nprocs: int, nodes: int | None, local_size: int | None) -> None:
    if nprocs < 1:
        raise ValueError(f"--nprocs must be >= 1; got {nprocs}")
    from trainer.exchange import topology_for

    topology_for(nprocs, nodes, local_size if local_size or nodes else nprocs)
