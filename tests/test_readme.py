"""Every ```python block of README.md runs as written, against real servers.

Each block is saved as a file and run by a fresh interpreter in an empty directory, after
pointing the README's well-known addresses at this test's servers: the broker
``127.0.0.1:8123`` (a real broker process with the sample topics), PostgreSQL
``postgresql://app@127.0.0.1/app`` (a fresh database of the session's server) and ZooKeeper
``127.0.0.1:2181/meta`` (the session's server, a fresh root, the broker registered there).
A block that raises, hangs or names an address the test does not serve fails. Some blocks
get an extra check of what they did (the row is there, the message is visible).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from notify.client import ConsumerConfig, connect
from notify.testing import BrokerProcess
from tests.docs.harness import example_broker
from tests.services import PostgresServer, fresh_database
from tests.services_conftest import running

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK_TIMEOUT_S = 120


@dataclass(frozen=True)
class Block:
    """One ```python block: its section, position and text."""

    section: str
    index: int
    code: str

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.section.lower()).strip("-")
        return f"{self.index}-{slug}"

    @property
    def needs_zookeeper(self) -> bool:
        return "zk=" in self.code

    @property
    def needs_postgres(self) -> bool:
        return "postgresql" in self.code


def readme_blocks(text: str) -> list[Block]:
    """The ```python blocks of ``text`` with the ``##`` section each is in."""
    blocks: list[Block] = []
    section = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        if line.strip() == "```python":
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            blocks.append(Block(section, len(blocks), "\n".join(lines[i + 1 : j]) + "\n"))
            i = j
        i += 1
    return blocks


BLOCKS = readme_blocks(README.read_text())


def test_readme_has_the_examples() -> None:
    """The blocks this file knows how to check are still there (a renamed section or a
    dropped example must be noticed, not silently skipped)."""
    sections = {b.section for b in BLOCKS}
    assert len(BLOCKS) >= 8
    assert {"Quickstart", "Client API", "Transactions"} <= sections
    assert any("send_in_transaction" in b.code and "checker" in b.code for b in BLOCKS)
    assert any("Outbox(engine)" in b.code and "outbox.relay(session)" in b.code for b in BLOCKS)
    assert any(".half_message(" in b.code and "prepared()" in b.code for b in BLOCKS)
    assert any("db=engine" in b.code and ".half_message(" in b.code for b in BLOCKS)
    assert any("transaction(db=conn)" in b.code for b in BLOCKS)
    assert any(b.needs_zookeeper for b in BLOCKS)
    # the raw-protocol example needs nothing a fresh Debian lacks (no nc)
    shell = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    assert not any(re.search(r"\|\s*nc\b", s) and "8123" in s for s in shell)


@dataclass
class Env:
    """What one block runs against."""

    broker: BrokerProcess
    pg_conninfo: str | None = None
    pg_url: str | None = None
    zk: str | None = None

    def substitute(self, code: str) -> str:
        host, port = self.broker.addr.rsplit(":", 1)
        out = code.replace('("127.0.0.1", 8123)', f'("{host}", {port})')
        out = out.replace("127.0.0.1:8123", self.broker.addr)
        if self.pg_url is not None and self.pg_conninfo is not None:
            out = out.replace("postgresql+psycopg://app@127.0.0.1/app", self.pg_url)
            out = out.replace("postgresql://app@127.0.0.1/app", self.pg_conninfo)
        if self.zk is not None:
            out = out.replace("127.0.0.1:2181/meta", self.zk)
        for served in (r"\b8123\b", r"app@127\.0\.0\.1", r"\b2181\b"):
            assert not re.search(served, out), f"an address this test does not serve: {served}"
        return out


def run_block(code: str, cwd: Path, timeout: float = BLOCK_TIMEOUT_S) -> str:
    path = cwd / "block.py"
    path.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(path)], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{code}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return proc.stdout


def visible(addr: str, topic: str, tmp: Path) -> list[bytes]:
    """Every message of ``topic`` a fresh consumer group sees."""
    with connect([addr]) as session:
        consumer = session.create_consumer(ConsumerConfig(group="readme-check", data_dir=tmp))
        return [m.data for m in consumer.messages(topic, idle_timeout_s=2.0)]


