"""One rank of ``cachepipe bench overlap`` (NOTE [benchmark ranks]; in an emulated node).

Trains nothing: runs forward + backward of the model on a fixed synthetic batch and times
the modes of NOTE [overlap breakdown] (tools/bench/overlap.py) in interleaved rounds.
Each step's time is the slowest rank's; rank 0 reports every mode's per-step times.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

from tools.bench.harness.ranks import run_rank

__all__ = ["plan_options", "time_modes"]


def plan_options(spec: str) -> dict:
    """``size`` (one 25 MiB fusion bucket), ``size:KIB`` (buckets of at most KIB KiB),
    ``layer`` or ``omgs`` as :class:`comm.GradientExchanger` keyword arguments (``omgs``'s
    merged layers come from profiling in the ranks: NOTE [omgs rows]).

    Raises:
        ValueError: for any other spec (names ``--plans``).
    """
    kind, _, kib = spec.partition(":")
    if kind in ("layer", "omgs") and not kib:
        return {"plan": kind}
    if kind == "size" and (not kib or (kib.isdigit() and int(kib) > 0)):
        return {"plan": "size", **({"bucket_bytes": int(kib) * 1024} if kib else {})}
    raise ValueError(f"--plans {spec!r}: expected size, size:KIB (a positive integer), layer or omgs")


def time_modes(settings: dict) -> dict:
    import torch
    import torch.distributed as dist

    from comm import GradientExchanger, Topology
    from comm.omgs import build_omgs_exchanger, plan_omgs
    from comm.plans import OMGSPlan, SizePlan, make_plan
    from trainer import models

    args = SimpleNamespace(**settings)
    rank = dist.get_rank()
    topo = Topology(nodes=args.nodes, local_size=args.local_size)
    torch.manual_seed(0)
    model = models.create(args.model, num_classes=10)
    gen = torch.Generator().manual_seed(rank)
    images = torch.randn(args.batch, 3, args.size, args.size, generator=gen)
    labels = torch.randint(0, 10, (args.batch,), generator=gen)
    params = [p for p in model.parameters() if p.requires_grad]

    omgs = {}  # (merged, order), planned once (collective) when a row asks for it

    def exchanger(spec: str, overlap: bool, pipeline: bool = False) -> GradientExchanger:
        # NOTE [omgs rows]: ``omgs`` is ``train --comm omgs``'s exchange: profile this
        # batch's backward, fit the cost model, plan merged layers (``optimal``), and
        # exchange them with topk_ag whatever ``--comm`` says (the planner models topk_ag)
        options = plan_options(spec)
        kind = options.pop("plan")
        if kind == OMGSPlan.name:
            if not omgs:
                omgs["plan"] = plan_omgs(model, loss, topo, density=args.density, selector=args.selector)[:2]
            merged, order = omgs["plan"]
            ex = build_omgs_exchanger(params, topo, merged=merged, order=order, density=args.density,
                                      selector=args.selector, skip_nonfinite=False, overlap=overlap,
                                      pipeline=pipeline)
        else:
            plan = SizePlan(hybrid_threshold_bytes=0, **options) if kind == SizePlan.name else make_plan(kind)
            ex = GradientExchanger(params, args.comm, topo, plan=plan, density=args.density,
                                   selector=args.selector, skip_nonfinite=False, overlap=overlap,
                                   pipeline=pipeline)
        ex.enabled = False  # hooks fire only in this exchanger's own mode
        return ex

    def loss() -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(images), labels)

    def backward() -> None:
        model.zero_grad(set_to_none=True)
        loss().backward()

    def compute() -> dict:
        dist.barrier()  # every rank starts together, as after an exchange; nothing else in the time
        start, cpu = time.perf_counter(), time.process_time()
        backward()
        return {"step": time.perf_counter() - start, "cpu": time.process_time() - cpu}

    def exchange_alone(ex: GradientExchanger):
        def run() -> dict:
            dist.barrier()  # every rank starts together: no skew from compute in this time
            start, cpu = time.perf_counter(), time.process_time()
            ex.synchronize()
            return {"step": time.perf_counter() - start, "cpu": time.process_time() - cpu}
        return run

    def train_step(ex: GradientExchanger):
        # when backward has produced the first bucket's last gradient (NOTE [overlap bound]);
        # a gradient hook runs before the engine's post-accumulate hooks launch anything
        first = {"left": 0, "at": None}

        def produced(_grad) -> None:
            first["left"] -= 1
            if first["left"] == 0:
                first["at"] = time.perf_counter()

        def run() -> dict:
            ex.enabled = True
            # hooked for this step only: other modes' backward stays free of them
            first.update(left=len(ex.buckets[0].params), at=None)
            hooks = [ex.params[i].register_hook(produced) for i in ex.buckets[0].params]
            launch0, wait0 = ex.stats["compress_s"], ex.stats["wait_s"]
            start, cpu = time.perf_counter(), time.process_time()
            backward()
            mid = time.perf_counter()
            launch1 = ex.stats["compress_s"]
            ex.synchronize()
            end = time.perf_counter()
            for h in hooks:
                h.remove()
            ex.enabled = False
            return {"step": end - start, "cpu": time.process_time() - cpu, "backward": mid - start,
                    "sync": end - mid, "first_ready": first["at"] - start,
                    "launch_in_backward": launch1 - launch0, "launch_in_sync": ex.stats["compress_s"] - launch1,
                    "select_in_backward": ex.last_timings.select_overlapped,
                    "blocked": ex.stats["wait_s"] - wait0}
        return run

    modes, buckets, drain = {"compute": compute}, {}, {}
    for spec in args.plans:
        alone = exchanger(spec, overlap=False)
        modes[f"exchange {spec}"] = exchange_alone(alone)
        modes[f"no overlap {spec}"] = train_step(alone)
        modes[f"overlap {spec}"] = train_step(exchanger(spec, overlap=True))
        # NOTE [pipelined exchange] in comm/engine.py: each round's first (untimed) step
        # fills the pipeline, its last exchange is drained after the round, untimed
        piped = exchanger(spec, overlap=True, pipeline=True)
        modes[f"pipeline {spec}"], drain[f"pipeline {spec}"] = train_step(piped), piped.flush
        buckets[spec] = len(alone.buckets)
    backward()
    names = list(modes)
    times: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]  # rotate: no mode always first
        for name in order:
            dist.barrier()
            for i in range(args.warmup + args.steps):
                row = modes[name]()
                if i >= args.warmup:
                    times[name].append(row)
            if name in drain:
                drain[name]()
    # slowest rank per step: one all-gather per mode at the end, outside every clock
    slowest = {}
    for name in names:
        keys = sorted(times[name][0])
        mine = torch.tensor([[row[k] for k in keys] for row in times[name]], dtype=torch.float64)
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        per_step = torch.stack(every).amax(dim=0)
        slowest[name] = [dict(zip(keys, row)) for row in per_step.tolist()]
    return {"modes": slowest, "buckets": buckets}


if __name__ == "__main__":
    raise SystemExit(run_rank(time_modes, group_timeout_min=20))
