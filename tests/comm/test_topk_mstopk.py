"""MSTopK: thresholds, agreement of the implementations, quality floors, fill rule."""
from __future__ import annotations

import pytest
import torch

from comm.topk import captured_energy, mstopk, mstopk_select, mstopk_thresholds, recall
from comm.topk.mstopk import resolve_kernel
from comm.topk.mstopk_torch import SCAN_THREADS
from tools.bench.topk import DISTRIBUTIONS, make_input


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _check_band(x: torch.Tensor, k: int, res) -> None:
    a = x.abs().double()
    selected = torch.zeros(x.numel(), dtype=torch.bool)
    selected[res.indices] = True
    band = res.band
    assert res.indices.numel() == k and int(selected.sum()) == k
    assert bool((a[selected] >= band.lower).all()), "a selected entry is below the lower threshold"
    assert bool((a[~selected] <= band.upper).all()), "an unselected entry is above the upper threshold"
    assert bool(selected[a >= band.upper].all()), "an entry above the upper threshold was dropped"
    assert band.lower <= band.upper
    assert band.n_upper <= k <= band.n_upper + band.n_band
    assert int((a >= band.upper).sum()) == band.n_upper


@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("density", [0.001, 0.01, 0.2])
def test_thresholds_bound_the_selection(dist, density):
    x = make_input(dist, 30_000, seed=11)
    k = int(density * x.numel())
    res = mstopk_select(x, k, generator=_gen())
    _check_band(x, k, res)
    assert mstopk_thresholds(x, k, generator=_gen()) == (res.band.lower, res.band.upper)


@pytest.mark.parametrize("iters", [0, 1, 2, 5, 30])
def test_thresholds_bound_the_selection_for_few_iterations(iters):
    x = make_input("laplace", 20_000, seed=12)
    res = mstopk_select(x, 300, iters=iters, generator=_gen())
    _check_band(x, 300, res)


@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("density", [0.001, 0.01])
def test_quality_floors_with_defaults(dist, density):
    x = make_input(dist, 200_000, seed=13)
    k = int(density * x.numel())
    _, indices = mstopk(x, k, generator=_gen())
    assert recall(x, indices, k) >= 0.95
    assert captured_energy(x, indices, k) >= 0.99


@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS) + ["ties"])
@pytest.mark.parametrize("iters", [0, 3, 8, 30])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_torch_path_selects_exactly_what_the_literal_algorithm_selects(dist, iters, dtype):
    x = make_input(dist, 20_000, seed=14).to(dtype)
    for k in (7, 200, 3_000):
        fast = mstopk_select(x, k, iters=iters, kernel="torch", generator=_gen(5))
        ref = mstopk_select(x, k, iters=iters, kernel="bisect", generator=_gen(5))
        assert torch.equal(fast.indices, ref.indices), (dist, iters, k)
        assert (fast.band.n_upper, fast.band.n_band) == (ref.band.n_upper, ref.band.n_band)


def test_torch_path_handles_inputs_that_fool_its_sample():
    # Every sampled position (stride 64) is large and nothing else is: the sampled cut
    # keeps far fewer than k entries and has to be lowered, several times.
    x = torch.rand(300_000, generator=_gen(1)) * 0.1
    x[::64] += 10.0
    k = 3_000
    res = mstopk_select(x, k, kernel="torch", generator=_gen())
    ref = mstopk_select(x, k, kernel="bisect", generator=_gen())
    assert torch.equal(res.indices, ref.indices)
    assert recall(x, res.indices) == 1.0


def test_seeded_generator_makes_the_fill_deterministic_and_it_is_random():
    x = torch.ones(10_000)  # one big band of ties: the window offset decides everything
    runs = [mstopk(x, 50, generator=_gen(s))[1] for s in (0, 0, 1, 2, 3)]
    assert torch.equal(runs[0], runs[1])
    assert len({int(r[0]) for r in runs}) > 1, "the fill window never moved"
    for r in runs:  # a contiguous window of the band, as in the paper
        assert torch.equal(r, torch.arange(int(r[0]), int(r[0]) + 50))


