"""What the runner checks after an example block, besides its exit status: that it did
what its text says (the row is in the database, the message is visible to a new group, the
output is the one its comment shows). Keyed by a marker the block contains."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from notify.client import ConsumerConfig, connect

if TYPE_CHECKING:
    from tests.docs.runner import DocBlock, PageEnv


def visible(addr: str, topic: str, tmp: Path) -> list[bytes]:
    """Every message of ``topic`` a fresh consumer group sees."""
    with connect([addr]) as session:
        consumer = session.create_consumer(ConsumerConfig(group="docs-check", data_dir=tmp))
        return [m.data for m in consumer.messages(topic, idle_timeout_s=1.0)]


def pg_rows(env: PageEnv, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(env.db.pg_conninfo) as db:
        return list(db.execute(sql).fetchall())


def _sent(code: str, call: str) -> list[tuple[str, bytes]]:
    """The (topic, data) literals of every ``call("topic", b"data"`` in ``code``."""
    pat = re.escape(call) + r'\(\s*(?:conn,\s*)?"([\w.-]+)",\s*b"([^"]*)"'
    return [(t, d.encode()) for t, d in re.findall(pat, code)]


def _check_publish(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    if "delay=" in block.code or "deliver_at=" in block.code:
        return  # not due yet
    if "transaction(db=" in block.code:
        return  # outbox rows: the relay's to publish
    seen: dict[str, list[bytes]] = {}  # one read per topic: the check's group commits
    for topic, data in _sent(block.code, "producer.send"):
        if b"%" in data:
            continue  # a formatted payload
        if topic not in seen:
            seen[topic] = visible(env.broker.addr, topic, tmp / topic)
        assert data in seen[topic], (topic, data)


def _check_outbox_relay(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    if "postgresql" not in block.code:
        return  # an example on a database of its own (SQLite)
    assert pg_rows(env, "SELECT count(*) FROM notify_outbox") == [(0,)]
    assert pg_rows(env, "SELECT count(*) FROM notify_outbox_dead") == [(0,)]
    seen: dict[str, list[bytes]] = {}
    for topic, data in _sent(block.code, "outbox.send"):
        if topic not in seen:
            seen[topic] = visible(env.broker.addr, topic, tmp / topic)
        assert data in seen[topic], (topic, data)


def _check_outbox_rollback(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    assert out.split() == ["True", "False"], out
    assert pg_rows(env, "SELECT id FROM receipts ORDER BY id") == [(1,)]


def _check_half(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    assert pg_rows(env, "SELECT id, paid FROM accounts WHERE id = 7") == [(7, True)]
    assert "LocalTxState.COMMIT TX:" in out, out
    assert b"paid 7" in visible(env.broker.addr, "orders", tmp)


def _check_half_block(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    assert pg_rows(env, "SELECT id FROM deliveries WHERE id = 9") == [(9,)]
    assert "TxState.COMMITTED TX:" in out, out
    assert "order-9 {'type': 'shipped', 'attempt': 1}" in out, out
    assert b"shipped 9" in visible(env.broker.addr, "orders", tmp)


def _check_xa(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    assert (42,) in pg_rows(env, "SELECT id FROM refunds")
    assert re.search(r"<Transaction shop-\S+ COMMITTED>", out), out
    assert b"refund 42" in visible(env.broker.addr, "orders", tmp)


def _check_tx_consumer(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    if "order_data" in block.code:
        assert (b"order 42",) in pg_rows(env, "SELECT order_data FROM invoices")


def _check_raw(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    assert out.startswith("result 200 ") and "value " in out and "hello" in out


def _check_queue_inbox(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    assert pg_rows(env, "SELECT count(*) FROM shipments") != [(0,)]
    claims = pg_rows(env, "SELECT group_id, topic FROM notify_queue_done")
    assert ("shipping", "jobs") in claims


def _check_producer_outbox(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    if "credit_notes" not in block.code:
        return  # the asyncio example: _check_async_outbox
    assert pg_rows(env, "SELECT id FROM credit_notes") == [(5,)]
    assert out.split()[-1] == "committed", out


def _check_async_outbox(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    assert pg_rows(env, "SELECT id, packed FROM parcels WHERE id = 8") == [(8, True)]
    assert out.split() == ["parcel", "8", "published"], out
    seen = [m for m in visible(env.broker.addr, "orders", tmp) if m.startswith(b"parcel 8")]
    assert seen == [b"parcel 8", b"parcel 8 packed"], seen  # once each, in commit order


def _check_half_db(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    assert pg_rows(env, "SELECT id FROM returns") == [(3,)]
    assert pg_rows(env, "SELECT count(*) FROM notify_outbox_half WHERE state = 1") != [(0,)]
    assert "return 3 committed and published" in out, out
    assert b"returned 3" in visible(env.broker.addr, "orders", tmp)


def _check_local_tx(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    if "transaction(db=" in block.code:
        return  # outbox rows, checked by _check_producer_outbox
    if "print(tx.status)" in block.code:
        assert out.split()[-1] == "committed", out
        assert b"order 42 placed" in visible(env.broker.addr, "audit", tmp)


CHECKS: dict[str, Callable[[DocBlock, str, PageEnv, Path], None]] = {
    "producer.send(": _check_publish,
    "outbox.relay(session)": _check_outbox_relay,
    'b"receipt 1" in seen': _check_outbox_rollback,
    "send_in_transaction": _check_half,
    "half.prepared()": _check_half_block,
    "transaction(db=conn)": _check_producer_outbox,
    "send_async(conn": _check_async_outbox,
    'producer("returns", db=engine)': _check_half_db,
    "TransactionManager(": _check_xa,
    "TransactionalConsumer(": _check_tx_consumer,
    "socket.create_connection": _check_raw,
    "QueueInbox(": _check_queue_inbox,
    "producer.transaction(": _check_local_tx,
}


def check_block(block: DocBlock, out: str, env: PageEnv, tmp: Path) -> None:
    """Every check whose marker ``block`` contains."""
    for marker, check in CHECKS.items():
        if marker in block.code and block.lang == "python":
            check(block, out, env, tmp)
