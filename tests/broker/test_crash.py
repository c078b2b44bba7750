"""Crash safety by crashing: SIGKILL the broker under pipelined load, restart, verify."""

from __future__ import annotations

import socket
import threading
import time
import zlib
from pathlib import Path

import pytest

from notify.protocol import records
from notify.protocol.frames import ResponseParser
from notify.testing import BrokerProcess
from tests.helpers import WireClient

pytestmark = pytest.mark.crash


def _producer(
    addr: str,
    partitions: int,
    acked: dict[int, tuple[int, int, int, bytes]],
    stop: threading.Event,
    start_opaque: int,
) -> None:
    host, port = addr.split(":")
    sock = socket.create_connection((host, int(port)))
    parser = ResponseParser()
    sent: dict[int, tuple[int, bytes]] = {}
    opaque = start_opaque
    try:
        while not stop.is_set():
            frames = []
            for _ in range(200):
                body = b"msg-%d-" % opaque + b"x" * (opaque % 50)
                part = opaque % partitions
                crc = zlib.crc32(body) & 0x7FFFFFFF
                frames.append(
                    b"put test %d %d 0 %d %d\r\n%b" % (part, len(body), crc, opaque, body)
                )
                sent[opaque] = (part, body)
                opaque += 1
            sock.sendall(b"".join(frames))
            sock.settimeout(0.01)
            try:
                while True:
                    data = sock.recv(1 << 20)
                    if not data:
                        return
                    for r in parser.feed(data):
                        assert r.code == 200, r
                        mid, part, off = (int(x) for x in r.body.split())
                        acked[r.opaque] = (part, off, mid, sent[r.opaque][1])
            except TimeoutError:
                pass
    except OSError:
        return
    finally:
        sock.close()


def _read_partition(addr: str, part: int) -> list[records.Record]:
    out: list[records.Record] = []
    off = 0
    with WireClient(addr) as c:
        while True:
            r = c.call(b"get test g %d %d 1048576 1\r\n" % (part, off))
            if r.code == 404:
                return out
            assert r.kind == "value", r
            recs, used = records.decode_all(r.body, off)  # verifies every checksum
            assert used > 0
            out += recs
            off += used


@pytest.mark.parametrize("threshold", [0, 1, 1000])
def test_sigkill_under_pipelined_puts_loses_no_acknowledged_message(
    tmp_path: Path, threshold: int
) -> None:
    b = BrokerProcess(
        tmp_path,
        topics={"test": 4},
        system={"unflushThreshold": threshold, "maxSegmentSize": 65536},
    )
    b.start()
    acked: dict[int, tuple[int, int, int, bytes]] = {}
    try:
        for round_no in range(3):
            stop = threading.Event()
            threads = [
                threading.Thread(
                    target=_producer, args=(b.addr, 4, acked, stop, (round_no * 3 + k) * 10**7)
                )
                for k in range(3)
            ]
            for t in threads:
                t.start()
            time.sleep(0.6 + 0.2 * round_no)
            b.kill()  # SIGKILL mid-stream
            stop.set()
            for t in threads:
                t.join(10)
            b.start()
            by_part = {p: _read_partition(b.addr, p) for p in range(4)}
            at = {(p, r.offset): r for p, rs in by_part.items() for r in rs}
            for opaque, (part, off, mid, body) in acked.items():
                r = at.get((part, off))
                assert r is not None, f"acknowledged message {opaque} at {part}/{off} lost"
                assert (r.msg_id, r.body) == (mid, body)
            # offsets continue right after the last whole record
            with WireClient(b.addr) as c:
                for p, rs in by_part.items():
                    end = rs[-1].offset + rs[-1].size if rs else 0
                    reply = c.put("test", p, b"after-restart")
                    assert reply.code == 200
                    assert int(reply.body.split()[2]) == end
        assert len(acked) > 1000
    finally:
        b.stop()
