"""The loop on the DALI loader (CPU mode here) and with mixed precision on a GPU."""
from __future__ import annotations

import pytest

from cachepipe import CacheConfig
from trainer.recipes import load_recipe, override
from trainer.run_config import RunConfig


def _recipe(**kw):
    return override(load_recipe("demo"), epochs=1, comm="dense", batch_size=8, size=32,
                    sets=["train.cache_size=40", "train.eval_size=32", "train.workers=1", "schedule.warmup_epochs=0"] + kw.pop("sets", []), **kw)


@pytest.mark.dali
def test_training_reads_through_the_dali_loader(small_dataset, tmp_path):
    from trainer.loop import train

    rows = train(RunConfig(recipe=_recipe(), data=str(small_dataset), out=str(tmp_path / "run"), loader="dali",
                           cache=CacheConfig(small_dataset, tmp_path / "cache"), device="cpu"))
    assert len(rows) == 1 and rows[0]["val_images"] == 16
    assert rows[0]["cache"]["source_reads"] + rows[0]["cache"]["l1_hits"] + rows[0]["cache"]["l2_hits"] > 0
    from cachepipe import EmbeddedRedis

    EmbeddedRedis(tmp_path / "cache").stop()


@pytest.mark.gpu
@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_channels_last_on_cuda(small_dataset, tmp_path, amp):
    import torch

    from trainer.loop import train

    recipe = _recipe(sets=[f"train.amp={amp}", "train.channels_last=true", "optim.name=lars"])
    rows = train(RunConfig(recipe=recipe, data=str(small_dataset), out=str(tmp_path / amp), loader="memory",
                           device="cuda"))
    assert torch.isfinite(torch.tensor(rows[0]["train_loss"]))
