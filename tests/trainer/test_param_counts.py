"""The parameter count table of ``cachepipe plan`` against the model code it stands for."""
from __future__ import annotations

import pytest

from trainer import models
from trainer.models.param_counts import PARAM_COUNTS, param_count


@pytest.mark.parametrize("name", sorted(models.MODELS))
@pytest.mark.parametrize("classes", [10, 1000])
def test_table_matches_the_built_model(name, classes):
    net = models.create(name, num_classes=classes)
    assert param_count(name, classes) == sum(p.numel() for p in net.parameters() if p.requires_grad)


def test_every_registered_model_has_a_count():
    assert set(PARAM_COUNTS) == set(models.MODELS)


@pytest.mark.parametrize("name, classes", [("vgg19", 1000), ("resnet50", 0)])
def test_unknown_model_or_no_class_is_refused(name, classes):
    with pytest.raises(ValueError):
        param_count(name, classes)
