import pytest

from trainer.config import Recipe
from trainer.recipes import from_dict
from trainer.recipes import available, load_recipe, override
from trainer.schedules import lr_at


def test_shipped_recipes_parse_and_dawnbench28_is_the_papers_schedule():
    assert {"dawnbench28", "resnet50-90ep", "demo"} <= set(available())
    r = load_recipe("dawnbench28")
    assert [(p.epochs, p.size, p.batch_size, p.comm) for p in r.phases] == [
        (13, 96, 256, "auto"), (11, 128, 256, "auto"), (3, 224, 256, "auto"), (1, 288, 128, "auto")]
    assert r.phases[0].selector == "mstopk" and r.total_epochs == 28 and r.optim.name == "lars"
    assert r.phase_of(12)[0] == 0 and r.phase_of(13)[0] == 1 and r.phase_of(27)[1].size == 288
    assert load_recipe("resnet50-90ep").total_epochs == 90


def test_cifar10_recipe_trains_resnet_small_on_native_32px_photos_every_phase_sparse():
    import torch

    from trainer import models

    r = load_recipe("cifar10")
    assert r.model.name == "resnet_small" and r.total_epochs >= 8
    assert {(p.size, r.cache_size_of(p), p.comm, p.sparse_density, p.hybrid_bytes) for p in r.phases} == {
        (32, 32, "auto", 0.01, 0)}
    assert r.train.eval_size == 32
    # momentum correction without masking, the default density warm-up (NOTE [warm-ups in steps])
    assert {(p.momentum_correction, p.momentum_masking, p.density_warmup_epochs, p.density_warmup_steps)
            for p in r.phases} == {(True, False, None, None)}
    net = models.create("resnet_small", num_classes=10).eval()
    stages = []
    for i in range(1, net.num_stages + 1):
        getattr(net, f"layer{i}").register_forward_hook(lambda m, x, y: stages.append(y.shape[-1]))
    with torch.no_grad():
        assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert stages == [16, 8, 4]  # the stride-2 stem and two stride-2 stages: no stage below 4 px


def test_overrides_apply_to_every_phase_and_single_fields():
    r = override(load_recipe("dawnbench28"), epochs=2, comm="gtopk", density=0.05,
                 sets=["optim.lr=0.5", "phases.1.size=112", "schedule.decay=cosine"])
    assert [p.epochs for p in r.phases] == [2, 2, 2, 2] and {p.comm for p in r.phases} == {"gtopk"}
    assert {p.density for p in r.phases} == {0.05} and r.optim.lr == 0.5
    assert r.phases[1].size == 112 and r.schedule.decay == "cosine"


def test_each_sparse_algorithm_trains_at_its_own_defaults_unless_the_recipe_or_a_flag_says():
    """NOTE [gtopk's training defaults]: gtopk at 0.02 with rate-following residuals, the
    others at 0.01 in gradient units; a given value wins, and an unset one follows --comm."""
    from trainer.schedules import phase_warmups

    base = load_recipe("cifar10")
    assert base.phases[0].density is None and base.phases[0].lr_scaled_residuals is None
    defaults = {c: (p.sparse_density, p.residuals_follow_lr)
                for c in ("hitopk", "topk_ag", "gtopk", "dense", "auto")
                for p in override(base, comm=c).phases}
    assert defaults == {"hitopk": (0.01, False), "topk_ag": (0.01, False), "gtopk": (0.02, True),
                        "dense": (0.01, False), "auto": (0.01, False)}
    given = override(base, comm="gtopk", density=0.01, sets=["phases.0.lr_scaled_residuals=false"]).phases[0]
    assert (given.sparse_density, given.residuals_follow_lr) == (0.01, False)
    switched = override(override(base, comm="gtopk"), comm="hitopk").phases[0]  # unset stays unset
    assert (switched.sparse_density, switched.residuals_follow_lr) == (0.01, False)
    # the warm-up's floor follows the density: 1.5 / 0.02 = 75 steps on a 156-step phase
    assert phase_warmups(override(base, comm="gtopk", epochs=4), 0, steps_per_epoch=39)[0] == 75
    assert phase_warmups(override(base, comm="hitopk", epochs=4), 0, steps_per_epoch=39)[0] == 150


def test_an_algorithm_with_an_impossible_training_density_is_refused():
    from comm.algorithm import Algorithm
    from comm.collectives.gtopk import GTopKExchanger

    with pytest.raises(ValueError, match=r"algorithm gtopk: density must be in \(0, 1\]; got 0"):
        Algorithm.of(GTopKExchanger, density=0)


