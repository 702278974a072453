"""The one place that decides whether optional dependencies (NVIDIA DALI, torchvision) are available."""
from __future__ import annotations

import functools
import importlib.util
import warnings
from types import ModuleType

__all__ = ["DALI_INSTALL_HINT", "dali_available", "require_dali", "torchvision_datasets"]

DALI_INSTALL_HINT = "pip install 'cachepipe[dali]'"


def dali_available() -> bool:
    """True when ``nvidia.dali`` can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):
        return False


def require_dali() -> None:
    """Raise ``ImportError`` naming the extra to install when DALI is missing."""
    if not dali_available():
        raise ImportError(f"the DALI loader needs NVIDIA DALI: {DALI_INSTALL_HINT} "
                          "(or nvidia-dali-cuda1xx matching your CUDA)")


@functools.lru_cache(maxsize=1)
def torchvision_datasets() -> ModuleType | None:
    """``torchvision.datasets`` where torchvision imports here, else None.

    An installed torchvision that fails to import (one built for another torch raises
    "operator torchvision::nms does not exist") counts as missing, with one warning naming
    the error: :class:`loaders.CachedImageFolder` is then a plain torch ``Dataset``.
    """
    try:
        if importlib.util.find_spec("torchvision") is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        import torchvision.datasets as datasets
    except Exception as exc:  # a broken install must not break `import loaders`
        warnings.warn(f"torchvision is installed but does not import ({type(exc).__name__}: {exc}); "
                      "CachedImageFolder is not a torchvision VisionDataset here", RuntimeWarning, stacklevel=2)
        return None
    return datasets
