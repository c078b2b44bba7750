"""Run wire requests through the broker's :class:`BrokerService` on behalf of HTTP callers.

An HTTP request becomes one or more decoded wire requests (:mod:`notify.protocol.frames` objects,
built directly, never parsed from text an HTTP client wrote, so nothing can be smuggled into
a frame) handed to :meth:`BrokerService.handle` through a :class:`LocalConnection`: a
connection without a socket whose replies are decoded back into
:class:`~notify.protocol.frames.Response` objects. HTTP puts therefore join the same per-turn
batches, group commit and fsync acknowledgement as wire puts, and every reply code and body
is exactly the wire's.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from notify.broker.connection import Connection, PendingReplies
from notify.protocol.frames import Quit, Request, Response, ResponseParser, encode_result
from notify.store.partition import Slice

if TYPE_CHECKING:
    from notify.broker.service import BrokerService

#: How long an HTTP caller waits for the broker's replies before a 504.
DEFAULT_TIMEOUT_S: Final = 30.0


class LocalConnection(Connection):
    """A socket-less :class:`Connection`: reply items are rendered and decoded in memory.

    It is never registered with the service (no ``connection_opened``), so it does not count
    against ``maxConnections`` and owns no transaction session; it is authenticated because
    the HTTP layer checked the caller already.
    """

    def __init__(self, service: BrokerService, peer: str = "http"):
        super().__init__(service)
        # the HTTP layer has already authorized the route (user or admin token), and only
        # builds the requests that route allows: the wire verbs see an admin connection
        self.grant(True, True, False)
        self.peer = peer
        self._decoder = ResponseParser()
        self.responses: dict[int, Response] = {}
        self._expected = 0
        self._waiter: asyncio.Future[None] = service.loop.create_future()

    def pump(self) -> None:
        """Decode every ready reply item at the head of the queue, in order."""
        out = self.out
        while out:
            item = out[0]
            if type(item) is bytes:
                data = item
            elif type(item) is PendingReplies:
                if not item.done:
                    break
                data = item.render()
                if item.tail is not None:  # a parked get: its bytes follow the header
                    tl = item.tail
                    data += tl.segment.read(tl.file_pos, tl.length)
            else:
                assert isinstance(item, Slice)
                try:
                    data = item.segment.read(item.file_pos, item.length)
                except OSError as e:
                    data = encode_result(500, 0, f"read failed: {e}".encode())
            out.popleft()
            for r in self._decoder.feed(data):
                self.responses[r.opaque] = r
        if len(self.responses) >= self._expected and not self._waiter.done():
            self._waiter.set_result(None)

    def close_after_replies(self) -> None:
        self.closing = True
        self.pump()

    async def run(self, requests: list[Request], timeout: float) -> dict[int, Response]:
        """Hand ``requests`` (distinct opaques) to the service; their replies by opaque."""
        self._expected = sum(1 for r in requests if not isinstance(r, Quit))
        self.service.handle(self, list(requests))
        self.pump()
        await asyncio.wait_for(asyncio.shield(self._waiter), timeout)
        return self.responses


async def call(
    service: BrokerService, requests: list[Request], timeout: float = DEFAULT_TIMEOUT_S
) -> dict[int, Response]:
    """Run wire requests through ``service``; raises TimeoutError after ``timeout``."""
    return await LocalConnection(service).run(requests, timeout)


async def call_one(
    service: BrokerService, request: Request, timeout: float = DEFAULT_TIMEOUT_S
) -> Response:
    """Run one wire request (with opaque set) and return its reply."""
    replies = await call(service, [request], timeout)
    opaque = getattr(request, "opaque", 0)
    reply = replies.get(opaque)
    if reply is None:  # pragma: no cover - every handled request answers with its opaque
        raise RuntimeError(f"no reply for {request!r}")
    return reply
