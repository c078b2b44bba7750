"""Each built-in participant against its real service: the protocol's guarantees."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest
from sqlalchemy import create_engine, text

from notify.protocol.keys import Xid
from notify.testing import BrokerProcess, free_port
from notify.xa import (
    BrokerParticipant,
    MySQLParticipant,
    Participant,
    ParticipantError,
    ParticipantUnavailableError,
    PostgresParticipant,
    Scope,
    SQLAlchemyParticipant,
    UnknownXidError,
    Vote,
    VoteRollbackError,
)
from notify.xa.ids import XidFactory
from tests.coordinator.helpers import (
    broker_prepared,
    message_ids,
    my_prepared,
    my_rows,
    pg_prepared,
    pg_rows,
)

SCOPE = Scope("pt")
XIDS = XidFactory(SCOPE)


def new_xid(name: str = "b1") -> Xid:
    return XIDS.branch(XIDS.new_gtrid(2e9), name)


class Kit:
    """One participant kind: how to make it, write through its handle, read the result."""

    def __init__(
        self,
        make: Callable[[], Participant],
        write: Callable[[object, int], None],
        visible: Callable[[], set[int]],
        prepared: Callable[[], int],
    ):
        self.make, self.write, self.visible, self.prepared = make, write, visible, prepared


def _pg_write(h: object, k: int) -> None:
    assert isinstance(h, psycopg.Connection)
    h.execute("INSERT INTO orders (id) VALUES (%s)", (k,))


def _my_write(h: object, k: int) -> None:
    with h.cursor() as cur:  # type: ignore[attr-defined]
        cur.execute("INSERT INTO orders (id) VALUES (%s)", (k,))


def _sa_write(h: object, k: int) -> None:
    h.execute(text("INSERT INTO orders (id) VALUES (:k)"), {"k": k})  # type: ignore[attr-defined]


@pytest.fixture(params=["broker", "postgres", "mysql", "sqla-postgres", "sqla-mysql"])
def kit(request: pytest.FixtureRequest) -> Iterator[Kit]:
    kind = request.param
    if kind == "broker":
        addr = request.getfixturevalue("xa_broker").addr

        def bwrite(h: object, k: int) -> None:
            h.send("orders", b"%d" % k)  # type: ignore[attr-defined]

        yield Kit(
            lambda: BrokerParticipant(addr),
            bwrite,
            lambda: set(message_ids(addr)),
            lambda: len(broker_prepared(addr)),
        )
    elif kind in ("postgres", "sqla-postgres"):
        dsn = request.getfixturevalue("pg_dsn")
        url = request.getfixturevalue("postgres_url")
        if kind == "postgres":
            yield Kit(
                lambda: PostgresParticipant(dsn, detect_read_only=True),
                _pg_write,
                lambda: pg_rows(dsn),
                lambda: len(pg_prepared(dsn)),
            )
        else:
            engine = create_engine(url)
            yield Kit(
                lambda: SQLAlchemyParticipant(engine),
                _sa_write,
                lambda: pg_rows(dsn),
                lambda: len(pg_prepared(dsn)),
            )
            engine.dispose()
    else:
        url = request.getfixturevalue("my_url")
        if kind == "mysql":
            yield Kit(
                lambda: MySQLParticipant(url),
                _my_write,
                lambda: my_rows(url),
                lambda: len(my_prepared(url)),
            )
        else:
            engine = create_engine(url)
            yield Kit(
                lambda: SQLAlchemyParticipant(engine),
                _sa_write,
                lambda: my_rows(url),
                lambda: len(my_prepared(url)),
            )
            engine.dispose()


def test_two_phase_commit_and_rollback(kit: Kit) -> None:
    p: Participant = kit.make()
    try:
        x1, x2 = new_xid(), new_xid()
        p.start(x1, 30)
        kit.write(p.handle, 1)
        p.end(x1, True)
        assert p.prepare(x1) is Vote.OK
        assert kit.visible() == set() and kit.prepared() == 1
        p.commit(x1, False)
        assert kit.visible() == {1}
        p.start(x2, 30)
        kit.write(p.handle, 2)
        p.end(x2, True)
        assert p.prepare(x2) is Vote.OK
        p.rollback(x2)
        p.start(x3 := new_xid(), 30)
        kit.write(p.handle, 3)
        p.end(x3, False)
        p.rollback(x3)  # never prepared
        x4 = new_xid()
        p.start(x4, 30)
        kit.write(p.handle, 4)
        p.end(x4, True)
        p.commit(x4, True)  # one phase
        assert kit.visible() == {1, 4} and kit.prepared() == 0
        with pytest.raises(UnknownXidError):
            p.commit(x2, False)
        with pytest.raises(UnknownXidError):
            p.rollback(x1)
    finally:
        p.close()


def test_prepared_branch_is_recovered_and_finished_by_another_connection(kit: Kit) -> None:
    p, q = kit.make(), kit.make()
    try:
        xa, xb = new_xid("a"), new_xid("b")
        for x, k in ((xa, 10), (xb, 11)):
            p.start(x, 30)
            kit.write(p.handle, k)
            p.end(x, True)
            assert p.prepare(x) is Vote.OK
        p.close()  # the connection that prepared them is gone
        assert sorted(q.recover(SCOPE), key=lambda x: x.bqual) == [xa, xb]
        assert q.recover(Scope("other")) == []
        q.commit(xa, False)
        q.rollback(xb)
        assert kit.visible() == {10} and q.recover(SCOPE) == [] and kit.prepared() == 0
    finally:
        q.close()


def test_read_only_branch(kit: Kit, request: pytest.FixtureRequest) -> None:
    p = kit.make()
    try:
        x = new_xid()
        p.start(x, 30)
        p.end(x, True)
        vote = p.prepare(x)
        expected = (
            Vote.READ_ONLY if isinstance(p, BrokerParticipant | PostgresParticipant) else Vote.OK
        )
        assert vote is expected
        if vote is Vote.OK:
            p.commit(x, False)
        assert kit.prepared() == 0
    finally:
        p.close()


def test_postgres_failed_statement_votes_rollback(pg_dsn: str) -> None:
    p = PostgresParticipant(pg_dsn)
    try:
        x = new_xid()
        p.start(x, 30)
        p.handle.execute("INSERT INTO orders (id) VALUES (1)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            p.handle.execute("INSERT INTO orders (id) VALUES (1)")
        with pytest.raises(VoteRollbackError):
            p.prepare(x)
        assert pg_rows(pg_dsn) == set() and pg_prepared(pg_dsn) == []
    finally:
        p.close()


def test_unreachable_resources(xa_broker: BrokerProcess, pg_dsn: str) -> None:
    addr = xa_broker.addr
    xa_broker.kill()
    b = BrokerParticipant(addr, connect_timeout_s=1)
    with pytest.raises(ParticipantUnavailableError):
        b.recover(SCOPE)
    b.close()
    x = new_xid()
    b.start(x, 5)  # nothing is sent before the first message
    with pytest.raises(ParticipantUnavailableError):
        b.handle.send("orders", b"x")
    pg = PostgresParticipant(f"host=127.0.0.1 port={free_port()} user=x", connect_timeout=1)
    try:
        with pytest.raises(ParticipantUnavailableError):
            pg.start(new_xid(), 5)
    finally:
        pg.close()


def test_broker_send_errors_and_attributes(xa_broker: BrokerProcess) -> None:
    b = BrokerParticipant(xa_broker.addr)
    try:
        x = new_xid()
        b.start(x, 30)
        r = b.handle.send("orders", b"7", attribute="tag-a", partition=1)
        assert r.partition == 1 and r.msg_id > 0
        with pytest.raises(ParticipantError, match="nosuch"):
            b.handle.send("nosuch", b"x")
        assert b.prepare(x) is Vote.OK
        b.commit(x, False)
        assert message_ids(xa_broker.addr) == [7]
    finally:
        b.close()
