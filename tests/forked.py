"""``python -m tools ...`` run to completion as a test's child process, forked from the fork
server (NOTE [forked emulated ranks] in tools/forked_command.py) instead of a new
interpreter: the same ``cachepipe`` code in a process of its own (its exit status, its
stdout and stderr, its working directory and environment), without the 1.5-2 CPU-s of
importing torch again that every subprocess of the fault and CLI tests paid. Tests of what
only a new interpreter shows (signals to a launcher, the console script, imports) keep
``subprocess``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from tools.forked_command import ForkedCommand

__all__ = ["run_tools"]


def run_tools(*argv, cwd=None, env=None, timeout: float | None = None, text: bool = True) -> subprocess.CompletedProcess:
    """Like ``subprocess.run([sys.executable, "-m", "tools", *argv], capture_output=True, ...)``."""
    args = [sys.executable, "-m", "tools", *map(str, argv)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = ForkedCommand(args, env=os.environ if env is None else env, cwd=cwd, stdout=out, stderr=err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if text:
        stdout, stderr = stdout.decode(errors="replace"), stderr.decode(errors="replace")
    return subprocess.CompletedProcess(args, code, stdout, stderr)
