"""ImageFolder trees of N files for the scale benchmark, built from hard links.

NOTE [scale trees]
A tree of N files is 1,000 class folders (fewer when N is small) of hard links to one
small JPEG per class folder, so that a 1,281,167-file tree (ImageNet's train split) costs
one inode per class and seconds to build. ext4 allows 65,000 links per inode, so a class
of more files gets a second JPEG. Each tree has its own JPEGs: a link adds to its inode's
link count and so changes its ctime, which is part of every file's identity (NOTE [file
identity]); trees sharing inodes would change each other's fingerprints. Names follow
ImageNet's (``n00000042/n00000042_17.JPEG``). A finished tree has a ``.complete`` marker
holding its file count, so an existing tree is reused and a torn one rebuilt.
"""
from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import numpy as np

__all__ = ["build_tree", "parse_count"]

_LINKS_PER_INODE = 60_000  # under ext4's 65,000
_MARKER = ".complete"


def parse_count(text: str) -> int:
    """``"10k"`` -> 10,000, ``"1.28M"`` -> 1,281,167 (ImageNet's train split), ``"500"`` -> 500.

    Raises:
        ValueError: not a positive count.
    """
    t = text.strip()
    if t.upper() == "1.28M":
        return 1_281_167
    scale = {"K": 1_000, "M": 1_000_000}.get(t[-1:].upper(), 1)
    try:
        n = int(round(float(t[:-1] if scale > 1 else t) * scale))
    except ValueError:
        raise ValueError(f"file count {text!r}: expected a number such as 500, 10k, 1.28M") from None
    if n < 1:
        raise ValueError(f"file count {text!r} must be positive")
    return n


def _jpeg(side: int, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def build_tree(root: str | os.PathLike, files: int, *, classes: int = 1000, side: int = 32) -> Path:
    """An ImageFolder tree of ``files`` hard links at ``root`` (NOTE [scale trees]).

    Args:
        root: the tree's folder (reused when complete with ``files`` files, else rebuilt).
        files: samples in all.
        classes: class folders (at most ``files``).
        side: side of each class's JPEG in pixels (noise: 32 px is about 1.5 KB).

    Returns:
        ``root`` as a ``Path``.

    Raises:
        ValueError: ``files`` or ``classes`` below 1, ``side`` below 8.
    """
    if files < 1 or classes < 1 or side < 8:
        raise ValueError(f"need files >= 1, classes >= 1, side >= 8; got {files=} {classes=} {side=}")
    root = Path(root)
    marker = root / _MARKER
    if marker.is_file() and marker.read_text().strip() == f"{files} {side}":
        return root
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    classes = min(classes, files)
    per_class = np.full(classes, files // classes)
    per_class[:files % classes] += 1
    for c, count in enumerate(per_class.tolist()):
        name = f"n{c:08d}"
        folder = root / name
        folder.mkdir()
        first = None
        for k in range(count):
            path = folder / f"{name}_{k}.JPEG"
            if k % _LINKS_PER_INODE == 0:
                path.write_bytes(_jpeg(side, seed=c * 1_000 + k // _LINKS_PER_INODE))
                first = path
            else:
                os.link(first, path)
    marker.write_text(f"{files} {side}")
    return root
