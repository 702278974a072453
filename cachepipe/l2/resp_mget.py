"""MGET over a plain socket, the reply read straight into one buffer (no user-space copies).

NOTE [zero-copy MGET]: redis-py with hiredis reads a reply into hiredis's buffer, builds
a ``bytes`` object from it and hands that on: each ~200 KB sample crosses memory again
after the kernel has copied it into user space. This reader parses the RESP reply itself
and ``recv_into``s the whole reply into one ``numpy.empty`` buffer (no zero fill, unlike
``bytearray``), sized from the previous reply's values, and returns each value as a
memoryview of it: the kernel's copy is the only one, with about as few ``recv`` calls as
hiredis's 1 MB reads. It speaks just what the L2 read path needs: connect (TCP or Unix
socket), ``AUTH`` and ``SELECT`` from the URL, and ``MGET``; everything else (writes,
``INFO``) stays on redis-py, and a ``rediss://`` URL reads through redis-py (TLS decrypts
into its own buffers, so there is no copy to save).

NOTE [MGET connection errors]: an error line is raised as redis-py raises it (issue 46,
item 13): ``WRONGPASS``, ``NOAUTH`` and a refused ``AUTH`` as ``AuthenticationError`` (a
``ConnectionError``), ``NOPERM`` as ``NoPermissionError``, so that the store backs off a
shard with wrong credentials (NOTE [dead shard backoff]) instead of connecting and
authenticating again on every batch. A server that closed an idle connection (its
``timeout`` setting, a restart, ``CLIENT KILL``) fails the next command on that socket;
redis-py checks a pooled connection before use and reconnects, and so does this reader:
a connection error on a socket opened by an earlier call is retried once on a fresh one
(``MGET`` has no side effects), so it costs no batch of misses. A fresh socket that fails,
a timeout or an authentication error is not retried.

NOTE [reused reply buffer]: a batch's reply is tens of MB (128 samples of ~250 KB); a
fresh buffer per reply is a fresh mapping (it is above malloc's mmap threshold), every
page of which the kernel zero-fills and faults in again. So each connection keeps its
buffer and reads the next reply into it, but only when no value of the previous reply is
still alive: the values are views of a per-reply numpy view of the buffer, which the
connection watches through a weak reference. A caller that keeps values (or arrays made
from them) therefore never sees them overwritten; the next reply gets a new buffer.
"""
from __future__ import annotations

import os
import socket
import weakref
from collections.abc import Sequence

import numpy as np
import redis
from redis.connection import parse_url

from cachepipe.l2.redis_url import connect_url, redact

__all__ = ["MGetConnection"]

_MAX_LINE = 512  # longest RESP framing line accepted (a length or an error message)
_SHORT_LINE = 32  # looked at first: "$262144" and "*128" fit
_FIRST_GUESS = 64 << 10  # bytes per value assumed before the first reply


