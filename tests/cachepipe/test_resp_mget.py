"""The zero-copy MGET reader against real redis-server processes."""
from __future__ import annotations

import os

import pytest
import redis

from cachepipe.l2.resp_mget import MGetConnection


def test_values_match_redis_py_for_every_size_and_missing_keys(redis_server):
    client = redis_server.client()
    values = {f"k{n}": os.urandom(n) for n in (0, 1, 2, 13, 4095, 4096, 70_000, 300_000, 1_000_003)}
    values["crlf"] = b"\r\n$-1\r\n*2\r\n"  # framing bytes inside a value
    client.mset(values)
    keys = ["nope", *values, "also-missing"]
    conn = MGetConnection(redis_server.url)
    got = conn.mget(keys)
    assert got == client.mget(keys)
    assert got[0] is None and got[-1] is None and isinstance(got[1], memoryview)
    again = conn.mget(keys[::-1])  # the buffer guess now fits: no growth, same answers
    assert again == got[::-1]
    assert conn.mget([]) == []


def test_auth_and_select_from_the_url(redis_server):
    admin = redis_server.client()
    redis.Redis(host="127.0.0.1", port=redis_server.port, db=3).set("x", b"in-db-3")
    admin.config_set("requirepass", "s3cret")
    try:
        url = f"redis://:s3cret@127.0.0.1:{redis_server.port}/3"
        assert MGetConnection(url).mget(["x"]) == [b"in-db-3"]
        with pytest.raises(redis.AuthenticationError):  # as redis-py raises it (issue 46, item 13)
            MGetConnection(f"redis://:wrong@127.0.0.1:{redis_server.port}/3").mget(["x"])
        with pytest.raises(redis.AuthenticationError, match="NOAUTH"):
            MGetConnection(f"redis://127.0.0.1:{redis_server.port}/3").mget(["x"])
    finally:
        redis.Redis(host="127.0.0.1", port=redis_server.port, password="s3cret").config_set("requirepass", "")


def test_error_reply_keeps_the_stream_aligned(redis_server):
    client = redis_server.client()
    client.mset({"ok:1": b"1", "secret": b"2"})
    client.acl_setuser("reader", enabled=True, passwords=["+pw"], keys=["ok:*"], commands=["+mget", "+auth"])
    conn = MGetConnection(f"redis://reader:pw@127.0.0.1:{redis_server.port}/0")
    with pytest.raises(redis.ResponseError, match="NOPERM"):
        conn.mget(["ok:1", "secret"])
    sock = conn._sock
    assert conn.mget(["ok:1"]) == [b"1"] and conn._sock is sock  # same connection, still in step


def test_dropped_connection_reconnects(redis_server):
    client = redis_server.client()
    client.set("a", b"1")
    conn = MGetConnection(redis_server.url)
    assert conn.mget(["a"]) == [b"1"]
    sock = conn._sock
    client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")  # drops conn's socket
    assert conn.mget(["a"]) == [b"1"] and conn._sock is not sock  # reconnected once, as redis-py (issue 46, 13)


def test_dead_server_then_restart(redis_server):
    redis_server.client().set("a", b"v")
    conn = MGetConnection(redis_server.url, timeout=0.5)
    assert conn.mget(["a"]) == [b"v"]
    redis_server.kill()
    with pytest.raises(redis.ConnectionError):
        conn.mget(["a"])
    redis_server.start()
    redis_server.client().set("a", b"w")
    assert conn.mget(["a"]) == [b"w"]


def test_child_process_opens_its_own_socket(redis_server):
    redis_server.client().set("a", b"v")
    conn = MGetConnection(redis_server.url)
    assert conn.mget(["a"]) == [b"v"]
    parent_sock = conn._sock
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child must not read from (or close) the parent's socket
        ok = conn.mget(["a"]) == [b"v"] and conn._sock is not parent_sock
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert conn._sock is parent_sock and conn.mget(["a"]) == [b"v"]


def test_tls_urls_are_refused():
    with pytest.raises(ValueError, match="rediss"):
        MGetConnection("rediss://127.0.0.1:6379/0")


def test_the_reply_buffer_is_reused_only_when_no_value_of_it_is_alive(redis_server):
    client = redis_server.client()
    first = {f"a{n}": os.urandom(200_000) for n in range(8)}
    second = {f"b{n}": os.urandom(200_000) for n in range(8)}
    client.mset({**first, **second})
    conn = MGetConnection(redis_server.url)
    kept = conn.mget(list(first))[3]  # one value of the first reply kept
    buffer = conn._buffer
    got = conn.mget(list(second))  # must not land on the kept value
    assert conn._buffer is not buffer and bytes(kept) == first["a3"] and got == list(second.values())
    del kept, got
    buffer = conn._buffer
    for keys, want in ((first, first), (second, second)) * 2:  # nothing kept: the same buffer every time
        assert conn.mget(list(keys)) == list(want.values())
        assert conn._buffer is buffer
