"""torchvision's ImageFolder scan, transcribed, as the independent reference for our ordering."""
from __future__ import annotations

import os

__all__ = ["IMG_EXTENSIONS", "torchvision_image_folder"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def torchvision_image_folder(root):
    """torchvision's ``find_classes`` + ``make_dataset`` (datasets/folder.py): ``(classes, class_to_idx, samples)``."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    class_to_idx = {c: i for i, c in enumerate(classes)}
    instances = []
    for target_class in sorted(class_to_idx):
        target_dir = os.path.join(root, target_class)
        for dirpath, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(dirpath, fname)
                if path.lower().endswith(IMG_EXTENSIONS):
                    instances.append((path, class_to_idx[target_class]))
    return classes, class_to_idx, instances
