"""The one place that decides whether optional dependencies (NVIDIA DALI) are available."""
from __future__ import annotations

import importlib.util

__all__ = ["DALI_INSTALL_HINT", "dali_available", "require_dali"]

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
