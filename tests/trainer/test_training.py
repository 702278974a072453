"""Short real training runs on multi-process gloo groups (CPU)."""
from __future__ import annotations

import math

import numpy as np

from tests.distributed import run_distributed
from trainer.recipes import load_recipe, override
from trainer.run_config import RunConfig
from trainer.checkpoint import Checkpoints
from trainer.serialize import load_state

ALGORITHMS = ["dense", "hier", "2dtar", "topk_ag", "gtopk", "hitopk", "omgs", "powersgd"]  # powersgd: always DDP
DDP_ALGORITHMS = ["dense", "hitopk"]  # also run inside backward as DDP (comm hook)
RESUME_COMMS = ["hitopk", "omgs", "hitopk-pipe"]  # sparse: residuals (and OMGS's planned layout) are resumed
# state; -pipe: train.pipeline_exchange (NOTE [pipelined exchange] in comm/engine.py)


def _assert_same(a, b, where="state"):
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif hasattr(a, "numpy"):
        assert np.array_equal(a.numpy(), b.numpy()), where
    else:
        assert a == b, where


def _recipe(epochs: int, comm: str, density: float = 0.05):
    return override(load_recipe("demo"), epochs=epochs, comm=comm, density=density, batch_size=4, size=32,
                    sets=["train.cache_size=36", "train.eval_size=32", "optim.label_smoothing=0.0",
                          "optim.lr=0.8", "schedule.warmup_epochs=0"])


def _train_each_algorithm(rank, world, data, out):
    from trainer.loop import train

    losses = {}
    runs = [(False, c, c) for c in ALGORITHMS] + [(True, c, f"ddp-{c}") for c in DDP_ALGORITHMS]
    for ddp, comm, name in runs + [(False, "hitopk", "hitopk-pipe")]:
        recipe = _recipe(3, comm)
        if name.endswith("-pipe"):
            recipe = override(recipe, sets=["train.pipeline_exchange=true"])
        cfg = RunConfig(recipe=recipe, data=str(data), out=f"{out}/{name}", loader="memory",
                        nodes=2, local_size=2, device="cpu", ddp=ddp)
        losses[name] = [row["train_loss"] for row in train(cfg)]
    return losses


def test_every_exchange_algorithm_lowers_the_loss(small_dataset, tmp_path):
    losses = run_distributed(_train_each_algorithm, 4, small_dataset, tmp_path, timeout=240)
    assert losses[0] == losses[3]  # every rank reports the same (reduced) loss
    assert len(losses[0]) == len(ALGORITHMS) + len(DDP_ALGORITHMS) + 1
    for comm, per_epoch in losses[0].items():
        assert per_epoch[-1] < per_epoch[0] and per_epoch[-1] < 0.9 * math.log(4), (comm, per_epoch)


def _interrupted_and_uninterrupted(rank, world, data, out):
    from trainer.loop import train

    epochs = []
    for name in RESUME_COMMS:
        comm, _, pipe = name.partition("-")
        # omgs: every layer alone; an "auto" plan is timed, so two runs may plan differently. The
        # density warm-up (1.5 epochs) changes the density at every step across the interruption.
        recipe = override(_recipe(2, comm, density=0.05), sets=["phases.0.omgs_plan=lags",
                                                                "phases.0.density_warmup_epochs=1.5",
                                                                f"train.pipeline_exchange={bool(pipe)}"])
        common = dict(recipe=recipe, data=str(data), loader="memory", nodes=1, local_size=2, device="cpu")
        train(RunConfig(out=f"{out}/{name}/straight", **common))
        # 6 steps per epoch: epoch 0 finishes, then the run stops at step 9 inside epoch 1 (with
        # pipeline_exchange, step 9's gradients are then in flight and saved by the checkpoint)
        first = train(RunConfig(out=f"{out}/{name}/broken", ckpt_every=2, stop_after_steps=9, **common))
        rows = train(RunConfig(out=f"{out}/{name}/broken", resume=f"{out}/{name}/broken", **common))
        epochs.append(([r["epoch"] for r in first], [r["epoch"] for r in rows]))
    return epochs