def test_fill_rule_falls_back_to_zero_lower_end_for_mostly_zero_input():
    # 2% of entries nonzero, and all below-mean ones matter at k = 3%: with the paper's
    # [mean, max] range the band would be everything below the first threshold and the
    # fill would pick zeros; the [0, max] fallback keeps every nonzero entry.
    x = make_input("sparse", 100_000, seed=15, nonzero=0.02)
    k = 3_000
    res = mstopk_select(x, k, generator=_gen())
    assert res.band.search_lo == 0.0
    assert bool((x[res.indices] != 0).sum() == (x != 0).sum())
    assert recall(x, res.indices) == 1.0


def test_search_runs_between_mean_and_max():
    x = make_input("gaussian", 50_000, seed=16)
    res = mstopk_select(x, 50)
    assert res.band.search_lo == pytest.approx(float(x.abs().double().mean()), rel=1e-6)
    assert res.band.search_hi == float(x.abs().max())


def test_kernel_names(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # CPU tensors need the interpreter
    x = torch.randn(10)
    assert resolve_kernel("auto", x, 3) == "torch"
    with pytest.raises(ValueError, match="valid: .*'bisect'"):
        mstopk(x, 3, kernel="cuda-please")
    with pytest.raises(ValueError, match="kernel='gpu' needs a CUDA tensor"):
        mstopk(x, 3, kernel="gpu")
    with pytest.raises(ValueError, match="iters"):
        mstopk(x, 3, iters=-1)


@pytest.mark.parametrize("chunk", [4_096, 1_000_000])
@pytest.mark.parametrize("density", [0.0005, 0.05])
def test_torch_path_across_many_chunks_and_a_ragged_tail(monkeypatch, chunk, density):
    import comm.topk.mstopk_torch as impl

    monkeypatch.setattr(impl, "CHUNK", chunk)  # many chunks, the last one not a multiple of 64
    x = make_input("student_t", 100_003, seed=17)
    k = int(density * x.numel())
    fast = mstopk_select(x, k, kernel="torch", generator=_gen(2))
    ref = mstopk_select(x, k, kernel="bisect", generator=_gen(2))
    assert torch.equal(fast.indices, ref.indices)
    _check_band(x, k, fast)
    assert recall(x, fast.indices) >= 0.95
    assert int(fast.indices.max()) < x.numel()


@pytest.mark.parametrize("scale", [1e-40, 1e37])
def test_subnormal_and_huge_magnitudes(monkeypatch, scale):
    # 1e-40 is subnormal in float32; 1e37 * 300K overflows a float32 sum of |x|, but only
    # in some chunks (the first third is scaled down).
    import comm.topk.mstopk_torch as impl

    monkeypatch.setattr(impl, "CHUNK", 65_536)
    x = torch.randn(300_000, generator=_gen(3)) * scale
    x[:100_000] *= 1e-6
    assert bool(torch.isfinite(x).all())
    for iters in (1, 30):
        res = mstopk_select(x, 3_000, iters=iters, kernel="torch", generator=_gen())
        ref = mstopk_select(x, 3_000, iters=iters, kernel="bisect", generator=_gen())
        assert torch.equal(res.indices, ref.indices)
        _check_band(x, 3_000, res)


def test_cpu_path_restores_the_thread_count_even_on_errors():
    ambient = torch.get_num_threads()
    torch.set_num_threads(SCAN_THREADS + 1)  # not the scan's own count, whatever the session's (conftest: 1)
    try:
        before = torch.get_num_threads()
        x = make_input("gaussian", 50_000, seed=18)
        mstopk(x, 50)
        assert torch.get_num_threads() == before
        x[7] = float("nan")
        with pytest.raises(ValueError):
            mstopk(x, 50)
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(ambient)
