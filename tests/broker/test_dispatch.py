"""The broker's verb tables: every verb is served in every role's table, the role decides
the answer once (not per handler), and decoding errors resolve to the error handler.

Run in process: a :class:`~notify.broker.app.Broker` on a temporary directory, connections
on a transport that records what they were sent.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterator
from typing import Any, cast, get_args

import pytest

from notify.broker.app import Broker
from notify.broker.connection import Connection
from notify.broker.service import ADMIN, AUTHENTICATED, UNAUTHENTICATED, BrokerService
from notify.config import load_config
from notify.errors import FrameTooLargeError, ProtocolError
from notify.protocol.frames import Request, ResponseParser
from notify.testing import render_ini


class _Transport:
    """Enough of an asyncio transport for a :class:`Connection`: keeps what it was sent."""

    def __init__(self) -> None:
        self.sent = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 4242) if name == "peername" else default

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.sent += data

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Broker, asyncio.AbstractEventLoop]]:
    tmp = tmp_path_factory.mktemp("dispatch")
    ini = tmp / "server.ini"
    ini.write_text(
        render_ini(tmp / "data", 0, {"t": 2}, {"authSecret": "user-s", "adminSecret": "admin-s"})
    )
    loop = asyncio.new_event_loop()
    b = Broker(load_config(ini))
    loop.run_until_complete(b.start())
    try:
        yield b, loop
    finally:
        loop.run_until_complete(b.stop())
        loop.close()


def _service(b: Broker) -> BrokerService:
    assert b.service is not None
    return b.service


def _talk(
    b: Broker, loop: asyncio.AbstractEventLoop, *chunks: bytes
) -> tuple[Connection, list[Any]]:
    """Open a connection, feed it ``chunks`` (one read each), run the loop until quiet;
    its decoded replies."""
    conn = Connection(_service(b))
    t = _Transport()
    conn.connection_made(cast(Any, t))
    for c in chunks:
        conn.data_received(c)
    loop.run_until_complete(asyncio.sleep(0.05))
    return conn, ResponseParser().feed(bytes(t.sent))


def test_every_verb_has_a_handler_in_every_table(
    broker: tuple[Broker, asyncio.AbstractEventLoop],
) -> None:
    svc = _service(broker[0])
    tables = svc._tables
    for level in (UNAUTHENTICATED, AUTHENTICATED, ADMIN):
        table = tables[level]
        for kind in get_args(Request):
            assert kind in table, (level, kind)
            assert table[kind] is not table.unknown
        assert table[ProtocolError] is table.on_error
        assert table[FrameTooLargeError] is table.on_error  # a subclass: found by __missing__
    # the admin's table differs from a user's only in the admin verbs
    differ = {k for k in get_args(Request) if tables[AUTHENTICATED][k] is not tables[ADMIN][k]}
    assert {k.__name__ for k in differ} == {"Reload", "Promote", "QueueDeadLetters", "QueueDelete"}


def test_unauthenticated_connections_get_auth_and_quit_only(
    broker: tuple[Broker, asyncio.AbstractEventLoop],
) -> None:
    b, loop = broker
    _conn, replies = _talk(b, loop, b"version 7\r\nput t 0 2 0 -1 8\r\nhistats 9\r\n")
    assert [(r.code, r.opaque) for r in replies] == [(403, 7), (403, 8), (403, 9)]
    assert b"authentication required" in replies[0].body
    assert all(b"authentication required" in r.body for r in replies[1:])  # errors too
    # a wrong secret: refused, and the connection closes after its replies
    conn, replies = _talk(b, loop, b"auth nope 1\r\nversion 2\r\n")
    assert [(r.code, r.opaque) for r in replies] == [(403, 1)] and conn.closing


def test_roles_are_chosen_again_after_auth_in_the_same_read(
    broker: tuple[Broker, asyncio.AbstractEventLoop],
) -> None:
    b, loop = broker
    svc = _service(b)
    before = svc.stats.cmd_other
    _conn, replies = _talk(b, loop, b"auth user-s 1\r\nversion 2\r\nreload 3\r\n")
    assert [(r.code, r.opaque) for r in replies] == [(200, 1), (200, 2), (403, 3)]
    assert b"needs the admin role" in replies[2].body
    assert svc.stats.cmd_other == before + 3  # auth, version, reload: every verb but data
    _conn, replies = _talk(b, loop, b"auth admin-s 1\r\nstats reset 2\r\n")
    assert [(r.code, r.opaque) for r in replies] == [(200, 1), (200, 2)]


def test_puts_of_a_read_are_written_before_the_next_verb_and_answered_in_order(
    broker: tuple[Broker, asyncio.AbstractEventLoop],
) -> None:
    b, loop = broker
    body = b"hello"
    crc = zlib.crc32(body) & 0x7FFFFFFF
    put = b"put t 1 5 0 %d %%d\r\nhello" % crc
    _conn, replies = _talk(
        b,
        loop,
        b"auth user-s 1\r\n",
        put % 2 + put % 3 + b"offset t g 1 99999 4\r\n" + put % 5,
    )
    assert [(r.code, r.opaque) for r in replies] == [
        (200, 1),
        (200, 2),
        (200, 3),
        (200, 4),
        (200, 5),
    ]
    offsets = [int(r.body.split()[2]) for r in replies[1:3]]
    assert offsets[1] == offsets[0] + 20 + len(body)
    assert int(replies[3].body) == offsets[1] + 20 + len(body)  # the puts before it are written
