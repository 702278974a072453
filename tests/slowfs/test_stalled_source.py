"""A source that stalls costs a timeout, a warning and a retry, never a hang (NOTE [stalled
source]); one that goes away is one line naming it."""
from __future__ import annotations

import errno
import subprocess
import sys
import threading
import time
import warnings

import pytest

from cachepipe.errors import CacheWarning
from cachepipe.source.timed import TimedPool


def test_a_call_past_its_deadline_is_retried_then_an_etimedout():
    release = threading.Event()
    calls = []

    def read(name):
        calls.append(name)
        if name == "stuck":
            release.wait()  # a read the kernel never answers
        return name.upper()

    pool = TimedPool(threads=2, timeout=0.2, attempts=2)
    timeouts = []
    t = time.monotonic()
    out = pool.map(read, [("a",), ("stuck",), ("b",)], on_timeout=lambda c, k: timeouts.append(k),
                   describe=lambda c: c[0])
    seconds = time.monotonic() - t
    assert out[0] == "A" and out[2] == "B"
    assert isinstance(out[1], OSError) and out[1].errno == errno.ETIMEDOUT and out[1].filename == "stuck"
    assert timeouts == [1, 2] and calls.count("stuck") == 2  # tried again on a fresh thread
    assert seconds < 2.0
    assert pool.map(read, [("c",), ("d",)]) == ["C", "D"]  # the stuck threads were replaced
    release.set()
    pool.close()


@pytest.mark.fuse
def test_training_reads_from_a_stalled_share_time_out_and_are_counted(source, tmp_path):
    from cachepipe import TwoLevelCache
    from cachepipe.config import CacheConfig
    from cachepipe.errors import CorruptSampleError
    from cachepipe.slowfs import SlowProfile
    from tools.bench.harness.slow_source import slowfs_mount

    with slowfs_mount(source, SlowProfile(latency_ms=0, mbps=0), stall_after=1) as m:
        cache = TwoLevelCache(CacheConfig(m.path, tmp_path / "cache", l2=False, source_timeout=0.3))
        assert cache.get(0).ndim == 3  # the one read the share answers
        t = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = cache.get_many([1, 2], errors="skip")
        assert time.monotonic() - t < 5.0  # 2 tries of 0.3 s each, not a hang
        assert got == [None, None]
        assert "ETIMEDOUT" in str(cache.last_errors) or "no answer" in str(cache.last_errors[1])
        stats = cache.stats()
        assert stats["source_timeouts"] == 4 and stats["source_errors"] == 2
        assert any(issubclass(w.category, CacheWarning) and "stalls" in str(w.message) for w in caught)
        with pytest.raises(CorruptSampleError, match="no answer"):
            cache.get(3)
        cache.close()
        from cachepipe.source.reader import read_file  # the uncached loaders' read

        with pytest.raises(OSError) as err, pytest.warns(CacheWarning, match="stalls"):
            read_file(str(m.path / cache.manifest.relpaths[4]), timeout=0.3)
        assert err.value.errno == errno.ETIMEDOUT
    assert m.process.returncode == 0  # SIGTERM ended the stalled requests too (no SIGKILL was needed)


@pytest.mark.fuse
def test_a_share_that_goes_away_is_one_line_naming_it(source, tmp_path):
    from cachepipe import Manifest, TwoLevelCache
    from cachepipe.config import CacheConfig
    from cachepipe.slowfs import SlowProfile
    from cachepipe.source.gone import SourceGoneError
    from tools.bench.harness.slow_source import slowfs_mount

    with slowfs_mount(source, SlowProfile(latency_ms=0, mbps=0)) as m:
        manifest = Manifest.scan(m.path)  # the scan saw the share, then its server ends
        m.process.kill()
        m.process.wait()
        with pytest.raises(SourceGoneError, match="went away: .*stopped answering.*Transport endpoint"):
            TwoLevelCache(CacheConfig(m.path, tmp_path / "cache", l2=False), manifest=manifest)
        done = subprocess.run([sys.executable, "-m", "tools", "warmup", str(m.path), "--cache-dir",
                               str(tmp_path / "cache"), "--no-l2", "--quiet"], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 3 and str(m.path) in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.fuse
def test_a_warmup_whose_share_goes_away_midway_is_one_line(source, tmp_path):
    from cachepipe.slowfs import SlowProfile
    from tools.bench.harness.slow_source import slowfs_mount

    with slowfs_mount(source, SlowProfile(latency_ms=0, mbps=0), stall_after=5) as m:  # hangs after 5 reads
        warm = subprocess.Popen([sys.executable, "-m", "tools", "warmup", str(m.path), "--cache-dir",
                                 str(tmp_path / "cache"), "--no-l2", "--quiet", "--workers", "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(4)  # scanned, and stuck on the stalled share
        m.process.kill()  # then its server ends: the reads in flight fail at once
        m.process.wait()
        _, err = warm.communicate(timeout=60)
    assert warm.returncode == 3, err
    assert len(err.strip().splitlines()) == 1 and "went away" in err and str(m.path) in err, err


@pytest.mark.fuse
def test_a_share_stopped_with_sigstop_times_out_and_serves_again_after_sigcont(source, tmp_path):
    import signal

    from cachepipe import TwoLevelCache
    from cachepipe.config import CacheConfig
    from cachepipe.slowfs import SlowProfile
    from tools.bench.harness.slow_source import slowfs_mount

    with slowfs_mount(source, SlowProfile(latency_ms=0, mbps=0)) as m:
        cache = TwoLevelCache(CacheConfig(m.path, tmp_path / "cache", l2=False, source_timeout=0.3))
        m.process.send_signal(signal.SIGSTOP)  # our own child: the server stops answering
        try:
            with pytest.warns(CacheWarning, match="stalls"):
                assert cache.get_many([0], errors="skip") == [None]
            assert cache.stats()["source_timeouts"] == 2
        finally:
            m.process.send_signal(signal.SIGCONT)
        assert cache.get(1).ndim == 3  # answering again
        cache.close()
    assert m.process.returncode == 0
