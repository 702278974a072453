import pytest
import torch

from trainer import models


def _count(m):
    return sum(p.numel() for p in m.parameters())


def test_resnet50_and_resnet18_match_torchvision_parameter_counts():
    assert _count(models.create("resnet50")) == 25_557_032
    assert _count(models.create("resnet18")) == 11_689_512
    assert _count(models.create("resnet50", num_classes=10)) == 25_557_032 - 2048 * 990 - 990


def test_zero_init_residual_zeroes_last_bn_gamma_of_every_block():
    net = models.create("resnet18", num_classes=10, zero_init_residual=True)
    blocks = [b for stage in (net.layer1, net.layer2, net.layer3, net.layer4) for b in stage]
    assert all(torch.count_nonzero(b.bn2.weight) == 0 for b in blocks)
    assert torch.count_nonzero(net.layer1[0].bn1.weight) > 0
    assert all(torch.count_nonzero(b.bn2.weight) > 0 for b in models.create("resnet18").layer1)


def test_small_resnet_forward_shape_at_demo_size():
    net = models.create("resnet_small", num_classes=7)
    assert net(torch.randn(2, 3, 56, 56)).shape == (2, 7)


def test_unknown_model_lists_valid_names():
    with pytest.raises(ValueError, match="resnet50"):
        models.create("vgg")
