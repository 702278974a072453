"""The training loop of one rank: phases, epochs, steps, evaluation, checkpoints, metrics.

Per step: wait for the batch (``data``), forward + backward under autocast
(``compute``), exchange gradients with the phase's algorithm (``compress`` +
``communicate``), LARS / SGD step (``update``). The learning rate follows the recipe's
schedule at fractional epochs; phases change image size, batch size and algorithm.
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from comm.topk.checks import NonFiniteInput
from trainer import models
from trainer.checkpoint import Checkpoints, rng_state, set_rng_state
from trainer.data import LoaderSpec, check_data_root, loader_workers, make_loader
from trainer.divergence import checked_loss, diverged
from trainer.distributed import (all_sum, all_true, broadcast_buffers, broadcast_model, loader_counts, pick_device,
                                 world)
from trainer.evaluate import evaluate
from trainer.auto_exchange import after_step, start_phase
from trainer.exchange import topology_for
from trainer.lookahead import look_ahead
from trainer.metrics import MetricsLog, TimeBreakdown, epoch_row, fresh_accum
from trainer.optim import autocast_for, build_optimizer, make_scaler, peak_lr
from trainer.phase_exchange import carried_residuals, follow_schedules, is_sparse, open_exchange
from trainer.progress import epoch_bar
from trainer.run_config import RunConfig
from trainer.run_dir import prepare_out_together
from trainer.schedules import phase_warmups

__all__ = ["train", "run_rank"]



class _Run:
    """State of one rank's run (kept on an object so the step code stays short)."""

    def __init__(self, cfg: RunConfig):
        self.cfg, self.recipe = cfg, cfg.recipe
        self.rank, self.world = world()
        self.device = pick_device(cfg.device)
        r = self.recipe
        num_classes = check_data_root(cfg.data) if r.model.num_classes == 0 else r.model.num_classes
        torch.manual_seed(r.train.seed)
        random.seed(r.train.seed)
        np.random.seed(r.train.seed)
        self.topology = topology_for(self.world, cfg.nodes, cfg.local_size)
        self.model = models.create(r.model.name, num_classes, r.model.zero_init_residual).to(self.device)
        self.channels_last = r.train.channels_last and self.device.type == "cuda"
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        broadcast_model(self.model)
        self.optimizer = build_optimizer(r.optim, self.model, self.device)
        self.scaler = make_scaler(r.train.amp, self.device)
        self.autocast = autocast_for(r.train.amp, self.device)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=r.optim.label_smoothing)
        workers = loader_workers(r.train.workers, cfg.ranks_per_machine or _local_world(self.world))
        self.spec = LoaderSpec(kind=cfg.loader, root=cfg.data, rank=self.rank, world_size=self.world,
                               seed=r.train.seed, cache=cfg.cache, cache_size=r.train.cache_size, workers=workers,
                               device=str(self.device), locality=r.train.locality,
                               exchange_fraction=r.train.exchange_fraction, local_size=self.topology.local_size,
                               on_error=cfg.on_error)
        self.phase_index, self.loader, self.exchanger, self.val_loader = -1, None, None, None
        self.comm, self.auto = None, None  # the exchange running now; ``comm: auto``'s chooser
        self.cache_seen: dict[str, float] = {}
        self.epoch, self.global_step, self.accum = 0, 0, fresh_accum()
        self.identity = {"model_name": r.model.name, "num_classes": num_classes, "recipe": r.name,
                         "world_size": self.world, "topology": [self.topology.nodes, self.topology.local_size]}
        self.local = None
        nccl = self.device if self.device.type == "cuda" else None
        prepare_out_together(cfg.out, resume=cfg.resume, overwrite=cfg.overwrite, rank=self.rank,
                             device=nccl)  # NOTE [refusing a used --out]
        self.checkpoints = Checkpoints(cfg.out, self.rank, nccl)
        if cfg.resume:  # before any loader starts, so a mismatch is the only thing said
            self._resume(Checkpoints(cfg.resume, self.rank, nccl))
        last = r.phases[-1]
        self.val_loader = make_loader(self.spec, train=False, batch_size=r.train.eval_batch_size or last.batch_size,
                                      size=r.train.eval_size or last.size)
        self.log = MetricsLog(Path(cfg.out) / "metrics.jsonl", self.epoch) if self.rank == 0 else None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _enter_phase(self, epoch: int) -> None:
        index, phase = self.recipe.phase_of(epoch)
        if index == self.phase_index:
            return
        self.phase_index = index
        carry = carried_residuals(self, index)  # NOTE [residual at a phase switch] in comm/engine_residuals.py
        if self.loader is not None and hasattr(self.loader, "close"):
            self.loader.close()
        # the old phase's loader (its workers, dataset and buffers) is freed before the next one is
        # built, so a phase switch never holds two of them
        self.loader = None
        self.loader = make_loader(self.spec, train=True, batch_size=phase.batch_size, size=phase.size,
                                  cache_size=self.recipe.cache_size_of(phase))
        self.cache_seen = loader_counts(self.loader)
        self.steps_per_epoch = len(self.loader)  # NOTE [warm-ups in steps] in trainer/schedules.py
        self.density_warmup, self.lr_warmup_epochs = phase_warmups(self.recipe, index, self.steps_per_epoch)
        comm = start_phase(self, index, phase)  # the phase's comm, or auto's first (NOTE [auto exchange])
        open_exchange(self, index, phase, comm, carry)
        self.peak = peak_lr(self.recipe.optim, phase.batch_size * self.world)

    def _resume(self, checkpoints: Checkpoints) -> None:
        shared, local = checkpoints.load(self.identity)
        self.cfg.accept_resume(shared.get("settings"), announce=self.rank == 0)
        self.model.load_state_dict(shared["model"])
        self.optimizer.load_state_dict(shared["optimizer"])
        if self.scaler is not None and shared.get("scaler"):
            self.scaler.load_state_dict(shared["scaler"])
        self.epoch, self.global_step, self.accum = shared["epoch"], shared["step"], local["accum"]
        self.checkpoints.generation = checkpoints.generation
        self.local = local

    def _checkpoint(self) -> None:
        shared = dict(self.identity, model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
                      scaler=self.scaler.state_dict() if self.scaler else None, epoch=self.epoch,
                      step=self.global_step, settings=self.cfg.settings())
        local = {"exchanger": self.exchanger.state_dict(), "phase": self.phase_index, "accum": self.accum,
                 "comm": self.comm, "auto_decided": self.auto is not None and self.auto.decided is not None,
                 "loader": self.loader.state_dict(), "rng": rng_state()}
        self.checkpoints.save(shared, local)

    def _step(self, images, labels, done: int, times: TimeBreakdown) -> float:
        phase = self.recipe.phases[self.phase_index]
        density = follow_schedules(self, phase, done)
        self.accum["density_sum"] = self.accum.get("density_sum", 0.0) + density
        stash = None
        if self.recipe.train.pipeline_exchange:  # timed only then: a part syncs CUDA
            with times.part("update"):
                stash = look_ahead(self, phase)
        with times.part("compute"):
            images, labels = images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)
            if self.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            with self.autocast():
                loss = self.criterion(self.exchanger.module(images), labels)
            # NOTE [a diverged run stops]: before backward starts any exchange
            value = None if self.scaler else checked_loss(loss, self.epoch, self.global_step + 1)
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        if stash is not None:
            with times.part("update"):
                stash.restore()
        # NOTE [skipped steps keep residuals clean]: with fp16 the gradients are unscaled
        # before the exchange and all ranks agree on finiteness first; a step with an
        # inf/NaN anywhere skips the exchange, so error-feedback residuals never see it.
        finite, applied = True, True
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
            local_ok = all(bool(torch.isfinite(p.grad).all()) for p in self.model.parameters() if p.grad is not None)
            finite = all_true(local_ok, self.device)
        if finite:
            start = time.perf_counter()
            applied = self.exchanger.synchronize()  # False: a pipelined exchange's first step
            self._sync()
            times.add_exchange(time.perf_counter() - start, self.exchanger.last_timings)
        self.accum["inter_node_bytes"] = self.accum.get("inter_node_bytes", 0) + self.exchanger.take_inter_node_bytes()
        with times.part("update"):
            self._update(phase, finite, applied)
        return float(loss.detach()) if value is None else value

    def _update(self, phase, finite: bool, applied: bool = True) -> None:
        """The optimiser step on the exchanged ``p.grad`` (none when not ``applied``), then zero them."""
        clip = self.recipe.optim.clip_norm
        clipped_locally = self.recipe.local_clip_of(phase, is_sparse(self, self.comm))  # before the exchange
        if finite and applied and clip and not clipped_locally:
            nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        if self.scaler is not None:
            if finite:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.scaler.update(self.scaler.get_scale() * self.scaler.get_backoff_factor())
        elif applied:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _drain(self, times: TimeBreakdown) -> None:
        """NOTE [pipelined exchange] in comm/engine.py: at the end of an epoch the exchange
        still in flight is finished and applied, so evaluations and phase switches see every
        gradient applied (mid-epoch checkpoints save it instead)."""
        start = time.perf_counter()
        flushed = self.exchanger.flush()
        self._sync()
        times.add("communicate", time.perf_counter() - start)
        if flushed:
            with times.part("update"):
                self._update(self.recipe.phases[self.phase_index], True)
        self.accum["seconds"] += time.perf_counter() - start
        self.accum["breakdown"] = times.state_dict()

    def close(self) -> None:
        """Release loader workers, cache connections and exchanger hooks."""
        for loader in (self.loader, self.val_loader):
            if loader is not None and hasattr(loader, "close"):
                loader.close()
        if self.exchanger is not None:
            self.exchanger.close()

    def run_epoch(self, on_step=None) -> bool:
        """Train the rest of the current epoch; False when stopped by ``stop_after_steps``."""
        self._enter_phase(self.epoch)
        self.loader.set_epoch(self.epoch)
        if self.local is not None:  # resumed: restore the sampler position, RNG and residuals
            if self.accum["batches"]:  # saved mid-epoch (an epoch-end checkpoint starts afresh)
                self.loader.load_state_dict(self.local["loader"])
            if self.local["phase"] == self.phase_index:
                self.exchanger.load_state_dict(self.local["exchanger"])
            set_rng_state(self.local["rng"])
            self.local = None
        times = TimeBreakdown(self._sync)
        times.load_state_dict(self.accum["breakdown"])
        steps = len(self.loader)
        done = self.accum["batches"]
        bar = epoch_bar(self.epoch, steps, done, show=self.rank == 0 and self.cfg.print_table)
        start = time.perf_counter()
        mark = time.perf_counter()
        for images, labels in self.loader:
            times.add("data", time.perf_counter() - mark)
            computed = times.totals["compute"]
            try:
                loss = self._step(images, labels, done, times)
            except NonFiniteInput:  # NOTE [a diverged run stops]
                raise ValueError(diverged("the gradients hold inf or NaN", self.epoch, self.global_step + 1)) from None
            done += 1
            self.global_step += 1
            times.iterations += 1
            self.accum.update(loss_sum=self.accum["loss_sum"] + loss, batches=done,
                              images=self.accum["images"] + labels.shape[0] * self.world)
            self.accum["seconds"] += time.perf_counter() - start
            if self.auto is not None and self.auto.decided is None:
                after_step(self, times.totals["compute"] - computed, done)
            start = time.perf_counter()
            self.accum["breakdown"] = times.state_dict()
            stop = self.cfg.stop_after_steps and self.global_step >= self.cfg.stop_after_steps
            if stop or (self.cfg.ckpt_every and self.global_step % self.cfg.ckpt_every == 0 and done < steps):
                self._checkpoint()
            if on_step:
                on_step(self.global_step, loss)
            bar.step(loss)
            if stop:
                bar.close()
                if self.rank == 0 and self.cfg.print_table:
                    print(f"stopped at global step {self.global_step} (--stop-after-steps): epoch {self.epoch}, "
                          f"batch {done} of {steps}; checkpoint in {Path(self.cfg.out) / 'checkpoints'}", flush=True)
                return False
            mark = time.perf_counter()
        self._drain(times)
        bar.close()
        return True

    def finish_epoch(self) -> dict:
        """Evaluate, log, checkpoint; returns the epoch's metrics row (same on all ranks)."""
        sums = all_sum(torch.tensor([self.accum["loss_sum"], float(self.accum["batches"]),
                                     float(self.accum.get("inter_node_bytes", 0)), self.exchanger.residual_sq()],
                                    dtype=torch.float64), self.device).tolist()
        broadcast_buffers(self.model)
        row = epoch_row(self.recipe, self.epoch, comm=self.comm, accum=self.accum, sums=sums,
                        lr=self.optimizer.param_groups[0]["lr"], steps=self.global_step, world=self.world,
                        auto=self.auto.reason if self.auto is not None else None)
        start = time.perf_counter()
        row.update(evaluate(self.model, self.val_loader, self.device, self.autocast, self.channels_last))
        row["val_seconds"] = time.perf_counter() - start
        counts = loader_counts(self.loader)
        delta = all_sum(torch.tensor([v - self.cache_seen.get(k, 0.0) for k, v in counts.items()],
                                     dtype=torch.float64), self.device).tolist()
        self.cache_seen = counts
        delta = dict(zip(counts, delta))
        skipped = int(delta.pop("skipped"))  # bad samples replaced, all ranks
        if self.spec.kind != "memory":
            row["cache"] = {k: int(v) for k, v in delta.items()}
        row["skipped"] = skipped
        self.epoch += 1
        self.accum = fresh_accum()
        self._checkpoint()
        if self.log is not None:
            self.log.append(row)
        return row


