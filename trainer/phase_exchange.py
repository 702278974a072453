"""Opening and switching a phase's gradient exchange on a training run (``trainer.loop``).

A phase opens its exchange when it starts; ``--comm auto`` switches it once more inside
the phase, after its first steps (NOTE [auto exchange] in comm/auto.py). Both go through
:func:`open_exchange`: what the old exchange still owes is carried into the new one
(NOTE [residual at a phase switch] in comm/engine.py) and the optimiser's momentum moves
into or out of the exchange with momentum correction (NOTE [momentum correction] in
comm/residual.py).
"""
from __future__ import annotations

from trainer.config import DDP_COMMS, SPARSE_COMMS
from trainer.exchange import build_ddp_exchange, build_exchange, saved_residuals
from trainer.omgs_probe import probing
from trainer.optim import decay_of, exchange_momentum, take_momentum

__all__ = ["is_sparse", "carried_residuals", "open_exchange"]


def is_sparse(run, comm: str) -> bool:
    """Whether ``comm`` runs a sparse exchange of the comm engine on ``run`` (DGC's techniques apply)."""
    return comm in SPARSE_COMMS and run.world > 1 and not run.cfg.ddp


def carried_residuals(run, index: int) -> dict:
    """What the exchange before phase ``index`` still owes, per parameter: the open
    exchanger's (closed here), or a checkpoint's of an earlier phase when resuming."""
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
    """Build ``comm``'s exchanger for ``phase`` on ``run`` (``run.exchanger``,
    ``run.forward_model``, ``run.comm``) and hand it ``carry``."""
    momentum = run.recipe.correction_of(phase, is_sparse(run, comm))
    if bool(momentum) != bool(run.optimizer.param_groups[0].get("momentum_in_grad")):
        for p, t in take_momentum(run.optimizer).items():  # NOTE [momentum correction] in comm/residual.py
            carry[p] = carry[p] + t if p in carry else t
    exchange_momentum(run.optimizer, bool(momentum))
    if (run.cfg.ddp or comm in DDP_COMMS) and run.world > 1:
        run.exchanger = build_ddp_exchange(comm, run.model, run.topology, density=phase.density,
                                           selector=phase.selector, carry=bool(carry),
                                           powersgd_rank=phase.powersgd_rank)
        run.forward_model = run.exchanger.module
    else:
        saved = run.local["exchanger"].get("layout") if run.local and run.local["phase"] == index else None
        with probing(run.model, run.optimizer, run.criterion, run.autocast, batch_size=phase.batch_size,
                     size=phase.size, num_classes=run.identity["num_classes"], seed=run.recipe.train.seed,
                     device=run.device) as probe:
            run.exchanger = build_exchange(comm, run.model, run.topology, density=phase.density,
                                           selector=phase.selector, overlap=run.scaler is None,
                                           pipeline=run.recipe.train.pipeline_exchange,
                                           hybrid_bytes=phase.hybrid_bytes, layout=saved,
                                           probe=probe if phase.omgs_plan == "auto" else None,
                                           momentum=momentum, masking=phase.momentum_masking,
                                           weight_decay=decay_of(run.optimizer) if momentum else None,
                                           clip_norm=run.recipe.local_clip_of(phase, is_sparse(run, comm)),
                                           dense_vectors=phase.dense_vectors)
        run.forward_model = run.model
    run.comm = comm
    run.exchanger.carry_in(carry)
