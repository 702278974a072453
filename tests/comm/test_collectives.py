"""Every exchange algorithm in real gloo groups (2x2, 3x2 and 4x1 layouts) against plain
references computed from all ranks' inputs."""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from tests.comm import reference
from tests.comm._workers import DENSE, SPARSE, exchanges, make_input, restore
from tests.distributed import run_distributed

D, STEPS, DENSITY = 1001, 3, 0.05
LAYOUTS = [(2, 2), (3, 2), (4, 1)]


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda l: f"{l[0]}x{l[1]}")
def layout_run(request):
    nodes, local_size = request.param
    world = nodes * local_size
    results = restore(run_distributed(exchanges, world, nodes, local_size, D, STEPS, DENSITY))
    return nodes, local_size, results


def _placed(res, rank, nodes, local_size, d):
    """A rank's residual placed in the full d-vector (hitopk residuals cover one chunk)."""
    if res.numel() == d:
        return res
    c = res.numel()
    full = torch.zeros(local_size * c, dtype=res.dtype)
    j = rank % local_size
    full[j * c:(j + 1) * c] = res
    return full[:d]


def test_dense_variants_equal_plain_mean(layout_run):
    nodes, local_size, results = layout_run
    world = nodes * local_size
    mean = torch.stack([make_input(r, 0, D, torch.float32) for r in range(world)]).mean(0)
    for rank, res in enumerate(results):
        for name in DENSE + ("2dtar/segmented", "hier/segmented"):
            got = res["dense"][name]
            assert got.dtype == torch.float32 and got.shape == (D,)
            assert_close(got, mean, rtol=1e-5, atol=1e-6, msg=f"{name} rank {rank}")
        assert_close(res["dense"]["dense/fp16"], mean, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("name", SPARSE)
def test_sparse_equals_reference_over_steps(layout_run, name):
    nodes, local_size, results = layout_run
    world = nodes * local_size
    residuals = None
    for step in range(STEPS):
        inputs = [make_input(r, step, D) for r in range(world)]
        if residuals is None:
            size = -(-D // local_size) if name == "hitopk" else D
            residuals = [torch.zeros(size, dtype=torch.float64) for _ in range(world)]
        if name == "hitopk":
            expected, residuals = reference.hitopk(inputs, residuals, DENSITY, nodes, local_size)
        else:
            expected, residuals = getattr(reference, name)(inputs, residuals, DENSITY)
        for rank in range(world):
            got, got_res = results[rank]["sparse"][name][step]
            assert_close(got, expected, rtol=1e-9, atol=1e-12, msg=f"{name} step {step} rank {rank} output")
            assert_close(got_res, residuals[rank], rtol=1e-9, atol=1e-12, msg=f"{name} step {step} residual")
        assert int((expected != 0).sum()) > 0


@pytest.mark.parametrize("name", SPARSE)
@pytest.mark.parametrize("wire", ["sparse", "bf16"])
def test_error_feedback_conserves_gradient(layout_run, name, wire):
    """sum(inputs) + sum(old residuals) == P * output + sum(new residuals), every step."""
    nodes, local_size, results = layout_run
    world = nodes * local_size
    dtype = torch.float64 if wire == "sparse" else torch.float32
    old = torch.zeros(D, dtype=torch.float64)
    for step, _ in enumerate(results[0][wire][name]):
        fed = sum(make_input(r, step, D, dtype).double() for r in range(world)) + old
        out = results[0][wire][name][step][0].double()
        new = sum(_placed(results[r][wire][name][step][1].double(), r, nodes, local_size, D) for r in range(world))
        tol = 1e-9 if wire == "sparse" else 1e-4
        assert_close(world * out + new, fed, rtol=tol, atol=tol, msg=f"{name} {wire} step {step}")
        for r in range(1, world):  # every worker applies the same update
            assert torch.equal(results[r][wire][name][step][0], results[0][wire][name][step][0])
        old = new


def test_no_error_feedback_keeps_no_residual_and_bad_layout_is_explained(layout_run):
    _, _, results = layout_run
    assert all(r["no_ef_residual"] is None for r in results)
    assert all("nodes * local_size" in r["bad_layout"] for r in results)
    assert all("not a multiple of local_size" in r["bad_env"] for r in results)
    assert [r["from_env"] for r in results] == [(1, len(results), r == 0) for r in range(len(results))]


def test_nodes_with_several_workers_get_shared_memory(layout_run):
    # NOTE [intra-node transport]: one worker per node has nothing to share
    _, local_size, results = layout_run
    assert [r["has_shm"] for r in results] == [local_size > 1] * len(results)
