"""Queue consumer process for the transactional acknowledgement crash test
(``python -m tests.queues.qtx_worker``).

Consumes queue group ``--group`` of ``--topic`` through a :class:`QueueInbox` into the
``applied`` table (one row per applied message, no unique key: a double apply shows) and
bumps ``totals.n`` per message, in the same transaction as the claims. ``--die-after K``
SIGKILLs itself after K applied messages with the transaction open (before the DB commit);
the points between the commit and the ack, and after the ack, are armed with
``NOTIFY_CRASHPOINTS=queue_tx_committed`` / ``queue_tx_acked``. ``--delay`` sleeps per
message for the first 40 (keeps a transaction open while the test kills the broker).
Exits 0 after ``--idle-exit`` seconds without messages.

``--zygote LOG``: import everything once, then fork one worker per line read on stdin
(JSON ``{"args": [...], "crash": "point,..."}``), its output appended to LOG, wait for it
and print ``exit <returncode>`` (negative: killed by that signal). A fork costs
milliseconds where a fresh interpreter costs seconds on a loaded machine.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time

import sqlalchemy as sa

import notify.faults
from notify.client import SyncQueueMessage, connect
from notify.offsets import QueueInbox


def zygote(log: str) -> int:
    """Fork a worker per command line on stdin (see the module doc)."""
    while True:
        line = sys.stdin.readline()
        if not line:
            return 0
        cmd = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the worker: its own crash points, output to the log
            code = 1
            try:
                os.environ["NOTIFY_CRASHPOINTS"] = cmd.get("crash", "")
                importlib.reload(notify.faults)  # crashpoint() reads the module's points
                fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                code = main(cmd["args"])
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--group", default="qtx")
    ap.add_argument("--topic", default="jobs")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--die-after", type=int, default=-1)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--idle-exit", type=float, default=1.0)
    args = ap.parse_args(argv)

    engine = sa.create_engine(args.url)
    inbox = QueueInbox(engine)
    insert = sa.text("INSERT INTO applied (part, off, body) VALUES (:p, :o, :b)")
    bump = sa.text("UPDATE totals SET n = n + :k WHERE id = 1")
    done = dups = 0
    print("go", flush=True)
    with connect([args.broker]) as session:
        consumer = session.create_queue_consumer(args.topic, args.group, credit=args.batch * 2)
        while True:
            first = consumer.get(args.idle_exit)
            if first is None:
                break
            batch: list[SyncQueueMessage] = [first]
            while len(batch) < args.batch:
                more = consumer.get(0.005)
                if more is None:
                    break
                batch.append(more)
            with inbox.transaction(batch) as tx:
                if tx.duplicates:
                    print(f"{len(tx.duplicates)} duplicates", flush=True)
                for m in tx:
                    tx.connection.execute(
                        insert, {"p": m.partition_key, "o": m.offset, "b": m.data.decode()}
                    )
                    done += 1
                    if args.delay and done <= 40:
                        time.sleep(args.delay)
                    if 0 <= args.die_after <= done:
                        print(f"dying before commit after {done}", flush=True)
                        os.kill(os.getpid(), signal.SIGKILL)
                tx.connection.execute(bump, {"k": len(tx)})
                dups += len(tx.duplicates)
        consumer.close()
    engine.dispose()
    print(f"idle exit after {done}, {dups} duplicates acknowledged", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--zygote"]:
        sys.exit(zygote(sys.argv[2]))
    sys.exit(main())
