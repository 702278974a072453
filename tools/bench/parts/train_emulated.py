"""``cachepipe bench train --emulate MxN[@MBIT] --comm dense,hitopk,...``: time to accuracy on
an emulated slow cluster.

Builds ``M`` network-namespace nodes joined by links limited to ``MBIT`` Mbit/s (default 4:
NOTE [emulate defaults] in ``tools/bench/harness/workload.py``), starts one Redis server per
node (``tools.bench.harness.redis.node_servers``)
and warms the two-level cache into them before any clock runs: node ``i`` writes the samples
its own server holds (NOTE [warm-up partitions]), so a read from
another node crosses the limited link, as on a real cluster. Then, per algorithm, real
``cachepipe train`` ranks run inside the nodes (``N`` per node, torchrun's environment,
one torch thread each) with the same seed, data and recipe; the bytes each node's link
sent are read before and after (``link_bytes``). With ``--locality global,node`` every
algorithm also runs with node-local sampling (NOTE [node-local order] in
``loaders.locality``): its run is named ``COMM-node`` and its row has ``locality`` node.
With ``--pipeline-exchange off,on`` every algorithm of the comm engine also runs with
its exchange pipelined into the next step (NOTE [pipelined exchange] in comm/engine.py):
run ``COMM-pipe``, row ``pipeline`` true. Rows and plot: ``tools.bench.parts.train_tta``.

NOTE [emulate on real photos]: with ``--data ROOT`` photos smaller than 96 px train at
their own size (CIFAR-10's 32 px: upscaling them to 96 is 9x the work for no new detail),
at the default batch of 32 per process, for at most 8 epochs and at most ``STEP_BUDGET``
steps. Not a larger batch to keep the 96 px default's compute per step: at a fixed
density error feedback delays an entry by about ``1 / rho`` steps whatever the batch, so
a larger batch is staler in samples; with 4x and 9x the batch (learning rate scaled
linearly) ``hitopk`` ended 2.6 and 2.4 points below dense on CIFAR-10 in 8 epochs, where
batch 32 ends level (docs/benchmarks/history/train.md, issue 30). The step budget: a dense exchange
costs about a second per step at 4 Mbit/s whatever the batch, so steps set the dense
run's wall time; CIFAR-10's 390 steps an epoch give 3 epochs, about 20 minutes of dense
and 27 for ``--comm dense,hitopk,gtopk,powersgd,auto``. Flags override each setting; the
resolved ones are printed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tools.bench.harness import Result
from tools.bench.harness.flags import choices, comms as parse_comms
from tools.bench.harness.redis import l2_flags
from tools.bench.harness.workload import DEFAULTS
from tools.bench.parts.train_tta import build_rows, check_target, plot_top1_vs_time
from tools.cli import UsageError

__all__ = ["configure", "parse_comm_epochs", "run", "run_kinds", "settings"]

STEP_BUDGET = 1200  # NOTE [emulate on real photos]: training steps at most, with --data
COLUMNS = ["comm", "ran", "locality", "pipeline", "epochs", "final_top1", "target_top1", "seconds_to_target",
           "speedup_to_target_vs_dense", "seconds",
           "step_s", "compute_ms", "selection_ms", "exchange_ms", "waiting_ms", "data_ms", "update_ms",
           "inter_node_bytes_per_step", "val_s"]


def configure(group: argparse._ArgumentGroup) -> None:
    """Flags of the emulated mode (``--emulate``, ``--burst``, ``--job-timeout`` and
    ``--plot`` come from the harness; ``--data``, ``--size``, ``--batch-size``,
    ``--cache-size``, ``--epochs``, ``--density``, ``--comm``, ``--recipe``, ``--set`` from
    ``bench train``)."""
    group.add_argument("--locality", default=DEFAULTS["locality"],
                       help="comma-separated data localities, each run with every --comm: node (a node's ranks "
                            "draw the samples its Redis holds; run named COMM-node), global (every rank shuffles "
                            f"over all samples) (default: {DEFAULTS['locality']})")
    group.add_argument("--pipeline-exchange", default="off",
                       help="comma-separated off/on, each run with every --comm: on applies each step's exchange "
                            "one step late, overlapping the next step (run named COMM-pipe; not powersgd) "
                            "(default: off)")
    group.add_argument("--comm-epochs", default=None, metavar="COMM=N[,COMM=N]",
                       help="epochs of the named --comm runs instead of --epochs: time to accuracy lets each "
                            "exchange train on its own schedule (NOTE [epochs per exchange]); e.g. hitopk=10")
    group.add_argument("--powersgd-rank", type=int, default=2, help="matrix approximation rank of powersgd")
    group.add_argument("--target-top1", type=float, default=None,
                       help="target validation top-1 in %% (default: the dense run's final top-1 minus 1)")
    group.add_argument("--per-class", type=int, default=DEFAULTS["per_class"],
                       help="training images per class of the generated dataset (without --data)")
    group.add_argument("--out", default="runs/bench-train-emulated",
                       help="keeps data/, cache/, one run directory per algorithm, rows.json and the plot "
                            "top1_vs_time.png (--plot: a copy elsewhere)")
    group.add_argument("--reuse", action="store_true",
                       help="read the finished runs in OUT instead of training (to combine runs made by "
                            "separate commands into one table and plot)")


# NOTE [epochs per exchange]: time to accuracy (DAWNBench's measure) asks how soon each way
# of training reaches the target, and each may choose its own schedule: an exchange whose
# epochs are 15x cheaper than dense's may spend some on more epochs. The target stays dense's
# final top-1 - 1 at --epochs; `--comm-epochs hitopk=10` gives hitopk's run 10 epochs (its
# learning rate and density schedules then span 10). On CIFAR-10 at 4 Mbit/s hitopk at 8
# epochs ends 0.6-1.5 points below dense's 8 epochs, at 10 epochs 1.2-1.6 above them, and
# reaches dense's final top-1 - 1 ~14x sooner than dense (docs/benchmarks/train-emulated.md).
def parse_comm_epochs(text: str, comms: list[str]) -> dict[str, int]:
    """``--comm-epochs`` as ``{comm: epochs}``.

    Raises:
        UsageError: naming the flag, for a malformed item, a comm not in ``comms``, a comm named
            twice or fewer than 1 epoch.
    """
    epochs = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        comm, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit() or int(value) < 1:
            raise UsageError(f"--comm-epochs {text!r}: expected COMM=N with N >= 1, got {item!r}")
        if comm.strip() not in comms:
            raise UsageError(f"--comm-epochs {text!r}: {comm.strip()!r} is not in --comm {comms}")
        if comm.strip() in epochs:
            raise UsageError(f"--comm-epochs {text!r}: {comm.strip()!r} is given twice")
        epochs[comm.strip()] = int(value)
    return epochs


def run_kinds(comms: list[str], locality: str, pipeline: str = "off") -> dict[str, tuple[str, str, bool]]:
    """Run name -> ``(comm, locality, pipeline)``: every algorithm with every locality of
    ``--locality`` and every choice of ``--pipeline-exchange`` (the comm engine's only)."""
    from loaders.locality import LOCALITIES
    from comm.registry import ALGORITHMS

    localities = choices("--locality", locality, LOCALITIES)
    pipelines = [c == "on" for c in choices("--pipeline-exchange", pipeline, ("off", "on"))]
    return {comm + ("" if loc == "global" else f"-{loc}") + ("-pipe" if pipe else ""): (comm, loc, pipe)
            for comm in comms for loc in localities for pipe in pipelines
            if not (pipe and comm in ALGORITHMS and ALGORITHMS[comm].inside_ddp)}


def _train_argv(args, comm: str, locality: str, pipeline: bool, data: Path, run_dir: Path, cache_dir: Path,
                urls: list[str]) -> list[str]:
    run = args.resolved
    argv = [sys.executable, "-m", "tools", "train", "--data", str(data), "--recipe", _recipe(args),
            "--out", str(run_dir), "--overwrite", "--loader", "torch", "--cache-dir", str(cache_dir), "--device", "cpu",
            "--comm", comm, "--locality", locality, "--epochs", str(args.comm_epochs.get(comm, run["epochs"])),
            "--size", str(run["size"]),
            "--batch-size", str(run["batch_size"]), "--powersgd-rank", str(args.powersgd_rank),
            "--set", f"train.cache_size={run['cache_size']}", "--set", f"train.eval_size={run['size']}"]
    if args.model:
        argv += ["--model", args.model]
    if args.density is not None:
        argv += ["--density", str(args.density)]
    if pipeline:
        argv.append("--pipeline-exchange")
    argv += l2_flags(urls)
    for item in args.set:
        argv += ["--set", item]
    return argv


def _recipe(args) -> str:
    return args.recipe or DEFAULTS["recipe"]


def _native_size(data: str) -> int:
    """Shorter side of the first training photo of ``data`` (ImageFolder layout).

    Raises:
        UsageError: naming ``--data`` when it holds no readable photo under train/.
    """
    from PIL import Image

    root = Path(data) / "train"
    first = next((f for d in sorted(root.iterdir()) if d.is_dir() for f in sorted(d.iterdir()) if f.is_file()), None) \
        if root.is_dir() else None
    try:
        if first is None:
            raise OSError("none found")
        with Image.open(first) as image:
            return min(image.size)
    except OSError as exc:
        raise UsageError(f"--data {data}: no readable photo under train/<class>/ ({exc})") from None


def settings(args, world: int) -> dict:
    """Image size, cached size, batch per process and epochs of every run: the flags, else
    NOTE [emulate defaults]; with ``--data`` at the photos' own size when smaller and within
    ``STEP_BUDGET`` steps of ``world`` processes (NOTE [emulate on real photos])."""
    size = args.size or (min(DEFAULTS["size"], _native_size(args.data)) if args.data else DEFAULTS["size"])
    batch = args.batch_size or DEFAULTS["batch_size"]
    epochs = args.epochs or DEFAULTS["epochs"]
    if args.data and not args.epochs:
        from trainer.data.layout import count_images

        per_epoch = max(count_images(args.data, "train") // world // batch, 1)
        epochs = min(epochs, max(1, STEP_BUDGET // per_epoch))
    return {"size": size, "cache_size": args.cache_size or (size if args.data else DEFAULTS["cache_size"]),
            "batch_size": batch, "epochs": epochs}


def _prepare_data(args, out: Path) -> Path:
    """``--data``, or the generated dataset in OUT, one directory per image size and
    ``--per-class``: a dataset kept from an earlier command with other settings (the
    32 px default of before, say) is never trained on in their place."""
    if args.data:
        return Path(args.data).absolute()
    cache_size = args.resolved["cache_size"]
    data = out / "data" / f"{cache_size}px-{args.per_class}"
    if not (data / "val").is_dir():
        from tools.demo_dataset import make_dataset

        make_dataset(data, classes=10, per_class=args.per_class, val_per_class=DEFAULTS["val_per_class"],
                     size=cache_size, seed=0)
    return data


def _warm(cluster, emu, data: Path, out: Path, urls: list[str], cache_size: int) -> None:
    """Node ``i`` warms its own L1 and its L2 partition (outside every clock)."""
    from tools.bench.harness.redis import warm_node

    for node in range(emu.nodes):
        for split in ("train", "val"):
            warm_node(cluster, node, data / split, out / f"cache/node{node}", urls, cache_size, "--workers", "1",
                      "--quiet")


def _run_one(args, cluster, emu, name: str, kind: tuple[str, str, bool], data: Path, out: Path,
             urls: list[str]) -> dict:
    from tools.bench.harness.jobs import launch, link_bytes

    run_dir = out / name
    (run_dir / "bench.json").unlink(missing_ok=True)  # --reuse must never pair old counters with a new run
    before = link_bytes(cluster)
    start = time.perf_counter()
    comm, locality, pipeline = kind
    launch(cluster, lambda rank: _train_argv(args, comm, locality, pipeline, data, run_dir,
                                             out / f"cache/node{rank // emu.local_size}", urls),
           local_size=emu.local_size, env={"OMP_NUM_THREADS": "1"}, timeout=emu.timeout, log_dir=run_dir / "logs")
    job_s = time.perf_counter() - start
    after = link_bytes(cluster)
    result = {"inter_node_bytes": sum(a["tx"] - b["tx"] for a, b in zip(after, before)), "job_s": job_s,
              "comm": comm, "locality": locality, "pipeline": pipeline}
    (run_dir / "bench.json").write_text(json.dumps(result))
    return result


# NOTE [first epoch on a slow source]: with ``--source-latency-ms``/``--source-mbps`` the data
# is served through slowfs and no warm-up runs first: the first epoch of the first run reads
# every file from the share (read-through fills L1 and the node's L2), later epochs read the
# cache, and the rows' ``epoch_s`` and ``data_ms_per_epoch`` show it. The caches persist
# across the runs of one command, so only its first run pays the share: measure one --comm.
def _train_all(args, emu, runs: dict[str, tuple[str, str, bool]], out: Path) -> None:
    from tools.bench.harness.slow_source import slow_source

    with slow_source(args, _prepare_data(args, out)) as (data, where):  # NOTE [slow source flags]
        _train_on(args, emu, runs, out, data, where)


def _train_on(args, emu, runs: dict[str, tuple[str, str, bool]], out: Path, data: Path, where: str) -> None:
    """Warm each node (not on a slow source: there the first epoch reads through it, NOTE
    [first epoch on a slow source]) and train every run."""
    from tools.bench.harness.cluster import maybe_cluster
    from tools.bench.harness.redis import node_servers

    run = args.resolved
    print(f"bench train: {run['size']} px from a {run['cache_size']} px cache, batch {run['batch_size']} per process, "
          f"{run['epochs']} epochs, data {data} ({where})", file=sys.stderr)
    with maybe_cluster(emu, "tr") as cluster:
        with node_servers(cluster, [out / f"redis/node{node}" for node in range(emu.nodes)],
                          maxmemory="1gb") as servers:
            urls = [s.url for s in servers]
            start = time.perf_counter()
            if where == "local":
                _warm(cluster, emu, data, out, urls, args.resolved["cache_size"])
                print(f"bench train: warmed {emu.nodes} node(s) in {time.perf_counter() - start:.0f} s",
                      file=sys.stderr)
            for name, kind in runs.items():
                print(f"bench train: training {name} ...", file=sys.stderr)
                result = _run_one(args, cluster, emu, name, kind, data, out, urls)
                print(f"bench train: {name} done in {result['job_s']:.0f} s", file=sys.stderr)


def _load(out: Path, names: list[str]) -> dict[str, dict]:
    from trainer.metrics import read_metrics

    runs = {}
    for name in names:
        if not (out / name / "bench.json").is_file():
            raise UsageError(f"--reuse: {out / name} holds no finished run; train it first (without --reuse)")
        runs[name] = dict(json.loads((out / name / "bench.json").read_text()), metrics=read_metrics(out / name))
    return runs


def run(args: argparse.Namespace) -> Result:
    """Train (unless ``--reuse``), then the rows and the plot."""
    emu = args.emulation
    if emu.mbit is None:
        raise UsageError("--emulate: time to accuracy needs the emulated link; give MxN@MBIT or MxN")
    comms = parse_comms(args.comm or DEFAULTS["comm"])
    runs = run_kinds(comms, args.locality, args.pipeline_exchange)
    args.comm_epochs = parse_comm_epochs(args.comm_epochs or "", comms)
    for flag, value in (("--powersgd-rank", args.powersgd_rank), ("--per-class", args.per_class)):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1; got {value}")
    try:
        check_target(runs.values(), args.target_top1)  # before minutes of training, not after
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    args.resolved = settings(args, emu.world)
    out = Path(args.out).absolute()  # handed to redis-server, warm-ups and ranks: from any directory
    out.mkdir(parents=True, exist_ok=True)
    try:
        if not args.reuse:
            _train_all(args, emu, runs, out)
        done = _load(out, list(runs))
        rows = build_rows(done, args.target_top1)
    except (RuntimeError, subprocess.SubprocessError) as exc:
        raise UsageError(str(exc)) from None
    target = rows[0]["target_top1"]
    own = "".join(f", {comm} {n}" for comm, n in args.comm_epochs.items())
    title = (f"{emu.describe()}, {_recipe(args)} recipe, {args.resolved['size']} px from a "
             f"{args.resolved['cache_size']} px cache, {args.resolved['epochs']} epochs{own}")
    curves = {name: r["metrics"] for name, r in done.items()}
    draw = lambda path: plot_top1_vs_time(curves, target, path, title)
    plot = draw(out / "top1_vs_time.png")
    (out / "rows.json").write_text(json.dumps(rows, indent=1))
    best = max((r for r in rows if r.get("speedup_to_target_vs_dense") and r["comm"] != "dense"),
               key=lambda r: r["speedup_to_target_vs_dense"], default=None)
    from tools.bench.harness.slow_source import source_profile

    columns = [*COLUMNS, "epoch_s", "data_ms_per_epoch"] if source_profile(args) else COLUMNS
    return Result(rows, columns,
                  notes=[f"{title}, batch {args.resolved['batch_size']}/process, density "
                         f"{args.density or 'of each algorithm'} (sparse), powersgd rank {args.powersgd_rank}; "
                         "one Redis per node", f"plot: {plot}"],
                  headline=(f"{best['comm']} reaches dense's final top-1 - 1 {best['speedup_to_target_vs_dense']:.1f}x "
                            f"sooner than dense ({emu.describe()})" if best else None),
                  figure=draw)
