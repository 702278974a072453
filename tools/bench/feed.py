"""``cachepipe bench feed``: the CPU proxy of feeding a GPU, CPU per image of every serial stage.

NOTE [feed proxy]: on a GPU a ResNet-50 bf16 step of batch 128 at 224 px takes ~29 ms,
~19 ms of which the training thread spends launching the model, which leaves it ~10 ms
per batch, **0.08 ms per image**, for everything it does for data. The loader has stages
that run once per batch in one place (the training thread, the training process's other
threads, each Redis server) and stages that scale with workers. This benchmark reads the
GPU configuration's shapes (batch 128, 224 px crops from a 256 px cache, 2 workers here)
through ``cached_dataloader``, with a consumer that takes each batch as training does
(reads every page of it) and then keeps its thread busy for ``--step-ms`` (the model
step), and charges CPU to each stage:

- ``main_thread_ms_per_image``: the consumer thread inside ``next()`` (``time.thread_time``);
- ``other_threads_ms_per_image``: the training process's other threads (process CPU less
  the consumer thread's);
- ``worker_ms_per_image``: the loader's worker processes (``/proc``);
- ``redis_ms_per_image``: the L2's servers (``INFO cpu``), per server (0 with ``shm://``:
  no server, its reads are the workers');
- ``faults_per_batch``: minor page faults of the training process and its workers;
- ``l1_reads``, ``source_reads``: reads below L2 (0 on a warm cache).

Each is printed against its budget: 0.08 for the consumer thread, 0.2 for the other serial
stages (the process's other threads, one Redis server), the step's rate for the workers
(``workers * step_ms / batch_size``: what they may spend per image and still keep up),
100 faults per batch, 0 reads below L2. Outputs (and, with ``--also-l2``, the same outputs
from other L2 stores: NOTE [L2 side by side]) are measured in interleaved rounds (median
round shown), so load from other jobs hits each alike.
"""
from __future__ import annotations

import argparse
import os
import time

from tools.bench.harness import Result
from tools.bench.harness.stats import median_run
from tools.cli import UsageError

__all__ = ["configure", "run", "OUTPUTS", "BUDGETS"]

OUTPUTS = ("uint8", "float32")
# per-image budgets (ms) of the serial stages, and faults per batch (NOTE [feed proxy])
BUDGETS = {"main_thread_ms_per_image": 0.08, "other_threads_ms_per_image": 0.2, "redis_ms_per_image": 0.2,
           "faults_per_batch": 100, "l1_reads": 0, "source_reads": 0}
COLUMNS = ("output", "l2", "main_thread_ms_per_image", "other_threads_ms_per_image", "worker_ms_per_image",
           "redis_ms_per_image", "faults_per_batch", "l1_reads", "source_reads", "images_per_s")


def configure(parser: argparse.ArgumentParser) -> None:
    from tools.bench.harness.data import add_dataset_flags
    from tools.cache_flags import add_cache_arguments

    add_cache_arguments(parser)  # SRC (a dataset root holding train/ uses SRC/train), --cache-dir, the L2 ...
    parser.add_argument("--step-ms", type=float, default=29.0,
                        help="model step the consumer keeps its thread busy for after each batch (ResNet-50 bf16, "
                             "batch 128 on an H200: 29)")
    parser.add_argument("--outputs", default=",".join(OUTPUTS), help="comma-separated subset of uint8,float32")
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes")
    parser.add_argument("--batch-size", type=int, default=128, help="batch size")
    parser.add_argument("--size", type=int, default=224, help="crop size")
    parser.add_argument("--batches", type=int, default=30, help="timed batches per output and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median round is reported")
    add_dataset_flags(parser, image_px=320)
    from tools.bench.harness.l2 import add_l2_compare
    from tools.bench.harness.slow_source import add_source_flags

    add_l2_compare(parser)
    add_source_flags(parser)


