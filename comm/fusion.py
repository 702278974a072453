"""Tensor fusion (Jizhi): pack gradients into buckets up to a byte threshold, exchange
each bucket with one collective, and pick the algorithm per bucket by its size (hybrid).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from comm.collectives import build_exchanger, get_algorithm
from comm.collectives.base import nonfinite_anywhere

__all__ = ["GradientExchanger", "plan_buckets"]


def plan_buckets(params: list[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Group parameter indices into buckets of at most ``bucket_bytes`` (one dtype each).

    Parameters are taken last to first, the order backward produces their gradients; a
    parameter larger than the threshold gets a bucket of its own.
    """
    buckets: list[list[int]] = []
    size, dtype = 0, None
    for i in reversed(range(len(params))):
        nbytes = params[i].numel() * params[i].element_size()
        if not buckets or params[i].dtype != dtype or size + nbytes > bucket_bytes:
            buckets.append([])
            size, dtype = 0, params[i].dtype
        buckets[-1].append(i)
        size += nbytes
    return buckets


class GradientExchanger:
    """Average every ``p.grad`` over all workers with fused buckets, for loops without DDP.

    Args:
        params: the model parameters (those with ``requires_grad``).
        algorithm: name in ``comm.ALGORITHMS`` for the large buckets.
        topology: a :class:`comm.Topology`.
        density, selector, error_feedback, value_dtype: as in :func:`comm.build_exchanger`.
        bucket_bytes: fusion threshold theta in bytes (default 25 MiB).
        hybrid_threshold_bytes: buckets smaller than this take ``hier`` (Jizhi's hybrid
            all-reduce, eta); 0 disables (default 1 MiB).
        skip_nonfinite: see NOTE [overflow steps] (default True).

    NOTE [overflow steps]: with mixed precision GradScaler skips a step whose gradients
    hold inf/NaN; a sparse exchange of such gradients would fold the overflow into the
    residuals and poison every later step. ``synchronize()`` therefore first agrees with
    one 1-element all-reduce whether any worker's gradients are non-finite; if so it skips
    the exchange, leaves the residuals untouched, fills every grad with NaN (so GradScaler
    skips the step on every worker alike) and returns False.

    Raises:
        ValueError: unknown algorithm, non-positive thresholds, bad density.

    Example:
        >>> ex = GradientExchanger(model.parameters(), "hitopk", topo, density=0.01)  # doctest: +SKIP
        >>> loss.backward(); ex.synchronize(); optimizer.step()                    # doctest: +SKIP
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], algorithm: str, topology, *,
                 density: float | None = None, selector: str = "mstopk", error_feedback: bool = True,
                 bucket_bytes: int = 25 * 2**20, hybrid_threshold_bytes: int = 2**20, value_dtype=None,
                 skip_nonfinite: bool = True):
        get_algorithm(algorithm)
        if bucket_bytes <= 0 or hybrid_threshold_bytes < 0:
            raise ValueError(f"bucket_bytes must be > 0 and hybrid_threshold_bytes >= 0, "
                             f"got {bucket_bytes} and {hybrid_threshold_bytes}")
        self.params = [p for p in params if p.requires_grad]
        self.topology = topology
        self.algorithm = algorithm
        self.skip_nonfinite = skip_nonfinite
        self.skipped_steps = 0
        self.buckets = plan_buckets(self.params, bucket_bytes)
        self.exchangers = []
        for bucket in self.buckets:
            nbytes = sum(self.params[i].numel() * self.params[i].element_size() for i in bucket)
            name = "hier" if nbytes < hybrid_threshold_bytes else algorithm
            self.exchangers.append(build_exchanger(name, topology, density=density, selector=selector,
                                                   error_feedback=error_feedback, value_dtype=value_dtype))

    @property
    def bucket_algorithms(self) -> list[str]:
        """The algorithm each bucket uses (after the hybrid choice)."""
        return [ex.name for ex in self.exchangers]

    def synchronize(self) -> bool:
        """Replace every ``p.grad`` by its average over all workers (collective).

        Returns:
            True if gradients were exchanged, False if the step was skipped because some
            worker's gradients were non-finite (NOTE [overflow steps]).
        """
        grads = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        if self.skip_nonfinite and grads:
            local = torch.stack([torch.isfinite(g).all() for g in grads]).all()
            if nonfinite_anywhere(torch.tensor([0.0 if local else float("nan")], device=grads[0].device)):
                for g in grads:
                    g.fill_(float("nan"))
                self.skipped_steps += 1
                return False
        for bucket, ex in zip(self.buckets, self.exchangers):
            flat = torch.cat([grads[i].reshape(-1) for i in bucket])
            out = ex.exchange(flat)
            offset = 0
            for i in bucket:
                n = grads[i].numel()
                grads[i].copy_(out[offset:offset + n].view_as(grads[i]))
                offset += n
        return True

    def state_dict(self) -> dict:
        """Residuals of every bucket (for checkpoints), with the bucket layout."""
        return {"algorithm": self.algorithm, "buckets": [list(b) for b in self.buckets],
                "exchangers": [ex.state_dict() for ex in self.exchangers]}

    def load_state_dict(self, state: dict) -> None:
        """Restore residuals saved by :meth:`state_dict`.

        Raises:
            ValueError: if the bucket layout differs (other model or thresholds).
        """
        if [list(b) for b in self.buckets] != [list(b) for b in state["buckets"]]:
            raise ValueError("saved gradient buckets differ from this model's: use the same model, "
                             "bucket_bytes and hybrid_threshold_bytes as when the state was saved")
        for ex, s in zip(self.exchangers, state["exchangers"]):
            ex.load_state_dict(s)
