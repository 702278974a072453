"""A decoded, in-memory ImageFolder loader with the cached loader's contract.

Used by tests, by ``--loader memory`` and by ``cachepipe bench train`` as the
no-cache reference. Images are decoded once (shorter side resized to ``cache_size``,
centre-cropped square) into one uint8 tensor. Augmentation (random-resized crop + flip
for training, resize for evaluation) is a pure function of ``(seed, epoch, batch)``, so
a resumed run sees the same batches as an uninterrupted one.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from trainer.data.layout import IMAGE_SUFFIXES, check_data_root, class_folders

__all__ = ["load_split", "MemoryLoader", "SyntheticLoader", "MEAN", "STD"]

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


def load_split(root: str | Path, split: str, cache_size: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Decode ``root/split/<class>/*`` into ``(uint8 N x 3 x S x S, int64 labels, class names)``.

    Raises:
        ValueError: the root is not laid out as ``check_data_root`` wants.
    """
    check_data_root(root)
    folder = Path(root) / split
    classes = class_folders(root, split)
    files = [(f, label) for label, c in enumerate(classes) for f in sorted((folder / c).iterdir())
             if f.suffix.lower() in IMAGE_SUFFIXES]
    images = torch.empty(len(files), 3, cache_size, cache_size, dtype=torch.uint8)
    for i, (f, _) in enumerate(files):
        with Image.open(f) as im:
            im = im.convert("RGB")
            scale = cache_size / min(im.size)
            w, h = max(cache_size, round(im.width * scale)), max(cache_size, round(im.height * scale))
            im = im.resize((w, h), Image.BILINEAR)
            left, top = (w - cache_size) // 2, (h - cache_size) // 2
            im = im.crop((left, top, left + cache_size, top + cache_size))
            images[i] = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1)
    return images, torch.tensor([label for _, label in files], dtype=torch.int64), classes


class MemoryLoader:
    """Batches of augmented, normalised images from decoded tensors, sharded by rank.

    Args:
        images: uint8 ``N x 3 x S x S``.
        labels: int64 ``N``.
        batch_size: images per batch on this rank.
        train: random-resized crop + flip, shuffled, whole batches only; else resize, in order.
        size: output side in pixels (``set_size`` changes it).
        rank, world_size: this rank's share (every rank gets the same number of batches).
        seed: shuffling and augmentation seed.

    Raises:
        ValueError: for batch_size < 1 or a rank outside the world.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, *, batch_size: int, train: bool, size: int,
                 rank: int = 0, world_size: int = 1, seed: int = 0):
        if batch_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need batch_size >= 1 and 0 <= rank < world_size; got {batch_size=}, {rank=}, {world_size=}")
        self.images, self.labels = images, labels
        self.batch_size, self.train, self.size = batch_size, train, size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.epoch, self.position = 0, 0  # position: batches already consumed this epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def set_size(self, size: int) -> None:
        self.size = size

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def _indices(self) -> torch.Tensor:
        n = len(self.labels)
        if not self.train:
            return torch.arange(self.rank, n, self.world_size)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 100003 + self.epoch))
        per_rank = n // self.world_size
        return order[self.rank * per_rank:(self.rank + 1) * per_rank]

    def __len__(self) -> int:
        n = len(self._indices())
        return n // self.batch_size if self.train else math.ceil(n / self.batch_size)

    def __iter__(self):
        idx = self._indices()
        for b in range(self.position, len(self)):
            chosen = idx[b * self.batch_size:(b + 1) * self.batch_size]
            self.position = b + 1
            yield self._batch(chosen, b), self.labels[chosen]
        self.position = 0

    def _batch(self, chosen: torch.Tensor, b: int) -> torch.Tensor:
        src = self.images[chosen].float()
        if not self.train:
            out = F.interpolate(src, size=(self.size, self.size), mode="bilinear", align_corners=False, antialias=True)
        else:
            g = torch.Generator().manual_seed(((self.seed * 1000 + self.epoch) * 100000 + b) * 64 + self.rank)
            out = torch.stack([self._crop(img, g) for img in src])
        return ((out - MEAN) / STD).contiguous()

    def _crop(self, img: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        s = img.shape[-1]
        r = torch.rand(4, generator=g).tolist()
        area = s * s * (0.25 + 0.75 * r[0])
        aspect = math.exp(math.log(3 / 4) + (math.log(4 / 3) - math.log(3 / 4)) * r[1])
        w = min(s, max(8, round(math.sqrt(area * aspect))))
        h = min(s, max(8, round(math.sqrt(area / aspect))))
        top, left = int(r[2] * (s - h + 1)), int(r[3] * (s - w + 1))
        crop = img[:, top:top + h, left:left + w].unsqueeze(0)
        out = F.interpolate(crop, size=(self.size, self.size), mode="bilinear", align_corners=False)[0]
        return out.flip(-1) if torch.rand(1, generator=g).item() < 0.5 else out


class SyntheticLoader:
    """Fixed random batches held in memory: the data-free throughput reference."""

    def __init__(self, *, batch_size: int, size: int, num_classes: int, steps: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(batch_size, 3, size, size, generator=g)
        self.labels = torch.randint(0, num_classes, (batch_size,), generator=g)
        self.steps, self.size = steps, size

    def set_epoch(self, epoch: int) -> None:
        pass

    def set_size(self, size: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        for _ in range(self.steps):
            yield self.images, self.labels
