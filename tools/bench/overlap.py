"""``cachepipe bench overlap``: a training step with and without overlap against its parts,
on an emulated slow cluster.

The question (issue 14): with overlap, does a sparse step take at most
``max(compute, exchange)`` + 15 %? Ranks run inside emulated nodes
(``--emulate MxN[@MBIT]``, default 2x2@4, as ``bench train --emulate``) on the model of ``bench train --emulate``'s
defaults with one fixed synthetic batch (no data loading: the claim is about compute and
exchange), and time every mode in interleaved rounds.

NOTE [overlap breakdown]: the four times, each the slowest rank's per step, median over
the steps of every round:

- ``compute``: forward + backward with no exchange at all (no hooks, no collectives),
  every rank starting after a barrier as it does after an exchange (ranks that never
  wait for each other would all compete for the cores all the time, a heavier load than
  any training step sees);
- ``exchange``: the exchange alone: every rank holds its gradients and starts
  ``synchronize()`` of an exchanger without overlap right after a barrier, so neither
  compute nor skew between ranks is in it;
- ``no overlap``: forward + backward, then ``synchronize()`` exchanges every bucket;
- ``overlap``: the engine's default: each bucket starts from the post-accumulate-grad hook
  of its last gradient, ``synchronize()`` finishes what is still in flight;
- ``pipeline``: ``overlap`` with ``pipeline=True``: each step's exchange runs on during
  the next step's forward and backward (NOTE [pipelined exchange] in comm/engine.py).

Modes alternate every few steps (``--steps``, after ``--warmup`` untimed ones) for
``--rounds`` rounds, in a rotating order, so that all see the same load: on a 2-core
machine shared with other jobs the load changes from minute to minute, and blocks of tens
of steps per mode measured the load more than the modes.

Without overlap a step is about ``compute + exchange``; perfect overlap would give
``max(compute, exchange)``.

NOTE [overlap bound]: an exchange that overlaps backward only cannot start before
backward has produced the first bucket's last gradient (``first_ready``: forward plus the
start of backward, measured in the overlapped step), and step ``t + 1``'s forward needs
the update; so ``bound = max(compute, first_ready + exchange)`` is what scheduling the
buckets can reach at best (an estimate: the exchange alone includes CPU work that could
run beside compute on an idle core). ``overlap_vs_bound`` says how much of the gap to
``max`` is the engine's, the rest is the bound's.

The overlap columns split the step: ``backward`` (forward +
backward with the launches inside it), ``launch_in_backward`` (the hooks' share: packing,
the first stages of the collectives, waiting there for the other ranks to reach the same
bucket, and ``select_in_backward``, the top-k selection), ``sync`` (after backward returned), of which
``blocked`` is waiting on collectives and ``launch_in_sync`` launches that had to wait for
``synchronize()``. The ``cpu`` columns are the process's CPU time in the same interval
(all its threads, gloo's included; the largest over the ranks): an exchange whose wall
time is far above its CPU time waits for the link or for other ranks to be scheduled.

``--burst`` sets the tbf bucket of the emulated links (NOTE [tbf burst] in
tools/bench/harness/cluster.py): the default bucket of 256 KiB passes a whole sparse exchange at once,
so only a smaller one makes every byte pay the link rate, as on a real slow link.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from tools.bench.harness import Result
from tools.bench.harness.workload import DEFAULTS
from tools.bench.ranks.overlap import plan_options
from tools.cli import UsageError

__all__ = ["configure", "run", "summarize"]

_ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["plan", "buckets", "compute_ms", "exchange_ms", "max_ms", "no_overlap_ms", "overlap_ms", "overlap_vs_max",
           "pipeline_ms", "pipeline_vs_max", "first_ready_ms", "bound_ms", "overlap_vs_bound", "backward_ms",
           "launch_in_backward_ms", "select_in_backward_ms", "sync_ms", "blocked_ms", "launch_in_sync_ms",
           "compute_cpu_ms", "exchange_cpu_ms", "overlap_cpu_ms", "pipeline_cpu_ms"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--comm", default="hitopk", help="exchange algorithm (comm.ALGORITHMS; default: hitopk)")
    parser.add_argument("--density", type=float, default=0.01, help="density of sparse algorithms (default: 0.01)")
    parser.add_argument("--selector", default="mstopk", help="top-k selector (default: mstopk)")
    parser.add_argument("--model", default="resnet_small", help="model name (default: resnet_small)")
    parser.add_argument("--batch", type=int, default=DEFAULTS["batch_size"],
                        help=f"batch per process (default: {DEFAULTS['batch_size']})")
    parser.add_argument("--size", type=int, default=DEFAULTS["size"], help=f"image side in pixels (default: {DEFAULTS['size']})")
    parser.add_argument("--plans", nargs="+", default=["size", "layer"],
                        help="bucket plans to compare: size (one 25 MiB fusion bucket), size:KIB, layer, "
                             "omgs (train --comm omgs: merged layers planned from a profile, exchanged with "
                             "topk_ag whatever --comm says) (default: size layer)")
    parser.add_argument("--rounds", type=int, default=30,
                        help="interleaved rounds: every mode runs in each (default: 30)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per mode and round (default: 2)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per mode and round (default: 1)")


def _median_ms(rows: list[dict], key: str) -> float:
    return 1000.0 * statistics.median(r[key] for r in rows)


def summarize(modes: dict[str, list[dict]], plans: list[str], buckets: dict[str, int]) -> list[dict]:
    """One row per plan from the per-step times of NOTE [overlap breakdown]."""
    compute, compute_cpu = _median_ms(modes["compute"], "step"), _median_ms(modes["compute"], "cpu")
    rows = []
    for plan in plans:
        exchange = _median_ms(modes[f"exchange {plan}"], "step")
        over = modes[f"overlap {plan}"]
        row = {"plan": plan, "buckets": buckets[plan], "compute_ms": compute, "exchange_ms": exchange,
               "max_ms": max(compute, exchange), "no_overlap_ms": _median_ms(modes[f"no overlap {plan}"], "step"),
               "overlap_ms": _median_ms(over, "step"), "compute_cpu_ms": compute_cpu,
               "exchange_cpu_ms": _median_ms(modes[f"exchange {plan}"], "cpu"), "overlap_cpu_ms": _median_ms(over, "cpu")}
        row["overlap_vs_max"] = row["overlap_ms"] / row["max_ms"]
        row["pipeline_ms"] = _median_ms(modes[f"pipeline {plan}"], "step")
        row["pipeline_cpu_ms"] = _median_ms(modes[f"pipeline {plan}"], "cpu")
        row["pipeline_vs_max"] = row["pipeline_ms"] / row["max_ms"]
        for key in ("backward", "launch_in_backward", "select_in_backward", "sync", "blocked", "launch_in_sync",
                    "first_ready"):
            row[f"{key}_ms"] = _median_ms(over, key)
        row["bound_ms"] = max(compute, row["first_ready_ms"] + exchange)  # NOTE [overlap bound]
        row["overlap_vs_bound"] = row["overlap_ms"] / row["bound_ms"]
        rows.append(row)
    return rows


def run(args: argparse.Namespace) -> Result:
    from tools.bench.harness.cluster import maybe_cluster
    from tools.bench.harness.jobs import launch
    from tools.bench.harness.ranks import rank_argv, read_rank_results

    emu = args.emulation
    try:
        for spec in args.plans:
            plan_options(spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for flag in ("rounds", "steps", "batch", "size"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag} must be >= 1; got {getattr(args, flag)}")
    if emu.mbit is None:
        raise UsageError("--emulate: the exchange needs a link; give MxN@MBIT")
    spec = {key: getattr(args, key) for key in ("batch", "size", "rounds", "steps", "warmup", "comm", "density",
                                                "selector", "model", "plans")}
    spec.update(nodes=emu.nodes, local_size=emu.local_size)
    with tempfile.TemporaryDirectory(prefix="cachepipe-bench-overlap-") as tmp:
        argv = rank_argv("tools.bench.ranks.overlap", spec, tmp)
        with maybe_cluster(emu, "ov") as cluster:
            launch(cluster, lambda rank: argv, local_size=emu.local_size, timeout=emu.timeout,
                   log_dir=Path(tmp) / "logs", env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(_ROOT)})
        result = read_rank_results(tmp)
    rows = summarize(result["modes"], args.plans, result["buckets"])
    best = min(rows, key=lambda r: r["overlap_vs_max"])
    return Result(rows, COLUMNS,
                  notes=[f"{emu.describe()}, {args.model} batch {args.batch} at {args.size} px, {args.comm} density "
                         f"{args.density} {args.selector}; medians of {args.rounds} x {args.steps} steps per mode "
                         "(slowest rank per step)"],
                  headline=f"overlap {best['overlap_vs_max']:.2f}x max(compute, exchange) ({best['plan']} plan), "
                           f"pipeline {best['pipeline_vs_max']:.2f}x")
