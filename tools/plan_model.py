"""What ``cachepipe plan`` computes from resolved inputs (:class:`Cluster`, :class:`Workload`):
per exchange algorithm the step model's step (:mod:`comm.step_model`), the throughput,
scaling efficiency and epoch time; for a recipe the run, phase by phase, with the choice
of ``--comm auto``'s rule (:func:`comm.auto.choose`, the same code) on the step model's
times. No flags here:
``tools/plan_inputs.py`` resolves them (and sizes the data side with :mod:`cachepipe.sizing`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from comm.auto import choose, sparse_candidate
from comm.cost_model import LinkParams
from comm.registry import ALGORITHMS, get_algorithm
from comm.step_model import Library, Step, bucket_count, images_per_s_at, step
from trainer.schedules import steps_per_epoch

__all__ = ["Cluster", "Workload", "algorithm_rows", "priced_algorithms", "recipe_rows", "scaling_curve"]


def priced_algorithms() -> list[str]:
    """The registered algorithms the cost model prices, in registration order."""
    return [n for n, a in ALGORITHMS.items() if a.cost is not None]


@dataclass(frozen=True)
class Cluster:
    """A cluster on paper: ``nodes x local_size`` GPUs, their links and their stack.

    Attributes:
        nodes, local_size: the GPUs.
        link: alpha/beta of the links and the selection's ``gamma`` per element.
        library: the stack's efficiencies, overlap, update and overhead.
        value_bytes: bytes of a gradient value on the wire.
    """

    nodes: int
    local_size: int
    link: LinkParams
    library: Library
    value_bytes: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.local_size

    def with_nodes(self, nodes: int) -> Cluster:
        """The same cluster with ``nodes`` nodes."""
        return dataclasses.replace(self, nodes=nodes)


@dataclass(frozen=True)
class Workload:
    """What trains on it.

    Attributes:
        params: gradient elements (the model's trainable parameters).
        batch_size: images per GPU per step.
        size: image side, px.
        rates: single-GPU training images/s measured at some sizes (size -> images/s).
        density: the sparse algorithms' density (None: each algorithm's own default).
        files: training images in the data set.
        compute_s: measured forward + backward seconds per step by algorithm (a profile),
            replacing what ``rates`` give.
        default_compute_s: the measured compute of algorithms ``compute_s`` has no entry for.
        update_s, overhead_s: measured update and per-step rest (a profile), replacing the library's.
    """

    params: int
    batch_size: int
    size: int
    rates: Mapping[int, float]
    density: float | None
    files: int
    compute_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    default_compute_s: float | None = None
    update_s: float | None = None
    overhead_s: float | None = None


def _density(workload: Workload, algorithm: str) -> float | None:
    spec = get_algorithm(algorithm)
    if not spec.sparse:
        return None
    return workload.density if workload.density is not None else spec.density


def _library(cluster: Cluster, workload: Workload) -> Library:
    """The cluster's library with a profile's measured overhead, when there is one."""
    if workload.overhead_s is None:
        return cluster.library
    return dataclasses.replace(cluster.library, overhead_s=workload.overhead_s)


def _price(cluster: Cluster, workload: Workload, algorithm: str, *, size: int, batch_size: int,
           density: float | None) -> Step:
    """One step of ``algorithm`` at ``size`` px and ``batch_size`` per GPU."""
    lib = _library(cluster, workload)
    measured = workload.compute_s.get(algorithm, workload.default_compute_s)
    compute = measured if measured is not None else lib.compute_s(
        batch_size, images_per_s_at(workload.rates, size), workload.params)
    update = workload.update_s if workload.update_s is not None else lib.update_s(workload.params)
    return step(algorithm, numel=workload.params, density=density, nodes=cluster.nodes,
                local_size=cluster.local_size, link=cluster.link, compute_s=compute, update_s=update, library=lib,
                buckets=bucket_count(workload.params), value_bytes=cluster.value_bytes)


def _row(cluster: Cluster, workload: Workload, s: Step, batch_size: int) -> dict:
    single = s.compute_s + cluster.library.single_update_s_per_param * workload.params
    per_epoch = steps_per_epoch(workload.files, cluster.gpus, batch_size)
    return {"algorithm": s.algorithm, "images_per_s": cluster.gpus * batch_size / s.total_s,
            "scaling_efficiency": single / s.total_s, "step_s": s.total_s, "compute_s": s.compute_s,
            "selection_s": s.selection_s, "exchange_s": s.exchange_s, "exposed_exchange_s": s.exposed_s,
            "overlapped_s": s.overlapped_s, "update_s": s.update_s, "overhead_s": s.overhead_s,
            "steps_per_epoch": per_epoch, "epoch_s": per_epoch * s.total_s}


def algorithm_rows(cluster: Cluster, workload: Workload) -> list[dict]:
    """One row per priced algorithm at the workload's size and batch."""
    return [_row(cluster, workload, _price(cluster, workload, a, size=workload.size, batch_size=workload.batch_size,
                                           density=_density(workload, a)), workload.batch_size)
            | {"density": _density(workload, a)} for a in priced_algorithms()]


