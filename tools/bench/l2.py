"""``cachepipe bench l2``: Redis CPU per GB of decoded samples served, one server vs several vs io-threads.

NOTE [a node's L2]: a node of 8 GPUs at ~3,000 images/s each reads ~5 GB/s of 256 px
samples from its L2. One ``redis-server`` executes every command on one thread, so what
limits a server is that thread's CPU per GB served; what a node pays is the CPU of all its
server threads. This benchmark starts each configuration's servers on Unix sockets (as
the embedded default), fills them with ``--values`` samples of ``--value-kb``, and has
``--clients`` processes (the loader's workers) issue batch MGETs through the loader's
reader (``cachepipe.l2.resp_mget``) for ``--seconds``, reads spread over the servers by key
as the sharded store does. Per configuration it reports GB/s served and, per GB, the
servers' CPU (``used_cpu_user + used_cpu_sys``, all threads), the busiest main thread's
(``used_cpu_*_main_thread``: the serial stage) and the clients' CPU.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import tempfile
import time
from pathlib import Path

from tools.bench.harness import Result
from tools.bench.harness.stats import median_run
from tools.cli import UsageError

__all__ = ["configure", "run"]

COLUMNS = ("config", "servers", "io_threads", "gb_per_s", "server_cpu_s_per_gb", "main_thread_cpu_s_per_gb",
           "client_cpu_s_per_gb", "max_gb_per_s_per_server")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", default="1,2,1x2",
                        help="comma-separated: N (N servers, reads spread by key) or 1xT (one server, T io-threads)")
    parser.add_argument("--clients", type=int, default=4, help="client processes (loader workers)")
    parser.add_argument("--batch", type=int, default=128, help="keys per batch (split over the servers)")
    parser.add_argument("--values", type=int, default=512, help="samples stored")
    parser.add_argument("--value-kb", type=int, default=245, help="sample size in KiB (256x327x3 px: 245)")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds per configuration and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")


def _parse(spec: str) -> tuple[int, int]:
    try:
        servers, _, threads = spec.partition("x")
        servers, threads = int(servers), int(threads or 1)
    except ValueError:
        raise UsageError(f"--configs: {spec!r} is neither N nor 1xT") from None
    if servers < 1 or threads < 1 or (threads > 1 and servers != 1):
        raise UsageError(f"--configs: {spec!r}: N >= 1 servers, or 1xT with T >= 1 io-threads")
    return servers, threads


def _servers(workdir: Path, count: int, threads: int) -> list:
    """``count`` servers on Unix sockets, as the embedded default (``threads`` io-threads each)."""
    from tools.bench.harness.redis import private_redis

    return [private_redis(workdir / str(i), tcp=False, io_threads=threads) for i in range(count)]


def _cpu(server) -> tuple[float, float]:
    """(all threads', main thread's) CPU seconds of a server so far."""
    info = server.client().info("cpu")
    main = float(info.get("used_cpu_user_main_thread", 0)) + float(info.get("used_cpu_sys_main_thread", 0))
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"]), main


def _client(urls: list[str], values: int, batch: int, seconds: float, start, out) -> None:
    from cachepipe.l2.resp_mget import MGetConnection

    conns = [MGetConnection(u, timeout=10) for u in urls]
    rng = random.Random(os.getpid())
    start.wait()
    served, t0, c0 = 0, time.monotonic(), time.process_time()
    while time.monotonic() - t0 < seconds:
        keys = rng.sample(range(values), batch)
        for s, conn in enumerate(conns):  # one MGET per server, as the sharded store reads a batch
            got = conn.mget([f"k{k}" for k in keys if k % len(conns) == s])
            served += sum(len(v) for v in got)
            del got
    out.put((served, time.process_time() - c0))


def _round(servers: list, args) -> dict:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_client, args=([s.url for s in servers], args.values, args.batch, args.seconds,
                                               start, out)) for _ in range(args.clients)]
    for p in procs:
        p.start()
    before = [_cpu(s) for s in servers]
    t0 = time.monotonic()
    start.set()
    results = [out.get(timeout=args.seconds + 60) for _ in procs]
    wall = time.monotonic() - t0
    for p in procs:
        p.join()
    after = [_cpu(s) for s in servers]
    gb = sum(r[0] for r in results) / 1e9
    total = sum(a[0] - b[0] for a, b in zip(after, before))
    main = max(a[1] - b[1] for a, b in zip(after, before))
    return {"gb_per_s": gb / wall, "server_cpu_s_per_gb": total / gb,
            "main_thread_cpu_s_per_gb": main * len(servers) / gb, "client_cpu_s_per_gb": sum(r[1] for r in results) / gb,
            "max_gb_per_s_per_server": gb / (main * len(servers)) if main else float("inf")}


def run(args: argparse.Namespace) -> Result:
    if args.values < args.batch or args.clients < 1 or args.seconds <= 0:
        raise UsageError(f"need --values >= --batch ({args.values} < {args.batch}?), --clients >= 1, --seconds > 0")
    configs = {spec: _parse(spec.strip()) for spec in args.configs.split(",") if spec.strip()}
    value = os.urandom(args.value_kb << 10)
    runs: dict[str, list[dict]] = {spec: [] for spec in configs}
    with tempfile.TemporaryDirectory(prefix="cachepipe-bench-l2-") as tmp:
        started: dict[str, list] = {}
        try:
            for spec, (n, threads) in configs.items():
                started[spec] = _servers(Path(tmp) / spec, n, threads)
                clients = [s.client() for s in started[spec]]
                for k in range(args.values):
                    clients[k % n].set(f"k{k}", value)
            for r in range(args.rounds):
                for spec, servers in started.items():
                    runs[spec].append(_round(servers, args))
                    print(f"round {r + 1}/{args.rounds} {spec}: {runs[spec][-1]['gb_per_s']:.2f} GB/s", flush=True)
        finally:
            for servers in started.values():
                for s in servers:
                    s.stop()
    rows = []
    for spec, results in runs.items():
        n, threads = configs[spec]
        rows.append({"config": spec, "servers": n, "io_threads": threads, **median_run(results, "server_cpu_s_per_gb"),
                     "clients": args.clients, "batch": args.batch, "value_kb": args.value_kb, "rounds": args.rounds,
                     "load_average": os.getloadavg()[0]})
    one = next((r for r in rows if r["servers"] == 1 and r["io_threads"] == 1), rows[0])
    return Result(rows, COLUMNS, notes=[f"load average {os.getloadavg()[0]:.2f}"],
                  headline=f"one server's main thread: {one['main_thread_cpu_s_per_gb']:.2f} s per GB "
                           f"(at most {one['max_gb_per_s_per_server']:.1f} GB/s a server)")
