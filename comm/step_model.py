"""The time of one data-parallel training step on a cluster: the step model behind
``--comm auto`` (:mod:`comm.auto`) and ``cachepipe plan``.

NOTE [step model]: a step of algorithm ``A`` on ``nodes x local_size`` GPUs costs

    step = compute + exposed + update + overhead

- ``compute``: forward and backward of one GPU's batch (the single-GPU training step less
  its update, :meth:`Library.compute_s`);
- the exchange ``X = selection + exchange``: ``A``'s cost formula (:mod:`comm.cost_model`,
  the papers' alpha-beta terms) with its inter-node bytes at the rate the library really
  reaches (NOTE [library efficiency]), its top-k selection at ``gamma`` per element, and
  for a sparse ``A`` the library's host work per gradient element;
- ``exposed``: what backward does not hide of ``X``. An algorithm the library runs after
  backward (``Library.after_backward``, or one bucket) exposes all of it; otherwise the
  last bucket's exchange always follows backward and the rest hides behind the share of
  backward the library really overlaps: ``max(X / buckets, X - overlap_share * backward)``
  with ``backward = BACKWARD_SHARE * compute`` (backward is about two forwards);
- ``update``: the optimiser's step on the cluster (LARS with PTO splits its norms over the
  GPUs, so it is shorter than on one GPU);
- ``overhead``: what a distributed step costs beyond these (framework, launches, data
  wait), per step.

``--comm auto`` prices with :data:`MEASURED`: the compute and links it measures, nothing
hidden, nothing added (NOTE [auto exchange] in comm/auto.py); ``cachepipe plan`` with a
testbed's :class:`Library` (:mod:`comm.testbed`).

NOTE [library efficiency]: the formulas assume every inter-node byte moves at the line
rate ``1 / beta_inter``. A real collective reaches less, for two named reasons. A cloud's
virtual network caps each TCP flow (``flow_gbit``): an algorithm that sends one stream per
node (NCCL's ring and tree, ``hier``'s leaders, the gTop-k tree) gets ``min(line, flow)``,
one that sends one stream per local rank (``Algorithm.per_rank_streams``: ``2dtar``,
``hitopk``) ``min(line, local_size * flow)``. And a library's own collective can reach only
``efficiency[A]`` of that (a socket transport's copies, a switch that all nodes send
through at once). Both are parameters of a testbed's library, fitted where a measurement
of it exists (docs/plan.md); unset they cost nothing.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from comm.cost_model import ALLGATHER_FORMS, LinkParams, coefficients
from comm.plans.size import SizePlan
from comm.registry import get_algorithm

__all__ = ["BACKWARD_SHARE", "Library", "MEASURED", "Step", "bucket_count", "images_per_s_at", "step"]

BACKWARD_SHARE = 2 / 3  # NOTE [step model]: backward ~ two forwards of compute


def images_per_s_at(rates: Mapping[int, float], size: int) -> float:
    """Single-GPU training images/s at ``size`` px from ``rates`` measured at some sizes
    (size -> images/s).

    NOTE [compute at other sizes]: a measured rate is used as it is; another size takes
    the nearest measured size's rate scaled by pixels, ``rate * (measured / size) ** 2``.
    That is rough: the seed's Table 4 (ResNet-50 on a V100) has 4400 images/s at 96 px,
    which pixels would make 808 at 224 px, and measures 1240 (a step has costs per image
    and per layer that pixels do not scale). So a testbed keeps a rate per size, and
    ``cachepipe plan`` says when it scaled one.

    Raises:
        ValueError: for no rates, or a rate or size that is not positive.

    Example:
        >>> images_per_s_at({96: 4400, 224: 1240}, 224), images_per_s_at({96: 4400}, 192)
        (1240, 1100.0)
    """
    if not rates or size < 1 or min(rates.values()) <= 0:
        raise ValueError(f"need positive measured rates and size, got {dict(rates)} at {size}")
    if size in rates:
        return rates[size]
    nearest = min(rates, key=lambda s: (abs(s - size), s))
    return rates[nearest] * (nearest / size) ** 2


def bucket_count(numel: int, bucket_bytes: int = SizePlan.bucket_bytes) -> int:
    """Buckets the engine's default plan cuts ``numel`` fp32 gradients into (at least one)."""
    return max(1, math.ceil(numel * 4 / bucket_bytes))


