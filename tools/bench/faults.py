"""``cachepipe bench faults``: the demo trained while real faults are injected, against a fault-free run.

Every scenario runs ``cachepipe train`` (4 CPU ranks as 2 nodes x 2, one DataLoader worker
each, two real ``redis-server`` L2 shards, a warmed L1) in a subprocess and injects its
fault from here, on processes and files this benchmark made:

- ``shard``: SIGKILL L2 shard 1 after the first epoch, start it again (empty) after the second;
- ``worker``: SIGKILL one rank's DataLoader worker in the second epoch;
- ``corrupt``: overwrite source files with garbage, cold cache (they are read, and fail, each epoch);
- ``rank``: SIGKILL a rank after a few checkpoints, then ``--resume``;
- ``launcher``: SIGTERM ``cachepipe train`` itself after a few checkpoints, then ``--resume``;
- ``other_out``: resume a stopped run into another run's ``--out`` (refused, that run
  untouched), then into its own (``tools.bench.parts.faults_launcher``);
- ``l1``: truncate L1's ``data.mdb`` to 16 KiB and empty L2 before the run, so reads go to L1;
- ``fifo``, ``huge``, ``replaced``: a FIFO, a 40 GB sparse file, a same-size same-mtime
  replacement in a copy of the source (``tools/bench/parts/faults_sources.py``);
- ``drop_other``, ``drop_prefix``, ``drop_training``: ``cachepipe drop`` of another source's
  namespace, of a prefix with glob characters, of a namespace a run is training on
  (``tools/bench/parts/faults_drop.py``).
- ``sent_batches``, ``full_disk``, ``l2_servers``, ``kill9``, ``idle_server``: issue 46's
  round 3 (``tools/bench/parts/faults_round3.py``, whose docstring says what each checks).

Per scenario: whether the fault was injected and the run finished (``survived``), epochs,
steps and samples seen per epoch against the baseline (``samples_lost``: fewer samples
trained on; bad samples are replaced, so 0), bad samples replaced (``skipped``), the final
top-1 and whether it is identical to the baseline's (expected everywhere but ``corrupt``,
whose data differ), segments left in ``/dev/shm``, processes of the run (ranks, loader
workers) still alive 10 s after it ended (``procs_left``: found by an environment variable
every process of the run inherits, then killed), and for ``replaced`` whether the cache
served the old pixels afterwards (``stale``). A run that does not end within
``--timeout`` seconds is killed and did not survive.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.bench.harness import Result
from tools.bench.parts.faults_drop import DROP_FAULTS, drop_fault
from tools.bench.parts.faults_launcher import other_out, spawned_children, stop_launcher
from tools.bench.parts.faults_round3 import ROUND3, round3_fault
from tools.bench.parts.faults_sources import SOURCE_FAULTS, source_fault
from tools.cli import UsageError

__all__ = ["configure", "run", "spawned_children"]

SCENARIOS = ["baseline", "shard", "worker", "corrupt", "rank", "launcher", "other_out", *SOURCE_FAULTS,
             *DROP_FAULTS, *ROUND3, "l1"]  # l1 last: it damages the shared cache
COLUMNS = ["fault", "injected", "survived", "epochs", "steps", "samples_lost", "skipped", "top1",
           "same_top1", "shm_left", "procs_left", "stale", "exit"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenarios", nargs="+", default=SCENARIOS, choices=SCENARIOS,
                        help="what to inject (baseline always runs first)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (default 3)")
    parser.add_argument("--classes", type=int, default=4, help="classes in the generated dataset (default 4)")
    parser.add_argument("--per-class", type=int, default=64, help="training images per class (default 64)")
    parser.add_argument("--corrupt", type=int, default=5, help="files corrupted in the corrupt scenario (default 5)")
    parser.add_argument("--work-dir", default=None, help="where data, caches and runs go (default: a temporary dir)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a run may take before it is killed (a hang does not survive)")


_MARK = "CACHEPIPE_BENCH_FAULTS_RUN"  # in the environment of every process of a run


def _kill_marked(mark: str, grace: float = 10.0) -> list[int]:
    """The processes whose environment carries ``_MARK=mark`` (a run's) still alive ``grace``
    seconds after the run ended: killed (they are ours), their pids returned."""
    token = f"{_MARK}={mark}".encode()

    def marked() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and token in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except (OSError, ValueError):
                continue
        return found

    deadline = time.monotonic() + grace
    while (left := marked()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def _rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("cachepipe-comm-")}


class _Bench:
    def __init__(self, args, work: Path):
        from cachepipe import CacheConfig
        from tools.bench.harness.redis import private_redis
        from tools.demo import prepare_cache
        from tools.demo_dataset import make_dataset

        self.args, self.work = args, work
        (work / "logs").mkdir(parents=True, exist_ok=True)
        self.data = make_dataset(work / "data", classes=args.classes, per_class=args.per_class,
                                 val_per_class=max(args.per_class // 4, 1), size=64, seed=0)
        self.shards = [private_redis(work / f"shard{i}") for i in range(2)]
        self.urls = [s.url for s in self.shards]
        self.cache = work / "cache"
        prepare_cache(CacheConfig(self.data, self.cache, self.urls, 64))
        self.procs_left, self.stale = 0, "-"

    def train_argv(self, out: Path, data: Path | None = None, cache: Path | None = None, *extra) -> list[str]:
        argv = [sys.executable, "-m", "tools", "train", "--data", str(data or self.data), "--recipe", "demo",
                "--cache-dir", str(cache or self.cache), "--epochs", str(self.args.epochs), "--batch-size", "8",
                "--nprocs", "4", "--nodes", "2", "--local-size", "2", "--threads", "1", "--device", "cpu",
                "--set", "train.workers=1", "--ckpt-every", "2", "--out", str(out), *extra]
        for url in self.urls:
            argv += ["--l2", url]
        return argv

    def run(self, argv, inject=None) -> tuple[int, bool]:
        """Run ``argv``; ``inject(job)`` is polled while it runs and returns True once injected.
        A run past ``--timeout`` is killed; processes it leaves behind are counted in
        ``self.procs_left`` and killed."""
        log = self.work / "logs" / f"run{len(list((self.work / 'logs').glob('*')))}.log"
        mark = f"{os.getpid()}-{log.name}"
        deadline = time.monotonic() + self.args.timeout
        with open(log, "w") as f:  # a file, not a pipe: a chatty run never blocks on it
            job = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, _MARK: mark})
            injected = inject is None
            try:
                while job.poll() is None and time.monotonic() < deadline:
                    if not injected:
                        injected = bool(inject(job))
                    time.sleep(0.02)
            finally:
                if job.poll() is None:
                    job.kill()
                job.wait()
        self.log = log.read_text()
        self.procs_left += len(_kill_marked(mark))
        return job.returncode, injected


def _epochs_seen(out: Path, n: int):
    return lambda job: len(_rows(out)) >= n


def _kill_shard_then_restart(bench: _Bench, out: Path):
    state = {"killed": False, "restarted": False}

    def inject(job) -> bool:
        done = len(_rows(out))
        if not state["killed"] and done >= 1:
            bench.shards[1].kill()
            state["killed"] = True
        if state["killed"] and not state["restarted"] and done >= 2:
            bench.shards[1].start()
            state["restarted"] = True
        return state["restarted"]
    return inject


def _kill_worker(out: Path):
    def inject(job) -> bool:
        if len(_rows(out)) < 1:
            return False
        ranks = spawned_children(job.pid)
        workers = spawned_children(ranks[-1]) if ranks else []
        if workers:
            os.kill(workers[0], signal.SIGKILL)  # a loader worker of our own rank
        return bool(workers)
    return inject


def _kill_rank(out: Path):
    def inject(job) -> bool:
        if not (out / "checkpoints/gen3.npz").exists():
            return False
        ranks = spawned_children(job.pid)
        if ranks:
            os.kill(ranks[-1], signal.SIGKILL)  # a rank of our own job
        return bool(ranks)
    return inject


def _scenario(bench: _Bench, name: str) -> tuple[int, bool, Path]:
    out = bench.work / "runs" / name
    if name == "baseline":
        return (*bench.run(bench.train_argv(out)), out)
    if name == "shard":
        return (*bench.run(bench.train_argv(out), _kill_shard_then_restart(bench, out)), out)
    if name == "worker":
        return (*bench.run(bench.train_argv(out), _kill_worker(out)), out)
    if name == "corrupt":
        data = bench.work / "data-corrupt"
        shutil.copytree(bench.data, data)
        files = sorted((data / "train").rglob("*.*"))
        for f in files[:: max(len(files) // bench.args.corrupt, 1)][: bench.args.corrupt]:
            f.write_bytes(b"\xff\xd8 garbage, not a JPEG")
        return (*bench.run(bench.train_argv(out, data, bench.work / "cache-corrupt")), out)
    if name == "launcher":
        return (*stop_launcher(bench, out), out)
    if name == "other_out":
        return (*other_out(bench, out), out)
    if name in SOURCE_FAULTS:
        return (*source_fault(bench, name, out), out)
    if name in DROP_FAULTS:
        return (*drop_fault(bench, name, out), out)
    if name in ROUND3:
        return (*round3_fault(bench, name, out), out)
    if name == "l1":
        for mdb in bench.cache.rglob("data.mdb"):
            os.truncate(mdb, 16384)
        for shard in bench.shards:
            shard.client().flushall()
        return (*bench.run(bench.train_argv(out)), out)
    code, injected = bench.run(bench.train_argv(out), _kill_rank(out))  # rank
    if code == 0:
        return code, injected, out
    code, _ = bench.run(bench.train_argv(out, None, None, "--resume", str(out)))
    return code, injected, out


def _row(name: str, code: int, injected: bool, out: Path, base: list[dict], batch: int, shm: set) -> dict:
    rows = _rows(out)
    per_epoch = lambda rs: [(r["steps"] - (rs[i - 1]["steps"] if i else 0)) * batch for i, r in enumerate(rs)]
    seen, want = per_epoch(rows), per_epoch(base)
    top1 = rows[-1]["val_top1"] if rows else None
    return {"fault": name, "injected": "yes" if injected else "no", "survived": "yes" if code == 0 and
            len(rows) == len(base) else "no", "epochs": len(rows), "steps": rows[-1]["steps"] if rows else 0,
            "samples_per_epoch": seen, "samples_lost": sum(want) - sum(seen),
            "skipped": sum(r.get("skipped", 0) for r in rows), "top1": top1,
            "same_top1": "yes" if base and top1 == base[-1]["val_top1"] else "no",
            "shm_left": len(_shm() - shm), "exit": code}


def run(args: argparse.Namespace) -> Result:
    if args.epochs < 2:
        raise UsageError("--epochs must be >= 2 (faults are injected between epochs)")
    work = Path(args.work_dir).absolute() if args.work_dir else Path(tempfile.mkdtemp(prefix="cachepipe-faults-"))
    bench = _Bench(args, work)
    results, base = [], []
    try:
        for name in ["baseline"] + [s for s in args.scenarios if s != "baseline"]:
            shm = _shm()
            start = time.perf_counter()
            bench.procs_left, bench.stale = 0, "-"
            code, injected, out = _scenario(bench, name)
            if name == "baseline":
                base = _rows(out)
            row = _row(name, code, injected, out, base, 8 * 4, shm)
            row.update(procs_left=bench.procs_left, stale=bench.stale)
            row["seconds"] = round(time.perf_counter() - start, 1)
            if code:
                row["error"] = bench.log.strip().splitlines()[-1][:200] if bench.log.strip() else ""
            results.append(row)
            print(f"faults: {name}: {row}", file=sys.stderr, flush=True)
    finally:
        for shard in bench.shards:
            shard.kill()
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    survived = sum(r["survived"] == "yes" for r in results[1:])
    lost = sum(r["samples_lost"] for r in results[1:])
    return Result(results, COLUMNS, notes=[f"samples per epoch (baseline): {results[0]['samples_per_epoch']}"],
                  headline=f"{survived} of {len(results) - 1} faults survived, {lost} samples lost")
