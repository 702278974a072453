"""The registry of gradient exchange algorithms: the one place their names are listed
(NOTE [one registry of names] in comm/algorithm.py). It imports no algorithm: each
module declares its ``ALGORITHM`` and :mod:`comm.builtin` registers the shipped ones when
the ``comm`` package is imported, so the registry sits below every algorithm (no import
circle) and is full before anyone can ask it.

Example:
    >>> from comm.registry import get_algorithm, names
    >>> get_algorithm(names(sparse=True)[0]).sparse
    True
"""
from __future__ import annotations

from comm.algorithm import Algorithm

__all__ = ["ALGORITHMS", "DENSE", "exchanger_class", "get_algorithm", "names", "register"]

ALGORITHMS: dict[str, Algorithm] = {}
DENSE = "dense"  # the plain all-reduce (comm/collectives/dense.py): the default, and what one process runs


def register(algorithm: Algorithm) -> Algorithm:
    """Add ``algorithm`` under its name (the order of registration is the order of ``names()``).

    Raises:
        ValueError: if the name is taken by another algorithm.
    """
    if ALGORITHMS.get(algorithm.name, algorithm) != algorithm:
        raise ValueError(f"algorithm name {algorithm.name!r} is registered already")
    ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name``.

    Raises:
        ValueError: for an unknown name; the message lists the registered ones.
    """
    try:
        return ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown gradient exchange algorithm {name!r}; valid: {names()}") from None


def exchanger_class(name: str) -> type:
    """The per-bucket :class:`comm.Exchanger` class of algorithm ``name``.

    Raises:
        ValueError: for an unknown name or one without a per-bucket exchanger (lists those with one).
    """
    cls = get_algorithm(name).exchanger
    if cls is None:
        raise ValueError(f"algorithm {name!r} has no per-bucket exchanger; valid: {names(per_bucket=True)}")
    return cls


def names(*, sparse: bool | None = None, per_bucket: bool = False) -> list[str]:
    """The registered names in registration order: only the sparse or the dense ones when
    ``sparse`` is given, only those with a per-bucket :class:`comm.Exchanger` (what the
    engine's buckets and the sparse DDP hook run) with ``per_bucket``."""
    return [n for n, a in ALGORITHMS.items()
            if (sparse is None or a.sparse == sparse) and (a.exchanger is not None or not per_bucket)]
