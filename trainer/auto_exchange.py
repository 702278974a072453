"""``comm: auto`` on a training run: the phase's first steps run the sparse candidate and
are measured, then the cost model picks the phase's exchange (NOTE [auto exchange] in
comm/auto.py) and the run switches to it if it differs (``trainer.phase_exchange``).

The first steps run sparse because on a slow link a dense step costs several sparse ones,
and because a run that keeps the sparse exchange then trains exactly as one that asked
for it (the measurements touch neither the weights nor the random streams).
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from comm import collective_ops as ops
from comm.auto import choose, fit_links, sparse_candidate
from comm.registry import DENSE
from trainer.config import AUTO

__all__ = ["AutoExchange", "PROVISIONAL_STEPS", "after_step", "first_comm", "provisional_steps", "start_phase"]

PROVISIONAL_STEPS = 6  # measured: steps 2..6 of the phase (the first pays one-off set-up costs)


def provisional_steps(phase_steps: int) -> int:
    """How many of a phase's ``phase_steps`` steps run the sparse candidate, measured, before
    ``auto`` decides."""
    return min(PROVISIONAL_STEPS, max(2, phase_steps // 4))


def first_comm(world: int) -> str:
    """The exchange an ``auto`` phase starts with: the sparse candidate, or the dense
    all-reduce on one process (nothing to exchange)."""
    return sparse_candidate() if world > 1 else DENSE


class AutoExchange:
    """Measures the provisional steps of one ``auto`` phase and decides once.

    Args:
        index: the phase's index (for the printed line).
        phase_steps: steps of the whole phase.
        decided: the comm already chosen (a resumed run), or None.
    """

    def __init__(self, index: int, phase_steps: int, decided: str | None = None):
        self.index, self.phase_steps = index, phase_steps
        self.steps = provisional_steps(phase_steps)
        self.compute: list[float] = []
        self.select: list[float] = []
        self.decided = decided
        self.reason = "" if decided is None else "chosen before the run resumed"

    def observe(self, compute_s: float, select_s: float) -> None:
        """One provisional step's forward + backward and top-k selection seconds."""
        self.compute.append(compute_s)
        self.select.append(select_s)

    def due(self, step_in_phase: int) -> bool:
        """Whether to decide after ``step_in_phase`` steps of the phase."""
        return self.decided is None and step_in_phase >= self.steps

    def decide(self, topology, *, numel: int, mean_density: float) -> str:
        """Fit the links, price every candidate for the rest of the phase and return the
        choice (collective; every rank decides the same from the slowest rank's times)."""
        local = len(self.compute) > 1
        compute = statistics.median(self.compute[1:] if local else self.compute)
        select = statistics.median(self.select[1:] if local else self.select)
        worst = torch.tensor([compute, select], dtype=torch.float64)
        ops.all_reduce(worst, op=dist.ReduceOp.MAX)
        compute, select = worst.tolist()
        gamma = select / max(numel / topology.local_size, 1.0)  # hitopk selects over d / n per rank
        link = fit_links(topology, gamma=gamma)
        remaining = max(self.phase_steps - len(self.compute), 1)
        choice = choose(numel=numel, nodes=topology.nodes, local_size=topology.local_size, link=link,
                        compute_s=compute, steps=remaining, mean_density=mean_density)
        self.decided = choice.name
        self.reason = f"{choice.reason} (first {len(self.compute)} steps ran {first_comm(2)})"
        return choice.name


def start_phase(run, index: int, phase) -> str:
    """The exchange phase ``index`` opens with; for ``auto`` also ``run.auto`` (its chooser,
    or None when the choice was made before a resume or there is one process: dense, said once)."""
    run.auto = None
    if phase.comm != AUTO:
        return phase.comm
    local = run.local if run.local and run.local["phase"] == index else None
    decided = local["comm"] if local and local.get("auto_decided") else None
    if run.world > 1:
        run.auto = AutoExchange(index, run.steps_per_epoch * phase.epochs, decided)
    elif run.rank == 0 and run.cfg.print_table and index == min(i for i, p in enumerate(run.recipe.phases)
                                                                 if p.comm == AUTO):
        print(f"auto: one process, nothing to exchange: {DENSE}", flush=True)
    return decided or first_comm(run.world)


def after_step(run, compute_s: float, done: int) -> None:
    """Record a provisional step of an ``auto`` phase (``done`` steps into the epoch); after
    the last one choose the exchange and switch ``run`` to it. The choice's own time (the
    link fit, the switch) is added to the epoch's training seconds."""
    from trainer.phase_exchange import carried_residuals, open_exchange
    from trainer.schedules import mean_density

    timings = run.exchanger.last_timings
    run.auto.observe(compute_s, timings.select + timings.select_overlapped)
    phase = run.recipe.phases[run.phase_index]
    step = (run.epoch - run.recipe.phase_start(run.phase_index)) * run.steps_per_epoch + done
    if not run.auto.due(step):
        return
    start = time.perf_counter()
    mean = mean_density(phase, start=step, warmup_steps=run.density_warmup, steps_per_epoch=run.steps_per_epoch)
    numel = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    comm = run.auto.decide(run.topology, numel=numel, mean_density=mean)
    if run.rank == 0 and run.cfg.print_table:
        print(f"auto: phase {run.phase_index} runs {comm}: {run.auto.reason}", flush=True)
    if comm != run.comm:
        if run.exchanger.flush():  # NOTE [pipelined exchange] in comm/engine.py: applied first
            run._update(phase, True)
        open_exchange(run, run.phase_index, phase, comm, carried_residuals(run, run.phase_index))
    run.accum["seconds"] += time.perf_counter() - start
