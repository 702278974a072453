"""cachepipe slowfs: a real FUSE mount of a small tree (latency per request, requests that
overlap, one bandwidth cap for all readers, read-only, the stats file, SIGTERM and SIGKILL).

Loose bounds only (a request takes at least its latency; eight overlapping reads take far
less than eight serial ones): timing targets live in the benchmarks (``bench io``).
"""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cachepipe.slowfs import SlowProfile
from tools.bench.harness.slow_source import slowfs_mount

pytestmark = pytest.mark.fuse

FILES = 8
FILE_BYTES = 200_000


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("slowfs_src")
    for k in range(FILES):
        (root / f"d{k % 2}").mkdir(exist_ok=True)
        (root / f"d{k % 2}" / f"f{k}.bin").write_bytes(os.urandom(FILE_BYTES))
    return root


def _files(root: Path) -> list[Path]:
    return sorted(root.glob("d*/f*.bin"))


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def test_each_request_waits_and_requests_overlap(tree):
    with slowfs_mount(tree, SlowProfile(latency_ms=60, mbps=0)) as m:
        files = _files(m.path)
        assert _timed(lambda: os.stat(files[0])) >= 0.06  # a lookup (and a stat) pays the latency
        one = _timed(lambda: files[1].read_bytes())  # lookup, open, read(s): several requests
        assert one >= 3 * 0.06
        threads = [threading.Thread(target=p.read_bytes) for p in files[2:]]  # 6 files not read yet
        eight = _timed(lambda: ([t.start() for t in threads], [t.join() for t in threads]))
        assert eight < 0.5 * len(threads) * one, (eight, one)  # in flight together, not one after another


def test_one_bandwidth_cap_for_all_readers(tree):
    mbps = 4.0  # 8 files of 200 kB: 1.6 MB, at least 0.4 s at 4 MB/s whatever the number of readers
    with slowfs_mount(tree, SlowProfile(latency_ms=0, mbps=mbps)) as m:
        files = _files(m.path)
        threads = [threading.Thread(target=p.read_bytes) for p in files]
        seconds = _timed(lambda: ([t.start() for t in threads], [t.join() for t in threads]))
    total = FILES * FILE_BYTES
    assert total / seconds <= 1.25 * mbps * 1e6, f"{total / seconds / 1e6:.1f} MB/s through a {mbps} MB/s cap"
    assert m.stats()["totals"]["bytes"] >= total


def test_read_only_and_the_stats_file(tree):
    with slowfs_mount(tree, SlowProfile(latency_ms=1, mbps=0)) as m:
        files = _files(m.path)
        for attempt in (lambda: open(files[0], "r+b"), lambda: (m.path / "new").write_bytes(b"x"),
                        lambda: (m.path / "newdir").mkdir(), lambda: files[0].unlink()):
            with pytest.raises(OSError) as err:
                attempt()
            assert err.value.errno == errno.EROFS
        assert files[3].read_bytes() == (tree / files[3].relative_to(m.path)).read_bytes()
        assert files[3].read_bytes()  # reopened: the kernel dropped its pages (NOTE [slowfs caching])
    assert m.process.returncode == 0
    doc = m.stats()
    entry = doc["files"][str(files[3].relative_to(m.path))]
    assert entry["opens"] == 2 and entry["bytes"] == 2 * FILE_BYTES and entry["reads"] >= 2
    assert doc["profile"]["latency_ms"] == 1 and doc["ops"]["getattr"] >= 1
    assert doc["totals"]["opens"] == 2  # the refused opens for writing never reached the file


def _start(src: Path, mnt: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tools", "slowfs", str(src), str(mnt), "--latency-ms", "0",
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _until_mounted(proc: subprocess.Popen) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        if line.startswith("mounted "):
            return lines
    raise AssertionError(f"slowfs ended without mounting: {lines}")


def test_sigterm_unmounts_and_sigkill_leaves_a_mount_the_next_slowfs_clears(tree, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = _start(tree, mnt)
    _until_mounted(proc)
    proc.kill()  # our own child: SIGKILL, no unmount
    proc.wait()
    with pytest.raises(OSError) as err:
        os.stat(mnt)
    assert err.value.errno == errno.ENOTCONN  # "Transport endpoint is not connected"
    proc = _start(tree, mnt, "--stats", str(tmp_path / "stats.json"))
    lines = _until_mounted(proc)
    assert any("cleared the dead FUSE mount" in line for line in lines), lines
    assert (mnt / "d0" / "f0.bin").read_bytes() == (tree / "d0" / "f0.bin").read_bytes()
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=20)[0]
    assert proc.returncode == 0 and "unmounted" in out, out
    assert not os.path.ismount(mnt) and list(mnt.iterdir()) == []
    assert json.loads((tmp_path / "stats.json").read_text())["files"]["d0/f0.bin"]["opens"] == 1


def _refused(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools", "slowfs", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_bad_input_is_one_line(tree, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    afile = tmp_path / "afile"
    afile.write_text("x")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [((str(tree), str(full)), 2, "not empty"), ((str(tree), str(afile)), 2, "not a directory"),
             ((str(tree), str(tmp_path / "nope")), 2, "does not exist"),
             ((str(tmp_path / "nosrc"), str(empty)), 2, "SRC"),
             ((str(tree), str(empty), "--latency-ms", "-1"), 2, "--latency-ms -1"),
             ((str(tree), str(empty), "--mbps", "-5"), 2, "--mbps -5"),
             ((str(tree), str(empty), "--metadata-latency-ms", "nan"), 2, "--metadata-latency-ms")]
    for args, code, words in cases:
        done = _refused(*args)
        assert done.returncode == code and words in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    no_fusermount = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # python, but no fusermount3
    done = _refused(str(tree), str(empty), env=no_fusermount)
    assert done.returncode == 1 and "apt-get install fuse3" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_missing_dev_fuse_says_how_to_get_it(monkeypatch):
    from cachepipe.slowfs import mount

    real = os.path.exists
    monkeypatch.setattr(mount.os.path, "exists", lambda p: False if p == "/dev/fuse" else real(p))
    why = mount.fuse_missing()
    assert "/dev/fuse" in why and "apt-get install fuse3" in why
