"""Queue consumer process for the transactional acknowledgement crash test
(``python -m tests.queues.qtx_worker``).

Consumes queue group ``--group`` of ``--topic`` through a :class:`QueueInbox` into the
``applied`` table (one row per applied message, no unique key: a double apply shows) and
bumps ``totals.n`` per message, in the same transaction as the claims. ``--die-after K``
SIGKILLs itself after K applied messages with the transaction open (before the DB commit);
the points between the commit and the ack, and after the ack, are armed with
``NOTIFY_CRASHPOINTS=queue_tx_committed`` / ``queue_tx_acked``. ``--delay`` sleeps per
message for the first 40 (keeps a transaction open while the test kills the broker);
``--go FILE`` waits for the file before consuming (the test starts the next worker early).
Exits 0 after ``--idle-exit`` seconds without messages.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import sqlalchemy as sa

from notify.client import SyncQueueMessage, connect
from notify.offsets import QueueInbox


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
    ap.add_argument("--go", help="wait until this file exists before consuming")
    args = ap.parse_args(argv)

    engine = sa.create_engine(args.url)
    inbox = QueueInbox(engine)
    insert = sa.text("INSERT INTO applied (part, off, body) VALUES (:p, :o, :b)")
    bump = sa.text("UPDATE totals SET n = n + :k WHERE id = 1")
    done = dups = 0
    while args.go and not os.path.exists(args.go):  # started early: imports done meanwhile
        time.sleep(0.01)
    print(f"go {time.time():.2f}", flush=True)
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
    sys.exit(main())
