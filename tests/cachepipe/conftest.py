"""Helpers for the cache tests: a Pillow reference decoder, file truncation, and a real
Redis Cluster fixture (``source`` and ``cache_dir`` come from tests/conftest.py)."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image


def reference_pixels(data: bytes, size: int) -> np.ndarray:
    """Plain Pillow decode + resize of the shorter side to ``size`` (the test's oracle)."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    if w <= h:
        nw, nh = size, int(size * h / w)
    else:
        nw, nh = int(size * w / h), size
    return np.asarray(img.resize((nw, nh), Image.Resampling.BILINEAR))


def truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _cluster_ports(n: int) -> list[int]:
    """Free ports whose cluster bus ports (port + 10000) are valid and free too."""
    import random
    import socket

    ports: list[int] = []
    for port in random.sample(range(20000, 55000), 2000):
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        if all(abs(port - p) not in (0, 10000) for p in ports):
            ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError("no free port pairs for Redis Cluster nodes")


@pytest.fixture
def redis_cluster(tmp_path):
    """A real 3-primary Redis Cluster (no replicas) on 127.0.0.1; yields
    ``(seed URL, clients, processes)``."""
    import time

    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from tests.redis_servers import private_redis

    servers, ports = [], _cluster_ports(3)
    try:
        for port in ports:
            d = tmp_path / f"cluster{port}"
            servers.append(private_redis(d, port=port, timeout=30,  # generous: CI machines are shared and loaded
                                         args=["--cluster-enabled", "yes", "--cluster-config-file",
                                               str(d / "nodes.conf")]))
        clients = [redis.Redis(host="127.0.0.1", port=p, retry=Retry(NoBackoff(), 0)) for p in ports]
        deadline = time.monotonic() + 30
        bounds = [0, 5461, 10923, 16384]
        for k, c in enumerate(clients):
            c.execute_command("CLUSTER", "ADDSLOTS", *range(bounds[k], bounds[k + 1]))
        for p in ports[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", p)
        while not all(c.cluster("info")["cluster_state"] == "ok" and
                      int(c.cluster("info")["cluster_known_nodes"]) == 3 for c in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("redis cluster did not form")
            time.sleep(0.05)
        yield f"redis-cluster://127.0.0.1:{ports[0]}", clients, [s.proc for s in servers]
    finally:
        for server in servers:
            server.kill()

