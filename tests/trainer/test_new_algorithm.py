"""A new exchange algorithm is one class and one registry call (NOTE [one registry of names]
in comm/algorithm.py): defined here alone, registered, and trained by name through the
trainer's normal path on 2 real gloo processes."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from comm import cost_model
from comm.algorithm import Algorithm
from comm.collectives.base import Exchanger, all_gather_async
from comm.registry import ALGORITHMS, register
from tests.distributed import run_distributed
from trainer.recipes import load_recipe, override
from trainer.run_config import RunConfig


@dataclass(frozen=True)
class GatherMeanOptions:
    """``chunks``: all-gathers each bucket is exchanged in."""

    chunks: int = 1

    def __post_init__(self):
        if self.chunks < 1:
            raise ValueError(f"gather_mean chunks must be >= 1; got {self.chunks}")


class GatherMeanExchanger(Exchanger):
    """Every worker's gradient gathered by all, then averaged locally (dense)."""

    name = "gather_mean"
    gathers = 0  # all-gathers started in this process

    def _stages(self, x, out):
        world = self.topology.world_size
        pieces = []
        for piece in x.chunk(self.options.chunks):
            gathered, work = all_gather_async(piece.contiguous(), None, world)
            GatherMeanExchanger.gathers += 1
            yield work
            pieces.append(gathered.view(world, -1).mean(0))
        return torch.cat(pieces)


def cost(c, m, n, d, b, **_):
    p = m * n
    cost_model.add_link(c, "inter" if m > 1 else "intra", p - 1, (p - 1) * d * b)


GATHER_MEAN = Algorithm.of(GatherMeanExchanger, options=GatherMeanOptions, cost=cost)


@pytest.fixture
def gather_mean():
    register(GATHER_MEAN)  # the one registry line
    yield GATHER_MEAN
    del ALGORITHMS[GATHER_MEAN.name]  # the other tests see the shipped registry


def _recipe(comm: str, sets=()):
    return override(load_recipe("demo"), epochs=1, comm=comm, batch_size=4, size=32,
                    sets=["train.cache_size=36", "train.eval_size=32", "optim.lr=0.8", "schedule.warmup_epochs=0",
                          *sets])


def _train_by_name(rank, world, data, out):
    from trainer.loop import train

    register(GATHER_MEAN)  # a fresh (spawned) process: registered the same way
    runs = {}
    for comm in ("dense", GATHER_MEAN.name):
        cfg = RunConfig(recipe=_recipe(comm, [f"phases.0.{GATHER_MEAN.name}_chunks=3"]), data=str(data),
                        out=f"{out}/{comm}", loader="memory", nodes=1, local_size=2, device="cpu")
        runs[comm] = [(row["comm"], row["train_loss"]) for row in train(cfg)]
    return runs, GatherMeanExchanger.gathers


def test_a_new_algorithm_trains_by_name(gather_mean, small_dataset, tmp_path):
    recipe = _recipe(gather_mean.name, ["phases.0.gather_mean_chunks=3", "phases.0.powersgd_rank=4"])
    assert recipe.phases[0].options == GatherMeanOptions(chunks=3)
    assert recipe.to_dict()["phases"][0]["gather_mean_chunks"] == 3
    assert cost_model.coefficients(gather_mean.name, 1000, None, 2, 2)["alpha_inter"] == 3  # P - 1 messages
    with pytest.raises(ValueError, match="gather_mean chunks must be >= 1"):
        _recipe(gather_mean.name, ["phases.0.gather_mean_chunks=0"])
    results = run_distributed(_train_by_name, 2, small_dataset, tmp_path, timeout=180)
    runs, gathers = results[0]
    assert results[0] == results[1]
    (dense_comm, dense_loss), = runs["dense"]
    (comm, loss), = runs[gather_mean.name]
    assert comm == gather_mean.name and gathers % 3 == 0 and gathers >= 3
    assert loss == pytest.approx(dense_loss, rel=1e-5)  # the same average as dense's all-reduce


def test_unknown_names_list_the_registered_ones(gather_mean):
    from comm.plans import make_plan

    with pytest.raises(ValueError, match=r"phase comm 'ring' is unknown; valid: \[.*'gather_mean', 'auto'\]"):
        _recipe("ring")
    with pytest.raises(ValueError, match=r"phase selector 'fast' is unknown; valid: \['dgc', 'exact', 'mstopk'\]"):
        _recipe(gather_mean.name, ["phases.0.selector=fast"])
    with pytest.raises(ValueError, match=r"unknown bucket plan 'ring'; valid: \['layer', 'omgs', 'size'\]"):
        make_plan("ring")
