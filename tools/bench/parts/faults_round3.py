"""``bench faults`` rows of issue 46's round 3 (``tools/bench/faults.py`` runs them).

Each scenario injects its fault into real processes, checks what the fix promises, then runs
the demo training of the row (4 CPU ranks, 3 epochs) through what the fault left, so the row's
training columns say that nothing was lost. A scenario whose check fails exits 1 (the row
does not survive; ``error`` says why). ``procs_left`` counts everything it left behind:
processes of its commands (as every row), embedded ``redis-server`` daemons and their
watchers, and network namespaces; all are removed after counting.

- ``sent_batches`` (defect 5): every batch of ``cached_dataloader(workers=2)`` is put on a
  ``torch.multiprocessing`` queue to another process that keeps it; its checksum at receipt
  and after three epochs must equal the sender's (``stale``: "no" when no pixel changed).
- ``full_disk`` (defect 6): a warm-up whose L1 cannot be opened on a full tmpfs must exit 6
  naming the reason (not "nothing to do"); with room again it fills L1, and the run trains
  from that cache.
- ``l2_servers`` (defect 8): two embedded servers started with ``--l2-memory 64mb``; training
  with ``--l2-servers 2`` and no ``--l2-memory`` must keep each one's 32 MiB; ``--l2-servers
  100`` is one line, exit 2, starting nothing.
- ``kill9`` (defect 10): ``cachepipe bench train --emulate 2x2`` killed with SIGKILL while its
  ranks train must leave no rank, per-node server or namespace; then ``cachepipe train``
  itself is killed with SIGKILL after a checkpoint (its ranks go with it) and ``--resume``\\ d.
- ``idle_server`` (defect 14): the embedded server of a warm-up with ``--l2-idle 0.05`` (3 s)
  must stop by itself, must not stop while the run trains from it (its last epoch all L2
  hits), must stop after it, and a server whose cache dir is deleted must stop too.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

__all__ = ["ROUND3", "round3_fault"]

ROUND3 = ["sent_batches", "full_disk", "l2_servers", "kill9", "idle_server"]


def _cli(*argv, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout)


def _without_l2(argv: list[str]) -> list[str]:
    """A train argv without its ``--l2 URL`` pairs (the embedded L2 then)."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == "--l2":
            skip = True
        else:
            out.append(word)
    return out


def _until(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _daemons_left(bench, cache_dir: Path) -> None:
    """Count the embedded servers still running in ``cache_dir`` (proven ours) as left; stop them."""
    from cachepipe.server.embedded_group import EmbeddedGroup

    group = EmbeddedGroup.found(cache_dir)
    bench.procs_left += sum(s.pid() is not None for s in group.servers)
    group.stop()


def _train(bench, out: Path, failures: list[str], argv=None, inject=None) -> tuple[int, bool]:
    """The row's training run; a failed check makes it exit 1 with the first failure as its error."""
    code, injected = bench.run(argv or bench.train_argv(out), inject)
    if failures:
        bench.log = f"{bench.log}\n{failures[0]}"
        return code or 1, injected
    return code, injected


def _crc(t) -> int:
    return zlib.crc32(t.contiguous().view(-1).numpy().view("uint8").tobytes())


def _receiver(batches, sums) -> None:
    held = []
    while (item := batches.get()) is not None:
        held.append((item[0], item[1], _crc(item[0])))
    sums.put([(sent, first, _crc(images)) for images, sent, first in held])


def sent_batches(bench, out: Path) -> tuple[int, bool]:
    import torch.multiprocessing as mp

    from loaders import cached_dataloader

    ctx = mp.get_context("spawn")
    batches, sums = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=_receiver, args=(batches, sums), daemon=True)
    receiver.start()
    loader = cached_dataloader(bench.data / "train", cache_dir=bench.cache, redis=bench.urls, batch_size=8, train=True,
                               size=32, cache_size=64, workers=2, seed=1, dtype="uint8", normalize=False)
    sent = 0
    try:
        for epoch in range(3):
            loader.set_epoch(epoch)
            for images, _ in loader:
                batches.put((images, _crc(images)))  # dropped here at once: only the receiver keeps it
                sent += 1
        batches.put(None)
        rows = sums.get(timeout=120)
    finally:
        loader.close()
        receiver.join(30)
    changed = sum(1 for s, first, last in rows if not s == first == last)
    bench.stale = "yes" if changed else "no"
    failures = [f"{changed} of {sent} batches sent to another process changed under it"] if changed or \
        len(rows) != sent else []
    return _train(bench, out, failures)


