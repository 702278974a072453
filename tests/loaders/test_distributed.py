"""cached_dataloader in a real 2-process gloo group: ranks come from torch.distributed, shards are
disjoint and complete, and set_epoch reshuffles identically on every rank."""
from __future__ import annotations

import torch
import torch.distributed as dist

from loaders import cached_dataloader
from tests.distributed import run_distributed


def _rank_epochs(rank, world_size, root, cache_dir):
    loader = cached_dataloader(root, batch_size=3, train=True, size=16, workers=0, cache_dir=cache_dir,
                               redis=False, cache_size=24, seed=11)
    out = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        indices = [i for batch in loader.sampler for i in batch]
        labels = torch.cat([y for _, y in loader]).tolist()
        # every rank must have agreed on the number of batches: a collective per batch would hang otherwise
        count = torch.tensor([len(loader)])
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        out.append({"indices": indices, "labels": labels, "batches": len(loader), "max_batches": int(count)})
    return out, loader.dataset.targets


def test_two_real_ranks_split_each_epoch(source, tmp_path):
    results = run_distributed(_rank_epochs, 2, str(source), str(tmp_path / "cache"))
    targets = results[0][1]
    for epoch in (0, 1):
        per_rank = [r[0][epoch] for r in results]
        union = per_rank[0]["indices"] + per_rank[1]["indices"]
        assert sorted(union) == list(range(24))  # 24 samples, 2 ranks x 4 batches of 3: disjoint, complete
        for r in per_rank:
            assert r["labels"] == [targets[i] for i in r["indices"]]
            assert r["batches"] == r["max_batches"] == 4
    assert results[0][0][0]["indices"] != results[0][0][1]["indices"]  # set_epoch reshuffled
