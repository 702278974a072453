"""The algorithms that ship with :mod:`comm`, registered in this order (the order of
``comm.registry.names()``, of the CLI's choices and of the benches' rows).

Imported by ``comm/__init__.py``, so the registry is full before any ``comm`` module can
ask it. A new algorithm is one new module with an ``ALGORITHM`` plus one line here (or one
:func:`comm.registry.register` call of the user's own).
"""
from __future__ import annotations

from comm import powersgd
from comm.collectives import dense, gtopk, hier, hitopk, topk_ag, torus2d
from comm.omgs import exchange as omgs
from comm.registry import register

__all__: list[str] = []

for _module in (dense, hier, torus2d, topk_ag, gtopk, hitopk, omgs, powersgd):
    register(_module.ALGORITHM)
