"""Issue 17, item 1: the embedded server is signalled only when proven ours and stuck."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from cachepipe.errors import CacheWarning
from cachepipe.server.embedded import EmbeddedRedis
from cachepipe.server.identity import alive
from tests.faults.cache_faults import NOBODY, needs_root, redis_on_socket, stopped


@pytest.fixture
def server(tmp_path):
    s = EmbeddedRedis(tmp_path / "cache", stuck_after=60)
    s.start("16mb")
    s.client().set("kept", b"value")
    yield s
    s.stuck_after = 5
    s.stop()


def test_busy_server_is_waited_for_not_killed(server):
    pid = server.pid()
    with stopped(pid, resume_after=2.0):  # misses many pings, answers again after 2 s
        assert server.start("16mb") is False
    assert server.pid() == pid and server.client().get("kept") == b"value"


def test_stop_waits_for_a_busy_server_to_shut_down_cleanly(server):
    pid = server.pid()
    with stopped(pid, resume_after=2.0):
        assert server.stop(timeout=0.5) is True
    assert not alive(pid)
    assert "bye bye" in server.log_path.read_text()  # it ran SHUTDOWN; no SIGKILL


def test_stuck_server_is_killed_only_after_the_limit(server):
    pid = server.pid()
    server.stuck_after = 1.0
    with stopped(pid):  # never resumed: stuck
        assert server.start("16mb") is True
    assert not alive(pid) and server.pid() not in (None, pid)


def test_pid_file_copied_from_another_cache_dir_is_not_ours(server, tmp_path):
    other = EmbeddedRedis(tmp_path / "other", stuck_after=1.0)
    other.dir.mkdir(parents=True)
    for name in ("redis.pid", "server.id"):
        shutil.copy(server.dir / name, other.dir / name)
    assert other.pid() is None  # pid and start time match, the socket does not
    assert other.start("16mb") is True
    assert other.stop() is True
    assert server.ping() and server.client().get("kept") == b"value"  # never signalled


@pytest.fixture
def run_dir(monkeypatch):
    """A short ``XDG_RUNTIME_DIR``: the socket path in it must stay within the 107 bytes a
    Unix socket takes, wherever pytest puts ``tmp_path`` (longer under xdist workers)."""
    path = Path(tempfile.mkdtemp(prefix="xdg-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_root()
def test_socket_of_another_user_is_never_used(tmp_path, run_dir):
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "cache"  # socket path too long: goes to the runtime dir
    server = EmbeddedRedis(deep, stuck_after=1.0)
    sock = server.socket_path
    assert str(sock).startswith(str(run_dir / f"cachepipe-{os.geteuid()}"))
    sock.parent.mkdir(mode=0o700)
    with redis_on_socket(sock, tmp_path / "foreign") as foreign:
        os.chown(sock, NOBODY, NOBODY)  # somebody else's server at our path
        assert not server.ping() and server.pid() is None
        with pytest.raises(PermissionError, match=f"{sock}.*uid {NOBODY}"):
            server.start("16mb")
        with pytest.raises(PermissionError):
            server.client()
        assert foreign.poll() is None and sock.exists()  # not signalled, not removed


@needs_root()
@pytest.mark.parametrize("owner,mode", [(NOBODY, 0o700), (os.geteuid(), 0o755)])
def test_a_socket_directory_we_did_not_make_private_is_never_used(tmp_path, run_dir, owner, mode):
    """Issue 32, item 17: another user (or a loose mode) on the shared cachepipe-<uid>
    directory gives a fresh private one instead of no embedded server."""
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "cache"  # socket path too long: goes to the runtime dir
    shared = run_dir / f"cachepipe-{os.geteuid()}"
    shared.mkdir(mode=mode)
    os.chmod(shared, mode)
    os.chown(shared, owner, owner)  # made first by someone else, or left open
    server = EmbeddedRedis(deep, stuck_after=1.0)
    try:
        with pytest.warns(CacheWarning, match="fresh private directory"):
            assert server.start("16mb") is True
        fresh = server.socket_path.parent
        st = fresh.stat()
        assert fresh != shared and fresh.name.startswith(f"cachepipe-{os.geteuid()}-")
        assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o700)
        assert list(shared.iterdir()) == []  # nothing of ours in theirs
        again = EmbeddedRedis(deep)  # another process of the cache dir finds it
        assert again.socket_path == server.socket_path and again.ping() and again.pid() == server.pid()
    finally:
        server.stop()
        if server.socket_path.parent != shared:
            shutil.rmtree(server.socket_path.parent, ignore_errors=True)


def test_server_in_a_long_command_is_waited_for(server):
    import threading

    pid = server.pid()
    busy = ("local s = tonumber(redis.call('TIME')[1]) "
            "while tonumber(redis.call('TIME')[1]) < s + 3 do end return 1")
    worker = threading.Thread(target=lambda: server.client(timeout=30).eval(busy, 0))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while server.ping():  # until the script runs: then it misses its 1 s pings
            assert time.monotonic() < deadline
        # the old start() SIGKILLed it here
        assert server.start("16mb") is False
    finally:
        worker.join()
    assert server.pid() == pid and server.client().get("kept") == b"value"
