"""Frozen, validated configuration sections of a training recipe.

A recipe (``trainer/recipes/*.yaml``) has the sections ``model``, ``optim``,
``schedule``, ``train`` and a list of ``phases``; each maps onto one dataclass here.
Every dataclass checks itself in ``__post_init__`` and raises ``ValueError`` with a
message that says which field to fix.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from comm.algorithm import DEFAULT_DENSITY, NoOptions
from comm.registry import ALGORITHMS, DENSE, get_algorithm, names
from comm.topk import SELECTORS
from trainer.schedules import check_warmup_span
from loaders.locality import DEFAULT_EXCHANGE_FRACTION, LOCALITIES

__all__ = ["AUTO", "AMP_MODES", "ModelConfig", "OptimConfig", "ScheduleConfig", "PhaseConfig", "TrainConfig", "Recipe",
           "comm_choices", "option_keys"]

# A phase's ``comm`` is a name in comm's registry (comm.registry), or ``auto``, which picks
# one per phase from the registered candidates (NOTE [auto exchange] in comm/auto.py);
# validated here so a typo in a recipe fails before any process starts.
AUTO = "auto"
AMP_MODES = ("off", "bf16", "fp16")
OPTIMIZERS = ("sgd", "lars")


def comm_choices() -> list[str]:
    """What a phase's ``comm`` (``--comm``) may be: every registered algorithm, and ``auto``."""
    return names() + [AUTO]


def option_keys() -> dict[str, tuple[str, dataclasses.Field]]:
    """Recipe key -> (algorithm, options field) of every registered algorithm's options.

    NOTE [algorithm options in a recipe]: a phase carries its algorithm's options object
    (``PhaseConfig.options``, the algorithm's own dataclass); a recipe writes its field
    ``f`` of algorithm ``a`` flat in the phase as ``a_f`` (``powersgd_rank: 4``, ``omgs_plan:
    lags``), so ``--set phases.0.powersgd_rank=4`` and the recipes written before the
    options objects keep working. Keys of another algorithm than the phase's are accepted
    and ignored, so switching a phase's ``comm`` (``--comm``) never trips over them.
    """
    return {f"{name}_{f.name}": (name, f) for name, a in ALGORITHMS.items() for f in dataclasses.fields(a.options)}


def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


@dataclass(frozen=True)
class ModelConfig:
    """``name`` from ``trainer.models.MODELS``; ``num_classes`` 0 = taken from the data."""

    name: str = "resnet50"
    num_classes: int = 0
    zero_init_residual: bool = False

    def __post_init__(self):
        from trainer.models import MODELS

        _need(self.name in MODELS, f"model.name {self.name!r} is unknown; valid: {sorted(MODELS)}")
        _need(self.num_classes >= 0, f"model.num_classes must be >= 0 (0 = from the data); got {self.num_classes}")


@dataclass(frozen=True)
class OptimConfig:
    """Optimiser: ``sgd`` (momentum) or ``lars``; ``lr`` is the peak rate per 256 images
    when ``scale_lr`` is true (scaled linearly by the global batch), else absolute.

    ``clip_norm``: gradient-norm clipping threshold (0 = no clipping). Dense phases clip
    the averaged gradient before the step; sparse phases with ``local_clipping`` clip each
    worker's gradient to ``clip_norm / sqrt(world size)`` before it enters the residual
    (NOTE [local update] in comm/local_update.py)."""

    name: str = "sgd"
    lr: float = 0.1
    scale_lr: bool = True
    momentum: float = 0.9
    weight_decay: float = 1e-4
    eta: float = 0.001
    label_smoothing: float = 0.0
    pto: bool = True
    clip_norm: float = 0.0

    def __post_init__(self):
        _need(self.name in OPTIMIZERS, f"optim.name {self.name!r} is unknown; valid: {list(OPTIMIZERS)}")
        _need(self.lr > 0, f"optim.lr must be > 0; got {self.lr}")
        _need(0 <= self.momentum < 1, f"optim.momentum must be in [0, 1); got {self.momentum}")
        _need(self.weight_decay >= 0, f"optim.weight_decay must be >= 0; got {self.weight_decay}")
        _need(self.eta > 0, f"optim.eta must be > 0; got {self.eta}")
        _need(0 <= self.label_smoothing < 1, f"optim.label_smoothing must be in [0, 1); got {self.label_smoothing}")
        _need(self.clip_norm >= 0, f"optim.clip_norm must be >= 0 (0 = no clipping); got {self.clip_norm}")


