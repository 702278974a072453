"""``torchvision.datasets`` with ``ImageFolder`` and ``DatasetFolder`` served by cachepipe, for the peer suite.

``tests/peer/torchvision_folder.py`` puts ``datasets = tests.peer.cachepipe_datasets.datasets``
after the imports of torchvision's own ``ImageFolderTestCase``/``DatasetFolderTestCase``: every
other name is torchvision's, these two are :class:`loaders.CachedImageFolder` with
``output="pil"`` (what torchvision's give) and torchvision's signatures, each with a cache dir
of its own under ``$PEER_CACHE_ROOT``. ``$PEER_L2``: ``none`` (default: L1 only) or
``embedded`` (a private redis-server per cache dir, stopped at exit). Needs an importable
torchvision (then ``CachedImageFolder`` is a ``VisionDataset``: NOTE [torchvision base class]
in loaders/folder.py). Nothing here is torchvision's code.
"""
from __future__ import annotations

import atexit
import os
import tempfile
import types

import torchvision.datasets as _tv

from loaders.folder import CachedImageFolder

__all__ = ["DatasetFolder", "ImageFolder", "datasets"]

_ROOT = os.environ.get("PEER_CACHE_ROOT") or tempfile.mkdtemp(prefix="cachepipe-peer-")
_L2 = os.environ.get("PEER_L2", "none")
if _L2 not in ("none", "embedded"):
    raise ValueError(f"PEER_L2 must be none or embedded; got {_L2!r}")
_DIRS: list[str] = []


def _cache() -> dict:
    os.makedirs(_ROOT, exist_ok=True)
    _DIRS.append(tempfile.mkdtemp(dir=_ROOT))
    return {"cache_dir": _DIRS[-1], "l2": False if _L2 == "none" else None, "output": "pil"}


@atexit.register
def _stop_servers() -> None:
    if _L2 == "embedded":
        from cachepipe.server.embedded import EmbeddedRedis

        for d in _DIRS:
            EmbeddedRedis(d).stop()


class ImageFolder(CachedImageFolder):
    """``torchvision.datasets.ImageFolder(root, transform, target_transform, loader, is_valid_file,
    allow_empty)`` as ``CachedImageFolder(..., output="pil")``; ``loader=None``: the cache."""

    def __init__(self, root, transform=None, target_transform=None, loader=None, is_valid_file=None,
                 allow_empty=False):
        super().__init__(root, transform, target_transform, loader, is_valid_file, allow_empty, **_cache())


class DatasetFolder(CachedImageFolder):
    """``torchvision.datasets.DatasetFolder(root, loader, extensions, transform, target_transform,
    is_valid_file, allow_empty)`` as ``CachedImageFolder``: a loader given reads every file with it
    (NOTE [torchvision arguments] in loaders/folder.py)."""

    def __init__(self, root, loader, extensions=None, transform=None, target_transform=None, is_valid_file=None,
                 allow_empty=False):
        super().__init__(root, transform, target_transform, loader, is_valid_file, allow_empty, extensions=extensions,
                         **_cache())


datasets = types.ModuleType("cachepipe_peer_datasets", "torchvision.datasets, ImageFolder/DatasetFolder cachepipe's")
datasets.__dict__.update({k: v for k, v in vars(_tv).items() if not k.startswith("__")})
datasets.ImageFolder, datasets.DatasetFolder = ImageFolder, DatasetFolder