def scaling_curve(cluster: Cluster, workload: Workload, nodes: list[int]) -> dict[str, list[float]]:
    """Scaling efficiency of each priced algorithm on each node count (the seed's Fig. 7/8 view)."""
    curves = {a: [] for a in priced_algorithms()}
    for m in nodes:
        for row in algorithm_rows(cluster.with_nodes(m), workload):
            curves[row["algorithm"]].append(row["scaling_efficiency"])
    return curves


def _phases(recipe, workload: Workload, cluster: Cluster, comm: str | None) -> list:
    """The phases of ``recipe`` (every one on ``comm`` when given) as the run trains them
    (trainer.config is imported here: only a recipe needs it, and it costs ~0.25 s)."""
    from trainer.phase_plan import phase_plans
    from trainer.recipes import override

    run = override(recipe, comm=comm, density=workload.density) if comm else recipe
    return phase_plans(run, train_samples=workload.files, world_size=cluster.gpus)


def _phase_price(cluster: Cluster, workload: Workload, p) -> Callable[[str, float | None], Step]:
    return lambda a, density: _price(cluster, workload, a, size=p.size, batch_size=p.batch_size, density=density)


def recipe_rows(cluster: Cluster, workload: Workload, recipe) -> list[dict]:
    """The whole run of ``recipe`` (a ``trainer.config.Recipe``): one row per priced
    algorithm (every phase on it, its density warm-up included) and one ``auto`` row (each
    ``auto`` phase's first steps on the sparse candidate, then :func:`comm.auto.choose`'s
    pick; other phases their own exchange)."""
    from trainer.config import AUTO

    rows = []
    for a in priced_algorithms():
        phases = []
        for p in _phases(recipe, workload, cluster, a):
            density = p.mean_density if get_algorithm(a).sparse else None
            s = _phase_price(cluster, workload, p)(a, density)
            phases.append(_phase_row(cluster, workload, p, s, p.steps, a, density))
        rows.append(_run_row(a, phases))
    phases = []
    for p in _phases(recipe, workload, cluster, None):
        at = _phase_price(cluster, workload, p)
        if p.comm != AUTO:
            density = p.mean_density if get_algorithm(p.comm).sparse else None
            phases.append(_phase_row(cluster, workload, p, at(p.comm, density), p.steps, p.comm, density))
            continue
        probe = at(sparse_candidate(), p.mean_density)  # the provisional steps, priced at the rest's mean density
        decided = choose(numel=workload.params, nodes=cluster.nodes, local_size=cluster.local_size, link=cluster.link,
                         compute_s=probe.compute_s, steps=p.steps - p.provisional_steps, mean_density=p.mean_density,
                         update_s=probe.update_s, library=_library(cluster, workload),
                         buckets=bucket_count(workload.params), value_bytes=cluster.value_bytes, basis="predicted")
        density = p.mean_density if get_algorithm(decided.name).sparse else None
        row = _phase_row(cluster, workload, p, at(decided.name, density), p.steps - p.provisional_steps,
                         decided.name, density)
        row["run_s"] += p.provisional_steps * probe.total_s
        phases.append(row | {"provisional_steps": p.provisional_steps, "reason": decided.reason})
    rows.append(_run_row(AUTO, phases))
    return rows


def _phase_row(cluster: Cluster, workload: Workload, p, s: Step, steps: int, comm: str,
               density: float | None) -> dict:
    row = _row(cluster, workload, s, p.batch_size)
    return row | {"phase": p.index, "size": p.size, "batch_size": p.batch_size, "epochs": p.epochs,
                  "cache_size": p.cache_size, "steps": p.steps, "comm": comm, "mean_density": density,
                  "run_s": steps * s.total_s, "images": p.steps * p.batch_size * cluster.gpus}


def _run_row(algorithm: str, phases: list[dict]) -> dict:
    """A run's row: its phases' sums, and step-weighted means of their per-step columns."""
    steps = sum(p["steps"] for p in phases)
    run_s = sum(p["run_s"] for p in phases)
    mean = {k: sum(p[k] * p["steps"] for p in phases) / steps
            for k in ("compute_s", "selection_s", "exchange_s", "exposed_exchange_s", "overlapped_s",
                      "update_s", "overhead_s", "scaling_efficiency")}
    return {"algorithm": algorithm, "images_per_s": sum(p["images"] for p in phases) / run_s,
            "step_s": run_s / steps, **mean, "run_s": run_s, "run_steps": steps, "phases": phases}
