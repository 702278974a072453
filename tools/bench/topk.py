"""``cachepipe bench topk``: time, recall and captured energy of the top-k selectors.

For every size and density it times each selector/implementation side by side on the
same tensor (median of ``--repeats`` after a warm-up call), and reports the speed-up
over ``exact`` (``torch.topk``), the recall and captured energy against the exact top-k,
and on CUDA the effective bandwidth (bytes of ``x`` / time) and the time in units of
one read pass over ``x`` (``x.sum()``). ``--plot`` draws time against size per density,
like Figure 6 of the MLSys 2021 paper. Runs standalone on a GPU box:
``python -m tools bench topk --device cuda --json topk_gpu.json --plot topk_gpu.png``.

Every ``mstopk`` row also reports, from one extra instrumented call
(``tools/bench/parts/topk_counts.py``), ``candidates_per_k``, ``read_passes`` (elements of ``x``
read, counted at the loads, / its size), ``launches`` (Triton kernels plus torch ops that
are not views) and ``host_syncs``. ``--kernel gpu`` compares the Triton kernel with the
torch path on the heavy-tailed distributions; without a GPU it runs in Triton's
interpreter (``TRITON_INTERPRET=1 cachepipe bench topk --device cpu --kernel gpu``),
which shows the counts, not GPU times. On CUDA the ``mstopk`` rows add ``op_us``: per
kernel, its device time per call (``torch.profiler``), to say where the time goes.
"""
from __future__ import annotations

import argparse
import io
import math
import statistics
import time

import torch

from comm.topk import captured_energy, get_selector, k_for, recall
from comm.topk.mstopk import gpu_kernel_available, interpreter_enabled
from tools.bench.harness import Result
from tools.bench.parts.topk_counts import mstopk_counts, op_times_us
from tools.cli import UsageError
from trainer.atomic_file import write_atomic

__all__ = ["configure", "make_input", "DISTRIBUTIONS", "parse_size", "measure", "run"]

CPU_SIZES = "256K,1M,4M,16M"
GPU_SIZES = "256K,1M,4M,16M,64M,128M"
INTERPRETER_SIZES = "1M,4M"
IMPLS = "exact,dgc,mstopk:torch,mstopk:bisect,mstopk:gpu"
KERNEL_DISTS = "gaussian,student_t3,cauchy,lognormal"  # --kernel's default --dist


def _laplace(n, g, dev):
    sign = torch.randint(0, 2, (n,), generator=g, device=dev) * 2 - 1
    return -torch.log(torch.rand(n, generator=g, device=dev)) * sign


def _student_t2(n, g, dev):  # Z / sqrt(chi2_2 / 2), chi2_2 = -2 log U
    return torch.randn(n, generator=g, device=dev) / torch.sqrt(-torch.log(torch.rand(n, generator=g, device=dev)))


def _student_t3(n, g, dev):  # Z / sqrt(chi2_3 / 3)
    z = torch.randn(n, generator=g, device=dev)
    chi2 = torch.randn(3, n, generator=g, device=dev).square().sum(0)
    return z / torch.sqrt(chi2 / 3)


def _lognormal(n, g, dev):  # random sign, log |x| ~ N(0, 1)
    sign = torch.randint(0, 2, (n,), generator=g, device=dev) * 2 - 1
    return torch.exp(torch.randn(n, generator=g, device=dev)) * sign


def _cauchy(n, g, dev):
    return torch.tan(math.pi * (torch.rand(n, generator=g, device=dev) - 0.5))


def _sparse(n, g, dev, nonzero=0.01):
    x = torch.zeros(n, device=dev)
    m = max(1, int(nonzero * n))
    x[torch.randperm(n, generator=g, device=dev)[:m]] = torch.randn(m, generator=g, device=dev)
    return x


def _ties(n, g, dev):
    return torch.round(torch.randn(n, generator=g, device=dev) * 4) / 4


# name -> fn(n, generator, device) -> float32 tensor. "ties" is extra (not a quality target).
DISTRIBUTIONS = {
    "gaussian": lambda n, g, dev: torch.randn(n, generator=g, device=dev),
    "laplace": _laplace,
    "student_t": _student_t2,
    "student_t3": _student_t3,
    "cauchy": _cauchy,
    "lognormal": _lognormal,
    "sparse": _sparse,
}
_EXTRA = {"ties": _ties}


