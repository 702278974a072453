"""The one check of a data root's layout: ``<root>/{train,val}/<class>/<image>``."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["IMAGE_SUFFIXES", "check_data_root", "class_folders", "count_images", "images_at_least"]

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png", ".bmp", ".webp")


def class_folders(root: str | Path, split: str) -> list[str]:
    """Sorted class folder names under ``root/split`` (none when it is missing)."""
    folder = Path(root) / split
    return sorted(d.name for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else []


def count_images(root: str | Path, split: str) -> int:
    """Image files under ``root/split/<class>/`` (one directory listing per class)."""
    folder = Path(root) / split
    return sum(1 for c in class_folders(root, split) for f in (folder / c).iterdir()
               if f.suffix.lower() in IMAGE_SUFFIXES)


def images_at_least(root: str | Path, split: str, need: int) -> int:
    """Image files under ``root/split/<class>/`` and below, counted until ``need`` are found
    (a batch-size check costs a listing or two, not a scan of ImageNet). Both the
    ImageFolder and the memory loader's suffixes count, so a result under ``need`` means
    no loader finds ``need``."""
    from cachepipe.source.manifest import IMG_EXTENSIONS

    ends = tuple(set(IMAGE_SUFFIXES) | set(IMG_EXTENSIONS))
    found = 0
    for c in class_folders(root, split):
        for _, _, files in os.walk(Path(root) / split / c, followlinks=True):
            found += sum(1 for f in files if f.lower().endswith(ends))
            if found >= need:
                return found
    return found


def check_data_root(root: str | Path) -> int:
    """Return the number of classes under ``root/train`` after checking the layout.

    Raises:
        ValueError: one line saying what is missing (``train/`` and ``val/`` folders of
            ``<class>/<image>`` files, with the same classes).
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"data root {str(root)!r} does not exist; pass --data DIR with train/ and val/ "
                         f"(or make one: cachepipe make-dataset DIR)")
    classes = {}
    for split in ("train", "val"):
        names = class_folders(root, split)
        if not names or not any(f.suffix.lower() in IMAGE_SUFFIXES for f in (root / split / names[0]).iterdir()):
            raise ValueError(f"data root {str(root)!r} lacks {split}/<class>/<image> files "
                             f"(expected the ImageFolder layout {root}/{{train,val}}/<class>/<file>.JPEG)")
        classes[split] = names
    if classes["train"] != classes["val"]:
        raise ValueError(f"data root {str(root)!r}: train/ has {len(classes['train'])} classes and val/ "
                         f"{len(classes['val'])}; they must have the same class folders")
    return len(classes["train"])
