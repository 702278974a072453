"""Top-k selectors: ``fn(x, k, **opts) -> (values, indices)`` registered by name.

``SELECTORS`` is public API: trainer flags and the collectives look selectors up here.
"""
from __future__ import annotations

from comm.topk.exact import exact_topk

__all__ = ["SELECTORS", "get_selector"]

SELECTORS = {
    "exact": exact_topk,
}


def get_selector(name: str):
    """Return the selector registered as ``name``.

    Raises:
        ValueError: for an unknown name; the message lists the valid ones.
    """
    try:
        return SELECTORS[name]
    except KeyError:
        raise ValueError(f"unknown top-k selector {name!r}; valid: {sorted(SELECTORS)}") from None