@dataclass(frozen=True)
class Library:
    """What a training stack adds to the cost formulas (NOTE [step model], NOTE [library
    efficiency]); every field a named parameter of a testbed.

    Attributes:
        flow_gbit: cap of one stream on the inter-node link, Gbit/s (None: no cap).
        efficiency: algorithm -> share of the inter-node rate its collective reaches (1 unset).
        overlap_share: share of backward an exchange can run beside (0 hides nothing).
        after_backward: algorithms the stack starts only after backward (nothing hidden).
        allgather: latency form of ``topk_ag``'s all-gather (NOTE [all-gather latency]).
        host_s_per_element: a sparse exchange's host work per gradient element, seconds.
        single_update_s_per_param: the optimiser's step on one GPU, seconds per parameter
            (inside a single-GPU throughput; :meth:`compute_s` takes it out).
        update_s_per_param: the optimiser's step on the cluster, seconds per parameter.
        overhead_s: a distributed step's cost beyond compute, exchange and update, seconds.

    Raises:
        ValueError: for a negative or non-finite value, a share or efficiency outside
            (0, 1] (``overlap_share``: [0, 1]), or an unknown all-gather form.
    """

    flow_gbit: float | None = None
    efficiency: Mapping[str, float] = field(default_factory=dict)
    overlap_share: float = 1.0
    after_backward: frozenset[str] = frozenset()
    allgather: str = "ring"
    host_s_per_element: float = 0.0
    single_update_s_per_param: float = 0.0
    update_s_per_param: float = 0.0
    overhead_s: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "after_backward", frozenset(self.after_backward))
        object.__setattr__(self, "efficiency", dict(self.efficiency))
        for name in ("host_s_per_element", "single_update_s_per_param", "update_s_per_param", "overhead_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.flow_gbit is not None and not (math.isfinite(self.flow_gbit) and self.flow_gbit > 0):
            raise ValueError(f"flow_gbit must be > 0 (or None: no cap), got {self.flow_gbit}")
        if not 0 <= self.overlap_share <= 1:
            raise ValueError(f"overlap_share must be in [0, 1], got {self.overlap_share}")
        for name, share in self.efficiency.items():
            get_algorithm(name)
            if not 0 < share <= 1:
                raise ValueError(f"efficiency of {name} must be in (0, 1], got {share}")
        for name in self.after_backward:
            get_algorithm(name)
        if self.allgather not in ALLGATHER_FORMS:
            raise ValueError(f"unknown all-gather form {self.allgather!r}; valid: {list(ALLGATHER_FORMS)}")

    def compute_s(self, batch_size: int, images_per_s: float, params: int) -> float:
        """Forward and backward seconds of ``batch_size`` images on a GPU whose single-GPU
        training throughput is ``images_per_s`` (its update taken out).

        Raises:
            ValueError: if the update takes the whole single-GPU step or more.
        """
        total = batch_size / images_per_s
        compute = total - self.single_update_s_per_param * params
        if compute <= 0:
            raise ValueError(f"a single-GPU step of {total * 1e3:.1f} ms leaves no time beside the update "
                             f"({self.single_update_s_per_param * params * 1e3:.1f} ms)")
        return compute

    def update_s(self, params: int) -> float:
        """The optimiser's step on the cluster for ``params`` parameters, seconds."""
        return self.update_s_per_param * params

    def beta_inter(self, algorithm: str, line_beta: float, local_size: int) -> float:
        """Seconds per byte ``algorithm`` really pays on a node's inter-node link
        (NOTE [library efficiency]); 0 for an unlimited link without a cap."""
        rate = math.inf if line_beta <= 0 else 1 / line_beta
        if self.flow_gbit is not None:
            streams = local_size if get_algorithm(algorithm).per_rank_streams else 1
            rate = min(rate, streams * self.flow_gbit * 1e9 / 8)
        rate *= self.efficiency.get(algorithm, 1.0)
        return 0.0 if math.isinf(rate) else 1 / rate


MEASURED = Library(overlap_share=0.0)  # --comm auto: the job's own measurements, nothing hidden or added


@dataclass(frozen=True)
class Step:
    """One algorithm's step, in seconds (NOTE [step model]).

    Attributes:
        algorithm: the exchange's name.
        compute_s: forward and backward.
        selection_s: the top-k selection (sparse algorithms).
        exchange_s: the exchange's messages, bytes and host work.
        exposed_s: the part of ``selection_s + exchange_s`` backward does not hide.
        update_s: the optimiser's step.
        overhead_s: the rest of a distributed step.
    """

    algorithm: str
    compute_s: float
    selection_s: float
    exchange_s: float
    exposed_s: float
    update_s: float
    overhead_s: float

    @property
    def overlapped_s(self) -> float:
        """Seconds of selection and exchange hidden behind backward."""
        return max(0.0, self.selection_s + self.exchange_s - self.exposed_s)

    @property
    def total_s(self) -> float:
        """The step: compute, the exposed exchange, the update and the overhead."""
        return self.compute_s + self.exposed_s + self.update_s + self.overhead_s


def step(algorithm: str, *, numel: int, density: float | None, nodes: int, local_size: int, link: LinkParams,
         compute_s: float, update_s: float = 0.0, library: Library = MEASURED, buckets: int = 1,
         value_bytes: int = 4) -> Step:
    """Price one step of ``algorithm`` (NOTE [step model]).

    Args:
        algorithm: a registered algorithm with a cost formula.
        numel: gradient elements exchanged per step.
        density: the sparse algorithms' density (None for dense ones).
        nodes, local_size: the cluster, ``nodes x local_size`` GPUs.
        link: the links' alpha/beta and the selection's ``gamma`` per element.
        compute_s: forward and backward seconds.
        update_s: the optimiser's step, seconds.
        library: the stack's efficiencies and overlap (default :data:`MEASURED`).
        buckets: how many pieces the exchange is cut into during backward (1: one, after it).
        value_bytes: bytes of one value on the wire (2 for fp16).

    Raises:
        ValueError: as :func:`comm.cost_model.coefficients`, or for buckets < 1 or negative times.

    Example:
        >>> link = LinkParams.from_bandwidth(inter_mbit=200)
        >>> s = step("dense", numel=1_000_000, density=None, nodes=2, local_size=2, link=link, compute_s=0.1)
        >>> round(s.total_s, 3), s.exposed_s == s.exchange_s
        (0.341, True)
    """
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    if compute_s < 0 or update_s < 0:
        raise ValueError(f"compute_s and update_s must be >= 0, got {compute_s} and {update_s}")
    c = coefficients(algorithm, numel, density, nodes, local_size, value_bytes=value_bytes,
                     allgather=library.allgather)
    wire = (c["alpha_intra"] * link.alpha_intra + c["beta_intra"] * link.beta_intra
            + c["alpha_inter"] * link.alpha_inter
            + c["beta_inter"] * library.beta_inter(algorithm, link.beta_inter, local_size))
    host = library.host_s_per_element * numel if get_algorithm(algorithm).sparse else 0.0
    selection = c["gamma"] * link.gamma
    total = selection + wire + host
    if algorithm in library.after_backward:
        exposed = total
    else:
        exposed = max(total / buckets, total - library.overlap_share * BACKWARD_SHARE * compute_s)
    return Step(algorithm, compute_s, selection, wire + host, exposed, update_s, library.overhead_s)
