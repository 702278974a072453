"""ResNet (v1.5, as torchvision builds it): basic and bottleneck blocks, any stage layout.

ResNet-50 here has torchvision's exact layer layout, initialisation and parameter count
(25,557,032 for 1000 classes); ResNet-18 has 11,689,512. ``resnet_small`` is a narrow
three-stage network with a 3x3 stem for CPU demos at ~56-64 px.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet50", "resnet_small"]


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with an identity (or 1x1 projection) shortcut."""

    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = _conv3x3(cin, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride, "v1.5"), 1x1 expand by 4."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = _conv1x1(cin, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, width * self.expansion)
        self.bn3 = nn.BatchNorm2d(width * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """A ResNet: stem, stages of residual blocks, global average pool, linear classifier.

    Args:
        block: ``BasicBlock`` or ``Bottleneck``.
        layers: number of blocks per stage.
        widths: base width per stage (output channels are ``width * block.expansion``).
        num_classes: classifier outputs.
        zero_init_residual: start the last BN gamma of every block at 0, so each residual
            branch starts as the identity (Goyal et al.).
        small_stem: a 3x3 stride-2 convolution without max-pool instead of the
            7x7 stride-2 convolution + 3x3 max-pool (for small CPU images).

    Raises:
        ValueError: if ``layers`` and ``widths`` differ in length or are empty.
    """

    def __init__(self, block: type[nn.Module], layers: Sequence[int], widths: Sequence[int], *,
                 num_classes: int = 1000, zero_init_residual: bool = False, small_stem: bool = False):
        super().__init__()
        if not layers or len(layers) != len(widths):
            raise ValueError(f"layers and widths must be non-empty and of equal length; got {layers}, {widths}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1; got {num_classes}")
        stem = widths[0]
        if small_stem:
            self.conv1 = nn.Conv2d(3, stem, 3, stride=2, padding=1, bias=False)
            self.maxpool = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(3, stem, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(stem)
        self.relu = nn.ReLU(inplace=True)
        cin = stem
        stages = []
        for i, (n, width) in enumerate(zip(layers, widths)):
            stride = 1 if i == 0 else 2
            blocks = []
            for j in range(n):
                down = None
                if j == 0 and (stride != 1 or cin != width * block.expansion):
                    down = nn.Sequential(_conv1x1(cin, width * block.expansion, stride),
                                         nn.BatchNorm2d(width * block.expansion))
                blocks.append(block(cin, width, stride if j == 0 else 1, down))
                cin = width * block.expansion
            stages.append(nn.Sequential(*blocks))
        # Attribute names layer1..layerN match torchvision so state dicts line up.
        for i, stage in enumerate(stages, 1):
            self.add_module(f"layer{i}", stage)
        self.num_stages = len(stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        self._init_weights(zero_init_residual)

    def _init_weights(self, zero_init_residual: bool) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, (BasicBlock, Bottleneck)):
                    nn.init.zeros_(m.last_bn().weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(1, self.num_stages + 1):
            x = getattr(self, f"layer{i}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    """ResNet-50 v1.5 (torchvision layout; 25,557,032 parameters at 1000 classes)."""
    return ResNet(Bottleneck, [3, 4, 6, 3], [64, 128, 256, 512], num_classes=num_classes,
                  zero_init_residual=zero_init_residual)


def resnet18(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    """ResNet-18 (torchvision layout; 11,689,512 parameters at 1000 classes)."""
    return ResNet(BasicBlock, [2, 2, 2, 2], [64, 128, 256, 512], num_classes=num_classes,
                  zero_init_residual=zero_init_residual)


def resnet_small(num_classes: int = 1000, zero_init_residual: bool = False) -> ResNet:
    """A narrow three-stage ResNet (16/32/64 channels, one basic block each) for CPU demos."""
    return ResNet(BasicBlock, [1, 1, 1], [16, 32, 64], num_classes=num_classes,
                  zero_init_residual=zero_init_residual, small_stem=True)
