"""The relay against a real broker, on SQLite, PostgreSQL and MariaDB: every committed
row published once, a key's messages in order on the partition a producer would pick,
delayed rows when due, rows the broker cannot take set aside, shards shared by relays
and taken over when one stops, PostgreSQL's NOTIFY wake-ups and its VACUUM thread."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from notify.client import connect, key_hash
from notify.outbox import Batch, Identity, Outbox, PublishError, Relay
from notify.outbox.relaydb import VACUUM_AFTER_ROWS
from notify.outbox.rows import decode_seqs
from notify.testing import BrokerProcess
from tests.helpers import wait_until
from tests.outbox.conftest import (
    FAST,
    assert_exactly_once,
    backlog,
    bodies,
    published,
    wait_published,
)


def test_committed_rows_are_published_once_in_key_order(
    engine: Engine, ob_broker: BrokerProcess, topic: str
) -> None:
    outbox = Outbox(engine)
    sent: list[bytes] = []
    with connect([ob_broker.addr]) as session:
        parts = [str(p) for p in session.partitions(topic)]
        with outbox.relay(session, FAST) as relay:
            for tx in range(30):
                with engine.begin() as c:
                    c.execute(sa.text("INSERT INTO orders (id) VALUES (:i)"), {"i": tx})
                    for j in range(tx % 3 + 1):
                        body = b"m-%d-%d" % (tx, j)
                        outbox.send(c, topic, body, attribute="tag", key=f"k{tx % 5}",
                                    headers={"tx": tx, "j": j})  # fmt: skip
                        sent.append(body)
                with pytest.raises(RuntimeError), engine.begin() as c:
                    outbox.send(c, topic, b"rolled-back-%d" % tx, key="k0")
                    raise RuntimeError
            with engine.begin() as c:
                for i in range(8):
                    outbox.send(c, topic, b"keyless-%d" % i)
                    sent.append(b"keyless-%d" % i)
            wait_published(ob_broker.addr, topic, len(sent))
            wait_until(
                lambda: backlog(engine) == 0, timeout=20, what="rows removed once acknowledged"
            )
            st = outbox.status()
            assert st.backlog == 0 and st.published == len(sent) == relay.published
            assert sorted(relay.leading) == [0, 1, 2, 3]
    got = published(ob_broker.addr, topic)
    assert_exactly_once([m.body for m in got], sent)
    by_key: dict[object, list[tuple[int, int]]] = defaultdict(list)
    seqs: dict[tuple[str | None, int], list[int]] = defaultdict(list)
    for m in got:
        seqs[(m.producer, m.partition)].append(m.seq)
        if m.key is None:
            assert m.headers == {} and m.attribute is None
            continue
        assert m.attribute == "tag" and set(m.headers) == {"tx", "j"}
        assert parts[m.partition] == parts[key_hash(str(m.key)) % len(parts)]
        by_key[m.key].append((m.headers["tx"], m.headers["j"]))
    for key, order in by_key.items():
        assert order == sorted(order), f"{key}: {order}"  # commit order, then send order
    for (producer, _p), s in seqs.items():
        assert producer is not None and producer.startswith("outbox-")
        assert s == list(range(len(s)))  # each shard's identity: consecutive per partition
    keyless: dict[str | None, set[int]] = defaultdict(set)
    for m in got:
        if m.key is None:
            keyless[m.producer].add(m.partition)
    # committed together, so one cycle per shard: one partition each, not one per message
    assert keyless and all(len(p) == 1 for p in keyless.values())


def test_delayed_rows_and_rows_the_broker_refuses(
    engine: Engine, ob_broker: BrokerProcess, topic: str
) -> None:
    outbox = Outbox(engine)
    cfg = dataclasses.replace(FAST, dead_letter_after_s=0.3)
    with engine.begin() as c:
        outbox.send(c, topic, b"later", key="a", delay=0.5)
        outbox.send(c, "no-such-topic", b"lost-topic", key="a")
        outbox.send(c, topic, b"now", key="a")
        outbox.send(c, topic, b"fine", key="b")
    with connect([ob_broker.addr]) as session, outbox.relay(session, cfg):
        wait_published(ob_broker.addr, topic, 3)
        wait_until(
            lambda: backlog(engine) == 0, timeout=20, what="the unknown topic's row set aside"
        )
        with engine.connect() as c:
            dead = c.execute(sa.text("SELECT topic, error FROM notify_outbox_dead")).all()
            delayed = c.execute(sa.text("SELECT count(*) FROM notify_outbox_delayed")).scalar()
    assert dead == [("no-such-topic", "topic no-such-topic unknown to the broker")]
    assert delayed == 0
    got = bodies(ob_broker.addr, topic)
    assert sorted(got) == [b"fine", b"later", b"now"] and got.index(b"now") < got.index(b"later")
    st = outbox.status()
    assert sum(s.dead for s in st.shards) == 1 and st.backlog == 0


def test_relays_share_the_shards_and_take_over(
    engine: Engine, ob_broker: BrokerProcess, topic: str
) -> None:
    outbox = Outbox(engine)
    sent: list[bytes] = []

    def send(n: int, tag: str) -> None:
        for i in range(n):
            with engine.begin() as c:
                body = f"{tag}-{i}".encode()
                outbox.send(c, topic, body, key=f"k{i % 7}")
                sent.append(body)

    with connect([ob_broker.addr]) as session:
        a = Relay(engine, session.publisher(), FAST, own_publisher=True).start()
        b = Relay(engine, session.publisher(), FAST, own_publisher=True).start()
        try:
            wait_until(
                lambda: len(a.leading) == len(b.leading) == 2, timeout=20, what="two shards each"
            )
            assert set(a.leading).isdisjoint(b.leading)
            send(40, "both")
            wait_published(ob_broker.addr, topic, len(sent))
            a.stop()
            wait_until(
                lambda: len(b.leading) == 4, timeout=20, what="the survivor leads every shard"
            )
            send(40, "one")
            wait_published(ob_broker.addr, topic, len(sent))
            assert sum(st.takeovers for st in b.stats.values()) >= 4
        finally:
            a.stop()
            b.stop()
    assert_exactly_once(bodies(ob_broker.addr, topic), sent)
    with engine.connect() as c:
        epochs = c.execute(sa.text("SELECT epoch FROM notify_outbox_relay")).scalars().all()
    assert all(e >= 1 for e in epochs) and max(epochs) >= 2


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_postgres_relay_sleeps_until_a_commit_notifies_it_and_vacuums_aside(
    engine: Engine, ob_broker: BrokerProcess, topic: str
) -> None:
    outbox = Outbox(engine)
    # polling alone would take 60 s: only NOTIFY can bring the row within the wait below
    cfg = dataclasses.replace(FAST, shards=(0, 1, 2, 3), notify_wait_s=60.0)
    with connect([ob_broker.addr]) as session, outbox.relay(session, cfg) as relay:
        wait_until(lambda: len(relay.leading) == 4, timeout=20, what="leadership")
        for i in range(3):
            with engine.begin() as c:
                outbox.send(c, topic, b"n-%d" % i, key="same")
            wait_published(ob_broker.addr, topic, i + 1, timeout_s=20.0)
        woken = sum(st.wakeups for st in relay.stats.values())
        # enough deletions make a VACUUM due: it runs on the relay's vacuum thread (a
        # shard's batch never waits for it)
        vacuum = relay.vacuum
        assert vacuum is not None
        n = VACUUM_AFTER_ROWS + 100
        with engine.begin() as c:
            for i in range(n):
                outbox.send(c, topic, b"v-%d" % i, key=f"k{i % 7}")
        wait_published(ob_broker.addr, topic, 3 + n)
        wait_until(lambda: vacuum.runs >= 1, timeout=20, what="a VACUUM of notify_outbox")
        assert sum(st.vacuums for st in relay.stats.values()) >= 1
        threads = [t for t in relay._threads if t.name == "outbox-vacuum"]
        assert len(threads) == 1
    assert woken >= 1
    assert not threads[0].is_alive()  # stop() ended it


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_identities_fence_and_a_database_behind_the_broker_is_refused(
    engine: Engine, ob_broker: BrokerProcess, topic: str
) -> None:
    outbox = Outbox(engine)
    with engine.begin() as c:
        for i in range(8):
            outbox.send(c, topic, b"first-%d" % i, key=f"k{i}")
    with connect([ob_broker.addr]) as session:
        with outbox.relay(session, FAST):
            wait_published(ob_broker.addr, topic, 8)
            wait_until(lambda: backlog(engine) == 0, timeout=20, what="rows removed")
        # the broker's claim answer is what the relay checks its records against
        pub = session.publisher()
        try:
            with engine.connect() as c:
                name, secret, epoch, seqs = c.execute(
                    sa.text(
                        "SELECT producer_name, producer_secret, epoch, seqs "
                        "FROM notify_outbox_relay WHERE seqs <> '{}' ORDER BY shard LIMIT 1"
                    )
                ).one()
            newer = Identity(name, secret, epoch + 10)
            last = pub.claim(newer, [topic])
            assert last and all(v >= 0 for v in last.values())
            assert set(last) <= set(decode_seqs(seqs))
            # an older epoch is fenced: its batches are refused for good
            stale = Identity(name, secret, epoch + 5)
            part = next(iter(last))[1]
            (res,) = pub.publish(stale, [Batch(topic, part, [(0, b"x")], 99)])
            assert isinstance(res, PublishError) and res.fenced and not res.retriable
            with pytest.raises(PublishError, match="fenced") as fenced:
                pub.claim(stale, [topic])
            assert fenced.value.fenced
        finally:
            pub.close()
        # a database that lost what it recorded (restored from a backup): the relay
        # finds the broker ahead of its sequences and does not publish over them
        with engine.begin() as c:
            c.execute(sa.text("UPDATE notify_outbox_relay SET seqs = '{}'"))
            outbox.send(c, topic, b"after-restore", key="k0")
        cfg = dataclasses.replace(FAST, standby_poll_s=0.05)
        with outbox.relay(session, cfg) as relay:
            wait_until(
                lambda: any("outbox recorded only" in s.last_error for s in relay.stats.values()),
                timeout=20,
                what="the relay refusing its shard",
            )
    assert b"after-restore" not in bodies(ob_broker.addr, topic)
