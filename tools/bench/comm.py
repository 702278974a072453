"""``cachepipe bench comm``: gradient exchange algorithms on an emulated cluster.

Runs ``--emulate MxN@MBIT`` (default 2x2@200: M network namespaces joined by links limited
to MBIT, N workers in each; ``tools/bench/harness/cluster.py``), times every algorithm on
every size (median of ``--reps`` exchanges after ``--warmup``, each the slowest worker's
time) and prints it beside the alpha-beta cost model: ``predicted_s`` uses parameters
fitted to this run's measurements (``comm.cost_model.fit_allgather``: the better of the ring
and recursive-doubling forms of the all-gather latency), ``nominal_s`` the nominal
link rate with the selector speed measured on rank 0. ``--loopback`` (and a machine
without root or iproute2, with a warning) runs every worker on loopback without a limit.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tools.bench.harness import Result

__all__ = ["configure", "run"]

RESNET50 = 25_557_032
COLUMNS = ["algorithm", "numel", "density", "median_s", "predicted_s", "nominal_s", "speedup_vs_dense"]


def configure(parser: argparse.ArgumentParser) -> None:
    from comm.registry import names

    parser.add_argument("--sizes", type=int, nargs="+", default=[RESNET50],
                        help="gradient sizes in fp32 elements (default: ResNet-50's 25,557,032)")
    parser.add_argument("--density", type=float, default=0.01, help="density rho of the sparse algorithms")
    every = names(per_bucket=True)  # what the engine's buckets run
    parser.add_argument("--algorithms", nargs="+", default=every, choices=every, metavar="ALG",
                        help=f"algorithms to time, from {every}")
    parser.add_argument("--selector", default=None,
                        help="top-k selector from comm.topk.SELECTORS (default: mstopk, the papers' choice "
                             "and the fastest here; exact and dgc return the exact top-k)")
    parser.add_argument("--value-dtype", default=None, choices=["fp16", "bf16"], help="wire dtype of values (default fp32)")
    parser.add_argument("--reps", type=int, default=3, help="timed exchanges per algorithm and size")
    parser.add_argument("--warmup", type=int, default=1, help="untimed exchanges first")
    parser.add_argument("--no-shm", action="store_true",
                        help="intra-node traffic over the gloo process group (default: the node's shared memory, "
                             "comm.shm, when its workers share /dev/shm)")


def run(args: argparse.Namespace) -> Result:
    from comm.topk import get_selector
    from tools.bench.harness.cluster import maybe_cluster
    from tools.bench.harness.jobs import launch
    from tools.bench.harness.ranks import rank_argv, read_rank_results
    from tools.cli import UsageError

    emu = args.emulation
    if not 0 < args.density <= 1:
        raise UsageError(f"--density {args.density:g}: must be in (0, 1]")
    selector = args.selector or "mstopk"
    try:
        get_selector(selector)
    except ValueError as exc:
        raise UsageError(f"--selector: {exc}") from None
    spec = {"nodes": emu.nodes, "local_size": emu.local_size, "inter_mbit": emu.mbit, "sizes": args.sizes,
            "density": args.density, "algorithms": args.algorithms, "selector": selector, "reps": args.reps,
            "warmup": args.warmup, "value_dtype": args.value_dtype, "shm": not args.no_shm}
    with tempfile.TemporaryDirectory(prefix="cachepipe-bench-comm-") as tmp:
        argv = rank_argv("tools.bench.ranks.comm", spec, tmp)
        with maybe_cluster(emu, "cm") as cluster:
            launch(cluster, lambda rank: argv, local_size=emu.local_size, nodes=emu.nodes, timeout=emu.timeout)
        result = read_rank_results(tmp)
    rows = _with_predictions(result["rows"], result["gamma"], emu.mbit)
    dense = next((r for r in rows if r.get("speedup_vs_dense") and r["algorithm"] == "hitopk"), None)
    return Result(rows, COLUMNS,
                  notes=[f"{emu.describe()}, selector {selector}, intra-node transport {rows[0]['intra_transport']}"],
                  headline=(f"hitopk {dense['speedup_vs_dense']:.1f}x dense at d = {dense['numel']:,}, density "
                            f"{dense['density']:g}" if dense else None),
                  figure=lambda path: _plot(rows, path, emu.describe()))


def _with_predictions(rows: list[dict], gamma: float | None, inter_mbit: float | None) -> list[dict]:
    from comm import cost_model
    from comm.registry import DENSE

    value_bytes = 2 if rows and rows[0].get("value_dtype") in ("fp16", "bf16") else 4
    form, fitted, errors = cost_model.fit_allgather(rows, value_bytes=value_bytes)
    nominal = cost_model.LinkParams.from_bandwidth(inter_mbit or 10_000.0, gamma=gamma or 0.0)
    dense = {r["numel"]: r["median_s"] for r in rows if r["algorithm"] == DENSE}
    for r in rows:
        args = (r["algorithm"], r["numel"], r["density"], r["nodes"], r["local_size"])
        r["predicted_s"] = cost_model.predict(*args, fitted, value_bytes=value_bytes, allgather=form)
        r["nominal_s"] = cost_model.predict(*args, nominal, value_bytes=value_bytes)
        r["gamma_measured"] = gamma
        r["allgather_form"] = form
        r.update({f"fit_error_{f}": e for f, e in errors.items()})
        if r["numel"] in dense:
            r["speedup_vs_dense"] = dense[r["numel"]] / r["median_s"]
    for k, v in vars(fitted).items():
        for r in rows:
            r[f"fit_{k}"] = v
    return rows


def _plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r["algorithm"] for r in rows):
        mine = sorted((r for r in rows if r["algorithm"] == name), key=lambda r: r["numel"])
        xs = [r["numel"] for r in mine]
        line, = ax.plot(xs, [r["median_s"] for r in mine], "o-", label=name)
        ax.plot(xs, [r["predicted_s"] for r in mine], "--", color=line.get_color(), alpha=0.6)
    ax.set(xscale="log", yscale="log", xlabel="elements (fp32)", ylabel="seconds per exchange",
           title=f"gradient exchange, {title} (dashed: cost model)")
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