def pg_rows(conninfo: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(conninfo) as db:
        return list(db.execute(sql).fetchall())


def _check_half(env: Env, tmp: Path, out: str) -> None:
    assert env.pg_conninfo is not None
    assert pg_rows(env.pg_conninfo, "SELECT id, paid FROM accounts") == [(7, True)]
    assert "LocalTxState.COMMIT" in out
    assert visible(env.broker.addr, "orders", tmp / "check") == [b"paid 7"]


def _check_half_block(env: Env, tmp: Path, out: str) -> None:
    assert env.pg_conninfo is not None
    assert pg_rows(env.pg_conninfo, "SELECT id FROM deliveries") == [(9,)]
    assert "TxState.COMMITTED" in out
    assert visible(env.broker.addr, "orders", tmp / "check") == [b"shipped 9"]


def _check_producer_outbox(env: Env, tmp: Path, out: str) -> None:
    assert env.pg_conninfo is not None
    assert pg_rows(env.pg_conninfo, "SELECT id FROM invoices") == [(5,)]
    assert pg_rows(env.pg_conninfo, "SELECT count(*) FROM notify_outbox") == [(2,)]
    assert "committed" in out
    assert visible(env.broker.addr, "orders", tmp / "check") == []  # the relay's to publish


def _check_half_db(env: Env, tmp: Path, out: str) -> None:
    assert env.pg_conninfo is not None
    assert pg_rows(env.pg_conninfo, "SELECT id FROM refunds") == [(3,)]
    assert pg_rows(env.pg_conninfo, "SELECT state FROM notify_outbox_half") == [(1,)]
    assert visible(env.broker.addr, "orders", tmp / "check") == [b"refunded 3"]


def _check_xa(env: Env, tmp: Path, out: str) -> None:
    assert env.pg_conninfo is not None
    assert pg_rows(env.pg_conninfo, "SELECT id FROM orders") == [(42,)]
    assert visible(env.broker.addr, "orders", tmp / "check") == [b"order 42"]


def _check_consumer(env: Env, tmp: Path, out: str) -> None:
    assert env.pg_conninfo is not None
    assert pg_rows(env.pg_conninfo, "SELECT order_data FROM invoices") == [(b"order 42",)]


def _check_raw(env: Env, tmp: Path, out: str) -> None:
    assert out.startswith("result 200 ") and "value " in out and "hello" in out


def _check_queue_tx(env: Env, tmp: Path, out: str) -> None:
    assert env.pg_conninfo is not None
    assert pg_rows(env.pg_conninfo, "SELECT job FROM shipments") == [(b"ship 42",)]
    claims = pg_rows(env.pg_conninfo, "SELECT group_id, topic FROM notify_queue_done")
    assert claims == [("shipping", "jobs")]


def _check_outbox(env: Env, tmp: Path, out: str) -> None:
    assert env.pg_conninfo is not None
    assert pg_rows(env.pg_conninfo, "SELECT id FROM orders") == [(42,)]
    assert pg_rows(env.pg_conninfo, "SELECT count(*) FROM notify_outbox") == [(0,)]
    assert "1 published" in out
    assert visible(env.broker.addr, "orders", tmp / "check") == [b"order 42"]


CHECKS: dict[str, Callable[[Env, Path, str], None]] = {
    "Outbox(engine)": _check_outbox,
    "transaction(db=conn)": _check_producer_outbox,
    'producer("refunds", db=engine)': _check_half_db,
    "send_in_transaction": _check_half,
    "half.prepared()": _check_half_block,
    "TransactionManager(": _check_xa,
    "TransactionalConsumer(": _check_consumer,
    "socket.create_connection": _check_raw,
    "QueueInbox(": _check_queue_tx,
}


def _env(
    block_needs_pg: bool,
    block_needs_zk: bool,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Env:
    broker, zk_url = example_broker(
        tmp_path, request, zookeeper=block_needs_zk, system={"txCheckBackDelay": 500}
    )
    env = Env(broker, zk=zk_url)
    if block_needs_pg:
        pg: PostgresServer = running(request.getfixturevalue("postgres"))
        env.pg_url = fresh_database(pg)
        env.pg_conninfo = env.pg_url.replace("postgresql+psycopg://", "postgresql://")
    return env


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    env = _env(block.needs_postgres, block.needs_zookeeper, tmp_path, request)
    work = tmp_path / "work"
    work.mkdir()
    out = run_block(env.substitute(block.code), work)
    for marker, check in CHECKS.items():
        if marker in block.code:
            check(env, tmp_path, out)


def test_half_message_checker_decides(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The README's half-message example with the local transaction's answer lost
    (UNKNOWN): the broker asks the README's checker, which finds the row paid and commits."""
    (block,) = [b for b in BLOCKS if "send_in_transaction" in b.code]
    env = _env(True, False, tmp_path, request)
    code = env.substitute(block.code)
    decided = "return LocalTxState.COMMIT   #"
    assert decided in code
    code = code.replace(decided, "return LocalTxState.UNKNOWN   #")
    code += (  # still inside the session, so the producer is there to answer the check
        "    import time\n"
        "    from notify.client import ConsumerConfig\n"
        "    seen = []\n"
        "    c = session.create_consumer(ConsumerConfig(group='wait', data_dir='wait'))\n"
        "    deadline = time.monotonic() + 30\n"
        "    while b'paid 7' not in seen and time.monotonic() < deadline:\n"
        "        seen += [m.data for m in c.fetch('orders', 0.5)]\n"
        "    assert b'paid 7' in seen, 'the checker did not commit it'\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    out = run_block(code, work)
    assert "LocalTxState.UNKNOWN" in out
    assert visible(env.broker.addr, "orders", tmp_path / "check") == [b"paid 7"]
