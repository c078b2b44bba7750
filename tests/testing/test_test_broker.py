"""The broker for applications' tests: ``notify.testing.broker()`` and the pytest plugin's
``notify_broker`` fixture (loaded here through notify's ``pytest11`` entry point, as in an
application's suite). The broker's ``autoCreateTopics``: topics created when named, and
only then; bad names refused with a clear error and nothing created."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from notify.client import ConsumerConfig, connect
from notify.errors import NotifyError
from notify.protocol.frames import encode_line
from notify.testing import TestBroker, broker
from tests.helpers import WireClient


def _refused(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return True
    return False


def test_the_fixture_is_a_broker_that_creates_topics_on_first_use(
    notify_broker: TestBroker, tmp_path: Path
) -> None:
    assert notify_broker.address.startswith("127.0.0.1:")
    with connect([notify_broker.address]) as session:
        producer = session.create_producer()
        sent = [producer.send("fresh-topic", b"m%d" % i, key="k") for i in range(3)]
        assert all(r.success for r in sent)
        consumer = session.create_consumer(ConsumerConfig(group="g", data_dir=tmp_path / "c"))
        got = [m.data for m in consumer.messages("fresh-topic", idle_timeout_s=0.5)]
    assert got == [b"m0", b"m1", b"m2"]
    assert (notify_broker.directory / "data" / "fresh-topic-0").is_dir()


def test_the_context_manager_stops_the_broker_and_removes_its_directory(tmp_path: Path) -> None:
    with broker(topics={"wide": 3}, partitions=2) as b:
        directory, address = b.directory, b.address
        with connect([address]) as session:
            producer = session.create_producer()
            wide = {producer.send("wide", b"x", key=str(i)).partition.partition for i in range(30)}
            auto = {producer.send("auto", b"x", key=str(i)).partition.partition for i in range(30)}
        assert wide == {0, 1, 2} and auto == {0, 1}  # given count; the default for new ones
    assert not directory.exists()
    assert _refused(address)
    # a directory the caller gives is kept, data and all
    with broker(tmp_path / "kept") as b, connect([b.address]) as session:
        session.create_producer().send("t", b"x")
    assert (tmp_path / "kept" / "data" / "t-0").is_dir()


def test_two_brokers_in_one_process_are_independent() -> None:
    with broker() as a, broker() as b:
        assert a.address != b.address
        with connect([a.address]) as sa_:
            sa_.create_producer().send("only-on-a", b"x")
        assert (a.directory / "data" / "only-on-a-0").is_dir()
        assert not (b.directory / "data" / "only-on-a-0").exists()


def test_bad_names_are_refused_and_nothing_is_created() -> None:
    with broker() as b, connect([b.address]) as session:
        producer = session.create_producer()
        for bad in ("__reserved", "has space", "x" * 300, "semi;colon"):
            with pytest.raises((NotifyError, ValueError)):
                r = producer.send(bad, b"x")
                assert not r.success, bad  # a result that failed is refused just as well
                raise NotifyError(str(r.error))
        # the broker's side, asked directly: a put or a stats naming them creates nothing
        with WireClient(b.address) as wc:
            for bad in ("__reserved", "semi;colon", ".."):
                assert wc.put(bad, 0, b"x").code in (400, 404)
                assert b"resultCode 1" in wc.call(encode_line("stats", bad, 1)).body
        made = sorted(p.name for p in (b.directory / "data").iterdir() if p.is_dir())
    assert all("reserved" not in m and "space" not in m and "colon" not in m for m in made)


def test_without_auto_create_an_unknown_topic_is_an_error() -> None:
    with broker(system={"autoCreateTopics": "false"}) as b, connect([b.address]) as session:
        with pytest.raises(NotifyError, match="unknown topic"):
            r = session.create_producer().send("nope", b"x")
            raise NotifyError(str(r.error))
        assert not (b.directory / "data" / "nope-0").exists()


def test_a_start_that_fails_raises_and_leaves_nothing_running(tmp_path: Path) -> None:
    with broker(tmp_path / "held") as first:
        # the same directory is locked by the running broker: a clear error, no thread left
        second = TestBroker(tmp_path / "held")
        with pytest.raises(NotifyError):
            second.start()
        assert second._thread is None
        with connect([first.address]) as session:  # the first one still serves
            assert session.create_producer().send("t", b"x").success
