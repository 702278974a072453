"""``cachepipe bench l2``: the L2 read path's CPU per sample and per GB, Redis servers vs ``shm://``.

NOTE [a node's L2]: a node of 8 GPUs at ~3,000 images/s each reads ~5 GB/s of 256 px
samples from its L2. One ``redis-server`` executes every command on one thread, so what
limits a server is that thread's CPU per GB served; what a node pays is the CPU of all its
server threads and of its readers. This benchmark fills each configuration's store with
``--values`` real encoded samples (NOTE [L2 value format]) of ``--value-kb``, and has
``--clients`` processes (the loader's workers) read batches of ``--batch`` random samples
for ``--seconds`` through the store the registry opens for the configuration's resolved
:class:`~cachepipe.l2.spec.L2Spec` (the one a cache would use) and check each value as a
cache read does (header, index, XXH3: ``decode_sample``, no copy). Configurations: ``N``
(N servers on Unix sockets, reads spread over them by key as the sharded store does),
``1xT`` (one server with T io-threads), ``embedded`` (the embedded server of a cache dir,
as ``cachepipe warmup`` starts it), ``shm`` (an ``shm://`` store in ``/dev/shm``: no server,
the clients read the map in place). Per configuration it reports GB/s read, the CPU per
sample of the clients and of the servers (``INFO cpu``, every thread) and their sum (what a
node pays per sample read), and per GB the servers', the busiest main thread's (the serial
stage) and the clients' CPU.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

from tools.bench.harness import Result
from tools.bench.harness.stats import median_run
from tools.cli import UsageError

__all__ = ["configure", "run"]

COLUMNS = ("config", "servers", "io_threads", "gb_per_s", "us_per_sample", "client_us_per_sample",
           "server_us_per_sample", "server_cpu_s_per_gb", "main_thread_cpu_s_per_gb", "client_cpu_s_per_gb")
_NAMESPACE = "bench:l2:"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", default="1,2,1x2,embedded,shm",
                        help="comma-separated: N (N servers, reads spread by key), 1xT (one server, T io-threads), "
                             "embedded (a cache dir's embedded server), shm (an shm:// store, no server)")
    parser.add_argument("--clients", type=int, default=4, help="client processes (loader workers)")
    parser.add_argument("--batch", type=int, default=128, help="samples per batch (split over the servers)")
    parser.add_argument("--values", type=int, default=512, help="samples stored")
    parser.add_argument("--value-kb", type=int, default=245, help="sample size in KiB (256x327x3 px: 245)")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds per configuration and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")


def _parse(spec: str) -> tuple[int, int]:
    if spec in ("embedded", "shm"):
        return (1 if spec == "embedded" else 0), 1
    try:
        servers, _, threads = spec.partition("x")
        servers, threads = int(servers), int(threads or 1)
    except ValueError:
        raise UsageError(f"--configs: {spec!r} is neither N, 1xT, embedded nor shm") from None
    if servers < 1 or threads < 1 or (threads > 1 and servers != 1):
        raise UsageError(f"--configs: {spec!r}: N >= 1 servers, or 1xT with T >= 1 io-threads")
    return servers, threads


def _start(workdir: Path, spec: str, threads: int, count: int, need: int) -> tuple:
    """``(L2Spec, main-thread probes)`` of one configuration: its servers started (Unix sockets,
    as the embedded default), or its shm:// store's directory (``need`` bytes and some room)."""
    from cachepipe.l2.spec import L2Spec
    from tools.bench.harness.redis import private_redis

    if spec == "shm":
        return L2Spec.of_urls([f"shm://{workdir}"], memory=int(need * 1.3) + (64 << 20)), []
    if spec == "embedded":
        from cachepipe.server.embedded_group import EmbeddedGroup

        group = EmbeddedGroup(workdir, 1)
        group.start("4gb")
        return L2Spec.of_urls(group.urls), [group]
    servers = [private_redis(workdir / str(i), tcp=False, io_threads=threads) for i in range(count)]
    return L2Spec.of_urls([s.url for s in servers]), servers


def _main_thread_cpu(probes) -> float:
    """The busiest server main thread's CPU seconds so far (Redis' ``used_cpu_*_main_thread``)."""
    busiest = 0.0
    for probe in probes:
        for server in getattr(probe, "servers", [probe]):
            info = server.client().info("cpu")
            busiest = max(busiest, float(info.get("used_cpu_user_main_thread", 0))
                          + float(info.get("used_cpu_sys_main_thread", 0)))
    return busiest


