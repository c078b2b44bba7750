"""A small application using notify.xa, run as a child process by the crash tests.

    python -m tests.coordinator.xa_app --log DIR --broker ADDR --pg DSN [--mysql URL]
        --first K --count N --ack FILE [--threads T] [--parts 2] [--timeout S]

Transaction ``k`` inserts row ``k`` into ``orders`` on PostgreSQL (and MariaDB) and sends
message ``b"<k>:<p>"`` to every partition ``p < parts`` of topic ``orders``. Before it
starts, ``b <k>`` is appended to the ack file, and ``ok <k>`` once commit returned (or
``fail <k> <error class>``). NOTIFY_CRASHPOINTS in the environment kills it at that point;
tests also SIGKILL it from outside. Failures (a broker being restarted) are retried after a
short pause, with the next number.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
import threading
import time

from notify.xa import (
    BrokerParticipant,
    CoordinatorConfig,
    MySQLParticipant,
    PostgresParticipant,
    TransactionManager,
    XAError,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--id", default="app")
    ap.add_argument("--broker", required=True)
    ap.add_argument("--pg", required=True)
    ap.add_argument("--mysql")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--stride", type=int, default=1_000_000)
    ap.add_argument("--ack", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--names", default="pg,broker", help="the participants' names: PG,BROKER")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    tm = TransactionManager(
        CoordinatorConfig(
            a.log, coordinator_id=a.id, recovery_interval_s=a.interval, recovery_grace_s=0.5
        )
    )
    pg_name, broker_name = a.names.split(",")
    tm.register(pg_name, lambda: PostgresParticipant(a.pg, connect_timeout=2))
    if a.mysql:
        tm.register("my", lambda: MySQLParticipant(a.mysql))
    tm.register(broker_name, lambda: BrokerParticipant(a.broker, connect_timeout_s=2))
    tm.start()
    fd = os.open(a.ack, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    lock = threading.Lock()
    numbers = itertools.count(a.first)
    last = a.first + a.count

    def note(line: str) -> None:
        with lock:
            os.write(fd, line.encode() + b"\n")

    def worker() -> None:
        while True:
            with lock:
                k = next(numbers)
            if k >= last:
                return
            note(f"b {k}")
            try:
                with tm.transaction(timeout=a.timeout) as tx:
                    tx.enlist(pg_name).execute("INSERT INTO orders (id) VALUES (%s)", (k,))
                    if a.mysql:
                        with tx.enlist("my").cursor() as cur:
                            cur.execute("INSERT INTO orders (id) VALUES (%s)", (k,))
                    producer = tx.enlist(broker_name)
                    for p in range(a.parts):
                        producer.send("orders", b"%d:%d" % (k, p), partition=p)
                note(f"ok {k}")
            except XAError as e:
                note(f"fail {k} {type(e).__name__}")
                time.sleep(0.05)

    threads = [threading.Thread(target=worker) for _ in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tm.close()
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
