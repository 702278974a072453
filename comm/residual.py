"""Residual memory for error feedback: what a sparse exchange did not apply is kept and
added back to the next step's input (the ``Gg_i = Gg_{i-1} + grad`` of the gTop-k paper)."""
from __future__ import annotations

import torch

__all__ = ["ResidualMemory"]


class ResidualMemory:
    """One residual buffer (fp32, or fp64 for fp64 inputs) for one tensor or fused bucket.

    Args:
        enabled: ``False`` turns error feedback off: ``compensate`` is the identity and
            ``update`` forgets.

    Example:
        >>> mem = ResidualMemory()
        >>> acc = mem.compensate(torch.ones(3))   # ones + residual (zeros at first)
        >>> mem.update(acc - acc.round())         # keep what was not applied
    """

    def __init__(self, enabled: bool = True):
        self.enabled = bool(enabled)
        self.residual: torch.Tensor | None = None

    def compensate(self, x: torch.Tensor) -> torch.Tensor:
        """Return a new accumulation-precision tensor ``x + residual``.

        Raises:
            ValueError: if ``x`` does not match the size of the stored residual.
        """
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        acc = x.to(dtype=dtype, copy=True)
        if self.enabled and self.residual is not None:
            if self.residual.numel() != acc.numel():
                raise ValueError(f"residual holds {self.residual.numel()} elements but the input has "
                                 f"{acc.numel()}: one ResidualMemory serves one tensor layout")
            acc += self.residual.to(device=acc.device, dtype=dtype)
        return acc

    def update(self, residual: torch.Tensor) -> None:
        """Store ``residual`` (taken, not copied) as what is left for the next step."""
        self.residual = residual if self.enabled else None

    def state_dict(self) -> dict:
        return {"enabled": self.enabled, "residual": None if self.residual is None else self.residual.detach().cpu()}

    def load_state_dict(self, state: dict) -> None:
        residual = state.get("residual")
        self.residual = None if residual is None or not self.enabled else residual.clone()
