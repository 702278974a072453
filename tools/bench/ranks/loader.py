"""One rank of ``cachepipe bench loader --emulate``: read whole epochs through ``cached_dataloader``.

Run inside an emulated node (NOTE [benchmark ranks]). The gloo group serves the barriers
and the placement broadcast; the rank reads one untimed epoch, then ``epochs`` timed epochs
between two barriers, and reports its counts.
"""
from __future__ import annotations

import time

from tools.bench.harness.ranks import run_rank

__all__ = ["read_epochs"]


def read_epochs(spec: dict) -> dict:
    import torch.distributed as dist

    from loaders import cached_dataloader

    node = dist.get_rank() // spec["local_size"]
    loader = cached_dataloader(spec["root"], batch_size=spec["batch_size"], train=True, size=spec["size"],
                               workers=spec["workers"], cache_dir=f"{spec['cache_dir']}/node{node}",
                               redis=spec["urls"], cache_size=spec["cache_size"], dtype=spec["dtype"],
                               normalize=spec["dtype"] != "uint8", locality=spec["locality"],
                               exchange_fraction=spec["exchange_fraction"])
    images, epochs = 0, spec["epochs"]
    for epoch in range(epochs + 1):
        if epoch == 1:  # epoch 0 starts the workers and the connections: untimed
            dist.barrier()
            start = time.perf_counter()
        loader.set_epoch(epoch)
        for _, labels in loader:
            images += len(labels)
    timed = images * epochs // (epochs + 1)  # every epoch has the same number of images
    dist.barrier()
    seconds = time.perf_counter() - start
    loader.close()
    return {"rank": dist.get_rank(), "images": images, "timed_images": timed, "seconds": seconds, **loader.cache_hits}


if __name__ == "__main__":
    raise SystemExit(run_rank(read_epochs, per_rank=True))
