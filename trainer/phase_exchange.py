"""Opening and switching a phase's gradient exchange on a training run (``trainer.loop``).

A phase opens its exchange when it starts; ``--comm auto`` switches it once more inside
the phase, after its first steps (NOTE [auto exchange] in comm/auto.py). Both go through
:func:`open_exchange`: what the old exchange still owes is carried into the new one
(NOTE [residual at a phase switch] in comm/engine_residuals.py) and the optimiser's momentum moves
into or out of the exchange with momentum correction (NOTE [momentum correction] in
comm/residual.py).
"""
from __future__ import annotations

import dataclasses

from comm.registry import get_algorithm
from trainer.exchange import build_exchange, saved_residuals
from trainer.omgs_probe import probing
from trainer.optim import decay_of, exchange_momentum, take_momentum
from trainer.schedules import density_at, lr_at

__all__ = ["is_sparse", "carried_residuals", "open_exchange", "follow_schedules"]

_SPANS = ("warmup_epochs", "warmup_steps")  # resolved in steps (NOTE [warm-ups in steps])


def is_sparse(run, comm: str) -> bool:
    """Whether ``comm`` runs a sparse exchange of the comm engine on ``run`` (DGC's techniques apply)."""
    return get_algorithm(comm).sparse and run.world > 1 and not run.cfg.ddp


def carried_residuals(run, index: int) -> dict:
    """What the exchange before phase ``index`` still owes, per parameter: the open
    exchange's (closed here), or a checkpoint's of an earlier phase when resuming."""
    if run.exchanger is not None:
        carry = run.exchanger.take_residuals()
        run.exchanger.close()
        run.exchanger = None
        return carry
    if run.local is None or run.local["phase"] == index or run.cfg.ddp:
        return {}
    before = run.recipe.phases[run.local["phase"]]
    comm = run.local.get("comm", before.comm)
    correction = run.recipe.correction_of(before, is_sparse(run, comm))
    return saved_residuals(before, run.model, run.topology, run.local["exchanger"], momentum=correction, comm=comm)


def open_exchange(run, index: int, phase, comm: str, carry: dict) -> None:
    """Open ``comm``'s exchange for ``phase`` on ``run`` (``run.exchanger``, ``run.comm``)
    and hand it ``carry``."""
    sparse = is_sparse(run, comm)
    momentum = run.recipe.correction_of(phase, sparse)
    if bool(momentum) != bool(run.optimizer.param_groups[0].get("momentum_in_grad")):
        for p, t in take_momentum(run.optimizer).items():  # NOTE [momentum correction] in comm/residual.py
            carry[p] = carry[p] + t if p in carry else t
    exchange_momentum(run.optimizer, bool(momentum))
    saved = run.local["exchanger"].get("layout") if run.local and run.local["phase"] == index else None

    def probe():  # a batch of the phase's shape for an algorithm that profiles backward (OMGS)
        return probing(run.model, run.optimizer, run.criterion, run.autocast, batch_size=phase.batch_size,
                       size=phase.size, num_classes=run.identity["num_classes"], seed=run.recipe.train.seed,
                       device=run.device)

    run.exchanger = build_exchange(comm, run.model, run.topology, phase, ddp=run.cfg.ddp, overlap=run.scaler is None,
                                   pipeline=run.recipe.train.pipeline_exchange, probing=probe, layout=saved,
                                   momentum=momentum, weight_decay=decay_of(run.optimizer) if momentum else None,
                                   clip_norm=run.recipe.local_clip_of(phase, sparse), carry=bool(carry))
    run.comm = comm
    run.exchanger.carry_in(carry)


def _lr_at(run, position: float) -> float:
    schedule = {k: v for k, v in dataclasses.asdict(run.recipe.schedule).items() if k not in _SPANS}
    return lr_at(position, lr=run.peak, total_epochs=run.recipe.total_epochs, warmup_epochs=run.lr_warmup_epochs,
                 **schedule)


def follow_schedules(run, phase, done: int) -> float:
    """Before step ``done`` of ``run``'s epoch: the learning rate into the optimiser and, on a
    sparse exchange, its density (warm-up) and its residuals rescaled to the new rate
    (NOTE [residuals follow the learning rate] in comm/collectives/base.py, with
    ``phase.residuals_follow_lr``). Returns the step's density (1 when not sparse)."""
    position = run.epoch + done / run.steps_per_epoch
    lr = _lr_at(run, position)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    if not get_algorithm(run.comm).sparse:
        return 1.0
    start = run.recipe.phase_start(run.phase_index)
    previous = position - 1 / run.steps_per_epoch  # the phase's first step has no earlier rate
    if phase.residuals_follow_lr and previous >= start and lr > 0:
        lr_previous = _lr_at(run, previous)
        if lr_previous > 0 and lr_previous != lr:  # a step at rate 0 keeps the residual as it is
            run.exchanger.rescale_residuals(lr_previous / lr)
    density = density_at((run.epoch - start) * run.steps_per_epoch + done, density=phase.sparse_density,
                         warmup_steps=run.density_warmup, schedule=phase.density_schedule,
                         steps_per_epoch=run.steps_per_epoch)
    run.exchanger.set_density(density)
    return density
