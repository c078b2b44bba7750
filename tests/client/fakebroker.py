"""A scripted in-process broker for client protocol tests (the in-memory twin).

Speaks enough of the wire protocol (put, mput, get, offset, stats topics, version) on a
background thread, with knobs a real broker does not have: reject ``mput`` like an old
broker, answer pipelined requests in reverse order, swallow replies (timeouts), cut the
connection after N requests.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from notify.errors import ProtocolError
from notify.protocol import records
from notify.protocol.frames import (
    Get,
    MultiPut,
    Offset,
    Put,
    RequestParser,
    Stats,
    Version,
    encode_error,
    encode_result,
    encode_stats_body,
    encode_value_header,
)


@dataclass
class Knobs:
    mput_supported: bool = True
    reverse_replies: bool = False
    drop_replies: bool = False
    close_after_requests: int | None = None
    puts: int = 0
    mputs: int = 0
    gets: int = 0


@dataclass
class FakeBroker:
    topics: dict[str, int] = field(default_factory=lambda: {"test": 4, "single": 1})
    knobs: Knobs = field(default_factory=Knobs)

    def __post_init__(self) -> None:
        self.data: dict[tuple[str, int], bytearray] = {
            (t, p): bytearray() for t, n in self.topics.items() for p in range(n)
        }
        self.next_id = 1000
        self.requests = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(5)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def append(self, topic: str, partition: int, payload: bytes, flag: int = 0) -> int:
        buf = self.data[(topic, partition)]
        off = len(buf)
        self.next_id += 1
        buf += records.encode(self.next_id, flag, payload)
        return off

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        parser = RequestParser(64 << 20)
        try:
            while data := await reader.read(1 << 16):
                replies = [self._handle(r) for r in parser.feed(data)]
                if self.knobs.reverse_replies:
                    replies.reverse()
                if not self.knobs.drop_replies:
                    writer.write(b"".join(replies))
                if (
                    self.knobs.close_after_requests is not None
                    and self.requests >= self.knobs.close_after_requests
                ):
                    self.knobs.close_after_requests = None
                    break
        except ConnectionError:
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def _handle(self, r: object) -> bytes:
        self.requests += 1
        k = self.knobs
        if isinstance(r, ProtocolError):
            return encode_error(r)
        if isinstance(r, Put):
            k.puts += 1
            if r.checksum != -1 and r.checksum != records.checksum(r.body):
                return encode_result(400, r.opaque, b"checksum mismatch")
            off = self.append(r.topic, r.partition, r.body, r.flag)
            return encode_result(200, r.opaque, b"%d %d %d" % (self.next_id, r.partition, off))
        if isinstance(r, MultiPut):
            if not k.mput_supported:
                return encode_result(400, r.opaque, b"unknown command 'mput'")
            k.mputs += 1
            recs, _ = records.decode_all(r.records)
            first = self.next_id + 1
            base = len(self.data[(r.topic, r.partition)])
            for x in recs:
                self.append(r.topic, r.partition, x.payload, x.flag)
            body = b"%d %d %d %d" % (first, r.partition, base, len(recs))
            return encode_result(200, r.opaque, body)
        if isinstance(r, Get):
            k.gets += 1
            buf = self.data.get((r.topic, r.partition))
            if buf is None:
                return encode_result(404, r.opaque, b"no such topic")
            if r.offset > len(buf) or r.offset < 0:
                return encode_result(301, r.opaque, b"%d" % len(buf))
            if r.offset == len(buf):
                return encode_result(404, r.opaque, b"no message")
            chunk = bytes(buf[r.offset : r.offset + r.max_size])
            return encode_value_header(len(chunk), r.opaque) + chunk
        if isinstance(r, Offset):
            buf = self.data[(r.topic, r.partition)]
            return encode_result(200, r.opaque, b"%d" % min(max(r.offset, 0), len(buf)))
        if isinstance(r, Stats):
            items: list[tuple[str, object]] = [
                (t, f"partitions={n} bytes=0") for t, n in self.topics.items()
            ]
            return encode_result(200, r.opaque, encode_stats_body(items))
        if isinstance(r, Version):
            return encode_result(200, r.opaque, b"fake")
        return encode_result(400, getattr(r, "opaque", 0), b"unknown command")

    def drop_connections(self) -> None:
        def _drop() -> None:
            for w in list(self._writers):
                w.transport.abort()

        self._loop.call_soon_threadsafe(_drop)

    def close(self) -> None:
        async def _stop() -> None:
            assert self._server is not None
            self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
