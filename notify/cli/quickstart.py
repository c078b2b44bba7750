"""The quickstart: a broker on embedded defaults, a producer, a consumer and transactions.

``notify demo -c conf/server.ini`` starts the broker of that config as a child process (no
ZooKeeper, no database), then, through the client API:

1. sends ten messages to topic ``demo`` with business keys (same key, same partition);
2. consumes them with a consumer group whose offsets live in a local file;
3. commits a transaction spanning ``orders`` and ``audit`` and rolls another back,
   showing that consumers see the first whole and never anything of the second;
4. sends a half message whose local transaction commits (Notify-style);
5. publishes from inside a database transaction with the transactional outbox, on a
   SQLite file (no server): an order row and its message commit together, a rolled-back
   transaction leaves neither, and a relay publishes the committed message exactly once.

and stops the broker cleanly. Run it twice: the consumer resumes after what it consumed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from notify.client import (
    Consumer,
    ConsumerConfig,
    LocalTxState,
    Message,
    MessageSessionFactory,
    connect,
)
from notify.config import load_config
from notify.errors import NotifyError
from notify.migrations import upgrade
from notify.outbox import Outbox

#: How long the demo waits for its broker (a fresh install compiles bytecode on the first
#: start; a busy machine may take a while).
START_TIMEOUT_S = 90.0


class DemoError(NotifyError):
    """The demo could not run (the broker did not start, a step failed)."""


def _start_broker(config_path: Path, console: Console) -> tuple[subprocess.Popen[bytes], str]:
    ready = Path(tempfile.mkdtemp(prefix="notify-demo-")) / "ready.json"
    log_path = ready.with_name("broker.log")
    log_file = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "notify", "broker", "start", "-c", str(config_path),
         "--ready-file", str(ready)],
        stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    log_file.close()
    console.print("starting the broker (the first start after an install compiles bytecode)")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready.exists():
            info = json.loads(ready.read_text())
            addr = f"{info['host']}:{info['port']}"
            console.print(f"[green]broker[/] pid {proc.pid} listening on {addr} (log {log_path})")
            return proc, addr
        if proc.poll() is not None:
            raise DemoError(f"the broker exited at start:\n{log_path.read_text()[-2000:]}")
        time.sleep(0.05)
    proc.kill()
    raise DemoError(f"the broker did not start within {START_TIMEOUT_S:.0f} s; see {log_path}")


def _outbox_step(
    session: MessageSessionFactory, consumer: Consumer, client_dir: Path, console: Console
) -> None:
    """5. the transactional outbox on a SQLite file: rows and messages commit together."""
    client_dir.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{client_dir / 'shop.db'}"
    upgrade(url)  # notify's tables (what `notify db upgrade --url ...` does)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE IF NOT EXISTS shop_orders (id INTEGER, item TEXT)"))
        outbox = Outbox(engine)
        n = int(time.time())
        with engine.begin() as conn:  # the application's own transaction
            conn.execute(sa.text("INSERT INTO shop_orders VALUES (:n, 'lamp')"), {"n": n})
            outbox.send(conn, "orders", b"order %d: lamp (outbox)" % n, key=str(n))
        try:
            with engine.begin() as conn:
                conn.execute(sa.text("INSERT INTO shop_orders VALUES (:n, 'x')"), {"n": n + 1})
                outbox.send(conn, "orders", b"order %d: never (outbox)" % (n + 1), key="x")
                raise RuntimeError("out of stock")
        except RuntimeError as e:
            console.print(f"5. outbox: one transaction committed, one rolled back ({e})")
        with outbox.relay(session):  # publishes committed rows, exactly once
            deadline = time.monotonic() + 20
            while outbox.status().backlog and time.monotonic() < deadline:
                time.sleep(0.05)
        seen: list[Message] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(b"(outbox)" in m.data for m in seen):
            seen += consumer.fetch("orders", max_wait_s=0.5)
        got = [m.data.decode() for m in seen if b"(outbox)" in m.data]
        console.print(f"   the relay published: {got}")
        if not got or any("never" in b for b in got):
            raise DemoError(f"the outbox published {got}")
    finally:
        engine.dispose()


def run_demo(config_path: Path) -> None:
    """Run the quickstart against the config at ``config_path``."""

    console = Console()
    cfg = load_config(config_path)
    for needed in ("demo", "orders", "audit"):
        if needed not in cfg.topics:
            raise DemoError(f"{config_path} has no [topic={needed}] section for the demo")
    proc, addr = _start_broker(config_path, console)
    client_dir = cfg.system.data_path.parent / "demo-client"
    try:
        with connect([addr]) as session:
            producer = session.create_producer()

            # 1. plain sends, ordered per key
            table = Table(title="1. producer.send(topic='demo', key=...)")
            for col in ("key", "partition", "offset", "msg id"):
                table.add_column(col)
            for i in range(10):
                key = f"user-{i % 3}"
                r = producer.send("demo", f"hello #{i}".encode(), key=key).raise_for_error()
                table.add_row(key, str(r.partition), str(r.offset), str(r.msg_id))
            console.print(table)

            # 2. a consumer group, offsets in a local file
            consumer = session.create_consumer(
                ConsumerConfig(group="demo-group", data_dir=client_dir)
            )
            got: list[Message] = []
            deadline = time.monotonic() + 10
            while len(got) < 10 and time.monotonic() < deadline:
                got += consumer.fetch("demo", max_wait_s=0.5)
            table = Table(title="2. consumer.fetch('demo') — group demo-group")
            for col in ("partition", "offset", "data"):
                table.add_column(col)
            for m in got[-10:]:
                table.add_row(str(m.partition), str(m.offset), m.data.decode())
            console.print(table)
            consumer.commit()

            # 3. local transactions: all or nothing
            with producer.transaction(timeout=10):
                producer.send("orders", b"order 42: 3 books")
                producer.send("audit", b"order 42 placed")
            console.print("3. transaction committed: [green]orders + audit visible together[/]")
            try:
                with producer.transaction(timeout=10):
                    producer.send("orders", b"order 43: never")
                    raise RuntimeError("payment declined")
            except RuntimeError as e:
                console.print(f"   transaction rolled back ({e}): [yellow]nothing visible[/]")
            seen: list[Message] = []
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not any(b"42" in m.data for m in seen):
                seen += consumer.fetch("orders", max_wait_s=0.5)
            bodies = [m.data.decode() for m in seen]
            console.print(f"   consumer of 'orders' sees: {bodies}")
            if any("43" in b for b in bodies):
                raise DemoError("a rolled-back message became visible")

            # 4. a half message whose local transaction decides
            tproducer = session.create_transactional_producer(
                "demo-shop", checker=lambda msg: LocalTxState.COMMIT
            )
            res = tproducer.send_in_transaction(
                "orders", b"order 44: paid", lambda msg: LocalTxState.COMMIT
            )
            console.print(f"4. half message + local transaction: {res.state.name}")
            _outbox_step(session, consumer, client_dir, console)
            consumer.commit()
            consumer.shutdown()
        console.print("[bold green]demo finished[/]: data in", str(cfg.system.data_path))
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