@dataclass(frozen=True)
class ScheduleConfig:
    """Warm-up then decay (see ``trainer.schedules.lr_at``): the linear warm-up lasts
    ``warmup_epochs`` or ``warmup_steps`` (one of them; none: no warm-up; NOTE [warm-ups
    in steps] in trainer/schedules.py)."""

    warmup_epochs: float | None = None
    warmup_steps: int | None = None
    warmup_start: float = 0.0
    decay: str = "cosine"
    final_lr: float = 0.0
    power: float = 2.0
    milestones: tuple[float, ...] = ()
    gamma: float = 0.1

    def __post_init__(self):
        from trainer.schedules import DECAYS

        object.__setattr__(self, "milestones", tuple(float(m) for m in self.milestones))
        _need(self.decay in DECAYS, f"schedule.decay {self.decay!r} is unknown; valid: {sorted(DECAYS)}")
        check_warmup_span("schedule.", "warmup", self.warmup_epochs, self.warmup_steps, float("inf"))
        _need(0 <= self.warmup_start <= 1, f"schedule.warmup_start must be in [0, 1]; got {self.warmup_start}")
        _need(self.final_lr >= 0, f"schedule.final_lr must be >= 0; got {self.final_lr}")
        _need(self.power > 0, f"schedule.power must be > 0; got {self.power}")
        _need(0 < self.gamma <= 1, f"schedule.gamma must be in (0, 1]; got {self.gamma}")


@dataclass(frozen=True)
class PhaseConfig:
    """A run of epochs at one image size, per-worker batch size and exchange algorithm.

    ``hybrid_bytes``: fused gradient buckets smaller than this use the dense ``hier``
    all-reduce whatever ``comm`` says (Jizhi's hybrid choice by size); 0 sends every
    bucket with ``comm``. ``options``: the options object of ``comm``'s algorithm
    (``comm.Algorithm.options``; None: its defaults), as ``comm.omgs.exchange.OMGSOptions``
    (``plan``: ``auto`` profiles backward and plans merged layers at the start of the phase,
    ``lags`` keeps every layer alone) or ``comm.powersgd.PowerSGDOptions`` (``rank``); a
    recipe writes them flat (``omgs_plan``, ``powersgd_rank``: NOTE [algorithm options in a
    recipe]).
    ``cache_size``: shorter side of the cached samples
    this phase reads (0 = ``train.cache_size``); see NOTE [cache size per phase].

    ``density`` (None: the algorithm's own, :attr:`sparse_density`).
    Sparse exchanges (``comm.registry.names(sparse=True)``; not under ``--ddp``)
    take Deep Gradient Compression's techniques, each switchable for ablation:
    ``momentum_correction`` (the residual accumulates the momentum-corrected update and
    the optimiser applies it without momentum; NOTE [momentum correction] in
    comm/residual.py), ``momentum_masking`` (clear the momentum of sent entries; off by
    default, NOTE [momentum masking] in comm/residual.py), ``lr_scaled_residuals``
    (rescale the residuals by ``lr_prev / lr`` when the rate changes, so that each gradient
    is applied at its own rate, as EF-SGD; NOTE [residuals follow the learning rate] in
    comm/collectives/base.py; unset: the algorithm's default, on for ``gtopk`` only),
    ``local_clipping`` (with ``optim.clip_norm``: clip before accumulation),
    ``dense_vectors`` (parameters of at most one dimension travel densely, NOTE [dense
    vectors] in comm/plans/size.py) and density
    warm-up: the density decays exponentially per step from 25 % at the phase's start to
    ``density`` over ``density_warmup_steps`` steps, or ``density_warmup_epochs`` epochs
    (fractional allowed; 0: none), or, when neither is given, over a share of the phase
    with a floor in steps (NOTE [warm-ups in steps] in trainer/schedules.py); or
    ``density_schedule`` lists the density of each epoch of the phase explicitly (then
    ``density``); see ``trainer.schedules.density_at``.
    """

    epochs: int = 1
    size: int = 224
    batch_size: int = 256
    comm: str = DENSE
    density: float | None = None
    selector: str = "mstopk"
    hybrid_bytes: int = 2**20
    cache_size: int = 0
    momentum_correction: bool = True
    momentum_masking: bool = False
    lr_scaled_residuals: bool | None = None
    local_clipping: bool = True
    dense_vectors: bool = True
    density_warmup_epochs: float | None = None
    density_warmup_steps: int | None = None
    density_schedule: tuple[float, ...] = ()
    options: object = None

    def __post_init__(self):
        object.__setattr__(self, "density_schedule", tuple(self.density_schedule))
        _need(all(isinstance(d, (int, float)) and not isinstance(d, bool) and 0 < d <= 1
                  for d in self.density_schedule),
              f"phase density_schedule must list densities in (0, 1], one per epoch; got {list(self.density_schedule)}")
        check_warmup_span("phase ", "density_warmup", self.density_warmup_epochs, self.density_warmup_steps,
                          self.epochs)
        _need(not (self.density_schedule and (self.density_warmup_epochs or self.density_warmup_steps)),
              "phase density_schedule and density_warmup_epochs/density_warmup_steps exclude each other; set one")
        _need(len(self.density_schedule) <= self.epochs,
              f"phase density_schedule lists {len(self.density_schedule)} epochs but the phase has {self.epochs}")
        _need(self.epochs >= 1, f"phase epochs must be >= 1; got {self.epochs}")
        _need(16 <= self.size <= 1024, f"phase size must be in [16, 1024] px; got {self.size}")
        _need(self.cache_size == 0 or self.cache_size >= self.size,
              f"phase cache_size must be 0 (train.cache_size) or >= the phase's size ({self.size} px), "
              f"or every crop is upscaled; got {self.cache_size}")
        _need(self.batch_size >= 1, f"phase batch_size must be >= 1; got {self.batch_size}")
        _need(self.comm in comm_choices(), f"phase comm {self.comm!r} is unknown; valid: {comm_choices()}")
        kind = NoOptions if self.comm == AUTO else get_algorithm(self.comm).options
        object.__setattr__(self, "options", kind() if self.options is None else self.options)
        _need(isinstance(self.options, kind),
              f"phase options of comm {self.comm} must be {kind.__name__}; got {type(self.options).__name__}")
        _need(self.density is None or 0 < self.density <= 1, f"phase density must be in (0, 1]; got {self.density}")
        _need(self.hybrid_bytes >= 0, f"phase hybrid_bytes must be >= 0; got {self.hybrid_bytes}")
        _need(self.selector in SELECTORS, f"phase selector {self.selector!r} is unknown; valid: {sorted(SELECTORS)}")

    @property
    def sparse_density(self) -> float:
        """The density the sparse exchange settles at: ``density``, or where unset the
        algorithm's training default (``comm.Algorithm.density``: 0.01, ``gtopk`` 0.02; NOTE
        [gtopk's training defaults] in comm/collectives/gtopk.py; ``auto`` 0.01)."""
        return self.density if self.density is not None else self._default("density", DEFAULT_DENSITY)

    @property
    def residuals_follow_lr(self) -> bool:
        """``lr_scaled_residuals``, or where unset the algorithm's default (off; ``gtopk`` on)."""
        chosen = self.lr_scaled_residuals
        return chosen if chosen is not None else self._default("lr_scaled_residuals", False)

    def _default(self, name: str, fallback):
        return getattr(ALGORITHMS[self.comm], name) if self.comm in ALGORITHMS else fallback


