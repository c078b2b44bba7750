"""A connection from this broker to another one (master <-> slave): pipelined requests over
the sans-IO codec, replies matched by opaque. The replication code's only socket owner."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from notify.admin import parse_addr
from notify.errors import BrokerError, ConnectionLostError, RequestTimeoutError
from notify.protocol.frames import Response, ResponseParser, encode_line


class BrokerLink(asyncio.Protocol):
    """Requests to one broker; ``await link.request(build)`` where ``build(opaque)`` makes
    the frame."""

    def __init__(self, addr: str, secret: str = ""):
        self.addr = addr
        self.secret = secret
        self._parser = ResponseParser()
        self._waiters: dict[int, asyncio.Future[Response]] = {}
        self._ids = itertools.count(1)
        self._transport: asyncio.Transport | None = None
        self._lost: Exception | None = None

    @property
    def connected(self) -> bool:
        return self._transport is not None and self._lost is None

    async def connect(self, timeout_s: float = 3.0) -> None:
        host, port = parse_addr(self.addr)
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.create_connection(lambda: self, host, port), timeout_s)
        except (OSError, TimeoutError) as e:
            raise ConnectionLostError(f"cannot connect to {self.addr}: {e}") from e
        if self.secret:
            r = await self.request(lambda o: encode_line("auth", self.secret, o), timeout_s)
            if r.code != 200:
                raise BrokerError(r.code, r.body.decode("utf-8", "replace"))

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self._lost = None

    def data_received(self, data: bytes) -> None:
        try:
            replies = self._parser.feed(data)
        except Exception as e:  # garbage from the peer: drop the connection
            if self._transport is not None:
                self._transport.abort()
            self.connection_lost(e)
            return
        for r in replies:
            fut = self._waiters.pop(r.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(r)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = ConnectionLostError(f"connection to {self.addr} lost: {exc or 'closed'}")
        self._transport = None
        waiters, self._waiters = self._waiters, {}
        for fut in waiters.values():
            if not fut.done():
                fut.set_exception(self._lost)

    def send(self, build: Any) -> asyncio.Future[Response]:
        """Write a request now; the future gets its reply (pipelining: call many times)."""
        if self._transport is None or self._lost is not None:
            raise self._lost or ConnectionLostError(f"not connected to {self.addr}")
        opaque = next(self._ids) & 0x7FFFFFFF
        fut: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._waiters[opaque] = fut
        self._transport.write(build(opaque))
        return fut

    async def request(self, build: Any, timeout_s: float = 10.0) -> Response:
        fut = self.send(build)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise RequestTimeoutError(f"{self.addr} did not answer within {timeout_s}s") from None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