def _check(args) -> None:
    from tools.cache_flags import cache_sizes_from_args

    try:
        (args.cache_size,) = cache_sizes_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not args.step_ms >= 0:
        raise UsageError(f"--step-ms must be >= 0 (milliseconds of model step per batch), got {args.step_ms:g}")
    for flag in ("workers", "batch_size", "size", "cache_size", "batches", "rounds"):
        if getattr(args, flag) < (0 if flag == "workers" else 1):
            raise UsageError(f"--{flag.replace('_', '-')} must be >= {0 if flag == 'workers' else 1}, "
                             f"got {getattr(args, flag)}")
    from tools.bench.harness.flags import choices

    args.outputs = choices("--outputs", args.outputs, OUTPUTS)


class Probe:
    """Counters of one loader's stages; ``take()`` reads them all at once."""

    def __init__(self, loader, servers) -> None:
        self.loader, self.servers = loader, servers

    def _workers(self) -> list[int]:
        it = self.loader.loader._iterator
        return [w.pid for w in getattr(it, "_workers", ())]

    def take(self) -> dict:
        from tools.bench.harness.procs import proc_stat

        cpu, faults = 0.0, proc_stat(os.getpid())[1]
        for pid in self._workers():
            c, f = proc_stat(pid)
            cpu, faults = cpu + c, faults + f
        redis_cpu = self.servers.cpu_seconds()
        hits = self.loader.cache_hits
        return {"process": time.process_time(), "thread": time.thread_time(), "workers": cpu, "faults": faults,
                "redis": redis_cpu, "l1": hits["l1_hits"], "source": hits["source_reads"],
                "wall": time.perf_counter()}


def _touch(images) -> None:
    """Read one byte of every page of ``images``, as the model's first layer reads them all."""
    import torch

    storage = images.untyped_storage()
    pages = torch.empty(0, dtype=torch.uint8, device=images.device).set_(storage)[::4096]
    pages.sum()


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(batches_iter, probe: Probe, batches: int, step_s: float) -> dict:
    """Consume ``batches`` batches as a training step would; CPU per image of each stage."""
    data_s, images = 0.0, 0
    before = probe.take()
    for _ in range(batches):
        t0 = time.thread_time()
        x, labels = next(batches_iter)
        data_s += time.thread_time() - t0
        images += len(labels)
        _touch(x)
        del x, labels
        _busy(step_s)
    after = probe.take()
    d = {k: after[k] - before[k] for k in after}
    ms = 1e3 / images
    servers = max(1, probe.servers.count)
    return {"main_thread_ms_per_image": data_s * ms,
            "other_threads_ms_per_image": (d["process"] - d["thread"]) * ms,
            "worker_ms_per_image": d["workers"] * ms, "redis_ms_per_image": d["redis"] * ms / servers,
            "faults_per_batch": d["faults"] / batches, "l1_reads": d["l1"], "source_reads": d["source"],
            "images_per_s": images / d["wall"], "batches": batches}


def _build(output: str, root: str, cache, args):
    from loaders import cached_dataloader

    raw = output == "uint8"
    return cached_dataloader(root, cache=cache, batch_size=args.batch_size, train=True, size=args.size,
                             workers=args.workers, seed=0, dtype=output, normalize=not raw)


def _verdicts(row: dict, args) -> dict:
    budgets = dict(BUDGETS, worker_ms_per_image=args.workers * args.step_ms / args.batch_size)
    return {k: ("ok" if row[k] <= b else "OVER") for k, b in budgets.items()}


def run(args: argparse.Namespace) -> Result:
    import torch

    from tools.bench.harness.data import source_root
    from tools.bench.harness.slow_source import slow_source

    _check(args)
    torch.set_num_threads(1)  # the consumer as a GPU training thread: one intra-op thread
    with slow_source(args, source_root(args)) as (root, where):  # NOTE [slow source flags]
        result = _run(args, root)
    result.notes = [*result.notes, f"source read from: {where}"]
    return result


