"""The command line that continues a stopped ``cachepipe train`` run (``train`` and its
``--demo`` print it)."""
from __future__ import annotations

import shlex

from cachepipe.l2.redis_url import redact

__all__ = ["resume_command"]


def resume_command(args, out: str) -> str:
    """The command line that continues a run stopped early: the one that started it
    (``args.command_line``, set by ``tools.cli``) without ``--stop-after-steps`` and with
    ``--resume out``; Redis passwords in it are shown as ``***`` (as ``stats`` does), and
    then the line says so."""
    argv, skip, masked = [], False, False
    for word in getattr(args, "command_line", None) or ["cachepipe", "train", "--data", str(args.data)]:
        if skip:
            skip = False
        elif word in ("--stop-after-steps", "--resume"):
            skip = True
        elif not word.startswith(("--stop-after-steps=", "--resume=")):
            argv.append(redact(word))
            masked = masked or argv[-1] != word
    line = shlex.join(argv + ["--resume", out])
    return line + ("  (the Redis password is shown as ***: put it back)" if masked else "")