def make_input(dist: str, n: int, seed: int = 0, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, **opts) -> torch.Tensor:
    """A seeded 1-D test vector: gaussian, laplace, student_t (df=2), student_t3 (df=3),
    cauchy, lognormal (random signs), sparse (1% nonzero Gaussian entries, ``nonzero=``
    changes it) or ties (multiples of 1/4).

    Raises:
        ValueError: for an unknown distribution (the message lists the valid ones).
    """
    table = {**DISTRIBUTIONS, **_EXTRA}
    if dist not in table:
        raise ValueError(f"unknown distribution {dist!r}; valid: {sorted(table)}")
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    x = table[dist](n, g, device, **opts)
    big = torch.finfo(dtype).max  # heavy tails would overflow float16 to inf
    return x.clamp(-big, big).to(dtype)


def parse_size(text: str) -> int:
    """``"256K"`` -> 262144, ``"16M"`` -> 16777216, ``"1000"`` -> 1000 (binary K/M/G)."""
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    try:
        return int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise ValueError(f"bad size {text!r}; use e.g. 262144, 256K, 16M") from None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=None,
                        help=f"comma-separated vector sizes; None means {CPU_SIZES} on cpu, {GPU_SIZES} on cuda")
    parser.add_argument("--density", default="0.001,0.01", help="comma-separated k / d")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where x lives")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed calls per measurement, the median is reported; None means 5 (1 with the "
                             "interpreted --kernel gpu)")
    parser.add_argument("--dist", default=None,
                        help=f"comma-separated input distributions, of {sorted(DISTRIBUTIONS)}; "
                             f"None means gaussian ({KERNEL_DISTS} with --kernel)")
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32",
                        help="dtype of x")
    parser.add_argument("--impls", default=None,
                        help=f"selector[:kernel] list, unavailable ones are skipped; None means {IMPLS} "
                             "(without mstopk:gpu on cpu: the interpreter only when asked for)")
    parser.add_argument("--kernel", choices=["torch", "bisect", "gpu"], default=None,
                        help="compare this mstopk kernel with the torch path (--impls mstopk:torch,mstopk:KERNEL); "
                             "gpu on --device cpu needs TRITON_INTERPRET=1 and times only the interpreter")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads, 0 = torch's default")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs and of the fill")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up (also compiles the Triton kernels)
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _op_times(fn, device: torch.device) -> dict:
    """Where the call's time goes, per kernel; a profiler that cannot start here (no CUPTI)
    costs only this column, never the row."""
    try:
        return op_times_us(fn, 5, device)
    except Exception as e:  # any profiler failure: say it, keep the timings
        return {f"profiler failed: {type(e).__name__}: {e}": 0.0}


def _available(impl: str, device: torch.device) -> bool:
    if not impl.endswith(":gpu"):
        return True
    return gpu_kernel_available() if device.type == "cuda" else interpreter_enabled()


def measure(sizes: list[int], densities: list[float], device: torch.device, repeats: int, dists: list[str],
        dtype: torch.dtype, impls: list[str], seed: int = 0) -> list[dict]:
    """Measure every (dist, size, density, impl); returns the JSON rows."""
    rows = []
    for dist in dists:
        for n in sizes:
            x = make_input(dist, n, seed=seed, device=device, dtype=dtype)
            read_s = _median_time(lambda: x.sum(), repeats, device) if device.type == "cuda" else None
            for density in densities:
                k = k_for(n, density)
                exact_s = None
                for impl in impls:
                    if not _available(impl, device):
                        continue
                    name, _, kernel = impl.partition(":")
                    opts = {"kernel": kernel} if kernel else {}
                    gen = torch.Generator().manual_seed(seed)
                    fn = lambda: get_selector(name)(x, k, generator=gen, **opts)
                    median_s = _median_time(fn, repeats, device)
                    exact_s = median_s if name == "exact" else exact_s
                    _, idx = fn()
                    row = dict(selector=name, impl=kernel or "torch", device=device.type, distribution=dist,
                               dtype=str(dtype).replace("torch.", ""), numel=n, k=k, density=density,
                               median_s=median_s, speedup_vs_exact=(exact_s / median_s) if exact_s else None,
                               recall=recall(x, idx, k), energy=captured_energy(x, idx, k))
                    if name == "mstopk" and kernel in ("torch", "gpu"):  # bisect: N passes by definition
                        row.update(mstopk_counts(x, k, kernel, torch.Generator().manual_seed(seed)))
                        if device.type == "cuda":
                            row["op_us"] = _op_times(fn, device)
                    if read_s is not None:
                        nbytes = n * x.element_size()
                        row.update(eff_GBps=nbytes / median_s / 1e9, read_pass_s=read_s,
                                   time_in_read_passes=median_s / read_s)
                    rows.append(row)
                    where = ", ".join(f"{op} {us:g}" for op, us in list(row.get("op_us", {}).items())[:4])
                    print(f"  {dist} n={n} k={k} {impl}: {median_s * 1e3:.3f} ms"
                          + (f" (us per call: {where})" if where else ""), flush=True)
            del x
    return rows


