"""``cachepipe bench comm``: gradient exchange algorithms on an emulated cluster.

Starts ``--nodes`` network namespaces joined by links limited to ``--inter-mbit``
(tools/cluster.py) with ``--local-size`` workers in each, times every algorithm on every
size (median of ``--reps`` exchanges after ``--warmup``, each the slowest worker's
time) and prints it beside the alpha-beta cost model: ``predicted_s`` uses parameters
fitted to this run's measurements (``comm.cost_model.fit_allgather``: the better of the ring
and recursive-doubling forms of the all-gather latency), ``nominal_s`` the nominal
link rate with the selector speed measured on rank 0. Without root (or iproute2) it
says so and runs every worker on loopback, without a rate limit.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tools.bench.table import format_table, machine_description, write_json

__all__ = ["configure", "main"]

RESNET50 = 25_557_032


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=2, help="emulated nodes (network namespaces)")
    parser.add_argument("--local-size", type=int, default=2, help="worker processes per node")
    parser.add_argument("--inter-mbit", type=float, default=200.0, help="inter-node link rate, Mbit/s (tc tbf)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[RESNET50],
                        help="gradient sizes in fp32 elements (default: ResNet-50's 25,557,032)")
    parser.add_argument("--density", type=float, default=0.01, help="density rho of the sparse algorithms")
    from comm.registry import names

    every = names(per_bucket=True)  # what the engine's buckets run
    parser.add_argument("--algorithms", nargs="+", default=every, choices=every, metavar="ALG",
                        help=f"algorithms to time, from {every}")
    parser.add_argument("--selector", default=None,
                        help="top-k selector from comm.topk.SELECTORS (default: mstopk, the papers' choice "
                             "and the fastest here; exact and dgc return the exact top-k)")
    parser.add_argument("--value-dtype", default=None, choices=["fp16", "bf16"], help="wire dtype of values (default fp32)")
    parser.add_argument("--reps", type=int, default=3, help="timed exchanges per algorithm and size")
    parser.add_argument("--warmup", type=int, default=1, help="untimed exchanges first")
    parser.add_argument("--loopback", action="store_true", help="skip namespaces: all workers on loopback, no limit")
    parser.add_argument("--no-shm", action="store_true",
                        help="intra-node traffic over the gloo process group (default: the node's shared memory, "
                             "comm.shm, when its workers share /dev/shm)")
    parser.add_argument("--port", type=int, default=29577, help="rendezvous port on rank 0's address")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before the workers are stopped")
    parser.add_argument("--json", default=None, help="write the rows as JSON here")
    parser.add_argument("--plot", default=None, help="write a time-vs-size plot (like MLSys'21 Fig. 7) here")


def main(args: argparse.Namespace) -> int:
    from tools.cluster import EmulatedCluster, netns_unavailable_reason

    if args.nodes < 1 or args.local_size < 1 or not 0 < args.density <= 1:
        print("bench comm: --nodes and --local-size must be >= 1 and --density in (0, 1]", file=sys.stderr)
        return 2
    from comm.topk import get_selector

    selector = args.selector or "mstopk"
    get_selector(selector)  # unknown name -> ValueError listing the valid ones
    reason = "--loopback given" if args.loopback else netns_unavailable_reason()
    if reason:
        print(f"bench comm: no emulated cluster ({reason}); running every worker on loopback "
              "without a rate limit", file=sys.stderr)
    inter_mbit = None if reason else args.inter_mbit
    with tempfile.TemporaryDirectory(prefix="cachepipe-bench-comm-") as tmp:
        out = Path(tmp) / "rows.json"
        cluster = None if reason else EmulatedCluster(args.nodes, inter_mbit)
        try:
            if cluster is not None:
                cluster.start()
            _run_workers(args, cluster, selector, inter_mbit, out)
        finally:
            if cluster is not None:
                cluster.close()
        result = json.loads(out.read_text())
    rows = _with_predictions(result["rows"], result["gamma"], inter_mbit)
    print(f"\n{machine_description()}; {args.nodes} nodes x {args.local_size} workers, "
          f"{'%g Mbit/s between nodes' % inter_mbit if inter_mbit else 'loopback'}, selector {selector}, "
          f"intra-node transport {rows[0]['intra_transport']}")
    print(format_table(rows, ["algorithm", "numel", "density", "median_s", "predicted_s", "nominal_s",
                              "speedup_vs_dense"]))
    if args.json:
        write_json(args.json, rows)
    if args.plot:
        _plot(rows, args.plot, f"{args.nodes}x{args.local_size}, {inter_mbit or 'loopback'} Mbit/s")
    return 0


def _run_workers(args, cluster, selector, inter_mbit, out: Path) -> None:
    from tools.emulated_job import launch

    world = args.nodes * args.local_size
    addr = cluster.address(0) if cluster else "127.0.0.1"

    def argv(rank: int) -> list[str]:
        cmd = [sys.executable, "-m", "tools.bench.comm_worker", "--rank", str(rank), "--world", str(world),
               "--nodes", str(args.nodes), "--local-size", str(args.local_size), "--master-addr", addr,
               "--master-port", str(args.port), "--iface", "eth0" if cluster else "lo",
               "--sizes", *map(str, args.sizes), "--density", str(args.density),
               "--algorithms", *args.algorithms, "--selector", selector, "--reps", str(args.reps),
               "--warmup", str(args.warmup), "--out", str(out)]
        if args.value_dtype:
            cmd += ["--value-dtype", args.value_dtype]
        if args.no_shm:
            cmd.append("--no-shm")
        if inter_mbit:
            cmd += ["--inter-mbit", str(inter_mbit)]
        return cmd

    launch(cluster, argv, local_size=args.local_size, nodes=args.nodes, port=args.port, timeout=args.timeout)


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
