"""The figures of one scale tree, each measured in a process of its own, and their growth.

Every figure comes from a fresh process (a ``cachepipe`` command, or the loader probe of
``probe.py``) so that its time and memory are that process's alone: nothing one
measurement allocated or touched counts in the next. Commands run as ``python -m tools``
with the environment given, so the same functions measure another checkout of cachepipe
(``PYTHONPATH``), the figures before a change.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from tools.bench.harness.procs import children_of
from tools.bench.harness.proc_memory import memory

__all__ = ["growth", "growth_rows", "l1_check", "manifest_bytes", "measure_tree", "run_command", "summary_row"]

MB = 1e6


def run_command(argv: list[str], *, env: dict | None = None, timeout: float = 3600) -> dict:
    """Run ``argv`` and measure it: ``seconds``, ``rc``, ``stdout``, ``stderr``, ``max_rss``
    (the peak RSS of the process or of a descendant it reaped, from ``wait4``), and
    ``children_max_uss`` and ``children_max_anon`` (the largest USS and anonymous memory
    any descendant showed, sampled every 0.2 s: the warm-up's workers)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    peak = {"uss": 0, "anon": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            for pid in children_of(proc.pid):
                try:
                    now = memory(pid)
                except OSError:
                    continue
                peak["uss"], peak["anon"] = max(peak["uss"], now["uss"]), max(peak["anon"], now["anon"])

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    streams: dict[str, str] = {}
    readers = [threading.Thread(target=lambda n=n, f=f: streams.__setitem__(n, f.read()), daemon=True)
               for n, f in (("stdout", proc.stdout), ("stderr", proc.stderr))]
    for t in readers:
        t.start()
    deadline = time.monotonic() + timeout
    try:
        while True:  # wait4 ourselves: its rusage is this child's own (Popen.wait would reap it first)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.05)
    finally:
        done.set()
        watcher.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in readers:
        t.join()
    return {"seconds": time.perf_counter() - t0, "rc": proc.returncode, "stdout": streams.get("stdout", ""),
            "stderr": streams.get("stderr", ""), "max_rss": usage.ru_maxrss * 1024,
            "children_max_uss": peak["uss"], "children_max_anon": peak["anon"]}


def manifest_bytes(cache_dir: str | os.PathLike) -> int:
    """Bytes of the saved manifest files under ``cache_dir`` (``<fingerprint>/manifest*``)."""
    return sum(p.stat().st_size for p in Path(cache_dir).glob("*/manifest*") if p.is_file())


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tools", *args]


def measure_tree(tree: str | os.PathLike, work: str | os.PathLike, *, cache_size: int = 32, workers: int = 2,
                 batches: int = 1000, batch_size: int = 64, contexts: tuple[str, ...] = ("fork", "spawn"),
                 env: dict | None = None, log=None) -> dict:
    """Every figure of ``tree`` with a fresh cache in ``work`` (emptied first).

    Returns:
        ``scan`` (a full scan, ``cachepipe stats --no-l2`` with no saved manifest),
        ``warmup``, ``warmup_again`` (the second, "nothing to do"), ``stats`` (after the
        warm-up), each ``{seconds, rc, max_rss, children_max_uss}``, ``warmup_rate`` (files
        per second), ``manifest_bytes``, and ``loader``: per start method the probe's figures
        (``probe.loader_probe``).
    """
    work = Path(work)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    cache = str(work / "cache")
    src = os.fspath(tree)
    say = log or (lambda msg: None)
    out: dict = {}

    def step(name: str, *args: str) -> dict:
        r = run_command(_cli(*args), env=env)
        say(f"{name}: rc {r['rc']} in {r['seconds']:.2f} s, max RSS {r['max_rss'] / MB:.0f} MB"
            + (f"\n{r['stderr'][-2000:]}" if r["rc"] else ""))
        out[name] = {k: r[k] for k in ("seconds", "rc", "max_rss", "children_max_uss", "children_max_anon")}
        return r

    step("scan", "stats", src, "--cache-dir", str(work / "scan"), "--no-l2")
    warm = ["warmup", src, "--cache-dir", cache, "--cache-size", str(cache_size), "--workers", str(workers),
            "--quiet"]
    r = step("warmup", *warm)
    out["warmup_rate"] = _files(tree) / r["seconds"] if r["rc"] == 0 else 0.0
    step("warmup_again", *warm)
    step("stats", "stats", src, "--cache-dir", cache, "--json")
    out["manifest_bytes"] = manifest_bytes(cache)
    out["loader"] = {}
    for ctx in contexts:
        r = run_command([sys.executable, "-m", "tools.bench.parts.scale_probe", "loader", src, "--cache-dir", cache,
                         "--context", ctx, "--workers", str(workers), "--batches", str(batches),
                         "--batch-size", str(batch_size), "--size", str(cache_size),
                         "--cache-size", str(cache_size)], env=env)
        say(f"loader {ctx}: rc {r['rc']} in {r['seconds']:.2f} s" + (f"\n{r['stderr'][-2000:]}" if r["rc"] else ""))
        out["loader"][ctx] = json.loads(r["stdout"].strip().splitlines()[-1]) if r["rc"] == 0 else {"rc": r["rc"]}
    run_command(_cli("server", "stop", "--cache-dir", cache), env=env)
    return out


def _files(tree: str | os.PathLike) -> int:
    marker = Path(tree) / ".complete"
    return int(marker.read_text().split()[0])


def growth(n1: int, v1: float, n2: int, v2: float) -> float:
    """The exponent k of ``v ~ n**k`` between two sizes (``nan`` when a value is not positive).

    Example:
        >>> round(growth(100_000, 1.0, 1_000_000, 10.0), 2)
        1.0
    """
    if v1 <= 0 or v2 <= 0 or n1 == n2:
        return math.nan
    return math.log(v2 / v1) / math.log(n2 / n1)


def l1_check(tree: str | os.PathLike, work: str | os.PathLike, *, env: dict | None = None) -> dict:
    """Warm ``tree`` into L1 alone (``--no-l2``) in a fresh cache: ``rc`` (6: L1 full),
    ``seconds``, ``entries`` (L1 entries after it) and ``error`` (the error line, if any)."""
    work = Path(work)
    if work.exists():
        shutil.rmtree(work)
    r = run_command(_cli("warmup", os.fspath(tree), "--cache-dir", str(work), "--no-l2", "--quiet",
                         "--workers", "1"), env=env)
    lines = [ln for ln in r["stderr"].splitlines() if "error:" in ln]
    stats = run_command(_cli("stats", os.fspath(tree), "--cache-dir", str(work), "--no-l2", "--json"), env=env)
    entries = json.loads(stats["stdout"])["l1"]["entries"] if stats["rc"] == 0 else 0
    return {"rc": r["rc"], "seconds": r["seconds"], "entries": entries, "error": lines[-1] if lines else ""}


def _mb(v: float) -> float:
    return v / MB


def summary_row(files: int, r: dict) -> dict:
    """The figures of one :func:`measure_tree` result as one flat row (times in s, memory in MB;
    a worker's memory is the larger of its loader's workers')."""
    row = {"files": files, "scan_s": r["scan"]["seconds"], "scan_rss_mb": _mb(r["scan"]["max_rss"]),
           "stats_s": r["stats"]["seconds"], "warmup_files_per_s": r["warmup_rate"],
           "warmup_worker_uss_mb": _mb(r["warmup"]["children_max_uss"]),
           "warmup_worker_anon_mb": _mb(r["warmup"]["children_max_anon"]),
           "warmup_again_s": r["warmup_again"]["seconds"], "manifest_mb": _mb(r["manifest_bytes"]),
           "failed": [k for k in ("scan", "warmup", "warmup_again", "stats") if r[k]["rc"]]}
    for ctx, lr in r["loader"].items():
        if "rc" in lr:
            row["failed"].append(f"loader {ctx}")
            continue
        worst = lambda key, field: _mb(max((w[field] for w in lr[key]), default=0))  # noqa: E731
        row.update({f"construct_{ctx}_s": lr["construct_s"], f"rank_rss_{ctx}_mb": _mb(lr["rank_built"]["rss"]),
                    f"rank_rss_after_{ctx}_mb": _mb(lr["rank_after"]["rss"]),
                    f"first_batch_{ctx}_s": lr["first_batch_s"], f"per_batch_{ctx}_ms": 1e3 * lr["per_batch_s"],
                    f"worker_uss_{ctx}_mb": worst("worker_after", "uss"),
                    f"worker_anon_{ctx}_mb": worst("worker_after", "anon"),
                    f"worker_pss_{ctx}_mb": worst("worker_after", "pss"),
                    f"worker_rss_{ctx}_mb": worst("worker_after", "rss"),
                    f"worker_uss_growth_{ctx}_mb": worst("worker_after", "uss") - worst("worker_first", "uss"),
                    "shuffle_s": lr["shuffle_s"]})
    return row


def growth_rows(rows: list[dict], fields: list[str]) -> list[dict]:
    """Per pair of consecutive sizes, the growth exponent of every field (1: linear in N)."""
    out = []
    for a, b in zip(rows, rows[1:]):
        out.append({"from": a["files"], "to": b["files"],
                    **{f: growth(a["files"], a.get(f, 0), b["files"], b.get(f, 0)) for f in fields}})
    return out
