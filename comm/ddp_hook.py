"""DDP comm hook running any registered exchange algorithm on DDP's gradient buckets."""
# No `from __future__ import annotations`: DDP checks the hook's return annotation object.
import torch
import torch.distributed as dist

from comm.collectives import build_exchanger, get_algorithm
from comm.collectives.base import nonfinite_anywhere

__all__ = ["SparseHookState", "sparse_hook", "register_sparse_hook"]


class SparseHookState:
    """State of :func:`sparse_hook`: how to exchange, and one exchanger per DDP bucket."""

    __slots__ = (
        # what to run
        "algorithm", "topology", "density", "selector", "error_feedback", "value_dtype",
        # NOTE [overflow steps] in comm.engine: skip non-finite buckets without touching residuals
        "skip_nonfinite", "skipped_buckets",
        # bucket index -> exchanger (holding that bucket's residual)
        "exchangers",
    )

    def __init__(self, algorithm, topology, *, density=None, selector="mstopk", error_feedback=True,
                 value_dtype=None, skip_nonfinite=True):
        get_algorithm(algorithm)
        self.algorithm, self.topology, self.density = algorithm, topology, density
        self.selector, self.error_feedback, self.value_dtype = selector, error_feedback, value_dtype
        self.skip_nonfinite, self.skipped_buckets = skip_nonfinite, 0
        self.exchangers: dict[int, object] = {}
        build_exchanger(algorithm, topology, density=density, selector=selector, value_dtype=value_dtype)  # validate

    def exchanger_for(self, index: int, numel: int):
        """The exchanger of bucket ``index``; rebuilt (residual dropped) if DDP re-bucketed.

        DDP rebuilds its buckets once after the first iteration, so a bucket's size may
        change then; its residual cannot carry over and starts from zero.
        """
        ex = self.exchangers.get(index)
        if ex is None or getattr(ex, "_numel", None) != numel:
            ex = build_exchanger(self.algorithm, self.topology, density=self.density, selector=self.selector,
                                 error_feedback=self.error_feedback, value_dtype=self.value_dtype)
            ex._numel = numel
            self.exchangers[index] = ex
        return ex

    def state_dict(self) -> dict:
        return {i: (ex._numel, ex.state_dict()) for i, ex in self.exchangers.items()}

    def load_state_dict(self, state: dict) -> None:
        for i, (numel, s) in state.items():
            self.exchanger_for(int(i), numel).load_state_dict(s)


def sparse_hook(state: SparseHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's averaged gradient by ``state.algorithm``."""
    buf = bucket.buffer()
    ex = state.exchanger_for(bucket.index(), buf.numel())
    if state.skip_nonfinite and nonfinite_anywhere(buf):
        state.skipped_buckets += 1
        result = torch.full_like(buf, float("nan"))
    else:
        result = ex.exchange(buf)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(result)
    return fut


def register_sparse_hook(ddp_model, algorithm: str, topology, *, density: float | None = None,
                         selector: str = "mstopk", error_feedback: bool = True, value_dtype=None,
                         skip_nonfinite: bool = True) -> SparseHookState:
    """Make ``ddp_model`` exchange its gradient buckets with ``algorithm``.

    Args:
        ddp_model: a ``torch.nn.parallel.DistributedDataParallel`` module.
        algorithm: name in ``comm.ALGORITHMS``.
        topology: a :class:`comm.Topology`.
        density, selector, error_feedback, value_dtype: as in :func:`comm.build_exchanger`.
        skip_nonfinite: skip buckets with inf/NaN on any worker (NOTE [overflow steps]).

    Returns:
        The hook state (keep it to checkpoint residuals with ``state_dict()``).

    Raises:
        ValueError: unknown algorithm or selector, bad density.

    Example:
        >>> ddp = DistributedDataParallel(model)                                   # doctest: +SKIP
        >>> register_sparse_hook(ddp, "hitopk", topo, density=0.01, selector="exact")  # doctest: +SKIP
    """
    state = SparseHookState(algorithm, topology, density=density, selector=selector, error_feedback=error_feedback,
                            value_dtype=value_dtype, skip_nonfinite=skip_nonfinite)
    ddp_model.register_comm_hook(state, sparse_hook)
    return state
