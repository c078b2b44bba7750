"""Blocking one-shot requests for admin commands (``notify stats``, ``notify config reload``).

Kept apart from the client library: a plain socket, one request, one reply.
"""

from __future__ import annotations

import socket

from notify.errors import BrokerError, ConnectionLostError
from notify.protocol.frames import Response, ResponseParser, encode_line


def parse_addr(addr: str, default_port: int = 8123) -> tuple[str, int]:
    """``host:port`` (or ``host``) -> ``(host, port)``; accepts ``meta://host:port``."""
    if "://" in addr:
        addr = addr.split("://", 1)[1]
    host, _, port = addr.rpartition(":")
    if not host:
        return port or "127.0.0.1", default_port
    return host, int(port)


def request(
    addr: str,
    frame: bytes,
    secret: str | None = None,
    timeout: float = 10.0,
) -> Response:
    """Send ``frame`` (optionally after ``auth``) and return the reply; raise on non-200."""
    host, port = parse_addr(addr)
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            parser = ResponseParser()
            frames = []
            if secret:
                frames.append(encode_line("auth", secret, 1))
            frames.append(frame)
            s.sendall(b"".join(frames))
            replies: list[Response] = []
            while len(replies) < len(frames):
                data = s.recv(1 << 20)
                if not data:
                    raise ConnectionLostError(f"{host}:{port} closed the connection")
                replies.extend(parser.feed(data))
    except OSError as e:
        raise ConnectionLostError(f"cannot reach broker at {host}:{port}: {e}") from e
    reply = replies[-1]
    if reply.code != 200:
        raise BrokerError(reply.code, reply.body.decode("utf-8", "replace"))
    return reply


def parse_stats(body: bytes) -> list[tuple[str, str]]:
    """``STATS\\r\\n<key> <value>\\r\\n...END\\r\\n`` -> pairs."""
    out: list[tuple[str, str]] = []
    for line in body.decode("utf-8", "replace").split("\r\n"):
        if not line or line in ("STATS", "END"):
            continue
        k, _, v = line.partition(" ")
        out.append((k, v))
    return out
