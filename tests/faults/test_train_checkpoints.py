"""Item 7 of issue 17: checkpoints survive damage, runs are never silently replaced or changed.

Real faults on real files: a truncated, a bit-flipped and a crafted newest checkpoint, a
rank file damaged on one rank only, a checkpoint file that cannot be written on one rank
of a real 2-process gloo group, a used ``--out``, a resume with changed flags.
"""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from tests.forked import run_tools
from tests.distributed import run_distributed
from tests.faults.train_faults import copy_dataset, small_recipe, train_dataset  # noqa: F401
from trainer.checkpoint import Checkpoints
from trainer.consensus import RankFailed
from trainer.run_config import RunConfig
from trainer.serialize import load_state, save_state


def _two_generations(folder, rank=0):
    ckpt = Checkpoints(folder, rank)
    for step in (1, 2, 3):  # three saves: only the last two generations stay
        ckpt.save({"model_name": "m", "step": step, "w": np.arange(4.0) * step}, {"rank": rank, "step": step})
    return ckpt


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_a_bit(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x10
    path.write_bytes(bytes(data))


def _craft(path):
    """A well-formed npz with a matching checksum whose structure is nonsense: a dtype
    name that is a torch function, and a meta that names an array that does not exist."""
    from trainer.serialize import _digest

    meta = json.dumps({"__dict__": {"step": {"__tensor__": 0, "dtype": "load"}}}).encode()
    arrays = [np.zeros(3)]
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(meta, dtype=np.uint8), sha256=_digest(meta, arrays), a0=arrays[0])
    path.write_bytes(buf.getvalue())


def _pickled(path):
    """An npz whose array is a pickled object: np.load(allow_pickle=False) must refuse it."""
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(b"{}", dtype=np.uint8), sha256=np.zeros(32, np.uint8),
             a0=np.array([{"evil": 1}], dtype=object))
    path.write_bytes(buf.getvalue())


@pytest.mark.parametrize("damage", [_truncate, _flip_a_bit, _craft, _pickled])
def test_a_damaged_newest_generation_falls_back_to_the_older(tmp_path, capsys, damage):
    ckpt = _two_generations(tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "gen2.npz", "gen2.rank0.npz", "gen3.npz", "gen3.rank0.npz"]
    damage(ckpt.shared_path(3))
    with pytest.raises(ValueError, match="gen3.npz"):
        load_state(ckpt.shared_path(3))
    shared, local = Checkpoints(tmp_path, 0).load({"model_name": "m"})
    assert shared["step"] == local["step"] == 2 and shared["generation"] == 2
    assert "generation 3" in capsys.readouterr().err
    damage(ckpt.shared_path(2))
    with pytest.raises(ValueError, match="no usable checkpoint"):
        Checkpoints(tmp_path, 0).load({"model_name": "m"})


def _rank1_file_damaged(rank, world, folder):
    ckpt = _two_generations(folder, rank)
    import torch.distributed as dist

    dist.barrier()
    if rank == 1:
        _truncate(ckpt.rank_path(3))
    dist.barrier()
    shared, local = Checkpoints(folder, rank).load({"model_name": "m"})
    return shared["step"], local["rank"]


def test_a_rank_file_damaged_on_one_rank_moves_every_rank_back(tmp_path):
    assert run_distributed(_rank1_file_damaged, 2, tmp_path, timeout=120) == [(2, 0), (2, 1)]


def _write_fails_on_rank1(rank, world, folder):
    ckpt = Checkpoints(folder, rank)
    ckpt.save({"step": 1}, {"rank": rank})
    if rank == 1:  # a real write failure: its next file's name is taken by a non-empty directory
        (ckpt.rank_path(2) / "in-the-way").mkdir(parents=True)
    try:
        ckpt.save({"step": 2}, {"rank": rank})
    except RankFailed as exc:
        return str(exc), ckpt.generation
    return "saved", ckpt.generation


def test_a_failed_write_on_one_rank_stops_every_rank_with_its_error(tmp_path):
    results = run_distributed(_write_fails_on_rank1, 2, tmp_path, timeout=60)  # a hang would time out
    for message, generation in results:
        assert message.startswith("rank 1: cannot write checkpoint") and "gen2.rank1.npz" in message
        assert generation == 1  # generation 1 is still the newest, complete one
    assert Checkpoints(tmp_path, 0).load({})[0]["step"] == 1


