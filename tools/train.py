"""``cachepipe train``: train an image model end to end from the cache.

Three ways to run:
- under torchrun (``RANK``/``WORLD_SIZE`` set): one rank per process, topology from
  torchrun's environment (or ``--nodes``/``--local-size``), NCCL on GPU, gloo on CPU;
- alone: ``--nprocs N`` local processes on gloo (default 1, in this process);
- ``--demo``: makes a small dataset if absent, starts the embedded Redis, warms the
  cache and trains the ``demo`` recipe on 4 CPU processes arranged as 2 nodes x 2.

Without ``--recipe`` it runs ``dawnbench28`` on a CUDA GPU and ``demo`` elsewhere, and says
so (and why) on its first line. Exit status: 0 done, 2 a bad flag (one line naming it,
found before anything starts), 1 a failed run.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["configure", "main"]


def configure(parser: argparse.ArgumentParser) -> None:
    from tools.cache_flags import add_cache_arguments

    parser.add_argument("--data", help="ImageFolder root with train/ and val/ (default with --demo: DEMO_DIR/data)")
    parser.add_argument("--recipe", default=None,
                        help="shipped recipe name (dawnbench28, resnet50-90ep, demo) or a .yaml path (default: "
                             "dawnbench28 when training on a CUDA GPU, else demo; --demo: demo)")
    parser.add_argument("--out", default=None, help="run directory: metrics.jsonl and checkpoints/ (default: the --resume "
                        "directory, else runs/train; with --demo DEMO_DIR/run)")
    add_cache_arguments(parser.add_argument_group("cache (as warmup's)"), source=False)
    parser.add_argument("--loader", default="torch", choices=["torch", "dali", "memory"],
                        help="torch: cached DataLoader; dali: DALI pipeline from the cache; memory: decode into RAM (no cache)")
    group = parser.add_argument_group("recipe overrides (every phase)")
    group.add_argument("--epochs", type=int, default=None, help="epochs of every phase (default: the recipe's)")
    from comm.registry import ALGORITHMS
    from trainer.config import AUTO

    inside_ddp = ", ".join(f"{n}: always under DDP" for n, a in ALGORITHMS.items() if a.inside_ddp)
    group.add_argument("--comm", default=None, metavar="NAME",  # checked by the recipe: one line listing the names
                       help=f"gradient exchange of every phase: {', '.join(ALGORITHMS)} ({inside_ddp}), {AUTO} "
                            "(chosen per phase from the cost model after its first steps; not with --ddp)")
    group.add_argument("--density", type=float, default=None,
                       help="top-k density of every phase, in (0, 1] (default: the recipe's, else each algorithm's "
                            "own: 0.01, gtopk 0.02)")
    group.add_argument("--powersgd-rank", type=int, default=None,
                       help="matrix approximation rank of --comm powersgd, every phase (default: the recipe's, 2)")
    from comm.topk import SELECTORS

    group.add_argument("--selector", default=None, metavar="NAME",
                       help=f"top-k selector of every phase: {', '.join(SELECTORS)}")
    group.add_argument("--batch-size", type=int, default=None, help="per-worker batch size of every phase")
    group.add_argument("--size", type=int, default=None, help="training image size of every phase (px)")
    group.add_argument("--lr", type=float, default=None, help="optim.lr")
    group.add_argument("--model", default=None, help="model.name: resnet50, resnet18, resnet_small")
    group.add_argument("--amp", default=None, choices=["off", "bf16", "fp16"], help="train.amp (CUDA only)")
    group.add_argument("--seed", type=int, default=None, help="train.seed")
    group.add_argument("--locality", default=None, choices=["global", "node"],
                       help="train.locality: global shuffles over all samples; node: each node's ranks draw the "
                            "samples held by its node's L2 (--l2 shm:// on every node, or one --l2 Redis URL per "
                            "node, in node order; default: the recipe's)")
    group.add_argument("--exchange-fraction", type=float, default=None, metavar="F",
                       help="train.exchange_fraction: with --locality node, the share of samples dealt across "
                            "nodes each epoch, in [0, 1] (default: the recipe's, 0.02)")
    group.add_argument("--pipeline-exchange", action="store_true", default=None,
                       help="train.pipeline_exchange: each step's gradient exchange runs on during the next step "
                            "and is applied one step late, hiding an exchange as long as a step (not with --ddp, "
                            "powersgd or fp16)")
    group.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                       help="override any recipe field, e.g. optim.eta=0.002 or phases.0.size=112")
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
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per local worker (0: $OMP_NUM_THREADS if set, else cores / nprocs)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to train")
    parser.add_argument("--ddp", action="store_true",
                        help="exchange inside backward with DDP (sparse algorithms as a DDP comm hook) instead of "
                             "the standalone exchanger after backward (no omgs)")
    parser.add_argument("--stop-after-steps", type=int, default=0,
                        help="checkpoint and stop at this global step, then print where and the command that "
                             "resumes (0: never)")
    demo = parser.add_argument_group("demo")
    demo.add_argument("--demo", action="store_true", help="run the self-contained CPU demo (4 workers, 2 nodes x 2)")
    demo.add_argument("--demo-dir", default="cachepipe-demo", help="where the demo keeps data/, cache/ and run/")
    demo.add_argument("--demo-classes", type=int, default=10, help="classes in the demo dataset")
    demo.add_argument("--demo-per-class", type=int, default=120, help="training images per class in the demo dataset")
    demo.add_argument("--demo-val-per-class", type=int, default=30, help="validation images per class in the demo dataset")


# flag -> (check, what it must be); checked before the recipe so the message names the flag
_FLAG_RULES = {
    "epochs": (lambda v: v >= 1, "must be >= 1"),
    "density": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "batch_size": (lambda v: v >= 1, "must be >= 1"),
    "size": (lambda v: v >= 1, "must be >= 1"),
    "lr": (lambda v: v > 0, "must be > 0"),
    "seed": (lambda v: 0 <= v < 2**32, "must be in [0, 2**32 - 1] (numpy's and torch's seeds)"),
    "nprocs": (lambda v: v >= 1, "must be >= 1"),
    "threads": (lambda v: v >= 0, "must be >= 0"),
    "ckpt_every": (lambda v: v >= 0, "must be >= 0"),
    "stop_after_steps": (lambda v: v >= 0, "must be >= 0"),
}


def _check_flags(args) -> None:
    """Raise ``UsageError`` naming the first flag whose value is impossible."""
    from tools.cli import UsageError

    for name, (ok, rule) in _FLAG_RULES.items():
        value = getattr(args, name)
        if value is not None and not ok(value):
            raise UsageError(f"--{name.replace('_', '-')} {value:g}: {rule}")


def default_recipe(device: str) -> tuple[str, str]:
    """The recipe to run when ``--recipe`` is not given, and why: ``dawnbench28`` (ResNet-50,
    GPU-sized batches) only when training on a CUDA GPU, else the small ``demo`` recipe."""
    import torch

    if device != "cpu" and torch.cuda.is_available():
        return "dawnbench28", f"no --recipe given; {torch.cuda.device_count()} CUDA GPU(s) here"
    return "demo", ("no --recipe given and no CUDA GPU here: a small ResNet at 56 px instead of "
                    "dawnbench28's ResNet-50 for 28 epochs; choose with --recipe")


def _recipe(args, default_name: str | None = None):
    from trainer.recipes import load_recipe, override

    sets = list(args.set)
    for key, value in (("optim.lr", args.lr), ("model.name", args.model), ("train.amp", args.amp),
                       ("train.seed", args.seed), ("train.locality", args.locality),
                       ("train.exchange_fraction", args.exchange_fraction),
                       ("train.pipeline_exchange", args.pipeline_exchange)):
        if value is not None:
            sets.append(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}")
    return override(load_recipe(args.recipe or default_name), epochs=args.epochs, comm=args.comm,
                    density=args.density, selector=args.selector, batch_size=args.batch_size, size=args.size,
                    powersgd_rank=args.powersgd_rank, sets=sets)


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def _run_torchrun(cfg) -> list[dict]:
    import torch
    import torch.distributed as dist

    from trainer.loop import run_rank

    backend = "nccl" if torch.cuda.is_available() and cfg.device != "cpu" else "gloo"
    dist.init_process_group(backend)
    try:
        return run_rank(dist.get_rank(), dist.get_world_size(), cfg)
    finally:
        dist.destroy_process_group()


def _default_threads(nprocs: int) -> int:
    """``OMP_NUM_THREADS`` when set to a positive count (as torch and torchrun read it), else
    the cores shared by the local workers."""
    from tools.forked_command import omp_threads

    return omp_threads(os.environ) or max(1, (os.cpu_count() or 1) // nprocs)


def _run_local(cfg, nprocs: int, threads: int) -> list[dict]:
    from trainer.launch import launch_local, stop_on_signals
    from trainer.loop import run_rank

    threads = threads or _default_threads(nprocs)
    if nprocs == 1:
        import torch

        torch.set_num_threads(threads)
        with stop_on_signals():  # NOTE [ranks end with their launcher]: the loader workers are closed
            return run_rank(0, 1, cfg)
    local_size = cfg.local_size or (nprocs // cfg.nodes if cfg.nodes else nprocs)
    return launch_local(run_rank, nprocs, cfg, local_size=local_size, threads=threads)


def main(args: argparse.Namespace) -> int:
    """Check the flags, recipe, data and topology (a bad one: exit 2), then train (exit 1 when
    a worker or rank fails or a checkpoint does not fit)."""
    import time

    from tools.cache_flags import cache_config
    from tools.cli import UsageError
    from tools.resume import resume_command
    from trainer.consensus import RankFailed
    from trainer.launch import Stopped, WorkerFailed
    from trainer.progress import describe_run, final_line
    from trainer.run_config import RunConfig

    _check_flags(args)
    if args.demo:
        from tools.demo import run_demo

        try:
            recipe = _recipe(args, "demo")
            cache_config(args, args.demo_dir, recipe.train.cache_size)  # a bad cache flag: exit 2, before anything
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        try:
            return run_demo(args, recipe)
        except (ValueError, WorkerFailed, RankFailed) as exc:
            print(f"cachepipe train: error: {exc}", file=sys.stderr)
            return 1
        except Stopped as exc:
            print(f"cachepipe train: {exc}: every rank stopped with it", file=sys.stderr)
            return 128 + exc.signum
    try:
        if not args.data:
            raise UsageError("--data ROOT is required (or use --demo)")
        from trainer.data import check_data_root, loader_workers

        check_data_root(args.data)
        name, why = (args.recipe, "") if args.recipe else default_recipe(args.device)
        recipe = _recipe(args, name)
        from trainer.run_dir import resumed_run

        out = args.out or (str(resumed_run(args.resume)) if args.resume else "runs/train")
        torchrun = _under_torchrun()
        nprocs = int(os.environ["WORLD_SIZE"]) if torchrun else args.nprocs
        cfg = RunConfig(recipe=recipe, data=args.data, out=out, loader=args.loader,
                        cache=cache_config(args, args.data, recipe.train.cache_size), ckpt_every=args.ckpt_every,
                        resume=args.resume, nodes=args.nodes, local_size=args.local_size, device=args.device,
                        stop_after_steps=args.stop_after_steps, ddp=args.ddp, on_error=args.on_error,
                        overwrite=args.overwrite, allow_changes=args.allow_changes,
                        ranks_per_machine=None if torchrun else args.nprocs)
        if not torchrun:
            _check_topology(args.nprocs, args.nodes, args.local_size)
        _check_paths(args, out)
        _check_warmup_steps(recipe, args.data, nprocs)
        _check_batches(recipe, args.data, nprocs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    rank0 = os.environ.get("RANK", "0") == "0"
    if rank0:
        workers = f"{nprocs} worker{'s' if nprocs > 1 else ''}"
        if args.nodes:
            workers += f" as {args.nodes} nodes x {nprocs // args.nodes}"
        if args.loader != "memory":
            here = int(os.environ.get("LOCAL_WORLD_SIZE", nprocs)) if torchrun else nprocs
            workers += f" ({loader_workers(recipe.train.workers, here)} loader workers each)"
        print("train: " + describe_run(recipe, workers=workers, loader=args.loader, why=why), flush=True)
    start = time.perf_counter()
    try:
        rows = _run_torchrun(cfg) if torchrun else _run_local(cfg, args.nprocs, args.threads)
    except (ValueError, WorkerFailed, RankFailed) as exc:
        print(f"cachepipe train: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # one process: a cache or run file that could not be written after the checks
        print(f"cachepipe train: error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""),
              file=sys.stderr)
        return 1
    except Stopped as exc:
        print(f"cachepipe train: {exc}: every rank stopped with it; --resume {out} continues from the newest "
              f"checkpoint in {Path(out) / 'checkpoints'}", file=sys.stderr)
        return 128 + exc.signum
    if rank0:
        if args.stop_after_steps and (not rows or rows[-1]["epoch"] < recipe.total_epochs - 1):
            print(f"train: to resume: {resume_command(args, out)}")
        elif rows:
            print("train: " + final_line(rows, time.perf_counter() - start, out))
        elif args.resume:  # a finished run: its table, and that nothing was left
            from trainer.metrics import read_metrics
            from trainer.progress import print_finished

            print_finished(read_metrics(out) if (Path(out) / "metrics.jsonl").is_file() else [], out,
                           recipe.total_epochs)
    return 0


def _check_paths(args, out: str) -> None:
    """NOTE [output paths checked first] in ``tools/writable.py``: ``--out`` must be
    writable; ``--cache-dir`` must be creatable, and writable when the embedded Redis lives
    in it (a read-only, warmed cache dir serves L1 to ``--l2`` or ``--no-l2``).

    Raises:
        UsageError: names the flag and why.
    """
    from tools.cache_flags import DEFAULT_CACHE_DIR, l2_from_args
    from tools.cli import UsageError
    from tools.writable import check_writable

    check_writable(out, "--out", directory=True)
    if args.loader == "memory":
        return
    cache_dir = args.cache_dir or DEFAULT_CACHE_DIR
    if not os.path.isdir(cache_dir):
        check_writable(cache_dir, "--cache-dir", directory=True)
    elif l2_from_args(args).is_embedded:
        try:
            check_writable(cache_dir, "--cache-dir", directory=True)
        except UsageError as exc:
            raise UsageError(f"{exc}; the embedded Redis keeps its socket there (a warmed read-only cache dir "
                             f"serves L1 with --l2 URL or --no-l2)") from None


def _check_warmup_steps(recipe, data: str, world_size: int) -> None:
    """Warm-ups given in steps longer than the run: refused before anything starts (NOTE
    [warm-ups in steps]); the training images are counted only when some are given."""
    spans = [recipe.schedule.warmup_steps] + [p.density_warmup_steps for p in recipe.phases]
    if any(s is not None for s in spans):
        from trainer.data.layout import count_images
        from trainer.schedules import check_warmup_steps

        check_warmup_steps(recipe, count_images(data, "train"), world_size)


def _check_batches(recipe, data: str, world_size: int) -> None:
    """A phase whose batch per rank asks for more training images than the ranks hold has no
    step (training drops a partial batch): refused before anything starts, in flags."""
    from trainer.data.layout import images_at_least

    have = images_at_least(data, "train", max(p.batch_size for p in recipe.phases) * world_size)
    for i, p in enumerate(recipe.phases):
        if p.batch_size * world_size > have:
            fit = have // world_size
            fix = (f"lower it to at most {fit}" if fit else
                   f"train on at most {have} rank(s) (--nprocs)")
            raise ValueError(f"batch size {p.batch_size} per rank (--batch-size, phases[{i}].batch_size): the {have} "
                             f"training images over {world_size} rank(s) give no full batch (training drops a "
                             f"partial one); {fix}")


def _check_topology(nprocs: int, nodes: int | None, local_size: int | None) -> None:
    if nprocs < 1:
        raise ValueError(f"--nprocs must be >= 1; got {nprocs}")
    from trainer.exchange import topology_for

    topology_for(nprocs, nodes, local_size if local_size or nodes else nprocs)