def _client(spec, values: int, batch: int, seconds: float, start, out) -> None:
    from cachepipe.l2.codec import decode_sample
    from cachepipe.l2.registry import open_store

    store = open_store(spec.urls, _NAMESPACE, Counter(), timeout=10.0, memory=spec.memory)
    rng = random.Random(os.getpid())
    for lo in range(0, values, batch):  # map (shm) or connect (Redis) before the clock
        store.get_many(range(lo, min(lo + batch, values)))
    start.wait()
    served = samples = 0
    t0, c0 = time.monotonic(), time.process_time()
    while time.monotonic() - t0 < seconds:
        keys = rng.sample(range(values), batch)
        for i, value in zip(keys, store.get_many(keys)):  # one read per server, as a cache batch
            served += decode_sample(value, i, copy=False).nbytes + 32
            samples += 1
    out.put((served, samples, time.process_time() - c0))
    store.close()


def _round(spec, store, probes, args) -> dict:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_client, args=(spec, args.values, args.batch, args.seconds, start, out))
             for _ in range(args.clients)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # let the clients get ready (they wait on the event)
    before, main0 = store.server_cpu_seconds(), _main_thread_cpu(probes)
    t0 = time.monotonic()
    start.set()
    results = [out.get(timeout=args.seconds + 120) for _ in procs]
    wall = time.monotonic() - t0
    for p in procs:
        p.join()
    server, main = store.server_cpu_seconds() - before, _main_thread_cpu(probes) - main0
    gb, samples, client = sum(r[0] for r in results) / 1e9, sum(r[1] for r in results), sum(r[2] for r in results)
    return {"gb_per_s": gb / wall, "us_per_sample": 1e6 * (client + server) / samples,
            "client_us_per_sample": 1e6 * client / samples, "server_us_per_sample": 1e6 * server / samples,
            "server_cpu_s_per_gb": server / gb, "main_thread_cpu_s_per_gb": main * max(1, len(probes)) / gb,
            "client_cpu_s_per_gb": client / gb, "samples": samples}


def run(args: argparse.Namespace) -> Result:
    import numpy as np

    from cachepipe.l2.codec import encode_sample
    from cachepipe.l2.registry import open_store

    if args.values < args.batch or args.clients < 1 or args.seconds <= 0:
        raise UsageError(f"need --values >= --batch ({args.values} < {args.batch}?), --clients >= 1, --seconds > 0")
    configs = {spec: _parse(spec.strip()) for spec in args.configs.split(",") if spec.strip()}
    width = max(1, (args.value_kb << 10) // (256 * 3))
    pixels = np.random.default_rng(0).integers(0, 256, (256, width, 3), dtype=np.uint8)
    runs: dict[str, list[dict]] = {spec: [] for spec in configs}
    opened: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory(prefix="cachepipe-bench-l2-") as tmp, \
            tempfile.TemporaryDirectory(prefix="cachepipe-bench-l2-", dir="/dev/shm") as shm:
        try:
            for spec, (n, threads) in configs.items():
                spec_dir = Path(shm if spec == "shm" else tmp) / spec
                l2, probes = _start(spec_dir, spec, threads, n, args.values * pixels.nbytes)
                store = open_store(l2.urls, _NAMESPACE, Counter(), timeout=10.0, memory=l2.memory)
                opened[spec] = (l2, store, probes)
                for lo in range(0, args.values, 32):
                    store.put_many([(i, encode_sample(i, pixels)) for i in range(lo, min(lo + 32, args.values))])
                if store.missing(range(args.values)):
                    raise UsageError(f"--configs {spec}: the store did not take {args.values} samples of "
                                     f"{args.value_kb} KiB (lower --values)")
            for r in range(args.rounds):
                for spec, (l2, store, probes) in opened.items():
                    runs[spec].append(_round(l2, store, probes, args))
                    print(f"round {r + 1}/{args.rounds} {spec}: {runs[spec][-1]['gb_per_s']:.2f} GB/s, "
                          f"{runs[spec][-1]['us_per_sample']:.1f} us CPU per sample", flush=True)
        finally:
            for _, store, probes in opened.values():
                store.close()
                for probe in probes:
                    probe.stop()
    rows = []
    for spec, results in runs.items():
        n, threads = configs[spec]
        rows.append({"config": spec, "servers": n, "io_threads": threads, **median_run(results, "us_per_sample"),
                     "clients": args.clients, "batch": args.batch, "value_kb": args.value_kb, "rounds": args.rounds,
                     "load_average": os.getloadavg()[0]})
    return Result(rows, COLUMNS, notes=[f"load average {os.getloadavg()[0]:.2f}", "us_per_sample: CPU of the "
                                        "clients and the servers per sample read and checked"],
                  headline=_headline(rows))


def _headline(rows: list[dict]) -> str:
    by = {r["config"]: r for r in rows}
    redis = by.get("embedded") or by.get("1") or next((r for r in rows if r["servers"]), None)
    if "shm" in by and redis is not None:
        shm = by["shm"]
        return (f"shm: {shm['us_per_sample']:.1f} us CPU per sample, {redis['us_per_sample'] / shm['us_per_sample']:.1f}x "
                f"less than Redis ({redis['config']}: {redis['us_per_sample']:.1f} us)")
    one = redis or rows[0]
    return f"{one['config']}: {one['us_per_sample']:.1f} us CPU per sample (clients + servers)"