@dataclass(frozen=True)
class TrainConfig:
    """Precision, memory format, seed, evaluation, cache and data-locality settings.

    ``locality``: ``global`` shuffles over the whole dataset; ``node`` makes the ranks of a
    node draw the samples held by their node's Redis, with ``exchange_fraction`` of them
    dealt across nodes each epoch (NOTE [node-local order] in ``loaders.locality``).

    ``pipeline_exchange``: each step's gradient exchange runs on during the next step's
    forward and backward and is applied one step late (NOTE [pipelined exchange] in
    ``comm/engine.py``): it hides an exchange as long as a step, at the price of one step
    of staleness, softened by computing each step's gradients at the weights the step in
    flight will lead to (NOTE [lookahead] in ``trainer/lookahead.py``). Not with fp16 loss
    scaling nor exchanges inside DDP (``powersgd``, ``--ddp``).
    """

    amp: str = "bf16"
    channels_last: bool = True
    seed: int = 0
    eval_size: int = 0  # 0 = the last phase's size
    eval_batch_size: int = 0  # 0 = the phase's batch size
    cache_size: int = 256
    workers: int = 4
    locality: str = "global"
    exchange_fraction: float = DEFAULT_EXCHANGE_FRACTION
    pipeline_exchange: bool = False

    def __post_init__(self):
        _need(self.amp in AMP_MODES, f"train.amp {self.amp!r} is unknown; valid: {list(AMP_MODES)}")
        _need(0 <= self.seed < 2**32, f"train.seed (--seed) must be in [0, 2**32 - 1]; got {self.seed}")
        _need(self.eval_size == 0 or 16 <= self.eval_size <= 1024,
              f"train.eval_size must be 0 or in [16, 1024]; got {self.eval_size}")
        _need(self.eval_batch_size >= 0, f"train.eval_batch_size must be >= 0; got {self.eval_batch_size}")
        _need(self.cache_size >= 16, f"train.cache_size must be >= 16; got {self.cache_size}")
        _need(self.workers >= 0, f"train.workers must be >= 0; got {self.workers}")
        _need(self.locality in LOCALITIES, f"train.locality {self.locality!r} is unknown; valid: {list(LOCALITIES)}")
        _need(0 <= self.exchange_fraction <= 1,
              f"train.exchange_fraction (--exchange-fraction) must be in [0, 1]; got {self.exchange_fraction}")
        _need(not (self.pipeline_exchange and self.amp == "fp16"),
              "train.pipeline_exchange (--pipeline-exchange) needs train.amp bf16 or off: fp16 loss scaling checks "
              "each step's gradients for overflow before they are exchanged")