def _local_world(world: int) -> int:
    """Ranks sharing this machine: torchrun's LOCAL_WORLD_SIZE, else the whole world."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world))


def train(cfg: RunConfig, on_epoch=None, on_step=None) -> list[dict]:
    """Run (or resume) ``cfg`` on this rank inside an initialised process group, or alone.

    Args:
        cfg: the run.
        on_epoch: called with each epoch's metrics row (every rank).
        on_step: called with ``(global_step, loss)`` after each step.

    Returns:
        The metrics rows of the epochs this call trained.

    Raises:
        ValueError: bad data root, topology, recipe/checkpoint mismatch (one line each).
    """
    run = _Run(cfg)
    rows = []
    try:
        while run.epoch < run.recipe.total_epochs:
            if not run.run_epoch(on_step):
                break
            row = run.finish_epoch()
            rows.append(row)
            if on_epoch:
                on_epoch(row)
    finally:
        run.close()
    return rows


def run_rank(rank: int, world_size: int, cfg: RunConfig) -> list[dict]:
    """Entry point of one worker process (``trainer.launch.launch_local``): train and,
    on rank 0, print the per-epoch table."""
    printed = []

    def show(row):
        from trainer.progress import print_row

        print_row(row, header=not printed)
        printed.append(row)

    return train(cfg, on_epoch=show if rank == 0 and cfg.print_table else None)