def _run(args: argparse.Namespace, root) -> Result:
    from cachepipe import TwoLevelCache
    from tools.bench.harness.data import epochs, warm
    from tools.bench.harness.l2 import compared_l2, describe_l2, l2_servers
    from tools.bench.parts.loader_emulated import check_batch
    from tools.cache_flags import cache_config

    try:
        config = cache_config(args, root, args.cache_size)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    loaders, servers, where = {}, {}, {}  # per (output, store k): the loader; per k: its L2Servers, its L2
    with compared_l2(args, config) as configs:
        for k, cfg in enumerate(configs):
            cache = TwoLevelCache(cfg)
            if len(cache) < args.batch_size:  # one line naming the flag, before the warm-up
                cache.close()
                check_batch(len(cache.manifest), 1, args.batch_size)
            warm(cache)  # the first from the source, the others from its warm L1
            servers[k], where[k] = l2_servers(cfg), describe_l2(cfg)
            print(f"dataset {root}: {len(cache)} images; L2 {where[k]} warm ({cache.stats()['l2_writes']} writes); "
                  f"{servers[k].count} server(s)")
            cache.close()
            loaders.update({(o, k): _build(o, os.fspath(root), cache, args) for o in args.outputs})
        runs: dict[tuple, list[dict]] = {key: [] for key in loaders}
        try:
            iters = {key: epochs(loader) for key, loader in loaders.items()}
            for (o, k), loader in loaders.items():  # untimed: worker start-up, first-touch of recycled buffers
                measure(iters[o, k], Probe(loader, servers[k]), 2 * max(1, args.workers) * 2 + 2, args.step_ms / 1e3)
            for r in range(args.rounds):
                for (o, k), loader in loaders.items():
                    runs[o, k].append(measure(iters[o, k], Probe(loader, servers[k]), args.batches,
                                              args.step_ms / 1e3))
                    print(f"round {r + 1}/{args.rounds} {o} ({where[k].split(':')[0]}): "
                          f"{runs[o, k][-1]['images_per_s']:.0f} images/s, consumer "
                          f"{runs[o, k][-1]['main_thread_ms_per_image']:.3f} ms/image", flush=True)
        finally:
            for loader in loaders.values():
                loader.close()
            for probe in servers.values():
                probe.close()
    rows = []
    for (o, k), results in runs.items():
        row = {"output": o, "l2": where[k], **median_run(results, "main_thread_ms_per_image"),
               "faults_per_batch_all": [r["faults_per_batch"] for r in results],  # round 1: first touches
               "workers": args.workers, "batch_size": args.batch_size, "size": args.size,
               "cache_size": args.cache_size, "step_ms": args.step_ms, "rounds": args.rounds,
               "redis_servers": servers[k].count, "load_average": os.getloadavg()[0]}
        row["verdict"] = _verdicts(row, args)
        rows.append(row)
    budgets = dict(BUDGETS, worker_ms_per_image=args.workers * args.step_ms / args.batch_size)
    notes = ["budgets: " + ", ".join(f"{k} <= {v:g}" for k, v in budgets.items())]
    for row in rows:
        over = [k for k, v in row["verdict"].items() if v != "ok"]
        notes.append(f"{row['output']} ({row['l2'].split(':')[0]}): " + ("every stage within budget" if not over
                                                                        else "OVER budget: " + ", ".join(over)))
    notes.append(f"load average {os.getloadavg()[0]:.2f}")
    heads = [r for r in rows if r["output"] == rows[0]["output"]]  # the first output, from each L2
    return Result(rows, COLUMNS, notes=notes,
                  headline="consumer thread " + ", ".join(f"{r['main_thread_ms_per_image']:.3f} ms/image "
                                                         f"({r['output']}, {r['l2'].split(':')[0]})" for r in heads)
                           + "; budget 0.08")
