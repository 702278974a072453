"""DDP comm hook running any registered exchange algorithm on DDP's gradient buckets,
asynchronously: the hook starts the bucket's exchange and returns a future, so the
backward of later buckets overlaps it.

NOTE [async DDP hook]: DDP calls the hook once per bucket, in bucket order, from inside
backward. The hook runs the bucket's stages up to their first collective in flight
(NOTE [exchange stages] in comm/collectives/base.py) and returns a future. The stages
after that issue further collectives, so they cannot run in a ``Work`` callback (another
thread, in an order that differs between ranks); instead the hook of DDP's last bucket
(``bucket.is_last()``) finishes every bucket in flight, in bucket order, on every rank
alike, and completes their futures. DDP waits for the futures only after that hook, so
every bucket but the last overlaps the backward of the buckets after it. Each returned
future is chained with ``then()`` to put the result in the bucket's layout.

NOTE [sparse gradients under DDP]: a bucket holding a ``torch.sparse`` gradient (for
example ``nn.EmbeddingBag(sparse=True)``) is exchanged densely: its dense form goes
through the algorithm (top-k still applies, with its residual), and the averaged result
goes back to DDP as a sparse tensor of the same sparse layout, so the optimiser sees a
sparse gradient as without the hook. Its stored values are what the overflow check looks
at.

NOTE [hook pieces]: DDP decides the buckets: until it rebuilds them after the first
iteration, every parameter sits in one bucket (640 MB of gradients for the 160M-parameter
model of torch's ``test_is_last_hook``), and ``bucket_cap_mb`` may be set high. A sparse
exchange's working memory grows with what it exchanges at once (NOTE [exchange working
memory] in comm/collectives/base.py: six times its input at density 1), so the hook
exchanges a bucket in pieces of at most ``bucket_bytes`` (default 25 MiB: DDP's own default
bucket and the engine's fusion threshold), each with its own exchanger and residual, as the
engine's ``size`` plan exchanges buckets of at most that size: the top-k is taken per piece.
Pieces depend on the bucket's size only, so every rank cuts the same ones; with the
in-flight budget (NOTE [in-flight budget] in comm/in_flight.py) the exchange then holds a
bounded number of bytes whatever DDP's buckets are.
"""
# No `from __future__ import annotations`: DDP checks the hook's return annotation object.
import torch
import torch.distributed as dist

from comm.collectives import build_exchanger
from comm.collectives.base import nonfinite_anywhere
from comm.in_flight import DEFAULT_INFLIGHT_BYTES, InFlight, make_room

__all__ = ["SparseHookState", "sparse_hook", "register_sparse_hook", "DEFAULT_BUCKET_BYTES"]

DEFAULT_BUCKET_BYTES = 25 * 2**20  # NOTE [hook pieces]


