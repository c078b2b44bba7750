"""Fixtures for the HTTP face: real broker processes with ``dashboardHttpPort`` set.

``http_broker`` is shared by a test module (read-mostly tests: every test uses its own
topics or tolerates what the others stored); tests that change the broker's config or need
auth start their own through ``http_broker_factory``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient

HTTP_TOPICS: dict[str, Any] = {
    "test": 4,
    "single": 1,
    "gc": {"numPartitions": 2, "unflushThreshold": 0},
    "closed": {"numPartitions": 1, "acceptPublish": "false"},
}
MAX_MESSAGE = 65536


@dataclass
class Reply:
    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class Http:
    """A tiny blocking HTTP client (urllib: no session to close, no redirects followed
    for MetaQ's Location-less 301)."""

    def __init__(self, base: str, token: str | None = None):
        self.base = base
        self.token = token

    def request(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        json_body: object = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> Reply:
        hdrs = dict(headers or {})
        if json_body is not None:
            data = json.dumps(json_body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        if method != "GET" and path.startswith("/api"):  # what the REST face asks for
            hdrs.setdefault("Content-Type", "application/json")
        if self.token is not None:
            hdrs.setdefault("Authorization", f"Bearer {self.token}")
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return Reply(resp.status, resp.read(), dict(resp.headers))
        except urllib.error.HTTPError as e:
            with e:
                return Reply(e.code, e.read(), dict(e.headers))

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, data: bytes | None = None, **kw: Any) -> Reply:
        return self.request("POST", path, data=data if data is not None else b"", **kw)


def start_http_broker(
    workdir: Path, topics: dict[str, Any] | None = None, **system: Any
) -> BrokerProcess:
    sysvals = {"dashboardHttpPort": free_port(), "maxMessageSize": MAX_MESSAGE, **system}
    return BrokerProcess(workdir, topics=topics or HTTP_TOPICS, system=sysvals).start()


@pytest.fixture(scope="module")
def http_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_http_broker(tmp_path_factory.mktemp("http"))
    yield b
    assert b.stop() == 0, b.log_tail()


@pytest.fixture
def http_broker_factory(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    started: list[BrokerProcess] = []

    def make(topics: dict[str, Any] | None = None, **system: Any) -> BrokerProcess:
        b = start_http_broker(tmp_path / f"b{len(started)}", topics, **system)
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def http(http_broker: BrokerProcess) -> Http:
    return Http(http_broker.http_url)


def xid(n: int, uq: str = "q1") -> str:
    return f"XID:1:{n:04x}:beef:{uq}"


def prepare_xa(
    addr: str,
    key: str,
    topic: str,
    partition: int,
    bodies: list[bytes],
    secret: str | None = None,
) -> None:
    """An XA transaction with ``bodies`` put to ``topic-partition``, left PREPARED."""
    from tests.helpers import crc

    with WireClient(addr) as c:
        if secret:
            assert c.call(f"auth {secret} 0\r\n".encode()).code == 200
        r = c.call(f"transaction {key} s1 BEGIN 1\r\n".encode())
        assert r.code == 200, r.body
        for i, body in enumerate(bodies):
            r = c.call(
                b"put %s %d %d 0 %d %s %d\r\n%b"
                % (topic.encode(), partition, len(body), crc(body), key.encode(), i + 2, body)
            )
            assert r.code == 200, r.body
        assert c.call(f"transaction {key} s1 END 90\r\n".encode()).code == 200
        r = c.call(f"transaction {key} s1 PREPARE 91\r\n".encode())
        assert (r.code, r.body) == (200, b"0"), r.body
