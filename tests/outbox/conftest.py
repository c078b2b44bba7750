"""Fixtures of the outbox tests: a migrated database of each kind, a broker with topics to
hand out, a relay whose settings suit tests (short waits), and a reader of what a topic
holds (every record decoded: body, key, headers, producer id and sequence)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from notify.migrations import upgrade
from notify.outbox import RelayConfig
from notify.protocol import records
from notify.protocol.properties import decode_attribute
from notify.testing import BrokerProcess
from tests.faults.ledger import read_partition
from tests.helpers import WireClient, wait_until
from tests.services import fresh_database
from tests.services_conftest import running

SQL = ["sqlite", "postgres", "mariadb"]
#: Topics of the module broker: each test takes fresh ones (4 partitions, "one": 1).
TOPICS = 80

#: Relay settings for tests: quick polls, heartbeats and take-overs.
FAST = RelayConfig(
    poll_min_s=0.001,
    poll_max_s=0.01,
    notify_wait_s=0.5,
    heartbeat_s=0.2,
    instance_ttl_s=1.0,
    standby_poll_s=0.05,
    retry_min_s=0.02,
    retry_max_s=0.2,
    delayed_check_s=0.1,
)


def sql_url(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> str:
    """A fresh database of ``kind`` migrated to head."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / f'app-{uuid.uuid4().hex[:8]}.db'}"
    else:
        url = fresh_database(running(request.getfixturevalue(kind)))
    upgrade(url)
    return url


@pytest.fixture(params=SQL)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database: SQLite, PostgreSQL, MariaDB."""
    return sql_url(request, request.param, tmp_path)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """An engine on ``db_url`` with an ``orders`` table of the application's own."""
    e = sa.create_engine(db_url, pool_size=20)
    with e.begin() as c:
        c.execute(sa.text("CREATE TABLE orders (id BIGINT PRIMARY KEY, note VARCHAR(100))"))
    yield e
    e.dispose()


@pytest.fixture(scope="module")
def ob_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for a test module, with topics ``t0``.. (4 partitions) and ``one``."""
    topics: dict[str, int] = {f"t{i}": 4 for i in range(TOPICS)}
    topics["one"] = 1
    b = BrokerProcess(tmp_path_factory.mktemp("outbox-broker"), topics=topics)
    b.start()
    yield b
    b.stop()


#: per test module (each has its own broker): a worker that runs several modules does not
#: run out of topics however the files are spread over the workers
_topic_ids: dict[str, itertools.count[int]] = {}


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic of the module broker no other test of the module used."""
    n = next(_topic_ids.setdefault(request.module.__name__, itertools.count()))
    if n >= TOPICS // 2:  # the upper half: second topics of tests that need two
        pytest.fail("out of topics: raise TOPICS in tests/outbox/conftest.py")
    return f"t{n}"


@dataclass(frozen=True)
class Published:
    """One record as a consumer would see it."""

    partition: int
    offset: int
    body: bytes
    key: str | bytes | None
    headers: dict[str, Any]
    attribute: str | None
    producer: str | None
    seq: int


def published(addr: str, topic: str, nparts: int = 4) -> list[Published]:
    """Every record of ``topic``, partition by partition, in offset order."""
    out: list[Published] = []
    with WireClient(addr) as c:
        for p in range(nparts):
            for r in read_partition(c, topic, p):
                text, body = records.split_payload(r.payload, r.flag)
                props = decode_attribute(text, r.flag)
                out.append(
                    Published(
                        p,
                        r.offset,
                        body,
                        props.key,
                        dict(props.headers),
                        props.attribute,
                        props.producer_id,
                        props.sequence,
                    )
                )
    return out


def bodies(addr: str, topic: str, nparts: int = 4) -> list[bytes]:
    return [m.body for m in published(addr, topic, nparts)]


def backlog(engine: Engine) -> int:
    with engine.connect() as c:
        return int(c.execute(sa.text("SELECT count(*) FROM notify_outbox")).scalar_one())


def wait_published(addr: str, topic: str, n: int, nparts: int = 4, timeout_s: float = 20.0) -> None:
    """Wait until ``topic`` holds at least ``n`` records."""
    wait_until(
        lambda: len(bodies(addr, topic, nparts)) >= n, timeout_s, what=f"{n} records in {topic}"
    )


def assert_exactly_once(got: list[bytes], expected: list[bytes]) -> None:
    """Each expected body exactly once, nothing else."""
    seen: dict[bytes, int] = {}
    for b in got:
        seen[b] = seen.get(b, 0) + 1
    dups = {b: n for b, n in seen.items() if n > 1}
    missing = [b for b in expected if b not in seen]
    extra = [b for b in seen if b not in set(expected)]
    assert not dups and not missing and not extra, (
        f"duplicates {list(dups.items())[:5]}, missing {missing[:5]} "
        f"({len(missing)}), extra {extra[:5]}"
    )
