"""Bucket plans: which parameters travel together, with which algorithm, in which order.

A planner takes the parameters (in the order the caller registers them, forward order for
a model) and the main algorithm and returns a list of :class:`Bucket` in launch order
(backward order: the bucket whose gradients are ready first comes first). Registered in
``PLANNERS``; adding a planner is one file plus one line here.

- ``size``: Jizhi's tensor fusion: buckets up to a byte threshold, small buckets take
  ``hier`` (the hybrid choice);
- ``layer``: one bucket per parameter (LAGS);
- ``omgs``: merged neighbouring layers from the OMGS planner (``merged`` list of
  :func:`comm.omgs.find_merged_layers`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["Bucket", "PLANNERS", "make_plan"]


@dataclass(frozen=True)
class Bucket:
    """One bucket: parameter indices in packing order, and its exchange algorithm."""

    params: tuple[int, ...]
    algorithm: str


from comm.plans import layer, omgs, size  # noqa: E402  (the planners use Bucket)

PLANNERS: dict[str, Callable[..., list[Bucket]]] = {"size": size.plan, "layer": layer.plan, "omgs": omgs.plan}


def make_plan(kind: str, params: Sequence[torch.Tensor], algorithm: str, **options) -> list[Bucket]:
    """The plan of planner ``kind`` for ``params`` (see the module docstring).

    Raises:
        ValueError: for an unknown planner (lists the valid ones) or bad options.
    """
    try:
        planner = PLANNERS[kind]
    except KeyError:
        raise ValueError(f"unknown bucket plan {kind!r}; valid: {sorted(PLANNERS)}") from None
    return planner(list(params), algorithm, **options)
