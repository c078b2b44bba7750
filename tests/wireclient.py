"""A minimal blocking client for protocol tests: raw frames in, decoded replies out."""

from __future__ import annotations

import socket
import zlib

from notify.protocol.frames import Response, ResponseParser


def crc(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


class WireClient:
    def __init__(self, addr: str, timeout: float = 10.0):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.parser = ResponseParser()
        self.pending: list[Response] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def replies(self, n: int) -> list[Response]:
        while len(self.pending) < n:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError(f"closed after {len(self.pending)} of {n} replies")
            self.pending.extend(self.parser.feed(data))
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    def call(self, data: bytes) -> Response:
        self.send(data)
        return self.replies(1)[0]

    def put(
        self, topic: str, partition: int, body: bytes, opaque: int = 1, flag: int = 0
    ) -> Response:
        return self.call(
            b"put %s %d %d %d %d %d\r\n%b"
            % (topic.encode(), partition, len(body), flag, crc(body), opaque, body)
        )

    def is_closed(self, timeout: float = 2.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
