"""A recipe's phases on paper (trainer/phase_plan.py) count as the training run does."""
from __future__ import annotations

import pytest

from trainer.auto_exchange import PROVISIONAL_STEPS
from trainer.phase_plan import phase_plans
from trainer.recipes import load_recipe, override
from trainer.schedules import density_at, mean_density, phase_warmups, steps_per_epoch


def test_dawnbench28_on_the_seeds_cluster():
    recipe = load_recipe("dawnbench28")
    plans = phase_plans(recipe, train_samples=1_281_167, world_size=128)
    assert [(p.size, p.batch_size, p.cache_size, p.steps_per_epoch, p.steps) for p in plans] == [
        (96, 256, 128, 39, 507), (128, 256, 128, 39, 429), (224, 256, 320, 39, 117), (288, 128, 320, 78, 78)]
    for p in plans:
        assert p.comm == "auto" and p.provisional_steps == PROVISIONAL_STEPS
        assert p.density_warmup_steps == phase_warmups(recipe, p.index, p.steps_per_epoch)[0]
        dens = [density_at(s, density=0.01, warmup_steps=p.density_warmup_steps) for s in range(6, p.steps)]
        assert p.mean_density == pytest.approx(sum(dens) / len(dens))
    assert plans[0].density_warmup_steps == 150 and 0.02 < plans[0].mean_density < 0.03


def test_a_fixed_exchange_is_priced_over_its_whole_phase_at_its_own_density():
    recipe = override(load_recipe("cifar10"), comm="gtopk")
    (p,) = phase_plans(recipe, train_samples=50_000, world_size=4)
    assert p.steps_per_epoch == steps_per_epoch(50_000, 4, 32) == 390 and p.provisional_steps == 0
    assert p.density == 0.02
    assert p.mean_density == pytest.approx(mean_density(recipe.phases[0], start=0, warmup_steps=p.density_warmup_steps,
                                                        steps_per_epoch=390))


def test_no_samples_or_gpus_is_refused():
    with pytest.raises(ValueError):
        phase_plans(load_recipe("demo"), train_samples=0, world_size=4)
