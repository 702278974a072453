"""``python -m MODULE ARGS`` forked from a fork server instead of started afresh.

NOTE [forked emulated ranks]: a rank of an emulated job (``tools.bench.harness.jobs.launch``)
used to be ``ip netns exec NS python -m tools train ...``: a new interpreter that imports
torch and the project, ~2-3 s of CPU per rank before its first step, paid again for every
rank of every run (a ``bench train --emulate`` of six runs started twelve). A command of
the form ``[sys.executable, "-m", MODULE, *ARGS]`` is now forked from the fork server of
:func:`trainer.launch.rank_context`, which imported all of that once (NOTE [forked
ranks]), and the child enters the node's network namespace itself with ``setns(2)``
(``CLONE_NEWNET``) before it opens a socket. It then runs as the command would: the
launcher's working directory, umask and the rank's whole environment, ``sys.argv`` as ``-m`` sets
it, stdin from /dev/null, stdout and stderr to the given descriptors, the module run as
``__main__`` and its exit status as the process's (``SystemExit`` included), atexit
handlers run at the end; it ends with the process that started it, as ``launch_local``'s
ranks do (NOTE [ranks end with their launcher] in trainer/launch.py: a parent-death signal
and a watch of the launcher, so a benchmark killed with SIGKILL leaves no rank training in
its namespace). What ``ip netns exec`` does beyond the network namespace (a
private /sys, /etc/netns files) is not needed by a rank. Any other command, and a
platform without ``setns``, keeps a real ``subprocess.Popen``. One difference shows in the
logs: what torch reads from the environment when it loads (``TORCH_CPP_LOG_LEVEL``) was
read in the fork server, so a rank's log may start with c10d's warning that a peer's
hostname cannot be resolved inside a namespace, which ``ip netns exec`` ranks silenced.
The same holds for ``OMP_NUM_THREADS``, which sizes torch's intra-op pool, so a forked
child applies its own with ``torch.set_num_threads``: without it every rank of a 2 x 2
job on 2 cores ran the server's 2 threads, and OpenMP's spinning workers made a sparse
step up to 10x slower (``gtopk``: 0.70 s of compute a step against 0.06).

:class:`ForkedCommand` has the part of ``Popen``'s surface the launcher uses (``poll``,
``returncode``, ``wait``, ``terminate``, ``kill``): the child is signalled only through
its own multiprocessing handle, whose sentinel proves it is still ours.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import runpy
import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = ["ForkedCommand", "forkable", "omp_threads"]

_CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"  # where `ip netns add` keeps a namespace's handle


def forkable(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs a module of this interpreter (``[sys.executable, "-m", MODULE, ...]``)."""
    return len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and sys.platform == "linux"


class _Fd:
    """A descriptor sent to the forked child (the fork server passes it with SCM_RIGHTS)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return _received, (reduction.DupFd(self.fd),)


def _received(dup) -> int:
    return dup.detach()


def _enter_netns(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _run_module(launcher: int, netns: str | None, module: str, args: list[str], env: dict, cwd: str, umask: int,
                out: int, err: int) -> None:
    from trainer.launch import as_new_process, die_with_launcher

    die_with_launcher(launcher)  # NOTE [ranks end with their launcher]: a SIGKILLed bench leaves no rank
    if netns:
        _enter_netns(netns)  # first: every socket of the rank belongs to its node
    as_new_process()  # NOTE [forked ranks] in trainer/launch.py: fork, as a new interpreter
    os.umask(umask)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {out, err}:
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _apply_thread_count(env)
    sys.argv = [module, *args]  # run_module sets argv[0] to the module's file, as -m does
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        atexit._run_exitfuncs()  # multiprocessing ends its children with os._exit


def omp_threads(env: Mapping[str, str]) -> int | None:
    """``env``'s ``OMP_NUM_THREADS`` when it is a positive count (as torch and torchrun read
    it), else None."""
    count = env.get("OMP_NUM_THREADS", "").strip()
    return int(count) if count.isdigit() and int(count) > 0 else None


def _apply_thread_count(env: dict) -> None:
    """The intra-op threads a new interpreter would take from ``env``'s ``OMP_NUM_THREADS``
    (torch read the fork server's when it loaded: NOTE [forked emulated ranks])."""
    count = omp_threads(env)
    if count is not None and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(count)


class ForkedCommand:
    """Run ``argv`` (:func:`forkable`) forked from the fork server, inside network namespace
    ``netns`` (None: this one), in directory ``cwd`` (None: this one), with environment
    ``env`` and stdout/stderr to ``stdout``/``stderr`` (open files; None: this process's)."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], netns: str | None = None,
                 cwd: str | os.PathLike | None = None, stdout=None, stderr=None):
        from trainer.launch import current_umask, rank_context

        if not forkable(argv):
            raise ValueError(f"not a module of this interpreter: {list(argv)[:3]}")
        out = stdout.fileno() if stdout is not None else 1
        err = stderr.fileno() if stderr is not None else 2
        self.args = list(argv)
        self._proc = rank_context().Process(
            target=_run_module, name=f"{argv[2]} (forked)",
            args=(os.getpid(), netns, argv[2], list(argv[3:]), dict(env), os.fspath(cwd or os.getcwd()),
                  current_umask(), _Fd(out), _Fd(err)))
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit status (negative: the signal), None while it runs."""
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the end; raises ``subprocess.TimeoutExpired`` after ``timeout`` s."""
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._proc.exitcode

    def terminate(self) -> None:
        if self._proc.exitcode is None:
            self._proc.terminate()

    def kill(self) -> None:
        if self._proc.exitcode is None:
            self._proc.kill()