class SparseHookState:
    """State of :func:`sparse_hook`: how to exchange, one exchanger per piece of a DDP bucket
    (NOTE [hook pieces]), and the buckets in flight."""

    __slots__ = (
        # what to run
        "algorithm", "topology", "density", "selector", "error_feedback", "value_dtype", "options",
        # NOTE [overflow steps] in comm.engine: skip non-finite buckets without touching residuals
        "skip_nonfinite", "skipped_buckets",
        # (bucket index, offset) -> exchanger of that piece of the bucket (holding its
        # residual; NOTE [hook pieces]) and its length, and bucket index -> its parameters
        "exchangers", "numels", "params_of", "bucket_bytes",
        # NOTE [async DDP hook]: (the pieces' exchanges, or None if skipped; the future; the
        # bucket) in bucket order, holding at most max_inflight_bytes of buffers (NOTE
        # [in-flight budget] in comm.in_flight)
        "in_flight", "max_inflight_bytes",
        # NOTE [residual at a phase switch] in comm.engine_residuals: id(param) -> residual to add once
        "carry",
    )

    def __init__(self, algorithm, topology, *, density=None, selector="mstopk", error_feedback=True,
                 value_dtype=None, skip_nonfinite=True, max_inflight_bytes=DEFAULT_INFLIGHT_BYTES,
                 bucket_bytes=DEFAULT_BUCKET_BYTES, options=None):
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.algorithm, self.topology, self.density = algorithm, topology, density
        self.selector, self.error_feedback, self.value_dtype = selector, error_feedback, value_dtype
        self.options = options
        self.skip_nonfinite, self.skipped_buckets = skip_nonfinite, 0
        self.exchangers: dict[tuple[int, int], object] = {}
        self.numels: dict[tuple[int, int], int] = {}
        self.params_of: dict[int, list] = {}
        self.bucket_bytes = int(bucket_bytes)
        self.in_flight: list = []
        self.max_inflight_bytes = max_inflight_bytes
        self.carry: dict[int, torch.Tensor] = {}
        build_exchanger(algorithm, topology, density=density, selector=selector, value_dtype=value_dtype,
                        options=options)  # validate

    def exchanger_for(self, key: tuple[int, int], numel: int):
        """The exchanger of piece ``key`` = (bucket index, offset) (a new one if its size changed).

        DDP rebuilds its buckets once after the first iteration; :func:`sparse_hook` then
        hands the old buckets' residuals to the new ones per parameter (``carry``).
        """
        ex = self.exchangers.get(key)
        if ex is None or self.numels[key] != numel:
            ex = build_exchanger(self.algorithm, self.topology, density=self.density, selector=self.selector,
                                 error_feedback=self.error_feedback, value_dtype=self.value_dtype,
                                 options=self.options)
            self.exchangers[key], self.numels[key] = ex, numel
        return ex

    def pieces(self, numel: int, itemsize: int) -> list[tuple[int, int]]:
        """``(offset, length)`` of the pieces a bucket of ``numel`` elements is exchanged in
        (NOTE [hook pieces]): as few as keep each within ``bucket_bytes``, of equal length."""
        if numel == 0:
            return [(0, 0)]
        length = -(-numel // -(-numel * itemsize // self.bucket_bytes))
        return [(start, min(length, numel - start)) for start in range(0, numel, length)]

    def finish(self) -> None:
        """Finish every bucket in flight, in order, and complete their futures (NOTE [async DDP hook])."""
        pending, self.in_flight = self.in_flight, []
        for flights, fut, flat in pending:
            if flights is None:
                flat.fill_(float("nan"))
            for flight in flights or ():
                flight.finish()  # the result is in flat already
            fut.set_result(flat)

    def take_residuals(self) -> dict:
        """This rank's residuals per parameter (tensor -> residual shaped like it), cleared
        here (NOTE [residual at a phase switch] in comm.engine_residuals)."""
        out = {}
        for (index, offset), ex in self.exchangers.items():
            if ex.memory.owed() is None or index not in self.params_of:
                continue
            numel = self.numels[(index, offset)]
            piece, start = ex.placed_residual(numel), 0
            for p in self.params_of[index]:  # the parameters this piece overlaps
                lo, hi = max(start, offset), min(start + p.numel(), offset + numel)
                if lo < hi:
                    if p not in out:
                        out[p] = torch.zeros(p.numel(), dtype=piece.dtype, device=piece.device)
                    out[p][lo - start:hi - start] += piece[lo - offset:hi - offset]
                start += p.numel()
            ex.memory.clear()
        return {p: r.view(p.shape) for p, r in out.items()}

    def carry_in(self, residuals: dict) -> None:
        """Add ``residuals`` (parameter -> tensor, as :meth:`take_residuals` gives) to the
        next gradients these buckets send."""
        for p, r in residuals.items():
            self.carry[id(p)] = r

    def state_dict(self) -> dict:
        return {i: (self.numels[i], ex.state_dict()) for i, ex in self.exchangers.items()}

    def load_state_dict(self, state: dict) -> None:
        for key, (numel, s) in state.items():  # a bucket index alone: a state saved before NOTE [hook pieces]
            self.exchanger_for((int(key[0]), int(key[1])) if isinstance(key, (tuple, list)) else (int(key), 0),
                               numel).load_state_dict(s)


def sparse_hook(state: SparseHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: a future of the bucket's averaged gradient by ``state.algorithm``
    (NOTE [async DDP hook]; sparse buckets: NOTE [sparse gradients under DDP])."""
    buf = bucket.buffer()
    flat = buf.coalesce().to_dense().reshape(-1) if buf.is_sparse else buf
    params = bucket.parameters()
    old = state.params_of.get(bucket.index())
    if old is not None and (len(old) != len(params) or any(a is not b for a, b in zip(old, params))):
        # DDP rebuilt its buckets (once, after the first iteration): the residuals move
        # to the new buckets through the carry, as at a phase switch
        state.carry_in(state.take_residuals())
        state.exchangers.clear()
        state.numels.clear()
        state.params_of.clear()
    state.params_of[bucket.index()] = params
    if state.carry:  # into DDP's bucket itself, which receives the result anyway (as torch's all-reduce hook)
        offset = 0
        for p in params:
            carried = state.carry.pop(id(p), None)
            if carried is not None:
                flat[offset:offset + p.numel()] += carried.reshape(-1).to(device=flat.device, dtype=flat.dtype)
            offset += p.numel()
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    if state.skip_nonfinite and nonfinite_anywhere(flat):
        state.skipped_buckets += 1
        state.in_flight.append((None, fut, flat))
    else:  # the result goes into the bucket in place, as torch's all-reduce hook puts it there
        flights = []
        state.in_flight.append((flights, fut, flat))
        for offset, length in state.pieces(flat.numel(), flat.element_size()):  # NOTE [hook pieces]
            ex = state.exchanger_for((bucket.index(), offset), length)
            need, piece = ex.inflight_bytes(length), flat[offset:offset + length]
            make_room((f for fs, _, _ in state.in_flight for f in fs or ()), need, state.max_inflight_bytes)
            flights.append(InFlight(ex.stages(piece, out=piece), need))
    if bucket.is_last():
        state.finish()
    if buf.is_sparse:
        sparse_dim = buf.sparse_dim()
        return fut.then(lambda f: f.value().view(buf.shape).to_sparse(sparse_dim))
    return fut.then(lambda f: f.value().view(buf.shape))


def register_sparse_hook(ddp_model, algorithm: str, topology, *, density: float | None = None,
                         selector: str = "mstopk", error_feedback: bool = True, value_dtype=None,
                         skip_nonfinite: bool = True, max_inflight_bytes: int | None = DEFAULT_INFLIGHT_BYTES,
                         bucket_bytes: int = DEFAULT_BUCKET_BYTES, options=None) -> SparseHookState:
    """Make ``ddp_model`` exchange its gradient buckets with ``algorithm``, asynchronously.

    Args:
        ddp_model: a ``torch.nn.parallel.DistributedDataParallel`` module.
        algorithm: a registered algorithm with a per-bucket exchanger
            (``comm.registry.names(per_bucket=True)``).
        topology: a :class:`comm.Topology`.
        density, selector, error_feedback, value_dtype: as in :func:`comm.build_exchanger`.
        skip_nonfinite: skip buckets with inf/NaN on any worker (NOTE [overflow steps]).
        max_inflight_bytes: buffers the buckets in flight may hold at once (default 256 MiB;
            None: no limit): NOTE [in-flight budget] in comm/in_flight.py.
        bucket_bytes: largest piece of a DDP bucket exchanged at once (default 25 MiB): NOTE
            [hook pieces].
        options: ``algorithm``'s options object (default: its defaults).

    Returns:
        The hook state (keep it to checkpoint residuals with ``state_dict()``).

    Raises:
        ValueError: unknown algorithm or selector, bad density.

    Example:
        >>> ddp = DistributedDataParallel(model)                                   # doctest: +SKIP
        >>> register_sparse_hook(ddp, algorithm, topo, density=0.01, selector="exact")  # doctest: +SKIP
    """
    state = SparseHookState(algorithm, topology, density=density, selector=selector, error_feedback=error_feedback,
                            value_dtype=value_dtype, skip_nonfinite=skip_nonfinite,
                            max_inflight_bytes=max_inflight_bytes, bucket_bytes=bucket_bytes, options=options)
    ddp_model.register_comm_hook(state, sparse_hook)
    return state
