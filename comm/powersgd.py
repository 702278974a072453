"""torch's own PowerSGD DDP comm hook as the ``powersgd`` exchange: the compression a
PyTorch user would pick instead of top-k, kept as a baseline.

It runs only under ``DistributedDataParallel`` (the hook is DDP's, ``ALGORITHM.ddp_hook``):
the trainer wraps the model in DDP for ``comm: powersgd`` whether or not ``--ddp`` is given.

NOTE [powersgd start]: ``PowerSGDState`` runs plain all-reduce for its first
``start_powerSGD_iter`` iterations (default 1000 in torch, most of a short run). Error
feedback and warm start need at least 2 (DDP rebuilds its buckets after the first
iteration), so the baseline starts compressing at iteration 2: every later step is
rank-``r`` PowerSGD, as the top-k algorithms compress from the first step.

NOTE [powersgd at a phase switch]: PowerSGD's error feedback is keyed by DDP bucket, not
by parameter, so it cannot be handed to another exchange, and a residual handed to it
cannot be placed in its buckets. A phase switch into or out of ``powersgd`` therefore
drops that residual, with one warning naming how much is dropped; it is a baseline, and
a recipe that mixes it with top-k phases is not one we tune for.

Example:
    >>> ddp = DistributedDataParallel(model)                                # doctest: +SKIP
    >>> state = register_powersgd_hook(ddp, rank=2)                         # doctest: +SKIP
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from comm.algorithm import Algorithm

__all__ = ["ALGORITHM", "POWERSGD_START_ITER", "PowerSGDHookState", "PowerSGDOptions", "register_powersgd_hook"]

POWERSGD_START_ITER = 2  # NOTE [powersgd start]


@dataclass(frozen=True)
class PowerSGDOptions:
    """``rank``: the matrix approximation rank of torch's PowerSGD hook (>= 1)."""

    rank: int = 2

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"PowerSGD rank must be an integer >= 1; got {self.rank!r}")


class PowerSGDHookState:
    """torch's ``PowerSGDState`` with a pickle-free ``state_dict()`` for the trainer's checkpoints.

    Args:
        state: the ``PowerSGDState`` registered with the DDP model.
    """

    __slots__ = ("state",)

    def __init__(self, state: powerSGD_hook.PowerSGDState) -> None:
        self.state = state

    def state_dict(self) -> dict:
        """Iteration, error-feedback residuals, warm-start P/Q per bucket and the Q seed RNG."""
        s = self.state
        name, keys, pos, has_gauss, cached = s.rng.get_state()
        return {"iter": s.iter, "error": dict(s.error_dict), "p": dict(s.p_memory_dict),
                "q": dict(s.q_memory_dict), "rng": [name, keys, int(pos), int(has_gauss), float(cached)]}

    def take_residuals(self) -> dict:
        """Nothing that fits another exchange (NOTE [powersgd at a phase switch])."""
        if self.state.error_dict:
            _warn_dropped(sum(float(e.norm()) ** 2 for e in self.state.error_dict.values()) ** 0.5, "out of")
        return {}

    def carry_in(self, residuals: dict) -> None:
        """Warn that ``residuals`` are dropped (NOTE [powersgd at a phase switch])."""
        if residuals:
            _warn_dropped(sum(float(r.norm()) ** 2 for r in residuals.values()) ** 0.5, "into")

    def load_state_dict(self, saved: dict) -> None:
        s = self.state
        s.iter = int(saved["iter"])
        for attr, key in (("error_dict", "error"), ("p_memory_dict", "p"), ("q_memory_dict", "q")):
            setattr(s, attr, {int(i): t for i, t in saved[key].items()})
        s.rng.set_state(tuple(saved["rng"]))


def _warn_dropped(norm: float, direction: str) -> None:
    warnings.warn(f"phase switch {direction} powersgd: an error-feedback residual of norm {norm:.3g} is dropped "
                  "(NOTE [powersgd at a phase switch] in comm/powersgd.py)", stacklevel=3)


def register_powersgd_hook(ddp_model, *, rank: int = 2, start_iter: int = POWERSGD_START_ITER,
                           min_compression_rate: float = 2.0, seed: int = 0) -> PowerSGDHookState:
    """Make ``ddp_model`` exchange its buckets with torch's ``powerSGD_hook``.

    Args:
        ddp_model: a ``torch.nn.parallel.DistributedDataParallel`` module.
        rank: matrix approximation rank (default 2).
        start_iter: iterations of plain all-reduce first (>= 2; NOTE [powersgd start]).
        min_compression_rate: tensors that rank-``rank`` factors would not shrink by at
            least this factor (biases, small layers) are all-reduced uncompressed.
        seed: seed of the random initial Q factors (same on every replica).

    Returns:
        The hook state (``state_dict()`` / ``load_state_dict()`` for checkpoints).

    Raises:
        ValueError: for ``rank < 1`` or ``start_iter < 2``.
    """
    if rank < 1:
        raise ValueError(f"PowerSGD rank must be >= 1; got {rank}")
    if start_iter < 2:
        raise ValueError(f"PowerSGD start_iter must be >= 2 (error feedback needs DDP's rebuilt buckets); got {start_iter}")
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                        start_powerSGD_iter=start_iter, min_compression_rate=min_compression_rate,
                                        use_error_feedback=True, warm_start=True, random_seed=seed)
    ddp_model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return PowerSGDHookState(state)


def _ddp_hook(ddp_model, options: PowerSGDOptions) -> PowerSGDHookState:
    return register_powersgd_hook(ddp_model, rank=options.rank)


ALGORITHM = Algorithm("powersgd", sparse=False, options=PowerSGDOptions, ddp_hook=_ddp_hook)
