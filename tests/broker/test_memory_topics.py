"""Memory-backed topics: same protocol, bounded, gone after a restart."""

from __future__ import annotations

import os

from notify.protocol import records
from tests.conftest import BrokerFactory
from tests.helpers import WireClient


def test_memory_topic_roundtrip_bound_and_restart(broker_factory: BrokerFactory) -> None:
    b = broker_factory(
        topics={
            "mem": {"store": "memory", "memoryMaxBytes": 8192},
            "memref": {"store": "memory", "memoryMaxBytes": 8192, "memoryFullPolicy": "refuse"},
        }
    )
    body = b"m" * 200  # 220-byte records
    with WireClient(b.addr) as c:
        for i in range(10):
            r = c.put("mem", 0, body, opaque=i)
            assert r.code == 200 and int(r.body.split()[2]) == i * 220
        g = c.call(b"get mem g 0 0 1048576 1\r\n")
        recs, _ = records.decode_all(g.body)
        assert len(recs) >= 4 and all(x.body == body for x in recs)
        # past the bound the oldest chunks go; offsets keep counting
        for _ in range(100):
            assert c.put("mem", 0, body).code == 200
        first = int(c.call(b"offset mem g 0 0 2\r\n").body)
        assert first > 0
        assert c.call(b"get mem g 0 0 100 3\r\n").code == 301
        # refuse policy: 503 once full, nothing partial
        codes = [c.put("memref", 0, body).code for _ in range(60)]
        assert codes[0] == 200 and codes[-1] == 503 and set(codes) == {200, 503}
        r503 = c.put("memref", 0, body)
        assert b"memoryFullPolicy=refuse" in r503.body
        # transactions work on memory topics too
        assert c.call(b"transaction TX:s:1 s BEGIN 4\r\n").code == 200
        assert c.call(b"put mem 0 2 0 TX:s:1 5\r\ntx").code == 200
        assert c.call(b"transaction TX:s:1 s COMMIT_ONE_PHASE 6\r\n").code == 200
        end = int(c.call(b"offset mem g 0 999999999 7\r\n").body)
        assert end == 110 * 220 + 22
    assert not any(n.startswith("mem-") for n in os.listdir(b.data_dir))
    b.restart()
    with WireClient(b.addr) as c:
        assert c.call(b"offset mem g 0 999999999 1\r\n").body == b"0"  # documented: lost
