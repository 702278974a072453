"""Redis URLs: one canonical name per server (shard placement), a printable form without
the password (every message, repr and ``stats`` line), and their credentials.

NOTE [Redis URL names]
Rendezvous hashing seeds each shard from its name (NOTE [rendezvous hashing]), so two
spellings of one server must give one name: ``redis://H:6379``, ``redis://h`` and
``redis://h:6379/0`` are all ``redis://h:6379/0``. The name is the scheme, the host in
lower case, the port (default 6379) and the db (``?db=`` as redis-py reads it, else the
path, default 0); a Unix socket is its normalized path and db. User names and passwords
are never part of it, so changing a password moves no key, and the name can be printed.

NOTE [Redis URL credentials]
``user:password@`` ends at the *last* ``@`` before the host (issue 46, item 9): a password
may hold ``/``, ``#``, ``?`` or ``@`` unencoded, which a URL parser would take for the path,
the fragment or the host (``redis://:s3cr/et#x@h:6379/0``). An ``@`` after a query key
(``?password=a@b``) is the query's, and a URL whose rest starts with ``/`` (``unix:///...``)
has no user part. Every client is given the URL with those characters of the user part
percent-encoded (:func:`connect_url`; redis-py decodes them once, so an already encoded
password stays as it was), and a Redis Cluster gets the user and password as arguments
(:func:`credentials`), never as part of a host name. :func:`redact` hides the whole user
part when it has no ``:`` (it may be a password) and the password otherwise.
"""
from __future__ import annotations

import os
import re
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["canonical", "connect_url", "credentials", "redact", "split_url"]

_DEFAULT_PORT = 6379
_QUERY_KEY = re.compile(r"[?&][A-Za-z_]+=")
_BREAKS_PARSING = {c: f"%{ord(c):02X}" for c in "/?#@[]"}


def split_url(url: str) -> tuple[str, str | None, str]:
    """``(scheme, user part or None, rest)`` of ``url`` (NOTE [Redis URL credentials]);
    ``rest`` is ``host:port/path?query`` (or a socket path). A string without ``://`` is
    all ``rest``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", None, url
    if rest.startswith("/"):
        return scheme, None, rest
    at = len(rest)
    while (at := rest.rfind("@", 0, at)) >= 0:
        if not _QUERY_KEY.search(rest[:at]):
            return scheme, rest[:at], rest[at + 1:]
    return scheme, None, rest


def credentials(url: str) -> tuple[str | None, str | None]:
    """``(username, password)`` of ``url`` (percent-decoded; ``None`` where absent), also
    from ``?password=`` and ``?username=`` as redis-py takes them."""
    _, user, rest = split_url(url)
    username = password = None
    if user is not None:
        name, colon, secret = user.partition(":")
        username, password = unquote(name) or None, unquote(secret) if colon else None
    query = parse_qs(rest.split("?", 1)[1]) if "?" in rest else {}
    return query.get("username", [username])[0] or None, query.get("password", [password])[0]


def connect_url(url: str) -> str:
    """``url`` as a client library parses it: the characters of its user part that would
    end it early percent-encoded (NOTE [Redis URL credentials])."""
    scheme, user, rest = split_url(url)
    if user is None:
        return url
    return f"{scheme}://{''.join(_BREAKS_PARSING.get(c, c) for c in user)}@{rest}"


def _db(path: str, query: str, url: str) -> int:
    raw = [path.strip("/")] if path.strip("/") else []
    raw += parse_qs(query).get("db", [])
    for value in raw:
        if not value.isdigit():
            raise ValueError(f"bad database number {value!r} in Redis URL {redact(url)!r}")
    return int(raw[-1]) if raw else 0  # ?db= wins over the path, as in redis-py


def canonical(url: str) -> str:
    """The name of the server ``url`` points to (NOTE [Redis URL names]).

    Raises:
        ValueError: an unparseable port or db (the message shows the URL redacted).
    """
    scheme, _, rest = split_url(url)
    scheme = scheme.lower()
    parts = urlsplit(f"{scheme}://{rest}")
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
    """``url`` with its password replaced by ``***`` (user name, host and path kept; a user
    part without ``:`` is hidden whole)."""
    scheme, user, rest = split_url(url)
    if user is not None:
        name, colon, _ = user.partition(":")
        url = f"{scheme}://{name}:***@{rest}" if colon else f"{scheme}://***@{rest}"
    return re.sub(r"(?i)([?&]password=)[^&]*", r"\1***", url)
