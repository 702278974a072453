"""The selector contract, for every name in ``comm.topk.SELECTORS``, and its edge cases."""
from __future__ import annotations

import pytest
import torch

from comm.topk import SELECTORS, captured_energy, get_selector, recall
from tools.bench.topk import make_input

NAMES = sorted(SELECTORS)


def _check_contract(x: torch.Tensor, k: int, values: torch.Tensor, indices: torch.Tensor) -> None:
    want = min(k, x.numel())
    assert indices.dtype == torch.int64
    assert indices.shape == (want,)
    assert torch.unique(indices).numel() == want, "indices are not distinct"
    if want:
        assert int(indices.min()) >= 0 and int(indices.max()) < x.numel()
    assert values.dtype == x.dtype and values.device == x.device
    torch.testing.assert_close(values, x[indices], rtol=0, atol=0)


def test_registry_names_and_unknown_name():
    assert {"exact", "dgc", "mstopk"} <= set(SELECTORS)
    assert get_selector("mstopk") is SELECTORS["mstopk"]
    with pytest.raises(ValueError, match="valid: .*'dgc'.*'exact'.*'mstopk'"):
        get_selector("nope")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dist", ["gaussian", "laplace", "cauchy", "sparse"])
def test_contract_on_distributions(name, dist):
    x = make_input(dist, 50_000, seed=3)
    for k in (1, 50, 500, 5_000):
        values, indices = get_selector(name)(x, k, generator=torch.Generator().manual_seed(0))
        _check_contract(x, k, values, indices)
        assert recall(x, indices) >= 0.95 and captured_energy(x, indices) >= 0.99


@pytest.mark.parametrize("name", NAMES)
def test_k_zero_k_equal_k_larger_and_empty(name):
    fn = get_selector(name)
    x = torch.randn(100, generator=torch.Generator().manual_seed(1))
    for k in (0, 100, 1_000):
        values, indices = fn(x, k)
        _check_contract(x, k, values, indices)
    assert sorted(fn(x, 100)[1].tolist()) == list(range(100))
    values, indices = fn(torch.empty(0), 5)
    assert values.numel() == 0 and indices.numel() == 0 and indices.dtype == torch.int64


@pytest.mark.parametrize("name", NAMES)
def test_all_zeros_and_many_equal_values(name):
    fn = get_selector(name)
    zeros = torch.zeros(10_000)
    _check_contract(zeros, 37, *fn(zeros, 37))
    # 9,000 entries tie at 1.0 above 1,000 smaller ones: any 500 of the ties are exact.
    x = torch.cat([torch.full((9_000,), -1.0), torch.rand(1_000, generator=torch.Generator().manual_seed(2)) * 0.5])
    values, indices = fn(x, 500)
    _check_contract(x, 500, values, indices)
    assert bool((values.abs() == 1.0).all())
    assert recall(x, indices) == 1.0
    # Ties straddling the k-th position: 300 entries above, 1,000 equal ones below them.
    x = torch.cat([torch.full((1_000,), 2.0), 3.0 + torch.arange(300.0), torch.zeros(5_000)])
    values, indices = fn(x, 800)
    _check_contract(x, 800, values, indices)
    assert int((values >= 3.0).sum()) == 300 and int((values == 2.0).sum()) == 500


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes(name, dtype):
    x = make_input("laplace", 20_000, seed=4).to(dtype)
    values, indices = get_selector(name)(x, 200)
    _check_contract(x, 200, values, indices)
    assert recall(x, indices) >= 0.95


@pytest.mark.parametrize("name", NAMES)
def test_non_contiguous_input_selects_as_its_copy(name):
    base = make_input("gaussian", 40_000, seed=5)
    x = base[::2]
    assert not x.is_contiguous()
    values, indices = get_selector(name)(x, 100, generator=torch.Generator().manual_seed(0))
    _check_contract(x, 100, values, indices)
    _, ref = get_selector(name)(x.contiguous(), 100, generator=torch.Generator().manual_seed(0))
    assert sorted(indices.tolist()) == sorted(ref.tolist())


@pytest.mark.parametrize("name", ["dgc", "mstopk"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_is_refused(name, bad):
    x = torch.randn(10_000)
    x[1234] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        get_selector(name)(x, 10)


@pytest.mark.parametrize("name", NAMES)
def test_bad_arguments_raise_value_error(name):
    fn = get_selector(name)
    with pytest.raises(ValueError, match="1-D"):
        fn(torch.randn(4, 4), 2)
    with pytest.raises(ValueError, match="k must be >= 0"):
        fn(torch.randn(10), -1)


@pytest.mark.parametrize("name", ["dgc", "mstopk"])
def test_integer_input_is_refused_and_unknown_options_are_ignored(name):
    fn = get_selector(name)
    with pytest.raises(ValueError, match="floating-point"):
        fn(torch.arange(10), 2)
    values, indices = fn(torch.randn(1_000), 10, generator=None, some_future_option=3)
    assert indices.numel() == 10


def test_dgc_is_deterministic_with_a_seeded_generator():
    x = make_input("student_t", 100_000, seed=6)
    a = SELECTORS["dgc"](x, 100, generator=torch.Generator().manual_seed(7))[1]
    b = SELECTORS["dgc"](x, 100, generator=torch.Generator().manual_seed(7))[1]
    assert torch.equal(a, b)


def test_dgc_recovers_when_the_sampled_threshold_is_too_high():
    # 20 huge entries and a sample of 1,024 that almost surely misses them all: the first
    # threshold passes too few entries and has to be lowered.
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(8))
    x[torch.arange(20) * 9_973] = 1e6
    values, indices = SELECTORS["dgc"](x, 500, ratio=0.001, generator=torch.Generator().manual_seed(0))
    _check_contract(x, 500, values, indices)
    assert recall(x, indices) == 1.0


def test_recall_and_energy_helpers():
    x = torch.tensor([5.0, -4.0, 3.0, 0.0, 0.0])
    assert recall(x, torch.tensor([0, 1])) == 1.0
    assert recall(x, torch.tensor([0, 2])) == 0.5
    assert captured_energy(x, torch.tensor([0, 2])) == pytest.approx(34 / 41)
    # Ties at the k-th magnitude: either zero completes an exact top-4.
    assert recall(x, torch.tensor([0, 1, 2, 4])) == 1.0
    assert captured_energy(torch.zeros(3), torch.tensor([1])) == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_a_tensor_that_requires_grad_is_accepted(name):
    x = torch.randn(5_000, requires_grad=True)
    values, indices = get_selector(name)(x, 50)
    assert indices.numel() == 50
    torch.testing.assert_close(values.detach(), x.detach()[indices], rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_every_selector_ignores_the_others_options(name):
    x = make_input("laplace", 10_000, seed=9)
    values, indices = get_selector(name)(x, 100, generator=None, iters=12, kernel="torch", ratio=0.05,
                                         min_samples=64)
    _check_contract(x, 100, values, indices)
