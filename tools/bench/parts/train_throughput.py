"""``cachepipe bench train`` (the default mode): training images/s with synthetic data vs the cached loaders.

One training configuration (model, image size, batch, precision) is timed side by side
in one run: ``synthetic`` (one random batch kept on the device: the data-free ceiling),
``torch`` (``loaders.cached_dataloader`` reading the warmed L2 Redis, float32 batches
normalised on the CPU and copied by the training loop), ``torch-gpu`` (the same loader
with ``device="cuda"``: uint8 to the GPU through its pinned ring, normalised there into
the autocast dtype; CUDA only) and ``dali`` (``loaders.build_dali_loader`` from the same
cache; GPU operators on CUDA, DALI CPU mode otherwise). Each row is images/s over
``--steps`` steps after ``--warmup-steps`` untimed ones, and its ratio to synthetic. On a
GPU the defaults are ResNet-50, bf16 autocast, channels_last, 224 px, batch 128, and the
training process keeps one intra-op thread (it only launches kernels; more threads would
take cores from the loader's workers); on CPU a small ResNet at 56 px. The generated
dataset has at least 4 batches per worker per epoch, so every worker delivers batches.
The cache flags are ``cachepipe train``'s (``tools.cache_flags``); ``--cache-dir``
defaults to a temporary directory, and the embedded L2 server (no ``--redis``,
``--redis-cluster`` or ``--no-l2``) is stopped at the end.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import tempfile
import time
from pathlib import Path

from tools.bench.harness import Result
from tools.bench.harness.stats import median_run
from tools.cli import UsageError

__all__ = ["SOURCES", "configure", "run"]

SOURCES = ["synthetic", "torch", "torch-gpu", "dali"]


def configure(group: argparse._ArgumentGroup) -> None:
    """Flags of the throughput mode (``--data``, ``--model``, ``--size``, ``--cache-size`` and
    ``--batch-size`` come from ``bench train``), the cache flags included."""
    from tools.cache_flags import add_cache_arguments

    add_cache_arguments(group, source=False)
    for action in group._group_actions:  # this benchmark's own default, not train's ./cachepipe-cache
        if "--cache-dir" in action.option_strings:
            action.help = "cache directory (default: a temporary one)"
    group.add_argument("--sources", nargs="+", default=SOURCES, choices=SOURCES, help="data sources to time")
    group.add_argument("--steps", type=int, default=30, help="timed steps per source and round")
    group.add_argument("--rounds", type=int, default=3,
                       help="rounds; each times every source in turn, the median round is reported (robust to load)")
    group.add_argument("--warmup-steps", type=int, default=5, help="untimed steps first")
    group.add_argument("--workers", type=int, default=2, help="loader worker processes / DALI threads")
    group.add_argument("--amp", default="bf16", choices=["off", "bf16", "fp16"], help="autocast dtype on CUDA")
    group.add_argument("--no-channels-last", action="store_true", help="keep NCHW on CUDA (default: channels_last)")
    group.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to train")
    group.add_argument("--images", type=int, default=None,
                       help="images in the generated dataset (default: 4 batches per loader worker, at least 4)")


def _time_source(name, batches, model, optimizer, criterion, autocast, device, channels_last, steps, warmup):
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    data_s = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            sync()
            start = time.perf_counter()
            data_s = 0.0
        t0 = time.perf_counter()
        images, labels = next(batches)
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        data_s += time.perf_counter() - t0
        with autocast():
            loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync()
    elapsed = time.perf_counter() - start
    return {"source": name, "images_per_s": steps * images.shape[0] / elapsed, "step_ms": 1000 * elapsed / steps,
            "data_wait_ms": 1000 * data_s / steps}


def run(args: argparse.Namespace) -> Result:
    """Time every source of ``--sources`` in interleaved rounds."""
    import torch

    from tools.bench.harness.data import epochs
    from tools.cache_flags import cache_config
    from trainer import models
    from trainer.optim import autocast_for

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    model_name = args.model or ("resnet50" if cuda else "resnet_small")
    size = args.size or (224 if cuda else 56)
    cache_size = args.cache_size or (256 if cuda else 64)
    batch = args.batch_size or (128 if cuda else 32)
    channels_last = cuda and not args.no_channels_last
    autocast = autocast_for(args.amp if cuda else "off", device)
    if cuda:  # the training process only launches kernels: its CPU is the workers'
        torch.set_num_threads(1)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cachepipe-bench-train-")))
        data = Path(args.data) if args.data else tmp / "data"
        try:
            cache = cache_config(args, data / "train", cache_size, cache_dir=tmp / "cache")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if not args.data:
            from tools.demo_dataset import make_dataset

            per_class = max(2, (args.images or 4 * max(1, args.workers) * batch) // 10)
            make_dataset(data, classes=10, per_class=per_class, val_per_class=0, size=cache_size, seed=0)
        from tools.bench.harness.slow_source import slow_source

        data, where = stack.enter_context(slow_source(args, data))  # NOTE [slow source flags]
        if where != "local":
            cache = dataclasses.replace(cache, source=os.fspath(data / "train"))
        num_classes = sum(1 for d in (data / "train").iterdir() if d.is_dir())
        if set(args.sources) - {"synthetic"}:
            from cachepipe import TwoLevelCache
            from cachepipe.server.embedded_group import EmbeddedGroup
            from cachepipe.warmup import warmup

            with TwoLevelCache(cache) as warm:
                warmup(warm, workers=1, progress=False)
            if cache.l2.is_embedded:  # the embedded server this benchmark started
                stack.callback(EmbeddedGroup.found(cache.cache_dir).stop)
        runners, rows = {}, []
        for name in args.sources:
            torch.manual_seed(0)
            model = models.create(model_name, num_classes=num_classes).to(device)
            if channels_last:
                model = model.to(memory_format=torch.channels_last)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            loader = _make(name, data, cache, args, batch, size, num_classes, device)
            if isinstance(loader, str):
                rows.append({"source": name, "note": loader})
                continue
            if hasattr(loader, "close"):
                stack.callback(loader.close)
            runners[name] = (epochs(loader), model, optimizer)
        timings: dict[str, list[dict]] = {name: [] for name in runners}
        for r in range(args.rounds):  # interleaved, so a load spike hits every source alike
            for name, (batches, model, optimizer) in runners.items():
                timings[name].append(_time_source(name, batches, model, optimizer, torch.nn.CrossEntropyLoss(),
                                                  autocast, device, channels_last, args.steps,
                                                  args.warmup_steps if r == 0 else 1))
        for name, results in timings.items():
            rows.append(dict(median_run(results, "images_per_s"), rounds=len(results)))
    base = next((r["images_per_s"] for r in rows if r["source"] == "synthetic"), None)
    for r in rows:
        r.update(model=model_name, size=size, batch=batch, device=device.type,
                 amp=args.amp if cuda else "fp32", channels_last=channels_last)
        if base and "images_per_s" in r:
            r["vs_synthetic"] = r["images_per_s"] / base
    fed = [r for r in rows if r.get("vs_synthetic") and r["source"] != "synthetic"]
    best = max(fed, key=lambda r: r["vs_synthetic"], default=None)
    return Result(rows, ["source", "images_per_s", "vs_synthetic", "step_ms", "data_wait_ms", "note"],
                  notes=[f"{model_name}, {size} px, batch {batch}, {device.type}"
                         f"{', ' + args.amp + ' autocast, channels_last' if cuda else ', fp32'}; "
                         f"{args.workers} loader workers; data read from: {where}"],
                  headline=(f"{best['source']} loader feeds {100 * best['vs_synthetic']:.1f} % of synthetic data's "
                            f"images/s ({model_name}, {device.type})" if best else None))


def _make(name, data, cache, args, batch, size, num_classes, device):
    """The loader of source ``name`` (``cache``: the resolved cache settings), or why it cannot run here."""
    from trainer.data import SyntheticLoader

    if name == "synthetic":
        loader = SyntheticLoader(batch_size=batch, size=size, num_classes=num_classes, steps=1 << 30)
        loader.images, loader.labels = loader.images.to(device), loader.labels.to(device)
        return loader
    import loaders

    if name.startswith("torch"):
        on_gpu = name == "torch-gpu"
        if on_gpu and device.type != "cuda":
            return "needs CUDA (uint8 to the GPU, normalised there)"
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(args.amp, "float32") if on_gpu else "float32"
        return loaders.cached_dataloader(data / "train", batch_size=batch, train=True, size=size,
                                         workers=args.workers, cache=cache, distributed=False, channels_last=device.type == "cuda", dtype=dtype,
                                         device=device if on_gpu else None)
    if not loaders.dali_available():
        return "nvidia-dali not installed"
    return loaders.build_dali_loader(data / "train", batch_size=batch, train=True, size=size,
                                     device="gpu" if device.type == "cuda" else "cpu", shard_id=0, num_shards=1,
                                     cache=cache, workers=max(args.workers, 1))
