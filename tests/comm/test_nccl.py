"""NCCL paths: every exchange, alone and through the engine launching buckets from
backward's hooks (also pipelined into the next step, across a state_dict), on CUDA tensors over an NCCL group, one process per GPU present (skipped
with a reason without a GPU). With one GPU the group has one member: the collectives then
move nothing, but every tensor on the way still has to be on the device NCCL carries
(NOTE [device check] in comm/collective_ops.py)."""
from __future__ import annotations

import os

import pytest
import torch

from tests.redis_servers import free_port


def _nccl_worker(rank, world, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from comm import GradientExchanger, LayerPlan, Topology, build_exchanger, names

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        topo = Topology(nodes=world, local_size=1)
        x = torch.full((1000,), float(rank + 1), device="cuda")
        got, engine, pipelined = {}, {}, {}
        for name in names(per_bucket=True):
            ex = build_exchanger(name, topo, density=1.0, selector="exact")
            got[name] = ex.exchange(x).cpu().tolist()
            # the engine: one bucket per layer, launched from backward's hooks while the
            # first layer's large matmul is still queued on the stream
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 8)).cuda()
            ex = GradientExchanger(model.parameters(), name, topo, density=1.0, selector="exact", plan=LayerPlan())
            inputs = torch.randn(4096, 512, device="cuda", generator=torch.Generator("cuda").manual_seed(rank))
            model(inputs).square().mean().backward()
            local = [p.grad.clone() for p in model.parameters()]
            ex.synchronize()
            ex.remove()
            # numpy: pickled by value (a CPU tensor would travel as a file descriptor of this process)
            engine[name] = [(g.cpu().numpy(), p.grad.cpu().numpy()) for g, p in zip(local, model.parameters())]
            # pipelined (NOTE [pipelined exchange]): the same batch twice; step 1 applies step 0's
            # average, finished inside step 1's backward; a state_dict holds it on the way
            ex = GradientExchanger(model.parameters(), name, topo, density=1.0, selector="exact", plan=LayerPlan(),
                                   pipeline=True)
            applied = []
            for _ in range(2):
                model.zero_grad()
                model(inputs).square().mean().backward()
                applied.append(ex.synchronize())
            resumed = GradientExchanger(model.parameters(), name, topo, density=1.0, selector="exact",
                                        plan=LayerPlan(), pipeline=True)
            resumed.load_state_dict(ex.state_dict())
            step1 = [p.grad.cpu().numpy() for p in model.parameters()]
            applied.append(resumed.flush())
            pipelined[name] = (applied, step1, [p.grad.cpu().numpy() for p in model.parameters()])
            ex.remove()
            resumed.remove()
        queue.put((rank, got, engine, pipelined))
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_nccl_exchanges_equal_the_mean():
    world = torch.cuda.device_count()
    if world < 1:
        pytest.skip("NCCL test needs a GPU")
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_nccl_worker, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = {rank: (got, engine, piped) for rank, got, engine, piped in (queue.get(timeout=300) for _ in procs)}
    for p in procs:
        p.join(timeout=30)
    mean = sum(range(1, world + 1)) / world
    local_mean = [sum(results[r][1]["dense"][i][0] for r in results) / world
                  for i in range(len(results[0][1]["dense"]))]
    for got, engine, pipelined in results.values():
        for name, (applied, *steps) in pipelined.items():
            assert applied == [False, True, True], name
            for grads in steps:  # step 0's average applied by step 1, step 1's by the resumed flush
                for want, averaged in zip(local_mean, grads):
                    torch.testing.assert_close(torch.from_numpy(averaged), torch.from_numpy(want), rtol=1e-5,
                                               atol=1e-6, msg=f"{name} pipelined")
        for name, values in got.items():
            assert values == pytest.approx([mean] * 1000), name
        for name, grads in engine.items():
            for want, (_, averaged) in zip(local_mean, grads):
                torch.testing.assert_close(torch.from_numpy(averaged), torch.from_numpy(want), rtol=1e-5, atol=1e-6,
                                           msg=name)