class MGetConnection:
    """One connection that answers ``MGET`` with memoryviews (``None`` for missing keys).

    Connects lazily, again after a fork (a child never shares its parent's socket) and
    after any error (the stream position is then unknown).

    Args:
        url: ``redis://[user:password@]host:port/db`` or ``unix:///path.sock[?db=N]``.
        timeout: socket timeout in seconds for connecting and each read.

    Raises:
        ValueError: a ``rediss://`` or otherwise unsupported URL.

    Example:
        >>> conn = MGetConnection("redis://localhost:6379/0")   # doctest: +SKIP
        >>> conn.mget(["a", "missing"])                          # doctest: +SKIP
        [<memory at 0x...>, None]
    """

    def __init__(self, url: str, timeout: float = 1.0) -> None:
        kw = parse_url(connect_url(url))  # NOTE [Redis URL credentials]
        if kw.get("connection_class") not in (None, redis.UnixDomainSocketConnection):
            raise ValueError(f"MGetConnection speaks plain TCP and Unix sockets, not {url.split(':', 1)[0]}://")
        self.url = redact(url)  # only used in messages
        self.timeout = timeout
        self._path = kw.get("path")
        self._address = (kw.get("host", "localhost"), int(kw.get("port", 6379)))
        self._auth = [kw[k] for k in ("username", "password") if kw.get(k)]
        self._db = int(kw.get("db", 0) or 0)
        self._sock: socket.socket | None = None
        self._pid = 0
        self._value_bytes = _FIRST_GUESS  # sizes the next reply's buffer (grown when short)
        self._buffer = np.empty(0, dtype=np.uint8)  # NOTE [reused reply buffer]
        self._lent: weakref.ref | None = None  # the last reply's view of it, while values live

    # -- connection ---------------------------------------------------------------------
    def _socket(self) -> socket.socket:
        if self._sock is not None and self._pid == os.getpid():
            return self._sock
        self._sock = None  # a parent's socket is the parent's: never close it here
        try:
            if self._path:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.timeout)
                sock.connect(self._path)
            else:
                sock = socket.create_connection(self._address, timeout=self.timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            raise redis.ConnectionError(f"cannot connect to {self.url}: {exc}") from None
        self._sock, self._pid = sock, os.getpid()
        try:
            if self._auth:
                self._command(["AUTH", *self._auth])
            if self._db:
                self._command(["SELECT", str(self._db)])
        except BaseException:
            self.close()
            raise
        return sock

    def _command(self, args: Sequence[str]) -> bytes:
        self._sock.sendall(_pack(args))
        line = _Reply(self._sock, np.empty(_MAX_LINE, dtype=np.uint8), self.url).line()
        if line[:1] == b"-":
            raise _error(line)
        return line

    def close(self) -> None:
        """Close the socket (when this process opened it)."""
        if self._sock is not None and self._pid == os.getpid():
            self._sock.close()
        self._sock = None

    # -- MGET -----------------------------------------------------------------------------
    def mget(self, keys: Sequence[str]) -> list[memoryview | None]:
        """Values of ``keys`` in order, ``None`` where a key is missing.

        Each value is a writable memoryview of one buffer per reply (the reply's framing
        sits between them), so keeping one keeps its whole reply's buffer alive, and that
        buffer is not reused for a later reply (NOTE [reused reply buffer]).

        Raises:
            redis.ConnectionError, redis.TimeoutError: the server is gone or too slow
                (the connection is dropped and reopened on the next call; a connection
                an earlier call opened is first retried once, NOTE [MGET connection errors]).
            redis.AuthenticationError: the server refused the URL's credentials.
            redis.ResponseError: the server refused the command (``NoPermissionError``:
                the ACL user may not run it).
        """
        if not keys:
            return []
        reused = self._sock is not None and self._pid == os.getpid()
        try:
            return self._mget(keys)
        except redis.AuthenticationError:
            raise
        except redis.ConnectionError:
            if not reused:
                raise
        return self._mget(keys)  # the server closed an idle connection: once on a fresh one

    def _mget(self, keys: Sequence[str]) -> list[memoryview | None]:
        sock = self._socket()
        try:
            sock.sendall(_pack(["MGET", *keys]))
            reply = _Reply(sock, self._reply_buffer(len(keys) * (self._value_bytes + 16) + 64), self.url)
            header = reply.line()
            if header[:1] == b"-":
                raise _error(header)
            if header[:1] != b"*" or int(header[1:]) != len(keys):
                raise redis.ConnectionError(f"unexpected MGET reply header {header[:40]!r} from {self.url}")
            values = [reply.bulk() for _ in keys]
        except socket.timeout:
            self.close()
            raise redis.TimeoutError(f"timeout reading from {self.url}") from None
        except redis.AuthenticationError:
            self.close()  # NOAUTH: AUTH again on the next connection, after the store's backoff
            raise
        except redis.ResponseError:
            raise  # the error line was the whole reply: the stream is still aligned
        except BaseException as exc:
            self.close()
            if isinstance(exc, OSError):
                raise redis.ConnectionError(f"error reading from {self.url}: {exc}") from None
            raise
        sizes = [len(v) for v in values if v is not None]
        if sizes:  # a quarter over the last mean: rarely short, and untouched pages cost nothing
            self._value_bytes = 5 * sum(sizes) // (4 * len(sizes))
        self._buffer, self._lent = reply.root, weakref.ref(reply.buf)
        return values

    def _reply_buffer(self, size: int) -> np.ndarray:
        """A view of this connection's buffer of at least ``size`` bytes (NOTE [reused reply buffer])."""
        if len(self._buffer) < size:  # with headroom, so that replies a little larger fit next time
            self._buffer = np.empty(size + size // 4, dtype=np.uint8)  # np.empty: no zero fill
        elif self._lent is not None and self._lent() is not None:
            self._buffer = np.empty(len(self._buffer), dtype=np.uint8)
        return self._buffer[:]


class _Reply:
    """Reads one RESP reply into ``buf`` (a view of the connection's buffer), growing it if needed.

    ``root`` is the array ``buf`` views: the buffer to keep for the next reply.
    """

    def __init__(self, sock: socket.socket, buf: np.ndarray, url: str) -> None:
        self.sock, self.url = sock, url
        self.root = buf.base if buf.base is not None else buf
        self.buf = buf
        self.view = memoryview(self.buf)
        self.pos = self.end = 0  # parsed up to pos, received up to end

    def _fill(self, upto: int) -> None:
        """Receive until ``buf[pos:upto]`` is complete."""
        if upto > len(self.buf):  # move the unparsed tail into a larger buffer
            tail = self.end - self.pos
            root = np.empty(max(2 * len(self.buf), upto - self.pos), dtype=np.uint8)
            buf = root[:]
            buf[:tail] = self.buf[self.pos:self.end]
            upto -= self.pos
            self.root, self.buf, self.view, self.pos, self.end = root, buf, memoryview(buf), 0, tail
        while self.end < upto:
            got = self.sock.recv_into(self.view[self.end:])
            if got == 0:
                raise redis.ConnectionError(f"{self.url} closed the connection mid-reply")
            self.end += got

    def line(self) -> bytes:
        """The next CRLF-terminated line of framing, without the CRLF."""
        window = _SHORT_LINE  # a value's length line fits: no 512-byte copy per value
        while True:
            chunk = bytes(self.view[self.pos:min(self.end, self.pos + window)])
            i = chunk.find(b"\r\n")
            if i >= 0:
                self.pos += i + 2
                return chunk[:i]
            if len(chunk) >= window:
                if window == _MAX_LINE:
                    raise redis.ConnectionError(f"RESP line over {_MAX_LINE} bytes from {self.url}")
                window = _MAX_LINE
                continue
            self._fill(self.end + 1)

    def bulk(self) -> memoryview | None:
        """The next bulk string of an array reply, as a view of the buffer."""
        line = self.line()
        if line[:1] != b"$":
            raise redis.ConnectionError(f"unexpected MGET element {line[:40]!r} from {self.url}")
        n = int(line[1:])
        if n < 0:
            return None
        self._fill(self.pos + n + 2)
        value = self.view[self.pos:self.pos + n]
        if bytes(self.view[self.pos + n:self.pos + n + 2]) != b"\r\n":
            raise redis.ConnectionError(f"bulk value of {n} bytes not followed by CRLF from {self.url}")
        self.pos += n + 2
        return value


_AUTH_ERRORS = ("WRONGPASS", "NOAUTH", "ERR invalid password", "ERR invalid username-password pair",
                "ERR Client sent AUTH, but no password is set", "ERR AUTH <password> called without")


def _error(line: bytes) -> redis.RedisError:
    """The exception redis-py raises for the error line ``-...`` (NOTE [MGET connection errors])."""
    text = line[1:].decode(errors="replace")
    if text.startswith(_AUTH_ERRORS):
        return redis.AuthenticationError(text)
    if text.startswith("NOPERM"):
        return redis.exceptions.NoPermissionError(text)
    return redis.ResponseError(text)


def _pack(args: Sequence[str]) -> bytes:
    """A command as a RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a.encode() if isinstance(a, str) else bytes(a)
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)
