"""Gradient exchange algorithms registered by name (``ALGORITHMS``) and their builder."""
from __future__ import annotations

from comm.collectives.base import Exchanger
from comm.collectives.dense import DenseExchanger
from comm.collectives.gtopk import GTopKExchanger
from comm.collectives.hier import HierExchanger
from comm.collectives.hitopk import HiTopKExchanger
from comm.collectives.topk_ag import TopKAllGatherExchanger
from comm.collectives.torus2d import Torus2DExchanger

__all__ = ["ALGORITHMS", "Exchanger", "build_exchanger", "get_algorithm"]

ALGORITHMS: dict[str, type[Exchanger]] = {
    cls.name: cls
    for cls in (DenseExchanger, HierExchanger, Torus2DExchanger, TopKAllGatherExchanger, GTopKExchanger,
                HiTopKExchanger)
}


def get_algorithm(name: str) -> type[Exchanger]:
    """The exchanger class registered as ``name``.

    Raises:
        ValueError: for an unknown name; the message lists the valid ones.
    """
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown gradient exchange algorithm {name!r}; valid: {sorted(ALGORITHMS)}") from None


def build_exchanger(name: str, topology, *, density: float | None = None, selector: str = "mstopk",
                    error_feedback: bool = True, value_dtype=None, momentum: float = 0.0,
                    masking: bool = True) -> Exchanger:
    """Build the exchanger ``name`` over ``topology``.

    Args:
        name: one of ``ALGORITHMS``: dense, hier, 2dtar, topk_ag, gtopk, hitopk.
        topology: a :class:`comm.Topology`.
        density: ``rho`` for the sparse algorithms (required there, ignored by dense ones).
        selector: top-k selector (``comm.topk.SELECTORS``) for the sparse algorithms.
        error_feedback: keep residuals of what was not applied.
        value_dtype: wire dtype of values (``"fp16"``, ``"bf16"``, a torch dtype or None).
        momentum, masking: DGC momentum correction factor (0: off) and momentum-factor
            masking (NOTE [momentum correction] in comm/residual.py).

    Returns:
        An object with ``exchange(flat) -> averaged flat``, ``state_dict()`` and
        ``load_state_dict()``.

    Raises:
        ValueError: unknown algorithm or selector, bad density or dtype.

    Example:
        >>> ex = build_exchanger("hitopk", topo, density=0.01, selector="exact")  # doctest: +SKIP
        >>> grad_avg = ex.exchange(flat_grad)                                     # doctest: +SKIP
    """
    cls = get_algorithm(name)
    return cls(topology, density=density, selector=selector, error_feedback=error_feedback, value_dtype=value_dtype,
               momentum=momentum, masking=masking)
