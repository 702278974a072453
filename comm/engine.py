"""The gradient-exchange engine: a bucket plan, one algorithm (with its selector and
residual memory) per bucket, and a scheduler that starts each bucket's exchange as soon as
backward has produced its last gradient.

Parts, as GRACE separates them: the *plan* (:mod:`comm.plans`) says which parameters
travel together; per bucket an *algorithm* from :mod:`comm.registry` (the communicator)
holds the *selector* (``comm.topk``, the compressor) and the *residual memory*
(:class:`comm.ResidualMemory`); the *scheduler* here runs the algorithms' stages (NOTE
[exchange stages] in comm/collectives/base.py).

NOTE [launch order]: buckets are launched strictly in plan order. A bucket whose
gradients are all ready waits for the buckets before it, so every rank issues the same
sequence of collectives whatever order autograd fires the hooks in. A launch runs the
bucket's stages up to the first collective in flight and returns to backward;
``synchronize()`` resumes the buckets in the same order. Parameters that got no gradient
in a backward count as zero there; every rank must leave the same parameters without
gradient (as DDP requires).

NOTE [overflow steps]: with mixed precision GradScaler skips a step whose gradients
hold inf/NaN; a sparse exchange of such gradients would fold the overflow into the
residuals and poison every later step. With ``skip_nonfinite`` the engine agrees with a
1-element all-reduce whether any worker's gradients are non-finite before it exchanges
(once per step without overlap, once per bucket with it); a non-finite bucket is not
exchanged, its residual is untouched, its gradients become NaN (so GradScaler skips the
step on every worker alike) and ``synchronize()`` returns False.

NOTE [local update] (comm/local_update.py): clipping, weight decay and a carried
residual act on each worker's bucket before it is exchanged.

NOTE [pipelined exchange]: overlapping backward alone cannot hide an exchange as long as
the step: step ``t``'s exchange cannot start before backward has produced the first
bucket's gradient, and step ``t + 1``'s forward needs its update, so a step takes at
least forward + the start of backward + the exchange (NOTE [overlap bound] in
tools/bench/overlap.py). With ``pipeline=True`` step ``t``'s exchange runs on during step
``t + 1``'s forward and backward and is applied by step ``t + 1``'s optimiser step: the
update uses the gradients of one step earlier (Pipe-SGD, Li et al., NeurIPS 2018: one
step of staleness, here with error feedback unchanged since every bucket still sends and
keeps its residual when it is launched). The step then takes about ``max(compute,
exchange)``. Order, the same on every rank: the previous step's buckets are finished (in
plan order) right before this step's first bucket is launched, so no collective of two
steps ever interleaves on a group. :meth:`synchronize` of the first step (and the first
after :meth:`flush`) has nothing to apply: it zeroes the gradients and returns False, and
the caller skips the optimiser step; :meth:`flush` finishes what is in flight and leaves
it in ``p.grad`` for one more optimiser step (the trainer flushes at every epoch end, so
evaluations and phase switches see every gradient applied). A checkpoint in between
(:meth:`state_dict`) holds the finished but unapplied gradients, so resuming from it
takes the same steps as going on.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence

import torch

from comm.collectives import build_exchanger
from comm.collectives import base
from comm.collectives.base import nonfinite_anywhere
from comm.engine_residuals import EngineResiduals
from comm.in_flight import DEFAULT_INFLIGHT_BYTES, InFlight, StepFlights, make_room
from comm.local_update import LocalUpdate
from comm.plans import Bucket, Plan, SizePlan
from comm.plans.same_layout import check_same_layout
from comm.registry import exchanger_class
from comm.select_timer import SelectTimer
from comm.timings import ExchangeTimings

__all__ = ["GradientExchanger"]


class GradientExchanger(EngineResiduals):
    """Average every ``p.grad`` over all workers by buckets, overlapped with backward.

    Args:
        params: the model parameters (those with ``requires_grad`` are kept), forward order.
        algorithm: a registered algorithm with a per-bucket exchanger
            (``comm.registry.names(per_bucket=True)``) for the buckets (a plan may pick
            others, as ``size``'s hybrid choice does).
        topology: a :class:`comm.Topology`.
        density, selector, error_feedback, value_dtype: as in :func:`comm.build_exchanger`.
        plan: a plan object of ``comm.plans`` (:class:`~comm.plans.SizePlan`, the default
            with its fusion threshold and hybrid choice, :class:`~comm.plans.LayerPlan`,
            :class:`~comm.plans.OMGSPlan`) or a list of :class:`comm.plans.Bucket`.
        skip_nonfinite: see NOTE [overflow steps] (default True).
        overlap: start each bucket's exchange from a post-accumulate-grad hook as soon as
            its gradients are ready (default True); False exchanges everything in
            :meth:`synchronize`.
        momentum, masking: DGC momentum correction factor (default 0: off; the optimiser
            must then apply ``p.grad`` without momentum or weight decay) and momentum-factor
            masking (default True): NOTE [momentum correction] in comm/residual.py.
        weight_decay: parameter -> weight decay added to its gradient before the exchange
            (NOTE [local update] in comm/local_update.py); default none.
        clip_norm: local gradient clipping threshold before ``P**-1/2`` scaling (NOTE
            [local update]); 0 (default) does not clip.
        pipeline: apply each step's exchange one step later, so that it overlaps the next
            step's forward and backward (NOTE [pipelined exchange]; look ahead with
            :meth:`lookahead_grads`, NOTE [lookahead] in trainer/lookahead.py); default
            False.
        max_inflight_bytes: buffers the buckets in flight may hold at once (default 256
            MiB; None: no limit): NOTE [in-flight budget] in comm/in_flight.py.
        options: ``algorithm``'s options object for its buckets (default: its defaults).

    Attributes:
        buckets: the plan (list of :class:`comm.plans.Bucket`, launch order).
        exchangers: one algorithm instance per bucket (holding its residual).
        stats: cumulative seconds: ``select_s`` (top-k selection), ``compress_s`` (launching
            buckets: packing, compensation, selection, residual, starting the collective),
            ``wait_s`` (blocked on collectives in :meth:`synchronize`) and ``sync_s`` (all
            of :meth:`synchronize`).
        bucket_compress_s: ``compress_s`` per bucket.
        last_timings: the last step's :class:`comm.ExchangeTimings`.

    Raises:
        ValueError: unknown algorithm or plan, bad plan options, bad density, momentum
            outside [0, 1), negative clip_norm or weight decay.

    Example:
        >>> ex = GradientExchanger(model.parameters(), algorithm, topo, density=0.01)  # doctest: +SKIP
        >>> loss.backward(); ex.synchronize(); optimizer.step()                    # doctest: +SKIP
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], algorithm: str, topology, *,
                 plan: Plan | Sequence[Bucket] = SizePlan(), density: float | None = None, selector: str = "mstopk",
                 error_feedback: bool = True, value_dtype=None, skip_nonfinite: bool = True, overlap: bool = True,
                 momentum: float = 0.0, masking: bool = True, weight_decay: Mapping[torch.Tensor, float] | None = None,
                 clip_norm: float = 0.0, pipeline: bool = False,
                 max_inflight_bytes: int | None = DEFAULT_INFLIGHT_BYTES, options=None):
        self.params = [p for p in params if p.requires_grad]
        self._local = LocalUpdate(self.params, topology.world_size, weight_decay, clip_norm)
        self.topology, self.algorithm = topology, algorithm
        self.skip_nonfinite, self.overlap, self.pipeline = skip_nonfinite, overlap, pipeline
        self.max_inflight_bytes = max_inflight_bytes
        self.skipped_steps = 0
        exchanger_class(algorithm)
        self.buckets = plan.buckets(self.params, algorithm) if hasattr(plan, "buckets") else list(plan)
        seen = sorted(i for b in self.buckets for i in b.params)
        if seen != list(range(len(self.params))):
            raise ValueError("a bucket plan must hold every parameter exactly once")
        check_same_layout([sum(self.params[i].numel() for i in b.params) for b in self.buckets], topology)
        self.stats = dict.fromkeys(("select_s", "compress_s", "wait_s", "sync_s"), 0.0)
        self.bucket_compress_s = [0.0] * len(self.buckets)
        self.last_timings = ExchangeTimings()
        self._select = SelectTimer()
        self.exchangers = []
        for b in self.buckets:
            ex = build_exchanger(b.algorithm, topology, density=density, selector=selector,
                                 error_feedback=error_feedback, value_dtype=value_dtype, momentum=momentum,
                                 masking=masking, options=options if b.algorithm == algorithm else None)
            if ex.sparse:
                ex.select = self._select.wrap(ex.select)
            self.exchangers.append(ex)
        self._bucket_of = {i: bi for bi, b in enumerate(self.buckets) for i in b.params}
        self._ready = [0] * len(self.buckets)
        self._inflight: list[tuple[int, InFlight | None]] = []  # (bucket, exchange); None: skipped
        self._estimates: list[torch.Tensor] = []  # this rank's inputs, pipelined: NOTE [lookahead]
        self._skipped = False
        self._previous: StepFlights | None = None  # NOTE [pipelined exchange]: not applied yet
        self._drained_in_backward = 0.0
        self.enabled = True
        self._handles = []
        if overlap:
            for i, p in enumerate(self.params):
                self._handles.append(p.register_post_accumulate_grad_hook(
                    lambda _p, b=self._bucket_of[i]: self._on_grad(b)))

    @property
    def bucket_algorithms(self) -> list[str]:
        """The algorithm each bucket uses (after the plan's choice)."""
        return [ex.name for ex in self.exchangers]

    @property
    def launched(self) -> int:
        """Buckets whose exchange has started in the current step."""
        return len(self._inflight)

    # -- backward side -------------------------------------------------------------------
    def _on_grad(self, bucket: int) -> None:
        if not self.enabled:
            return
        self._ready[bucket] += 1
        while self.launched < len(self.buckets):  # NOTE [launch order]
            b = self.launched
            if self._ready[b] < len(self.buckets[b].params):
                break
            self._drained_in_backward += self._drain()
            self._launch(b, check=self.skip_nonfinite)

    def _drain(self) -> float:
        """Finish the previous step's exchanges before this step launches any (NOTE
        [pipelined exchange]); the seconds it took."""
        if self._previous is None or self._previous.done:
            return 0.0
        start = time.perf_counter()
        self._previous.finish()
        return time.perf_counter() - start

    def _launch(self, b: int, check: bool) -> None:
        need = self.exchangers[b].inflight_bytes(sum(self.params[i].numel() for i in self.buckets[b].params))
        make_room((f for _, f in self._inflight), need, self.max_inflight_bytes)  # waits count in wait_s
        start = time.perf_counter()
        self._start(b, check, need)
        took = time.perf_counter() - start
        self.bucket_compress_s[b] += took
        self.stats["compress_s"] += took

    def _start(self, b: int, check: bool, need: int) -> None:
        grads = [self._grad(i) for i in self.buckets[b].params]
        flat = torch.cat([g.reshape(-1) for g in grads]) if len(grads) > 1 else grads[0].reshape(-1).clone()
        self._local.apply(self.buckets[b].params, flat)  # NOTE [local update]
        if check and nonfinite_anywhere(flat):
            self._skipped = True
            self._inflight.append((b, None))
            return
        if self.pipeline:
            self._estimates.append(flat.clone())  # the stages consume flat
        self._inflight.append((b, InFlight(self.exchangers[b].stages(flat, out=flat), need)))  # flat is ours

    def set_density(self, density: float) -> None:
        """Send ``density`` of every sparse bucket from the next step on (density warm-up).

        Raises:
            ValueError: for a density outside (0, 1].
        """
        base.set_density(self.exchangers, density)

    def _grad(self, i: int) -> torch.Tensor:
        p = self.params[i]
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        return p.grad

    # -- optimiser side ------------------------------------------------------------------
    def synchronize(self) -> bool:
        """Finish every exchange and leave the averaged gradients in ``p.grad`` (collective).

        Buckets not launched during backward (``overlap=False``, parameters without
        gradient, :meth:`no_sync`) are launched now, in plan order. With ``pipeline`` this
        step's exchange stays in flight and ``p.grad`` receives the previous step's
        averaged gradients (NOTE [pipelined exchange]).

        Returns:
            True if gradients were exchanged; False if the step was skipped because some
            worker's gradients were non-finite (NOTE [overflow steps]), or, with
            ``pipeline``, when there is no earlier step to apply (``p.grad`` is zero):
            skip the optimiser step then.
        """
        start = time.perf_counter()
        overlapped = self._select.take()
        in_backward = self.launched
        if self.skip_nonfinite and in_backward == 0 and self.params:
            local = all(bool(torch.isfinite(self._grad(i)).all()) for i in range(len(self.params)))
            if nonfinite_anywhere(torch.tensor([0.0 if local else float("nan")], device=self.params[0].device)):
                self._skipped = True
                self._inflight = [(b, None) for b in range(len(self.buckets))]
        self._drain()
        while self.launched < len(self.buckets):
            self._launch(self.launched, check=self.skip_nonfinite and in_backward > 0)
        current = StepFlights(self._inflight, self._skipped, None if self._skipped else self._estimates)
        self._inflight, self._estimates, self._ready, self._skipped = [], [], [0] * len(self.buckets), False
        if self.pipeline:
            applied = self._apply(self._previous)
            self._previous = current
        else:
            applied = self._apply(current)
        wait = time.perf_counter() - start
        select = self._select.take()
        self.stats["select_s"] += overlapped + select
        self.stats["sync_s"] += wait
        self.last_timings = ExchangeTimings(select=select, select_overlapped=overlapped, wait=wait,
                                            drained_in_backward=self._drained_in_backward,
                                            launched_in_backward=in_backward)
        self._drained_in_backward = 0.0
        return applied

    def lookahead_grads(self) -> bool:
        """With ``pipeline``: put this rank's own gradients of the step still in flight (its
        exchange's input, after the local update) into ``p.grad``, for an optimiser step to
        the weights that step will lead to (NOTE [lookahead] in trainer/lookahead.py). Once
        per step: the copies are freed here. Returns False (``p.grad`` untouched) when
        there is nothing to look ahead with (no step in flight, it was skipped, or they
        were taken already)."""
        step = self._previous
        if step is None or step.estimates is None:
            return False
        for (b, _), est in zip(step.flights, step.estimates):
            self._write_grads(b, est)
        step.estimates = None
        return True

    def flush(self) -> bool:
        """With ``pipeline``: finish the exchange still in flight and leave its averaged
        gradients in ``p.grad`` for one more optimiser step (collective); the next
        :meth:`synchronize` then has nothing to apply. Returns False (and changes nothing)
        when nothing was in flight or pending; without ``pipeline`` there never is."""
        step, self._previous = self._previous, None
        return step is not None and self._apply(step)

    def _apply(self, step: StepFlights | None) -> bool:
        """Finish ``step`` and copy its results into ``p.grad`` (NaN for a skipped bucket);
        zeros without a step (the first pipelined one). Returns whether a step may apply them."""
        if step is None:
            for i in range(len(self.params)):
                self._grad(i).zero_()
            return False
        step.finish()
        for b, flight in step.flights:
            if flight is None:
                for i in self.buckets[b].params:
                    self._grad(i).fill_(float("nan"))
                continue
            self.stats["wait_s"] += flight.waited_s
            self._write_grads(b, flight.result)
        self.skipped_steps += step.skipped
        return not step.skipped

    def _write_grads(self, b: int, flat: torch.Tensor) -> None:
        """Copy bucket ``b``'s concatenated gradients ``flat`` into its parameters' ``p.grad``."""
        offset = 0
        for i in self.buckets[b].params:
            g = self._grad(i)
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally (hooks ignored); the next backward outside the
        context exchanges the accumulated gradients."""
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = True

    def remove(self) -> None:
        """Remove the autograd hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    close = remove
