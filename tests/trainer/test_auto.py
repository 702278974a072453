"""``comm: auto`` in real training runs (NOTE [auto exchange] in comm/auto.py): the choice is
made once per phase after its first steps, recorded, kept across a resume, and a run that keeps
the sparse candidate trains exactly as one that asked for it."""
from __future__ import annotations

from tests.distributed import run_distributed
from trainer.recipes import load_recipe, override
from trainer.run_config import RunConfig

KEYS = ("epoch", "comm", "train_loss", "val_top1", "val_loss", "density", "inter_node_bytes")


def _recipe(comm: str):
    return override(load_recipe("demo"), epochs=3, comm=comm, density=0.05, batch_size=4, size=32,
                    sets=["train.cache_size=36", "train.eval_size=32", "schedule.warmup_epochs=0",
                          "phases.0.density_warmup_steps=4"])


def _auto_runs(rank, world, data, out):
    from trainer.loop import train

    def run(name, comm, **kw):
        return train(RunConfig(recipe=_recipe(comm), data=str(data), out=f"{out}/{name}", loader="memory", nodes=2,
                               local_size=1, device="cpu", **kw))

    auto = run("auto", "auto")
    first = run("broken", "auto", ckpt_every=5, stop_after_steps=7)  # 6 steps per epoch: stops after the choice
    resumed = run("broken", "auto", resume=f"{out}/broken")
    same = run("same", auto[0]["comm"])
    return auto, first, resumed, same


def test_auto_chooses_once_records_why_and_keeps_the_choice_on_resume(small_dataset, tmp_path):
    for auto, first, resumed, same in run_distributed(_auto_runs, 2, small_dataset, tmp_path, timeout=240):
        chosen = auto[0]["comm"]  # timed: each run chooses for itself, a resumed one keeps its own
        assert chosen in ("dense", "hier", "2dtar", "hitopk") and {r["comm"] for r in auto} == {chosen}
        assert "s/step predicted against" in auto[0]["auto"] and "first 4 steps ran hitopk" in auto[0]["auto"]
        assert [r["epoch"] for r in first] == [0] and {r["comm"] for r in resumed} == {first[0]["comm"]}
        assert resumed[0]["epoch"] == 1 and resumed[0]["auto"] == "chosen before the run resumed"
        if chosen == "hitopk":  # the measurements touched neither the weights nor the random streams
            assert [{k: r[k] for k in KEYS} for r in auto] == [{k: r[k] for k in KEYS} for r in same]
        else:  # hitopk's first steps, then the choice, its residual carried in: the loss still falls
            assert auto[-1]["train_loss"] < auto[0]["train_loss"]


def test_auto_on_one_process_is_dense_said_once(small_dataset, tmp_path, capsys):
    from trainer.loop import train

    data = _recipe("auto").to_dict()
    data["phases"] = [dict(data["phases"][0], epochs=1), dict(data["phases"][0], epochs=1, size=36)]
    from trainer.recipes import recipe_from_dict

    rows = train(RunConfig(recipe=recipe_from_dict(data, "demo"), data=str(small_dataset), out=str(tmp_path / "one"),
                           loader="memory", device="cpu"))
    assert [r["comm"] for r in rows] == ["dense", "dense"] and "auto" not in rows[0]
    assert capsys.readouterr().out.count("auto: one process, nothing to exchange: dense") == 1
