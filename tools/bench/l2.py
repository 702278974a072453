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
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["configure", "main"]

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
    parser.add_argument("--json", default=None, metavar="PATH", help="write the rows as JSON")


def _parse(spec: str) -> tuple[int, int]:
    from tools.cli import UsageError

    try:
        servers, _, threads = spec.partition("x")
        servers, threads = int(servers), int(threads or 1)
    except ValueError:
        raise UsageError(f"--configs: {spec!r} is neither N nor 1xT") from None
    if servers < 1 or threads < 1 or (threads > 1 and servers != 1):
        raise UsageError(f"--configs: {spec!r}: N >= 1 servers, or 1xT with T >= 1 io-threads")
    return servers, threads


class _Server:
    def __init__(self, workdir: Path, threads: int) -> None:
        import redis

        from cachepipe.server.redis_binary import find_redis_server, server_env

        workdir.mkdir(parents=True, exist_ok=True)
        self.sock = workdir / "redis.sock"
        extra = ["--io-threads", str(threads), "--io-threads-do-reads", "yes"] if threads > 1 else []
        self.proc = subprocess.Popen(
            [find_redis_server(), "--port", "0", "--unixsocket", str(self.sock), "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", str(workdir), *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=server_env())
        self.client = redis.Redis(unix_socket_path=str(self.sock))
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.client.ping():
                    break
            except (redis.ConnectionError, FileNotFoundError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.sock} did not start")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    def cpu(self) -> tuple[float, float]:
        info = self.client.info("cpu")
        main = float(info.get("used_cpu_user_main_thread", 0)) + float(info.get("used_cpu_sys_main_thread", 0))
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"]), main

    def stop(self) -> None:
        from tools.emulated_job import stop_child

        stop_child(self.proc)


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


def _round(servers: list[_Server], args) -> dict:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_client, args=([s.url for s in servers], args.values, args.batch, args.seconds,
                                               start, out)) for _ in range(args.clients)]
    for p in procs:
        p.start()
    before = [s.cpu() for s in servers]
    t0 = time.monotonic()
    start.set()
    results = [out.get(timeout=args.seconds + 60) for _ in procs]
    wall = time.monotonic() - t0
    for p in procs:
        p.join()
    after = [s.cpu() for s in servers]
    gb = sum(r[0] for r in results) / 1e9
    total = sum(a[0] - b[0] for a, b in zip(after, before))
    main = max(a[1] - b[1] for a, b in zip(after, before))
    return {"gb_per_s": gb / wall, "server_cpu_s_per_gb": total / gb,
            "main_thread_cpu_s_per_gb": main * len(servers) / gb, "client_cpu_s_per_gb": sum(r[1] for r in results) / gb,
            "max_gb_per_s_per_server": gb / (main * len(servers)) if main else float("inf")}


def main(args: argparse.Namespace) -> int:
    from tools.bench.table import format_table, machine_description, write_json

    from tools.cli import UsageError

    if args.values < args.batch or args.clients < 1 or args.seconds <= 0:
        raise UsageError(f"need --values >= --batch ({args.values} < {args.batch}?), --clients >= 1, --seconds > 0")
    configs = {spec: _parse(spec.strip()) for spec in args.configs.split(",") if spec.strip()}
    value = os.urandom(args.value_kb << 10)
    runs: dict[str, list[dict]] = {spec: [] for spec in configs}
    with tempfile.TemporaryDirectory(prefix="cachepipe-bench-l2-") as tmp:
        started: dict[str, list[_Server]] = {}
        try:
            for spec, (n, threads) in configs.items():
                started[spec] = [_Server(Path(tmp) / f"{spec}-{i}", threads) for i in range(n)]
                for k in range(args.values):
                    started[spec][k % n].client.set(f"k{k}", value)
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
        median = sorted(results, key=lambda m: m["server_cpu_s_per_gb"])[len(results) // 2]
        n, threads = configs[spec]
        rows.append({"config": spec, "servers": n, "io_threads": threads, **median, "clients": args.clients,
                     "batch": args.batch, "value_kb": args.value_kb, "rounds": args.rounds,
                     "load_average": os.getloadavg()[0]})
    print(format_table(rows, COLUMNS))
    print(f"machine: {machine_description()}; load average {os.getloadavg()[0]:.2f}")
    if args.json:
        write_json(args.json, rows)
    return 0
