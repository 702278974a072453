"""Top-k selectors: ``fn(x, k, **opts) -> (values, indices)`` registered by name.

``SELECTORS`` is public API: trainer flags and the collectives look selectors up here.
Every selector takes a 1-D float tensor (any dtype, CPU or CUDA), returns exactly
``min(k, numel)`` distinct int64 indices and the signed values ``x[indices]``, and
ignores keyword options it does not know (all accept ``generator=None``).

- ``exact``: ``torch.topk`` on ``|x|``.
- ``dgc``: Deep Gradient Compression's sampled threshold (``comm/topk/dgc.py``).
- ``mstopk``: Algorithm 1 of the MLSys 2021 paper, with a torch, a literal and a
  Triton implementation (``comm/topk/mstopk.py``).
"""
from __future__ import annotations

from comm.topk.checks import k_for
from comm.topk.dgc import dgc_topk
from comm.topk.exact import exact_topk
from comm.topk.mstopk import mstopk, mstopk_select, mstopk_thresholds
from comm.topk.quality import captured_energy, recall

__all__ = ["SELECTORS", "get_selector", "exact_topk", "dgc_topk", "mstopk", "mstopk_select",
           "mstopk_thresholds", "recall", "captured_energy", "k_for"]

SELECTORS = {
    "exact": exact_topk,
    "dgc": dgc_topk,
    "mstopk": mstopk,
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