def full_disk(bench, out: Path) -> tuple[int, bool]:
    if os.geteuid() != 0:
        return _train(bench, out, ["full_disk needs root (a tmpfs mount)"])
    mnt = bench.work / "full-disk"
    mnt.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mnt)], check=True)
    failures: list[str] = []
    try:
        cache = mnt / "cache"
        warm = ["warmup", bench.data / "train", "--cache-dir", cache, "--cache-size", 64, "--workers", 1, "--quiet",
                *[w for u in bench.urls for w in ("--l2", u)]]
        if _cli(*warm).returncode:
            failures.append("the first warm-up on the tmpfs failed")
        for l1 in cache.glob("*/l1"):
            shutil.rmtree(l1)  # L1 lost, L2 still holds every sample
        with open(mnt / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        full = _cli(*warm)
        if full.returncode != 6 or "nothing to do" in full.stdout or "No space left" not in full.stderr:
            failures.append(f"warm-up with L1 bypassed on a full disk: exit {full.returncode}, "
                            f"{(full.stderr or full.stdout).strip().splitlines()[-1:]}")
        (mnt / "filler").unlink()
        again = _cli(*warm)
        files = sum(1 for p in (bench.data / "train").rglob("*") if p.is_file())
        if again.returncode or f"L1 written: {files} entries" not in again.stdout:
            failures.append(f"warm-up with room again: exit {again.returncode}")
        return _train(bench, out, failures, bench.train_argv(out, None, cache))
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def l2_servers(bench, out: Path) -> tuple[int, bool]:
    from cachepipe.server.embedded_group import EmbeddedGroup

    cache = bench.work / "cache-l2-servers"
    failures: list[str] = []
    started = _cli("server", "start", "--cache-dir", cache, "--l2-servers", 2, "--l2-memory", "64mb")
    if started.returncode:
        failures.append(f"server start: {started.stderr.strip()}")
    many = _cli("warmup", bench.data / "train", "--cache-dir", cache, "--l2-servers", 100, "--quiet")
    if many.returncode != 2 or many.stderr.count("\n") != 1 or "--l2-servers" not in many.stderr:
        failures.append(f"--l2-servers 100: exit {many.returncode}, {many.stderr.strip()[:120]}")
    if (cache / "redis-2").exists():
        failures.append("--l2-servers 100 started servers")
    try:
        code, injected = _train(bench, out, [], _without_l2(bench.train_argv(out, None, cache)) + ["--l2-servers", "2"])
        kept = [s.status()["maxmemory"] for s in EmbeddedGroup(cache, 2).servers]
        if kept != [32 << 20] * 2:
            failures.append(f"maxmemory after training with --l2-servers 2 and no --l2-memory: {kept} (not 32 MiB each)")
    finally:
        group = EmbeddedGroup.found(cache)  # the two started on purpose are stopped, not counted; more are left
        bench.procs_left += max(0, sum(s.pid() is not None for s in group.servers) - 2)
        group.stop()
    if failures:
        bench.log = f"{bench.log}\n{failures[0]}"
        return code or 1, injected
    return code, injected


def _netns_of(pid: int) -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    return [n for n in names if n.startswith(f"cp-{pid}-")]


def _left(token: bytes, directory: Path) -> list[int]:
    """This scenario's processes: their environment carries ``token``, or they work under
    ``directory`` (a redis-server writes its title over its environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if token in (entry / "environ").read_bytes().split(b"\0") or \
                    Path(os.readlink(entry / "cwd")).is_relative_to(directory):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _kill9_emulated(bench, failures: list[str]) -> None:
    """SIGKILL ``cachepipe bench train --emulate 2x2`` while its ranks train; count what is left."""
    emu = bench.work / "kill9-emulate"
    mark = f"CACHEPIPE_FAULTS_KILL9={os.getpid()}-{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "tools", "bench", "train", "--emulate", "2x2@200", "--comm", "dense", "--epochs",
            "200", "--per-class", "16", "--batch-size", "8", "--size", "16", "--cache-size", "20", "--out", str(emu),
            "--set", "schedule.warmup_epochs=0"]
    name, value = mark.split("=")
    job = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, name: value})
    training = _until(lambda: (len(_netns_of(job.pid)) == 3 and bool(list(emu.glob("*/logs/rank3.log"))))
                      or job.poll() is not None, 300)
    time.sleep(2)  # the four ranks are forked and training (200 epochs: far from their end)
    names = _netns_of(job.pid)
    job.send_signal(signal.SIGKILL)
    job.wait()
    if not training or len(names) != 3 or job.returncode != -signal.SIGKILL:
        failures.append(f"bench train --emulate did not reach its ranks (namespaces {names}, exit {job.returncode})")
    token = mark.encode()
    gone = _until(lambda: not _netns_of(job.pid) and not _left(token, emu), 15)
    left, names = _left(token, emu), _netns_of(job.pid)
    bench.procs_left += len(left) + len(names)
    for pid in left:  # ours: they carry this scenario's mark or work in its directory
        os.kill(pid, signal.SIGKILL)
    for ns in names:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    if not gone:
        failures.append(f"SIGKILL of bench train --emulate left {len(left)} processes and {len(names)} namespaces")


def kill9(bench, out: Path) -> tuple[int, bool]:
    from tools.bench.harness.cluster import netns_unavailable_reason

    failures: list[str] = []
    reason = netns_unavailable_reason()
    if reason is None:
        _kill9_emulated(bench, failures)
    else:
        failures.append(f"kill9 needs network namespaces: {reason}")

    def kill_launcher(job) -> bool:
        if not (out / "checkpoints/gen3.npz").exists():
            return False
        job.send_signal(signal.SIGKILL)  # the launcher itself: its ranks must end with it
        return True
    code, injected = bench.run(bench.train_argv(out), kill_launcher)
    if code != -signal.SIGKILL:
        failures.append(f"cachepipe train was not killed after a checkpoint (exit {code})")
    code, _ = _train(bench, out, failures, bench.train_argv(out, None, None, "--resume", str(out)))
    return code, injected


def idle_server(bench, out: Path) -> tuple[int, bool]:
    from cachepipe.server.embedded import EmbeddedRedis

    cache = bench.work / "cache-idle"
    failures: list[str] = []
    for split in ("train", "val"):
        warm = _cli("warmup", bench.data / split, "--cache-dir", cache, "--cache-size", 64, "--workers", 1, "--quiet",
                    "--l2-idle", 0.05)
        if warm.returncode:
            failures.append(f"warm-up: {warm.stderr.strip()[-200:]}")
    server = EmbeddedRedis(cache)
    if not _until(lambda: server.pid() is None, 20):
        failures.append("the warm-up's server did not stop after 3 idle seconds")
    argv = _without_l2(bench.train_argv(out, None, cache)) + ["--l2-idle", "0.05"]
    code, injected = _train(bench, out, [], argv)
    rows = [r for r in _rows(out)]
    if rows and rows[-1].get("cache", {}).get("l1_hits", 1) + rows[-1].get("cache", {}).get("source_reads", 1):
        failures.append(f"the server stopped while the run trained from it (last epoch: {rows[-1].get('cache')})")
    if not _until(lambda: server.pid() is None, 20):
        failures.append("the run's server did not stop after 3 idle seconds")
    deleted = bench.work / "cache-deleted"
    if _cli("server", "start", "--cache-dir", deleted, "--l2-idle", 0).returncode:
        failures.append("server start failed")
    pid = EmbeddedRedis(deleted).pid()
    shutil.rmtree(deleted)
    if pid is None or not _until(lambda: not os.path.exists(f"/proc/{pid}"), 10):
        failures.append(f"the server of a deleted cache dir kept running (pid {pid}; not signalled: nothing "
                        f"proves it ours any more)")
        bench.procs_left += 1
    _daemons_left(bench, cache)
    if failures:
        bench.log = f"{bench.log}\n{failures[0]}"
        return code or 1, injected
    return code, injected


def _rows(out: Path) -> list[dict]:
    import json

    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


_SCENARIOS = {"sent_batches": sent_batches, "full_disk": full_disk, "l2_servers": l2_servers, "kill9": kill9,
              "idle_server": idle_server}


def round3_fault(bench, name: str, out: Path) -> tuple[int, bool]:
    """Run round-3 scenario ``name`` (:data:`ROUND3`) for ``bench`` (``tools.bench.faults``); the
    run's metrics go to ``out``. Returns ``(exit status, injected)``."""
    return _SCENARIOS[name](bench, out)