@dataclass(frozen=True)
class Recipe:
    """A whole training recipe: its sections and its phases in order."""

    name: str
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    phases: tuple[PhaseConfig, ...] = (PhaseConfig(),)

    def __post_init__(self):
        object.__setattr__(self, "phases", tuple(self.phases))
        _need(len(self.phases) >= 1, f"recipe {self.name!r} needs at least one phase")
        _need((self.schedule.warmup_epochs or 0) <= self.total_epochs,
              f"schedule.warmup_epochs ({self.schedule.warmup_epochs}) must not exceed the total epochs "
              f"({self.total_epochs}); lower it (--set schedule.warmup_epochs=N) or train longer")
        _need(max(self.schedule.milestones, default=0) <= self.total_epochs,
              f"schedule.milestones must lie within the {self.total_epochs} epochs; got {list(self.schedule.milestones)}")
        inside_ddp = [f"phases[{i}]" for i, p in enumerate(self.phases) if p.comm != AUTO
                      and get_algorithm(p.comm).inside_ddp]
        _need(not (self.train.pipeline_exchange and inside_ddp),
              f"train.pipeline_exchange (--pipeline-exchange) pipelines the comm engine's exchange; "
              f"{', '.join(inside_ddp)} exchange inside DDP's backward "
              f"({', '.join(n for n in names() if get_algorithm(n).inside_ddp)}): drop one of them")

    @property
    def total_epochs(self) -> int:
        return sum(p.epochs for p in self.phases)

    def cache_size_of(self, phase: PhaseConfig) -> int:
        """Shorter side of the cached samples ``phase`` reads.

        NOTE [cache size per phase]: random-resized crops are taken after the cache, so a
        phase that trains at 96 or 128 px can read a cache whose shorter side is 128
        instead of 320: a quarter or less of the L2 memory and of the bytes per sample read
        (over the network when the shard is on another node). Its crops are upscaled about
        as much as 224 px crops of a 256 px cache, the usual ImageNet setting. Each size
        has its own L2 namespace (``<prefix>:<fingerprint>:<size>:``), so the phases'
        caches coexist; ``cachepipe warmup --cache-size`` takes the list of
        :attr:`cache_sizes`.
        """
        return phase.cache_size or self.train.cache_size

    @property
    def cache_sizes(self) -> tuple[int, ...]:
        """Every cached size the recipe reads, smallest first (the phases', and
        ``train.cache_size`` for evaluation)."""
        return tuple(sorted({self.cache_size_of(p) for p in self.phases} | {self.train.cache_size}))

    def phase_start(self, index: int) -> int:
        """The 0-based epoch at which phase ``index`` starts."""
        return sum(p.epochs for p in self.phases[:index])

    def correction_of(self, phase: PhaseConfig, sparse: bool) -> float:
        """The momentum correction factor of ``phase``'s exchange when it runs ``sparse``
        (0: the optimiser keeps its momentum; NOTE [momentum correction] in comm/residual.py)."""
        return self.optim.momentum if sparse and phase.momentum_correction else 0.0

    def local_clip_of(self, phase: PhaseConfig, sparse: bool) -> float:
        """``optim.clip_norm`` when ``phase``'s exchange runs ``sparse`` and clips locally
        (NOTE [local update] in comm/local_update.py), else 0."""
        return self.optim.clip_norm if sparse and phase.local_clipping else 0.0

    def phase_of(self, epoch: int) -> tuple[int, PhaseConfig]:
        """Return ``(index, phase)`` that trains 0-based ``epoch``."""
        end = 0
        for i, p in enumerate(self.phases):
            end += p.epochs
            if epoch < end:
                return i, p
        return len(self.phases) - 1, self.phases[-1]

    def to_dict(self) -> dict:
        """The recipe as YAML would write it: each phase's options flat (NOTE [algorithm
        options in a recipe])."""
        data = dataclasses.asdict(self)
        for phase, row in zip(self.phases, data["phases"]):
            del row["options"]
            row.update({f"{phase.comm}_{k}": v for k, v in dataclasses.asdict(phase.options).items()})
        return data
