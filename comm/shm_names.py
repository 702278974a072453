"""Names of shared-memory segments that say who made them, and the sweep of dead makers' segments.

NOTE [shm segment names]: a segment is named
``cachepipe-comm-u<uid>.n<pid namespace>.p<pid>.t<start time>.<random>-<generation>``.
A segment whose maker was SIGKILLed before it could unlink it (NOTE [shm segment
lifetime] in ``comm.shm``) is removed by the next group that starts on the machine, but
only when its maker is *proven* dead: the file belongs to this user, its name parses, it
was made in this pid namespace (a pid from another container means nothing here), and no
process with that pid and that start time (``/proc/<pid>/stat``, field 22, so a reused
pid does not count) exists. Anything else is left alone.
"""
from __future__ import annotations

import os
import re
import uuid

__all__ = ["SHM_DIR", "PREFIX", "new_base", "maker_alive", "remove_orphans", "start_time"]

SHM_DIR = "/dev/shm"
PREFIX = "cachepipe-comm-"
_NAME = re.compile(re.escape(PREFIX) + r"u(\d+)\.n(\d+)\.p(\d+)\.t(\d+)\.[0-9a-f]+(?:-\d+)?")


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (with the pid, unique at any moment),
    or None if there is no such process or it has exited (a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return None if fields[0] == b"Z" else int(fields[19])


def _pid_namespace() -> int:
    return int(re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")))


def new_base() -> str:
    """A fresh segment base name for this process (generation numbers are appended)."""
    pid = os.getpid()
    return f"{PREFIX}u{os.getuid()}.n{_pid_namespace()}.p{pid}.t{start_time(pid)}.{uuid.uuid4().hex[:8]}"


def maker_alive(name: str) -> bool | None:
    """Whether the maker of segment ``name`` lives: True, False (proven dead), None (cannot tell)."""
    m = _NAME.fullmatch(name)
    if m is None or int(m.group(2)) != _pid_namespace():
        return None
    return start_time(int(m.group(3))) == int(m.group(4))


def remove_orphans(directory: str = SHM_DIR) -> list[str]:
    """Unlink this user's segments whose maker is proven dead (NOTE [shm segment names]); their names."""
    removed = []
    try:
        names = [n for n in os.listdir(directory) if n.startswith(PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != os.getuid() or not os.path.isfile(path) or os.path.islink(path):
            continue
        if maker_alive(name) is False:
            try:
                os.unlink(path)
                removed.append(name)
            except OSError:
                pass
    return removed
