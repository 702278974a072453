"""One rank of ``cachepipe bench loader --emulate``: read whole epochs through ``cached_dataloader``.

Run by :func:`tools.emulated_job.launch` inside an emulated node with torchrun's
environment. Joins a gloo group (only for barriers and the placement broadcast), reads
one untimed epoch, then ``--epochs`` timed epochs between two barriers, and writes its
counts to ``--out`` as JSON.
"""
from __future__ import annotations

import argparse
import json
import time

__all__ = ["main"]


def _parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.bench.loader_rank")
    p.add_argument("root")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--redis", action="append", required=True)
    p.add_argument("--locality", required=True)
    p.add_argument("--exchange-fraction", type=float, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--cache-size", type=int, required=True)
    p.add_argument("--dtype", required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    import torch
    import torch.distributed as dist

    from loaders import cached_dataloader

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        loader = cached_dataloader(args.root, batch_size=args.batch_size, train=True, size=args.size,
                                   workers=args.workers, cache_dir=args.cache_dir, redis=args.redis,
                                   cache_size=args.cache_size, dtype=args.dtype, normalize=args.dtype != "uint8",
                                   locality=args.locality, exchange_fraction=args.exchange_fraction)
        images = 0
        for epoch in range(args.epochs + 1):
            if epoch == 1:  # epoch 0 starts the workers and the connections: untimed
                dist.barrier()
                start = time.perf_counter()
            loader.set_epoch(epoch)
            for _, labels in loader:
                images += len(labels)
        timed = images * args.epochs // (args.epochs + 1)  # every epoch has the same number of images
        dist.barrier()
        seconds = time.perf_counter() - start
        loader.close()
        with open(args.out, "w") as f:
            json.dump({"rank": dist.get_rank(), "images": images, "timed_images": timed, "seconds": seconds,
                       **loader.cache_hits}, f)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
