"""MSTopK's Triton kernels against the torch implementation.

On a CUDA machine the kernels run on the GPU; elsewhere tests/conftest.py sets
TRITON_INTERPRET=1 and they run in Triton's interpreter on CPU tensors (NOTE [Triton
interpreter in tests]), which checks the logic, masking, atomics and counts, not speed.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from comm.topk import SELECTORS, captured_energy, k_for, mstopk, mstopk_select, recall
from comm.topk.mstopk import resolve_kernel
from tools.bench.topk import DISTRIBUTIONS, make_input
from tools.bench.parts.topk_counts import HostSyncCounter, mstopk_counts

pytestmark = [pytest.mark.triton]

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DIST_CASES = sorted(DISTRIBUTIONS) + ["ties"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def kernels():
    """The kernel module (imported only here: importing triton reads TRITON_INTERPRET)."""
    import comm.topk.mstopk_triton as kernels

    return kernels


@pytest.fixture(autouse=True)
def no_fallback(kernels):
    """The kernel path falls back to torch if a kernel fails or its counts disagree:
    that is a bug here, so the count must not move. (The fallback tests count in a
    dict of their own, which monkeypatch removes before this check.)"""
    before = kernels.FALLBACKS["count"]
    yield
    assert kernels.FALLBACKS["count"] == before, "the Triton path fell back to torch"


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _same_as_torch(x: torch.Tensor, k: int, **opts) -> None:
    gpu = mstopk_select(x, k, kernel="gpu", generator=_gen(3), **opts)
    ref = mstopk_select(x, k, kernel="torch", generator=_gen(3), **opts)
    assert torch.equal(gpu.indices, ref.indices), (x.dtype, x.numel(), k)
    g, r = gpu.band, ref.band
    assert (g.n_upper, g.n_band) == (r.n_upper, r.n_band)
    if g.search_lo == r.search_lo:
        # Same thresholds when the searches start from the same mean. The means can differ
        # in the low bits (the kernel sums in float64; torch on CPU in float32 per 1M chunk),
        # and then a threshold can land one float32 step away with the same selection.
        assert (g.lower, g.upper) == (r.lower, r.upper)
    torch.testing.assert_close(gpu.values, x[gpu.indices], rtol=0, atol=0)


def _sizes():
    # Below one tile, several tiles with a ragged last one, and ~1M (float32 only:
    # the dtype only changes the load, which the smaller sizes already cover).
    from comm.topk.mstopk_triton import TILE  # noqa: PLC0415 (after conftest set the mode)

    return [1_000, 2 * TILE + 17]


# Every distribution in float32; the half types only change the kernels' loads (and the
# ties their rounding makes), so three distributions cover them (the suite's time, issue 42).
DIST_DTYPE_CASES = ([(dist, torch.float32) for dist in DIST_CASES]
                    + [(dist, dtype) for dtype in DTYPES[1:] for dist in ("gaussian", "cauchy", "ties")])


@pytest.mark.parametrize("dist, dtype", DIST_DTYPE_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("size", ["below_one_block", "ragged_blocks"])
def test_kernel_selects_what_the_torch_path_selects(dist, dtype, size):
    n = dict(zip(["below_one_block", "ragged_blocks"], _sizes()))[size]
    x = make_input(dist, n, seed=21, device=DEVICE, dtype=dtype)
    for density in (0.001, 0.01, 0.3):
        _same_as_torch(x, max(1, int(density * n)))


@pytest.mark.parametrize("dist", DIST_CASES)
def test_kernel_selects_what_the_torch_path_selects_at_1m(dist):
    x = make_input(dist, 1_000_003, seed=21, device=DEVICE)
    for density in (0.001, 0.01, 0.3):
        _same_as_torch(x, int(density * x.numel()))


@pytest.mark.slow
@pytest.mark.parametrize("dist", ["gaussian", "student_t3", "cauchy", "lognormal"])
def test_kernel_selects_what_the_torch_path_selects_at_4m(dist):
    x = make_input(dist, 1 << 22, seed=21, device=DEVICE)
    _same_as_torch(x, (1 << 22) // 1000)


# The size's branches in _plan: at 4M the sample is exactly 1/16 of x; past 4M it stops at
# its cap (32 programs x 8192 entries), 1/32 of x at 8M (the bins hit their 4096 cap from
# 4M at density 0.01). A larger x only adds tiles, which the interpreter runs one by one:
# 16M took 7.5 s a case here (8M: 4.4 s) and took no branch that 8M does not.
@pytest.mark.parametrize("n", [1 << 22, pytest.param(1 << 23, marks=pytest.mark.slow)])
@pytest.mark.parametrize("density", [0.001, 0.01])
def test_one_read_of_x_six_launches_and_one_sync(n, density):
    # NOTE [MSTopK GPU cost model], counted at the kernels' loads (in the interpreter), the
    # Triton launches and the torch dispatcher: the sample (1/16 of x at most), one pass,
    # three kernels plus an allocation, the summary's copy and the offset's draw.
    x = make_input("gaussian", n, seed=0, device=DEVICE)
    k = k_for(n, density)
    counts = mstopk_counts(x, k, "gpu", _gen())
    assert counts["read_passes"] is None or 1 < counts["read_passes"] <= 1 + 1 / 16
    assert (counts["launches"], counts["triton_launches"]) == (6, 3)
    assert (counts["full_size_ops"], counts["host_syncs"]) == (0, 1)
    assert k < counts["candidates"] <= 2 * k + counts["fine_bin"]
    _same_as_torch(x, k)


def test_kernel_with_the_gpu_block_sizes(kernels, monkeypatch):
    # The interpreter runs larger tiles and fewer programs; the GPU's own tile sizes, with
    # several tiles per program, a ragged tail and a look-back over many programs, select the same.
    monkeypatch.setattr(kernels, "TILE", 4096)
    monkeypatch.setattr(kernels, "CHUNK", 1024)
    monkeypatch.setattr(kernels, "FILTER_PROGRAMS", 5)
    monkeypatch.setattr(kernels, "WRITE_PROGRAMS", 7)
    x = make_input("student_t3", 9 * 4096 + 123, seed=25, device=DEVICE)
    for k in (7, 400, 9_000):
        _same_as_torch(x, k)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, in the interpreter, on Inf
def test_kernel_edge_cases():
    zeros = torch.zeros(100_000, device=DEVICE)
    assert mstopk(zeros, 100, kernel="gpu")[1].unique().numel() == 100
    _same_as_torch(zeros, 100)
    mostly_zero = make_input("sparse", 200_000, seed=26, device=DEVICE, nonzero=0.001)
    for k in (50, 199, 200, 201, 5_000):  # 200 nonzero entries: (k+1)-th magnitude 0 from k = 200
        _same_as_torch(mostly_zero, k)
    outlier = make_input("gaussian", 300_000, seed=27, device=DEVICE) * 1e-3
    outlier[123_456] = 1e6
    for k in (1, 30, 3_000):
        _same_as_torch(outlier, k)
    x = torch.randn(100_000, device=DEVICE)
    assert mstopk(x, 0, kernel="gpu")[1].numel() == 0
    assert mstopk(x, 200_000, kernel="gpu")[1].numel() == 100_000
    strided = x[::3]
    assert torch.equal(mstopk(strided, 50, kernel="gpu", generator=_gen())[1],
                       mstopk(strided.contiguous(), 50, kernel="torch", generator=_gen())[1])
    for bad in (float("nan"), float("inf")):
        y = x.clone()
        y[77] = bad
        with pytest.raises(ValueError, match="NaN or Inf"):
            mstopk(y, 10, kernel="gpu")
    with pytest.raises(ValueError, match="float16/bfloat16/float32"):
        mstopk(x.double(), 10, kernel="gpu")
    # bad input as on every path: k < 0 and integer tensors refused, an empty x gives nothing
    with pytest.raises(ValueError, match="k must be >= 0"):
        mstopk(x, -1, kernel="gpu")
    with pytest.raises(ValueError, match="floating-point"):
        mstopk(x.int(), 10, kernel="gpu")
    values, indices = mstopk(x[:0], 10, kernel="gpu")
    assert values.numel() == indices.numel() == 0


@pytest.mark.parametrize("iters", [0, 2, 30])
def test_kernel_thresholds_bound_the_selection(iters):
    x = make_input("laplace", 1_000_003, seed=22, device=DEVICE)
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
def test_kernel_quality_floors(dist):
    x = make_input(dist, 1 << 18, seed=23, device=DEVICE)
    for density in (0.001, 0.01):
        k = int(density * x.numel())
        _, idx = mstopk(x, k, kernel="gpu")
        assert recall(x, idx, k) >= 0.95 and captured_energy(x, idx, k) >= 0.99


@pytest.mark.parametrize("dist", ["gaussian", "student_t3", "cauchy", "lognormal", "ties"])
def test_candidates_stay_close_to_k(dist):
    # The sampled cut lets through about 1.4 (k + 1) entries: more than k, at most 2k plus
    # the bin that holds the (k+1)-th magnitude (ties put a whole tie group in it).
    x = make_input(dist, 1 << 20, seed=28, device=DEVICE)
    for k in (1 << 10, 1 << 14):
        counts = mstopk_counts(x, k, "gpu", _gen())
        assert k < counts["candidates"] <= 2 * k + counts["fine_bin"], (dist, k, counts)


def test_auto_runs_the_torch_path_without_a_measurement():
    x = torch.randn(10_000, device=DEVICE)
    assert resolve_kernel("auto", x, 10) == "torch"  # NOTE [MSTopK kernel choice]: none recorded
    assert resolve_kernel("auto", x.double(), 10) == "torch"
    g = torch.Generator(device=DEVICE).manual_seed(0)
    values, indices = mstopk(x, 10, generator=g, kernel="gpu")
    assert indices.device == x.device and indices.numel() == 10


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_every_selector_runs_on_the_device(name):
    x = make_input("student_t", 500_000, seed=24, device=DEVICE)
    values, indices = SELECTORS[name](x, 500, generator=torch.Generator(device=DEVICE).manual_seed(0),
                                      kernel="gpu")
    assert indices.device == x.device and indices.unique().numel() == 500
    torch.testing.assert_close(values, x[indices], rtol=0, atol=0)
    assert recall(x, indices) >= 0.95


@pytest.mark.parametrize("scale", [1e-40, 1e37])
def test_kernel_on_subnormal_and_huge_magnitudes(scale):
    x = torch.randn(200_003, generator=_gen(29)).to(DEVICE) * scale
    for iters in (1, 30):
        _same_as_torch(x, 1_000, iters=iters)


@pytest.mark.parametrize("dist,density", [("gaussian", 0.001), ("cauchy", 0.01), ("ties", 0.3),
                                          ("sparse", 0.05)])
def test_one_host_sync_per_call(dist, density):
    x = make_input(dist, 300_000, seed=30, device=DEVICE)
    k = int(density * x.numel())
    mstopk(x, k, kernel="gpu")  # compile first
    for generator in (None, _gen(), torch.Generator(device=DEVICE).manual_seed(0)):
        with HostSyncCounter() as syncs:
            _, idx = mstopk(x, k, kernel="gpu", generator=generator)
        assert syncs.count == 1, syncs.where
        assert idx.numel() == k
    # ... and the counter sees the torch path's syncs, so it is not blind.
    with HostSyncCounter() as syncs:
        mstopk(x, k, kernel="torch")
    assert syncs.count > 2, syncs.where


def test_a_misleading_sample_costs_one_more_pass_and_sync():
    # The sample sees only the quarter of x that is large, so its cut lets through a
    # quarter of the entries it aims at, fewer than k; the filter pass says so and a second
    # one cuts lower: the same indices, 2 host syncs, a little over 2 reads of x.
    from comm.topk.mstopk_triton import _plan

    x = make_input("gaussian", 1 << 20, seed=33, device=DEVICE) * 1e-3
    step = _plan(x, 1000).step  # the sample reads every step-th entry
    x[::step // 4] *= 1e3
    counts = mstopk_counts(x, 1000, "gpu", _gen())
    assert counts["host_syncs"] == 2  # one per pass
    if x.is_cuda:  # compiled kernels' loads cannot be counted: the row says so
        assert counts["read_passes"] is None
    else:
        assert 2 < counts["read_passes"] <= 3
    _same_as_torch(x, 1000)


def test_a_kernel_that_fails_to_compile_falls_back_with_one_warning(kernels, monkeypatch):
    # A real Triton compile error: tl.arange needs a power-of-two block.
    monkeypatch.setattr(kernels, "TILE", 3000)
    monkeypatch.setattr(kernels, "FALLBACKS", {"count": 0})
    x = make_input("gaussian", 50_000, seed=31, device=DEVICE)
    with pytest.warns(RuntimeWarning, match="a kernel failed"):
        first = mstopk_select(x, 100, kernel="gpu", generator=_gen())
    ref = mstopk_select(x, 100, kernel="torch", generator=_gen())
    assert torch.equal(first.indices, ref.indices)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: no second warning
        again = mstopk_select(x, 100, kernel="gpu", generator=_gen())
    assert torch.equal(again.indices, ref.indices) and kernels.FALLBACKS["count"] == 2


def test_counts_that_disagree_fall_back(kernels, monkeypatch):
    # One more entry in the window's histogram than the filter pass let through, as a
    # miscompiled histogram would give: the call falls back to the torch path.
    launch = kernels._launch

    def corrupted(kernel, grid, *args, **meta):
        launch(kernel, grid, *args, **meta)
        if kernel is kernels.sample_kernel:
            args[6][0] += 1  # the control block's first bin, after the sample kernel zeroed it

    monkeypatch.setattr(kernels, "_launch", corrupted)
    monkeypatch.setattr(kernels, "FALLBACKS", {"count": 1})  # already warned in this process
    x = make_input("gaussian", 50_000, seed=32, device=DEVICE)
    res = mstopk_select(x, 500, kernel="gpu", generator=_gen())
    assert kernels.FALLBACKS["count"] == 2
    assert torch.equal(res.indices, mstopk_select(x, 500, kernel="torch", generator=_gen()).indices)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="kernel='gpu' needs a CUDA tensor"):
        mstopk(torch.randn(100), 3, kernel="gpu")


def test_the_kernel_module_imports_without_the_interpreter():
    # on a GPU TRITON_INTERPRET is unset and triton never imports its interpreter module;
    # asking for triton.runtime.interpreter there broke every kernel (seen on an H200)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "import comm.topk.mstopk_triton as k; print(k.interpreted())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
