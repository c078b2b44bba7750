"""TLS on the wire port with the handshake counted as a connection.

``loop.create_server(ssl=...)`` hands a socket to its protocol only once the TLS handshake is
done, so sockets that never send a ClientHello were held (up to the handshake timeout each)
outside ``maxConnections``: an attacker could exhaust the process's file descriptors. Here the
server accepts plain TCP; :class:`TlsAccept` counts the socket at once (refusing it when the
open connections plus the handshakes in progress reach ``maxConnections``), upgrades it with
``loop.start_tls`` within the handshake timeout, and then gives the TLS transport to the real
protocol (:class:`~notify.broker.connection.Connection`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Final, Protocol, cast

log = logging.getLogger("notify.broker")

#: Bytes a client may send before the broker answered its TLS ClientHello (default of
#: ``tlsMaxHelloSize``).
MAX_HELLO: Final = 64 * 1024


def feed(proto: asyncio.BufferedProtocol, data: bytes) -> None:
    """Hand ``data`` to a buffered protocol as if it had been read from its socket."""
    view = memoryview(data)
    while view:
        buf = memoryview(proto.get_buffer(len(view)))
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        proto.buffer_updated(n)
        view = view[n:]


class Admission(Protocol):
    """What the acceptor asks of the broker service."""

    def tls_handshake_started(self) -> bool:
        """Whether one more handshake may start (False: refuse the socket)."""
        ...

    def tls_handshake_ended(self) -> None:
        """A handshake that was admitted finished, failed or timed out."""
        ...


class TlsAccept(asyncio.Protocol):
    """The first protocol of an accepted TCP socket on a TLS port (see the module doc);
    ``timeout_s`` is ``tlsHandshakeTimeout``: a socket that has not completed its handshake
    by then (silent, or trickling its ClientHello) is closed and its slot freed; one that sends
    more than ``max_hello`` bytes (``tlsMaxHelloSize``) before it is answered is closed."""

    def __init__(
        self,
        admission: Admission,
        ctx: ssl.SSLContext,
        make: Callable[[], asyncio.BaseProtocol],
        timeout_s: float,
        max_hello: int = MAX_HELLO,
    ) -> None:
        self.admission = admission
        self.ctx = ctx
        self.make = make
        self.timeout_s = timeout_s
        self.max_hello = max_hello
        self.app: asyncio.Protocol | None = None
        self.early: list[bytes] = []  # app data read between the handshake and the hand-over
        self.lost = False
        self.started = False  # start_tls took the socket over
        self.raw: asyncio.Transport | None = None
        self.raw_early: list[bytes] = []
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = cast(asyncio.Transport, transport)
        if not self.admission.tls_handshake_started():
            t.abort()
            return
        # bytes that uvloop read before start_tls takes the socket over (the ClientHello; a
        # client sends nothing more before the server answers) are handed to the TLS
        # protocol once it is in place (:meth:`_upgrade`)
        self.raw = t
        self.task = asyncio.get_running_loop().create_task(self._upgrade(t))

    async def _upgrade(self, raw: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        try:
            if self.lost:
                raise ConnectionError("lost before the handshake")
            handshake = loop.create_task(
                loop.start_tls(
                    raw, self, self.ctx, server_side=True, ssl_handshake_timeout=self.timeout_s
                )
            )
            # start_tls's first step sets its protocol on the socket and schedules that
            # protocol's connection_made: two loop turns later both ran
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            self.started = True
            if self.lost:  # over tlsMaxHelloSize (or gone) while start_tls was setting up
                handshake.cancel()
                raise ConnectionError("lost before the handshake")
            hello, self.raw_early = b"".join(self.raw_early), []
            if hello:
                feed(cast(asyncio.BufferedProtocol, raw.get_protocol()), hello)
            tls = await handshake
        except (OSError, ssl.SSLError, ConnectionError, TimeoutError, RuntimeError) as e:
            log.debug("tls handshake failed: %s", e)
            raw.abort()
            return
        finally:
            self.admission.tls_handshake_ended()
        if tls is None or self.lost or tls.is_closing():
            raw.abort()
            return
        app = self.app = cast(asyncio.Protocol, self.make())
        tls.set_protocol(app)
        app.connection_made(tls)
        for data in self.early:
            app.data_received(data)
        self.early.clear()

    def data_received(self, data: bytes) -> None:
        if not self.started:  # raw bytes read before start_tls took the socket over
            self.raw_early.append(data)
            if sum(map(len, self.raw_early)) > self.max_hello:
                self.lost = True
                self.raw_early.clear()
                if self.raw is not None:
                    self.raw.abort()
            return
        if self.app is not None:
            self.app.data_received(data)
        else:
            self.early.append(data)

    def eof_received(self) -> bool | None:
        return self.app.eof_received() if self.app is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.app is not None:
            self.app.connection_lost(exc)
