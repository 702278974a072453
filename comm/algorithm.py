"""What an exchange algorithm declares about itself to the registry (:mod:`comm.registry`).

NOTE [one registry of names]: an algorithm's name, whether it is sparse, its options and
its cost formula are written once, in the algorithm's own module, as an :class:`Algorithm`;
``comm/builtin.py`` registers it in :mod:`comm.registry` (one line). Everything that names algorithms (the engine,
the DDP hook, the cost model, ``--comm auto``, the trainer's recipes and the CLI's choices)
asks the registry, so a new algorithm is one new file plus one registry line, or one
:func:`comm.registry.register` call from anywhere (``tests/trainer/test_new_algorithm.py``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Algorithm", "NoOptions", "DEFAULT_DENSITY"]

DEFAULT_DENSITY = 0.01  # a training phase's density unless its algorithm or recipe says otherwise


@dataclass(frozen=True)
class NoOptions:
    """The options of an algorithm that has none of its own."""


@dataclass(frozen=True)
class Algorithm:
    """One gradient exchange algorithm as the registry knows it.

    Attributes:
        name: what recipes, ``--comm`` and checkpoints call it.
        sparse: it sends a top-k selection with error feedback, so a phase's ``density``,
            ``selector`` and Deep Gradient Compression's techniques apply to it.
        exchanger: the :class:`comm.Exchanger` subclass the engine and the sparse DDP hook
            run per bucket (None: the algorithm runs through ``build`` or ``ddp_hook``).
        options: a frozen dataclass of the algorithm's own settings, validated in its
            ``__post_init__`` (a training phase carries one: ``PhaseConfig.options``).
        cost: its cost formula ``cost(c, m, n, d, b, bi, rho, share, allgather)``, which adds
            its terms to the coefficients ``c`` of :mod:`comm.cost_model` (None: not priced).
        auto: a candidate of ``--comm auto`` (NOTE [auto exchange] in comm/auto.py); it
            needs a ``cost``.
        build: ``build(model, topology, options, *, probe, layout, **engine) -> (exchanger,
            layout)`` for an algorithm that lays out its own buckets (OMGS): a
            :class:`comm.GradientExchanger` and the layout that rebuilds it on resume.
        ddp_hook: ``ddp_hook(ddp_model, options) -> hook state`` for an algorithm that runs
            only as a DDP comm hook (PowerSGD).
        per_rank_streams: its inter-node phase runs one stream per local rank at once
            (``2dtar``, ``hitopk``), so a node's link carries ``local_size`` concurrent
            streams; the others send one stream per node. A link that caps each stream
            (NOTE [library efficiency] in comm/step_model.py) slows the others more.
        density, lr_scaled_residuals: a sparse algorithm's training defaults, what a
            training phase (``trainer.config.PhaseConfig``) uses where its recipe and flags
            leave these unset: its density (``DEFAULT_DENSITY``) and whether its residuals
            follow the learning rate (NOTE [residuals follow the learning rate] in
            comm/collectives/base.py; off). ``gtopk`` sets both (NOTE [gtopk's training
            defaults] in comm/collectives/gtopk.py). The library's exchangers take no
            default: they are given a density.

    Raises:
        ValueError: for an empty name, options that are not a frozen dataclass, not
            exactly one way to run, an ``auto`` candidate without a cost formula, or a
            density outside (0, 1].
    """

    name: str
    sparse: bool
    exchanger: type | None = None
    options: type = NoOptions
    cost: Callable | None = None
    auto: bool = False
    build: Callable | None = None
    ddp_hook: Callable | None = None
    per_rank_streams: bool = False
    density: float = DEFAULT_DENSITY
    lr_scaled_residuals: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"an algorithm needs a non-empty name; got {self.name!r}")
        if not (dataclasses.is_dataclass(self.options) and self.options.__dataclass_params__.frozen):
            raise ValueError(f"algorithm {self.name}: options must be a frozen dataclass; got {self.options!r}")
        if sum(x is not None for x in (self.exchanger, self.build, self.ddp_hook)) != 1:
            raise ValueError(f"algorithm {self.name}: give exactly one of exchanger, build and ddp_hook")
        if self.exchanger is not None and bool(self.exchanger.sparse) != bool(self.sparse):
            raise ValueError(f"algorithm {self.name}: sparse={self.sparse} but {self.exchanger.__name__} "
                             f"says sparse={self.exchanger.sparse}")
        if self.auto and self.cost is None:
            raise ValueError(f"algorithm {self.name}: an --comm auto candidate needs a cost formula")
        if not 0 < self.density <= 1:
            raise ValueError(f"algorithm {self.name}: density must be in (0, 1]; got {self.density}")

    @classmethod
    def of(cls, exchanger: type, **kw) -> Algorithm:
        """The algorithm that runs ``exchanger`` per bucket, named and sparse as the class says."""
        return cls(exchanger.name, exchanger.sparse, exchanger=exchanger, **kw)

    @property
    def inside_ddp(self) -> bool:
        """Whether it runs only as a DDP comm hook (the trainer wraps the model in DDP for it)."""
        return self.ddp_hook is not None

    def make_options(self, **values) -> object:
        """Its options from ``values`` (field -> value), validated.

        Raises:
            ValueError: for a field the options do not have (lists those they do) or a bad value.
        """
        fields = [f.name for f in dataclasses.fields(self.options)]
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"algorithm {self.name} has no option(s) {unknown}; valid: {fields}")
        return self.options(**values)
