"""Loaders fed from the cachepipe cache: a drop-in cached ImageFolder/DataLoader and DALI pipelines.

``import loaders`` needs neither DALI nor a GPU; ``build_dali_loader`` imports DALI when
called and otherwise raises ``ImportError`` naming ``pip install 'cachepipe[dali]'``.
"""
from loaders._optional import dali_available
from loaders.dali import DALILoader, build_dali_loader
from loaders.dataloader import CachedDataLoader, cached_dataloader
from loaders.folder import CachedImageFolder
from loaders.transforms import TrainTransform, ValTransform, normalize

__all__ = ["CachedImageFolder", "cached_dataloader", "build_dali_loader", "CachedDataLoader", "DALILoader",
           "TrainTransform", "ValTransform", "normalize", "dali_available"]
