"""``cachepipe bench memory``: peak memory per process of the sparse DDP hook against torch's
all-reduce hook, on the model of torch's ``test_is_last_hook``.

For every case (torch's ``allreduce_hook`` first, then every algorithm at every density)
it starts a fresh gloo job (``tools/bench/ranks/memory.py``; ``--emulate MxN``, default 1x2:
``comm.Topology`` of M nodes x N workers, ranks on this host's loopback unless ``@MBIT``
puts them in emulated nodes) that builds ``Linear(2, W)``
and ``L`` times ``Linear(W, W)`` without bias (W = 4000, L = 10: 160M parameters, 640 MB
of fp32 gradients, DDP buckets of one layer each), registers the hook and runs
``--steps`` forward/backward passes. Each rank reports its peak RSS (``getrusage``: the
whole process, torch, gloo and the hook's buffers); the table shows the larger of the two
and its ratio to the all-reduce hook's. Each process may be capped with ``--limit-gb``
(``RLIMIT_AS``): an exchange that needs more fails with "out of memory" in that row
instead of driving the machine into its OOM killer.

NOTE [hook working memory]: RSS mixes the model, DDP's buckets and the interpreter with
what the exchange allocates. ``--live-bytes`` runs backward inside
:class:`tools.bench.harness.live_bytes.LiveBytes` and also reports ``hook_peak_mib``: the most
bytes of tensors allocated during backward (gradients and DDP's copies included) alive at
once, which tells the exchange's own share apart from the rest.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from tools.bench.harness import Result

__all__ = ["configure", "run"]

ALGORITHMS = ["hitopk", "topk_ag", "gtopk", "hier", "2dtar", "dense"]
COLUMNS = ["hook", "density", "status", "peak_rss_mib", "vs_allreduce", "start_rss_mib", "grad_mib", "hook_peak_mib"]


def _density(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"--densities must be in (0, 1], got {text!r}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--width", type=int, default=4000, help="W, the width of every Linear (default 4000)")
    parser.add_argument("--layers", type=int, default=10, help="L, Linear(W, W) layers after Linear(2, W) (default 10)")
    parser.add_argument("--steps", type=int, default=3,
                        help="forward/backward passes (default 3: the first, DDP's bucket rebuild, one more)")
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS, choices=ALGORITHMS, metavar="ALG",
                        help=f"comm algorithms to run under the hook (default: {' '.join(ALGORITHMS)})")
    parser.add_argument("--densities", nargs="+", type=_density, default=[1.0, 0.25, 0.01],
                        help="densities of the sparse algorithms (default 1.0 0.25 0.01)")
    parser.add_argument("--selector", default="mstopk", help="top-k selector (default mstopk)")
    parser.add_argument("--limit-gb", type=float, default=None,
                        help="RLIMIT_AS per process in GiB (default: 60%% of this machine's RAM over the processes)")
    parser.add_argument("--live-bytes", action="store_true",
                        help="also count the bytes of tensors allocated in backward (NOTE [hook working memory])")


def run(args: argparse.Namespace) -> Result:
    from tools.bench.harness.cluster import maybe_cluster

    emu = args.emulation
    limit = args.limit_gb if args.limit_gb is not None else _default_limit_gb(emu.world)
    cases = [("allreduce", None)] + [(a, d) for a in args.algorithms for d in
                                     (args.densities if _sparse(a) else [None])]
    params = args.width * 2 + args.width * args.width * args.layers
    print(f"# model: Linear(2, {args.width}) + {args.layers} x Linear({args.width}, {args.width}), "
          f"{params / 1e6:.1f}M parameters; {emu.describe()}; RLIMIT_AS {limit:.1f} GiB per process", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="cachepipe-bench-memory-") as tmp, maybe_cluster(emu, "me") as cluster:
        for i, (hook, density) in enumerate(cases):
            rows.append(_run_case(args, cluster, hook, density, limit, Path(tmp) / f"case{i}"))
            print(f"  {hook:9s} density={density} {rows[-1]['status']} peak {rows[-1]['peak_rss_mib']} MiB",
                  flush=True)
    base = rows[0]["peak_rss_mib"] if rows[0]["status"] == "ok" else None
    for r in rows:
        r["vs_allreduce"] = round(r["peak_rss_mib"] / base, 2) if base and r["peak_rss_mib"] else None
        r.update(width=args.width, layers=args.layers, topology=f"{emu.nodes}x{emu.local_size}", limit_gb=limit,
                 selector=args.selector)
    worst = max((r for r in rows[1:] if r["vs_allreduce"]), key=lambda r: r["vs_allreduce"], default=None)
    return Result(rows, COLUMNS if args.live_bytes else COLUMNS[:-1],
                  notes=[f"{emu.describe()}; {params / 1e6:.1f}M parameters; RLIMIT_AS {limit:.1f} GiB per process"],
                  headline=(f"sparse hook peak RSS at most {worst['vs_allreduce']:.2f}x torch's all-reduce hook "
                            f"({worst['hook']}, density {worst['density']})" if worst else None))


def _sparse(algorithm: str) -> bool:
    from comm import ALGORITHMS as registry

    return registry[algorithm].sparse


def _default_limit_gb(processes: int) -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 * 0.6 / processes


def _run_case(args, cluster, hook: str, density: float | None, limit: float, workdir: Path) -> dict:
    from tools.bench.harness.jobs import JobFailed, launch
    from tools.bench.harness.ranks import rank_argv, read_rank_results

    emu = args.emulation
    spec = {"hook": hook, "density": density, "width": args.width, "layers": args.layers, "steps": args.steps,
            "nodes": emu.nodes, "local_size": emu.local_size, "selector": args.selector, "limit_gb": limit,
            "live_bytes": args.live_bytes}
    argv = rank_argv("tools.bench.ranks.memory", spec, workdir)
    status = "ok"
    try:
        launch(cluster, lambda rank: argv, local_size=emu.local_size, nodes=emu.nodes, timeout=emu.timeout,
               log_dir=workdir / "logs", fork=False)  # peak RSS of a process of its own
    except JobFailed as e:
        status = f"failed: {e}".split(";")[0]
    results = read_rank_results(workdir, per_rank=True)
    if any(r.get("status") == "out of memory" for r in results):
        status = "out of memory"
    mib = lambda key: max((r[key] for r in results if r.get(key) is not None), default=None)
    row = {"hook": hook, "density": density, "status": status}
    for key in ("peak_rss", "start_rss", "grad_bytes", "hook_peak"):
        value = mib(key)
        name = {"grad_bytes": "grad_mib"}.get(key, f"{key}_mib")
        row[name] = None if value is None else round(value / 2**20)
    row["rank_peak_rss_mib"] = [round(r["peak_rss"] / 2**20) for r in results if r.get("peak_rss")]
    return row
