"""Redis URLs: one canonical name per server (shard placement) and a printable form
without the password (every message, repr and ``stats`` line).

NOTE [Redis URL names]
Rendezvous hashing seeds each shard from its name (NOTE [rendezvous hashing]), so two
spellings of one server must give one name: ``redis://H:6379``, ``redis://h`` and
``redis://h:6379/0`` are all ``redis://h:6379/0``. The name is the scheme, the host in
lower case, the port (default 6379) and the db (path or ``?db=``, default 0); a Unix
socket is its normalized path and db. User names and passwords are never part of it, so
changing a password moves no key, and the name can be printed.
"""
from __future__ import annotations

import os
import re
from urllib.parse import parse_qs, urlsplit

__all__ = ["canonical", "redact"]

_DEFAULT_PORT = 6379


def _db(path: str, query: str, url: str) -> int:
    raw = path.strip("/") or parse_qs(query).get("db", ["0"])[0]
    if not raw.isdigit():
        raise ValueError(f"bad database number {raw!r} in Redis URL {redact(url)!r}")
    return int(raw)


def canonical(url: str) -> str:
    """The name of the server ``url`` points to (NOTE [Redis URL names]).

    Raises:
        ValueError: an unparseable port or db (the message shows the URL redacted).
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "unix":
        return f"unix://{os.path.normpath(parts.path)}?db={_db('', parts.query, url)}"
    try:
        port = parts.port or _DEFAULT_PORT
    except ValueError:
        raise ValueError(f"bad port in Redis URL {redact(url)!r}") from None
    host = (parts.hostname or "localhost").lower()
    host = f"[{host}]" if ":" in host else host
    if scheme == "redis-cluster":
        return f"{scheme}://{host}:{port}"
    return f"{scheme}://{host}:{port}/{_db(parts.path, parts.query, url)}"


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (user name, host and path kept)."""
    url = re.sub(r"(://[^:@/]*:)[^/]*@", r"\1***@", url)  # user:password@ and :password@
    return re.sub(r"(?i)([?&]password=)[^&]*", r"\1***", url)

