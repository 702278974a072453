"""MSTopK's Triton kernel against the torch implementation (CUDA + Triton only)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from comm.topk import SELECTORS, captured_energy, mstopk, mstopk_select, recall
from comm.topk.mstopk import resolve_kernel
from tools.bench.topk import DISTRIBUTIONS, make_input

pytestmark = [
    pytest.mark.gpu,
    # The kernel path warns and falls back to torch if its passes disagree: that is a bug here.
    pytest.mark.filterwarnings("error::RuntimeWarning"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton: pip install triton"),
]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS) + ["ties"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1_000, 1_000_003, 1 << 22])
def test_gpu_kernel_selects_what_the_torch_path_selects(dist, dtype, n):
    x = make_input(dist, n, seed=21, device="cuda", dtype=dtype)
    for density in (0.001, 0.01, 0.3):
        k = max(1, int(density * n))
        gpu = mstopk_select(x, k, kernel="gpu", generator=_gen(3))
        ref = mstopk_select(x, k, kernel="torch", generator=_gen(3))
        assert torch.equal(gpu.indices, ref.indices), (dist, dtype, n, k)
        # Same thresholds and counts (the means may differ in the last float64 bits:
        # the kernel sums per program, torch sums at once).
        g, r = gpu.band, ref.band
        assert (g.lower, g.upper, g.n_upper, g.n_band) == (r.lower, r.upper, r.n_upper, r.n_band)
        torch.testing.assert_close(gpu.values, x[gpu.indices], rtol=0, atol=0)


@pytest.mark.parametrize("iters", [0, 2, 30])
def test_gpu_kernel_thresholds_bound_the_selection(iters):
    x = make_input("laplace", 2_000_000, seed=22, device="cuda")
    k = 2_000
    res = mstopk_select(x, k, iters=iters, kernel="gpu", generator=_gen())
    a = x.abs()
    selected = torch.zeros_like(x, dtype=torch.bool)
    selected[res.indices] = True
    assert int(selected.sum()) == k
    assert bool((a[selected] >= res.band.lower).all())
    assert bool((a[~selected] <= res.band.upper).all())
    assert torch.equal(res.indices, mstopk_select(x, k, iters=iters, kernel="bisect", generator=_gen()).indices)


@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS))
def test_gpu_kernel_quality_floors(dist):
    x = make_input(dist, 1 << 20, seed=23, device="cuda")
    for density in (0.001, 0.01):
        k = int(density * x.numel())
        _, idx = mstopk(x, k, kernel="gpu")
        assert recall(x, idx, k) >= 0.95 and captured_energy(x, idx, k) >= 0.99


def test_gpu_edge_cases():
    zeros = torch.zeros(100_000, device="cuda")
    assert mstopk(zeros, 100, kernel="gpu")[1].unique().numel() == 100
    x = torch.randn(100_000, device="cuda")
    assert mstopk(x, 0, kernel="gpu")[1].numel() == 0
    assert mstopk(x, 200_000, kernel="gpu")[1].numel() == 100_000
    strided = x[::3]
    assert torch.equal(mstopk(strided, 50, kernel="gpu", generator=_gen())[1],
                       mstopk(strided.contiguous(), 50, kernel="torch", generator=_gen())[1])
    x[77] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        mstopk(x, 10, kernel="gpu")


def test_auto_picks_the_kernel_on_cuda_and_cuda_generators_work():
    x = torch.randn(10_000, device="cuda")
    assert resolve_kernel("auto", x) == "gpu"
    assert resolve_kernel("auto", x.double()) == "torch"
    g = torch.Generator(device="cuda").manual_seed(0)
    values, indices = mstopk(x, 10, generator=g)
    assert indices.device == x.device and indices.numel() == 10


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_every_selector_runs_on_cuda(name):
    x = make_input("student_t", 500_000, seed=24, device="cuda")
    values, indices = SELECTORS[name](x, 500, generator=torch.Generator(device="cuda").manual_seed(0))
    assert indices.device.type == "cuda" and indices.unique().numel() == 500
    torch.testing.assert_close(values, x[indices], rtol=0, atol=0)
    assert recall(x, indices) >= 0.95


@pytest.mark.parametrize("scale", [1e-40, 1e37])
def test_gpu_kernel_on_subnormal_and_huge_magnitudes(scale):
    x = torch.randn(1_000_003, device="cuda") * scale
    for iters in (1, 30):
        gpu = mstopk_select(x, 5_000, iters=iters, kernel="gpu", generator=_gen())
        ref = mstopk_select(x, 5_000, iters=iters, kernel="torch", generator=_gen())
        assert torch.equal(gpu.indices, ref.indices)