@pytest.mark.parametrize("text, match", [
    ("phases: [{epochs: 1}]\nmodell: {}", r"unknown section.*modell"),
    ("optim: {lrr: 1}\nphases: [{epochs: 1}]", r"optim: unknown key.*lrr.*valid"),
    ("phases: [{epochs: 0}]", r"phases\[0\].*epochs must be >= 1"),
    ("phases: [{epochs: 1, density: 1.5}]", r"density must be in \(0, 1\]"),
    ("phases: [{epochs: 1, comm: ring}]", r"comm 'ring' is unknown; valid"),
    ("phases: [{epochs: 1, size: big}]", r"size must be an integer"),
    ("phases: []", r"non-empty list"),
    ("schedule: {warmup_epochs: 5}\nphases: [{epochs: 2}]", r"warmup_epochs"),
    ("model: {name: vgg}\nphases: [{epochs: 1}]", r"model.name 'vgg' is unknown"),
    ("phases: [{epochs: 1\n", r"not valid YAML"),
    ("optim: {clip_norm: -1}\nphases: [{epochs: 1}]", r"optim: optim.clip_norm must be >= 0"),
    ("phases: [{epochs: 2, density_warmup_epochs: 3}]", r"phases\[0\].*density_warmup_epochs must be in \[0, 2\]"),
    ("phases: [{epochs: 2, density_warmup_steps: -1}]", r"phases\[0\].*density_warmup_steps must be >= 0"),
    ("phases: [{epochs: 2, density_warmup_epochs: 1, density_warmup_steps: 50}]",
     r"phases\[0\].*density_warmup_epochs and density_warmup_steps exclude each other"),
    ("schedule: {warmup_epochs: 1, warmup_steps: 50}\nphases: [{epochs: 2}]",
     r"schedule.warmup_epochs and warmup_steps exclude each other"),
    ("schedule: {warmup_steps: -5}\nphases: [{epochs: 2}]", r"schedule.warmup_steps must be >= 0"),
    ("phases: [{epochs: 2, density_schedule: [0.25, 2]}]", r"phases\[0\].*density_schedule must list densities in"),
    ("phases: [{epochs: 1, density_schedule: [0.25, 0.1]}]", r"density_schedule lists 2 epochs but the phase has 1"),
    ("phases: [{epochs: 2, density_schedule: [0.2], density_warmup_epochs: 1}]", r"exclude each other"),
    ("phases: [{epochs: 1, momentum_correction: 1}]", r"momentum_correction must be true or false"),
])
def test_bad_recipes_give_one_line_errors(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        load_recipe(path)
    assert "\n" not in str(info.value)


def test_unknown_recipe_name_and_bad_override():
    with pytest.raises(ValueError, match="shipped"):
        load_recipe("nope")
    with pytest.raises(ValueError, match="unknown field 'lrr'"):
        override(load_recipe("demo"), sets=["optim.lrr=1"])
    with pytest.raises(ValueError, match="selector"):
        override(load_recipe("demo"), selector="fast")


def test_recipe_round_trips_through_its_dict():
    r = load_recipe("resnet50-90ep")
    assert from_dict(r.to_dict(), r.name) == r
    assert isinstance(r, Recipe)


def test_schedules_warmup_then_decay():
    kw = dict(lr=1.0, total_epochs=10, warmup_epochs=2)
    assert lr_at(1.0, **kw) == pytest.approx(0.5)
    assert lr_at(2.0, decay="poly", **kw) == pytest.approx(1.0)
    assert lr_at(6.0, decay="poly", power=2.0, **kw) == pytest.approx(0.25)
    assert lr_at(6.0, decay="cosine", **kw) == pytest.approx(0.5)
    assert lr_at(10.0, decay="cosine", **kw) == pytest.approx(0.0)
    assert lr_at(7.0, decay="step", milestones=[5, 7], gamma=0.1, **kw) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="valid"):
        lr_at(1.0, decay="exp", **kw)


def test_density_warmup_schedules():
    from trainer.schedules import density_at

    # DGC's own numbers: W = 4 epochs (of 10 steps) down to 0.25 ** 5 (about 0.1 %), sampled at whole epochs
    assert [density_at(10 * e, density=0.25 ** 5, warmup_steps=40) for e in range(5)] == \
        pytest.approx([0.25, 0.0625, 0.015625, 0.00390625, 0.25 ** 5], rel=1e-12)
    # continuous per step in between, and the target after the warm-up
    assert density_at(5, density=0.01, warmup_steps=10) == pytest.approx((0.25 * 0.01) ** 0.5)
    assert density_at(79, density=0.01, warmup_steps=10) == 0.01
    assert density_at(30, density=0.01) == 0.01  # no warm-up
    assert density_at(0, density=0.5, warmup_steps=20) == 0.5  # never below... nor above the target
    assert [density_at(10 * e + 5, density=0.01, schedule=[0.25, 0.05], steps_per_epoch=10)
            for e in range(3)] == [0.25, 0.05, 0.01]