def _cli(*args):
    return run_tools("train", *args, timeout=300)


def test_used_out_is_refused_and_resume_refuses_changes(train_dataset, tmp_path):
    out = tmp_path / "run"
    base = ["--data", train_dataset, "--recipe", "demo", "--loader", "memory", "--batch-size", "8", "--size", "32",
            "--set", "train.eval_size=32", "--set", "schedule.warmup_epochs=0", "--device", "cpu", "--out", out]
    first = _cli(*base, "--epochs", 1)
    assert first.returncode == 0, first.stderr[-2000:]
    log = (out / "metrics.jsonl").read_text()
    again = _cli(*base, "--epochs", 1)
    assert again.returncode == 1 and again.stderr.count("\n") == 1
    assert f"--out {out} is not empty" in again.stderr and "--overwrite" in again.stderr
    assert (out / "metrics.jsonl").read_text() == log  # nothing was touched
    changed = _cli(*base, "--epochs", 2, "--lr", 0.2, "--resume", out)
    assert changed.returncode == 1 and changed.stderr.count("\n") == 1
    assert "recipe.phases.0.epochs: 1 -> 2" in changed.stderr and "recipe.optim.lr: 0.4 -> 0.2" in changed.stderr
    assert "--allow-changes" in changed.stderr
    allowed = _cli(*base, "--epochs", 2, "--resume", out, "--allow-changes")
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert "resuming with changes (--allow-changes): recipe.phases.0.epochs: 1 -> 2" in allowed.stdout
    assert [json.loads(r)["epoch"] for r in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    fresh = _cli(*base, "--epochs", 1, "--overwrite")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert [json.loads(r)["epoch"] for r in (out / "metrics.jsonl").read_text().splitlines()] == [0]
    assert Checkpoints(out, 0).generations() == [1]  # the old run's checkpoints went with it


def test_changes_are_listed_by_key():
    cfg = RunConfig(recipe=small_recipe(epochs=2), data="d", out="o")
    saved = RunConfig(recipe=small_recipe(epochs=1, **{"optim.lr": 0.8}), data="d", out="o", ddp=True).settings()
    assert cfg.changes(saved) == ["ddp: True -> False", "recipe.optim.lr: 0.8 -> 0.4",
                                  "recipe.phases.0.epochs: 1 -> 2"]
    assert cfg.changes(cfg.settings()) == []


@pytest.mark.parametrize("comm, changes", [
    ("hitopk", []),
    ("gtopk", ["recipe.phases.0.density: 0.01 -> 0.02", "recipe.phases.0.lr_scaled_residuals: False -> True"])])
def test_resume_compares_the_density_a_phase_uses_not_how_it_was_written(comm, changes):
    """A checkpoint from before NOTE [gtopk's training defaults] wrote ``density: 0.01`` and
    ``lr_scaled_residuals: false`` in every phase; the recipes now leave them unset."""
    saved = RunConfig(recipe=small_recipe(comm=comm), data="d", out="o").settings()
    for row in saved["recipe"]["phases"]:
        row.update(density=0.01, lr_scaled_residuals=False)
    cfg = RunConfig(recipe=small_recipe(comm=comm), data="d", out="o")
    assert cfg.recipe.phases[0].density is None
    assert cfg.changes(saved) == changes


@pytest.mark.parametrize("comm, changes", [
    ("dense", []),  # dense reads no density: a new --density changes nothing it does
    ("hitopk", ["recipe.phases.0.density: 0.01 -> 0.05"])])
def test_a_new_density_is_a_change_only_for_a_phase_that_uses_one(comm, changes):
    from trainer.recipes import override

    saved = RunConfig(recipe=small_recipe(comm=comm), data="d", out="o").settings()
    assert RunConfig(recipe=override(small_recipe(comm=comm), density=0.05), data="d", out="o").changes(saved) == changes
    longer = RunConfig(recipe=small_recipe(comm=comm, epochs=2), data="d", out="o")
    assert longer.changes(saved) == ["recipe.phases.0.epochs: 1 -> 2"]  # what a dense phase reads still counts
