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

    def compensate(self, x: torch.Tensor, *, inplace: bool = False) -> torch.Tensor:
        """Return ``x + residual`` in accumulation precision (fp32, or fp64 for fp64 ``x``).

        With error feedback on, the result is a new tensor (or ``x`` itself when
        ``inplace`` and ``x`` already has the accumulation dtype) that the caller may turn
        into the next residual; with it off, ``x`` may be returned as is (do not write).

        Raises:
            ValueError: if ``x`` does not match the size of the stored residual.
        """
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        if not self.enabled:
            return x.to(dtype)
        acc = x if inplace and x.dtype == dtype else x.to(dtype=dtype, copy=True)
        if self.residual is not None:
            if self.residual.numel() != acc.numel():
                raise ValueError(f"residual holds {self.residual.numel()} elements but the input has "
                                 f"{acc.numel()}: one ResidualMemory serves one tensor layout")
            acc += self.residual.to(device=acc.device, dtype=dtype)
        return acc

    def update(self, residual: torch.Tensor) -> None:
        """Store ``residual`` (taken, not copied) as what is left for the next step."""
        self.residual = residual if self.enabled else None

    def state_dict(self) -> dict:
        residual = None if self.residual is None else self.residual.detach().to("cpu", copy=True)
        return {"enabled": self.enabled, "residual": residual}

    def load_state_dict(self, state: dict) -> None:
        residual = state.get("residual")
        self.residual = None if residual is None or not self.enabled else residual.clone()