def test_warmups_are_steps_a_share_of_the_run_with_a_floor_or_what_the_user_gave():
    """NOTE [warm-ups in steps]: given steps, else given epochs x steps per epoch, else
    max(share x run, floor) at most the run; steps longer than the run name the field."""
    from trainer.schedules import DENSITY_WARMUP_CYCLES, DENSITY_WARMUP_SHARE as share, phase_warmups, warmup_steps

    floor = round(DENSITY_WARMUP_CYCLES / 0.01)  # 150 steps at density 0.01

    rule = dict(epochs=None, steps=None, share=share, min_steps=floor)
    assert warmup_steps("w", steps_per_epoch=390, run_steps=8 * 390, **rule) == max(round(share * 3120), floor)
    assert warmup_steps("w", steps_per_epoch=5000, run_steps=13 * 5000, **rule) == round(share * 65000)
    assert warmup_steps("w", steps_per_epoch=11, run_steps=floor // 2, **rule) == floor // 2  # short: the whole run
    assert warmup_steps("w", epochs=1.5, steps=None, steps_per_epoch=10, run_steps=80, share=share,
                        min_steps=floor) == 15
    assert warmup_steps("w", epochs=None, steps=0, steps_per_epoch=10, run_steps=80, share=share, min_steps=floor) == 0
    cifar = load_recipe("cifar10")  # density 0.01: an eighth of 8 x 390 steps; the floor, 150, on 8 x 39
    assert phase_warmups(cifar, 0, 390) == (390, 1.0) and phase_warmups(cifar, 0, 39) == (150, 1.0)
    assert phase_warmups(override(cifar, density=0.001), 0, 39)[0] == 312  # at most the phase
    with pytest.raises(ValueError, match=r"phases\[0\]\.density_warmup_steps 81 is longer than the run it warms up \(80 steps\)"):
        warmup_steps("phases[0].density_warmup", epochs=None, steps=81, steps_per_epoch=10, run_steps=80)


def test_a_warmup_set_in_steps_replaces_the_recipes_epochs_and_the_other_way_round():
    r = override(load_recipe("cifar10"), sets=["phases.0.density_warmup_steps=200", "schedule.warmup_steps=50"])
    assert (r.phases[0].density_warmup_steps, r.phases[0].density_warmup_epochs) == (200, None)
    assert (r.schedule.warmup_steps, r.schedule.warmup_epochs) == (50, None)
    r = override(r, sets=["phases.0.density_warmup_epochs=0.5"])
    assert (r.phases[0].density_warmup_steps, r.phases[0].density_warmup_epochs) == (None, 0.5)
    assert from_dict(r.to_dict(), r.name) == r


def test_dgc_fields_can_be_set_from_the_command_line():
    r = override(load_recipe("demo"), sets=["phases.0.momentum_correction=false", "phases.0.density_warmup_epochs=1.5",
                                            "optim.clip_norm=5", "phases.0.local_clipping=false",
                                            "phases.0.momentum_masking=true", "phases.0.dense_vectors=false"])
    p = r.phases[0]
    assert (p.momentum_correction, p.momentum_masking, p.local_clipping, p.density_warmup_epochs) == (False, True, False, 1.5)
    assert not p.dense_vectors and load_recipe("demo").phases[0].dense_vectors
    assert r.optim.clip_norm == 5.0
    r = override(load_recipe("demo"), sets=["phases.0.density_warmup_epochs=0", "phases.0.density_schedule=[0.25, 0.05]"])
    assert r.phases[0].density_schedule == (0.25, 0.05)


def _train_flags(*argv):
    import argparse

    from tools import train

    parser = argparse.ArgumentParser()
    train.configure(parser)
    return train._recipe(parser.parse_args(["--recipe", "demo", *argv]))


@pytest.mark.parametrize("argv, field, value", [
    (["--lr", "1e-5"], "optim.lr", 1e-5),
    (["--lr", "0.00001"], "optim.lr", 1e-5),  # Python writes it 1e-05, which YAML 1.1 reads as a string
    (["--exchange-fraction", "0.00001"], "train.exchange_fraction", 1e-5),
    (["--set", "optim.lr=1e-5"], "optim.lr", 1e-5),
    (["--set", "optim.weight_decay=5E-4"], "optim.weight_decay", 5e-4),
])
def test_numbers_in_exponent_form_are_numbers(argv, field, value):
    """NOTE [numbers in recipes]: every spelling of a small number reaches the recipe as that number."""
    section, name = field.split(".")
    assert getattr(getattr(_train_flags(*argv), section), name) == value


def test_a_recipe_file_takes_exponent_form_and_a_quoted_number_stays_a_string(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text("optim: {lr: 1e-5}\nphases: [{epochs: 2, density: 1e-3, density_schedule: [5e-2, 1e-2]}]\n")
    recipe = load_recipe(path)
    assert recipe.optim.lr == 1e-5 and recipe.phases[0].density == 1e-3
    assert recipe.phases[0].density_schedule == (0.05, 0.01)
    path.write_text("optim: {lr: '1e-5'}\nphases: [{epochs: 1}]\n")
    with pytest.raises(ValueError, match=r"optim.lr must be a number; got '1e-5'"):
        load_recipe(path)
