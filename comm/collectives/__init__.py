"""The per-bucket gradient exchange algorithms (each module declares its ``ALGORITHM`` for
:mod:`comm.registry`) and the builder of one exchanger by name."""
from __future__ import annotations

from comm.collectives.base import Exchanger
from comm.registry import exchanger_class, get_algorithm

__all__ = ["Exchanger", "build_exchanger"]


def build_exchanger(name: str, topology, *, density: float | None = None, selector: str = "mstopk",
                    error_feedback: bool = True, value_dtype=None, momentum: float = 0.0,
                    masking: bool = True, options=None) -> Exchanger:
    """Build the exchanger ``name`` over ``topology``.

    Args:
        name: a registered algorithm with a per-bucket exchanger
            (``comm.registry.names(per_bucket=True)``).
        topology: a :class:`comm.Topology`.
        density: ``rho`` for the sparse algorithms (required there, ignored by dense ones).
        selector: top-k selector (``comm.topk.SELECTORS``) for the sparse algorithms.
        error_feedback: keep residuals of what was not applied.
        value_dtype: wire dtype of values (``"fp16"``, ``"bf16"``, a torch dtype or None).
        momentum, masking: DGC momentum correction factor (0: off) and momentum-factor
            masking (NOTE [momentum correction] in comm/residual.py).
        options: the algorithm's options object (default: its defaults).

    Returns:
        An object with ``exchange(flat) -> averaged flat``, ``state_dict()`` and
        ``load_state_dict()``.

    Raises:
        ValueError: unknown algorithm or one without a per-bucket exchanger (the message
            lists those with one), unknown selector, bad density or dtype.

    Example:
        >>> ex = build_exchanger("hitopk", topo, density=0.01, selector="exact")  # doctest: +SKIP
        >>> grad_avg = ex.exchange(flat_grad)                                     # doctest: +SKIP
    """

    cls, kind = exchanger_class(name), get_algorithm(name).options
    options = kind() if options is None else options
    if not isinstance(options, kind):
        raise ValueError(f"options of {name} must be {kind.__name__}; got {type(options).__name__}")
    return cls(topology, density=density, selector=selector, error_feedback=error_feedback, value_dtype=value_dtype,
               momentum=momentum, masking=masking, options=options)
