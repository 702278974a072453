"""torchvision's ImageFolder scan, transcribed, as the independent reference for our ordering and rules."""
from __future__ import annotations

import os

__all__ = ["IMG_EXTENSIONS", "torchvision_image_folder"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def torchvision_image_folder(root, extensions=None, is_valid_file=None, allow_empty=False):
    """torchvision's ``find_classes`` + ``make_dataset`` (datasets/folder.py): ``(classes, class_to_idx, samples)``.

    ``extensions`` defaults to ``IMG_EXTENSIONS`` when ``is_valid_file`` is None, as
    ``ImageFolder`` passes it to ``DatasetFolder``.
    """
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {root}.")
    class_to_idx = {c: i for i, c in enumerate(classes)}
    if extensions is None and is_valid_file is None:
        extensions = IMG_EXTENSIONS
    if extensions is not None and is_valid_file is not None:
        raise ValueError("Both extensions and is_valid_file cannot be None or not None at the same time")
    if extensions is not None:
        def is_valid_file(x):
            return x.lower().endswith(extensions if isinstance(extensions, str) else tuple(extensions))
    instances = []
    available_classes = set()
    for target_class in sorted(class_to_idx):
        target_dir = os.path.join(root, target_class)
        for dirpath, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(dirpath, fname)
                if is_valid_file(path):
                    instances.append((path, class_to_idx[target_class]))
                    available_classes.add(target_class)
    empty_classes = set(class_to_idx) - available_classes
    if empty_classes and not allow_empty:
        msg = f"Found no valid file for the classes {', '.join(sorted(empty_classes))}. "
        if extensions is not None:
            msg += f"Supported extensions are: {extensions if isinstance(extensions, str) else ', '.join(extensions)}"
        raise FileNotFoundError(msg)
    return classes, class_to_idx, instances