def plot(rows: list[dict], path: str) -> None:
    """Time against size, one panel per density, one line per selector/impl (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    densities = sorted({r["density"] for r in rows})
    fig, axes = plt.subplots(1, len(densities), figsize=(5.5 * len(densities), 4), squeeze=False)
    for ax, density in zip(axes[0], densities):
        sub = [r for r in rows if r["density"] == density]
        for label in dict.fromkeys(f"{r['selector']}:{r['impl']}" for r in sub):
            pts = sorted((r["numel"], r["median_s"] * 1e3) for r in sub if f"{r['selector']}:{r['impl']}" == label)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("vector size d")
        ax.set_ylabel("time (ms)")
        ax.set_title(f"{sub[0]['device']}, k = {density:g} d")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    plt.close(fig)
    write_atomic(path, png.getbuffer())


def run(args: argparse.Namespace) -> Result:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA device is available")
    if args.threads:
        torch.set_num_threads(args.threads)
    impls = [i.strip() for i in (args.impls or IMPLS).split(",")]
    if args.impls is None and device.type == "cpu":
        impls.remove("mstopk:gpu")
    if args.kernel:
        impls = ["mstopk:torch"] + ([f"mstopk:{args.kernel}"] if args.kernel != "torch" else [])
        if args.kernel == "gpu" and not _available("mstopk:gpu", device):
            raise UsageError("--kernel gpu needs triton and a CUDA device, or TRITON_INTERPRET=1 with --device cpu")
    interpreted = device.type == "cpu" and "mstopk:gpu" in impls and _available("mstopk:gpu", device)
    default_sizes = GPU_SIZES if device.type == "cuda" else INTERPRETER_SIZES if interpreted else CPU_SIZES
    try:
        sizes = [parse_size(s) for s in (args.sizes or default_sizes).split(",")]
    except ValueError as e:
        raise UsageError(f"--sizes: {e}") from None
    try:
        densities = [float(d) for d in args.density.split(",")]
    except ValueError:
        raise UsageError(f"--density {args.density!r}: comma-separated numbers in (0, 1]") from None
    dists = [d.strip() for d in (args.dist or (KERNEL_DISTS if args.kernel else "gaussian")).split(",")]
    for d in dists:
        if d not in DISTRIBUTIONS and d != "ties":
            raise UsageError(f"unknown --dist {d!r}; valid: {sorted(DISTRIBUTIONS)}")
    dtype = getattr(torch, args.dtype)
    for impl in impls:
        name, _, kernel = impl.partition(":")
        try:
            get_selector(name)
        except ValueError as e:
            raise UsageError(f"--impls: {e}") from None
        if kernel and (name != "mstopk" or kernel not in ("torch", "bisect", "gpu")):
            raise UsageError(f"--impls: {impl!r}: only mstopk takes a kernel (torch, bisect, gpu)")
    where = f"GPU {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "CPU"
    print(f"{where}; torch {torch.__version__}, {torch.get_num_threads()} CPU threads", flush=True)
    if interpreted:
        print("mstopk:gpu runs in Triton's interpreter: its times are not GPU times; its counts are the GPU's",
              flush=True)
    repeats = args.repeats or (1 if interpreted else 5)
    rows = measure(sizes, densities, device, repeats, dists, dtype, impls, args.seed)
    columns = ["distribution", "numel", "k", "selector", "impl", "median_s", "speedup_vs_exact", "recall", "energy",
               "candidates_per_k", "fine_bin", "read_passes", "launches", "full_size_ops", "host_syncs"]
    if device.type == "cuda":
        columns += ["eff_GBps", "time_in_read_passes"]
    return Result(rows, columns, notes=[f"{where}, torch {torch.get_num_threads()} CPU threads, {repeats} timed calls "
                                        "per row (median)"], headline=_headline(rows),
                  figure=lambda path: plot(rows, path))


def _headline(rows: list[dict]) -> str | None:
    """MSTopK's speed-up over exact top-k at the largest size measured (density 0.001 if run)."""
    ms = [r for r in rows if r["selector"] == "mstopk" and r.get("speedup_vs_exact")]
    if not ms:
        return None
    n = max(r["numel"] for r in ms)
    best = max((r for r in ms if r["numel"] == n), key=lambda r: (r["density"] == 0.001, r["speedup_vs_exact"]))
    return (f"mstopk:{best['impl']} {best['speedup_vs_exact']:.1f}x torch.topk at d = {n:,}, density "
            f"{best['density']:g}, recall {best['recall']:.2f}")