def test_resume_is_bit_identical_to_an_uninterrupted_run(small_dataset, tmp_path):
    epochs = run_distributed(_interrupted_and_uninterrupted, 2, small_dataset, tmp_path, timeout=240)
    # the resumed call trained only the rest of epoch 1
    assert epochs == [[([0], [1])] * len(RESUME_COMMS)] * 2
    for comm in RESUME_COMMS:
        _check_identical(tmp_path / comm)


def _newest(run, rank=0):
    checkpoints = Checkpoints(run, rank)
    generation = checkpoints.generations()[0]
    return load_state(checkpoints.shared_path(generation)), load_state(checkpoints.rank_path(generation))


def _check_identical(tmp_path):
    a, b = _newest(tmp_path / "straight")[0], _newest(tmp_path / "broken")[0]
    assert a["step"] == b["step"] == 12 and a["epoch"] == b["epoch"] == 2
    for key in a["model"]:
        assert np.array_equal(a["model"][key].numpy(), b["model"][key].numpy()), key
    for pid, state in a["optimizer"]["state"].items():
        assert np.array_equal(state["momentum_buffer"].numpy(), b["optimizer"]["state"][pid]["momentum_buffer"].numpy())
    for r in range(2):  # error-feedback residuals of every rank
        ra = _newest(tmp_path / "straight", r)[1]["exchanger"]
        rb = _newest(tmp_path / "broken", r)[1]["exchanger"]
        _assert_same(ra, rb)
    rows_a = (tmp_path / "straight/metrics.jsonl").read_text().splitlines()
    rows_b = (tmp_path / "broken/metrics.jsonl").read_text().splitlines()
    import json

    keys = ("epoch", "train_loss", "val_top1", "val_top5", "val_loss", "steps", "density", "inter_node_bytes",
            "residual_norm")
    assert [{k: json.loads(r)[k] for k in keys} for r in rows_a] == [{k: json.loads(r)[k] for k in keys} for r in rows_b]
    # the density of each of the 6 steps per epoch is the recipe's warm-up (1.5 epochs = 9 steps from 25 % to 5 %)
    from trainer.schedules import density_at

    for row in map(json.loads, rows_a):
        steps = [density_at(row["epoch"] * 6 + i, density=0.05, warmup_steps=9) for i in range(6)]
        assert row["density"] == sum(steps) / 6 and row["residual_norm"] > 0


def _two_phases():
    """hitopk for one epoch, then 2dtar: a phase switch that must apply hitopk's residual."""
    from trainer.recipes import recipe_from_dict

    data = _recipe(1, "hitopk", density=0.05).to_dict()
    data["phases"] = [dict(data["phases"][0]), dict(data["phases"][0], comm="2dtar")]
    return recipe_from_dict(data, "demo")


class _Crash(Exception):
    pass


def _resume_at_the_phase_switch(rank, world, data, out):
    from trainer.loop import train

    common = dict(recipe=_two_phases(), data=str(data), loader="memory", nodes=1, local_size=2, device="cpu")
    train(RunConfig(out=f"{out}/straight", **common))

    def crash(row):  # the run dies right after epoch 0's checkpoint, the last of phase 0
        raise _Crash

    try:
        train(RunConfig(out=f"{out}/broken", **common), on_epoch=crash)
    except _Crash:
        pass
    rows = train(RunConfig(out=f"{out}/broken", resume=f"{out}/broken", **common))
    return [r["epoch"] for r in rows]


def test_resume_into_the_next_phase_carries_the_residual_like_an_uninterrupted_run(small_dataset, tmp_path):
    epochs = run_distributed(_resume_at_the_phase_switch, 2, small_dataset, tmp_path, timeout=240)
    assert epochs == [[1], [1]]  # resumed in phase 1, from the checkpoint of phase 0
    a, b = _newest(tmp_path / "straight")[0], _newest(tmp_path / "broken")[0]
    assert a["step"] == b["step"] == 12
    for key in a["model"]:
        assert np.array_equal(a["model"][key].numpy(), b["model"][key].numpy()), key
