"""Consumer process for the exactly-once crash test (``python -m tests.offsets.eo_worker``).

Consumes ``topic`` with a :class:`TransactionalConsumer` into the ``applied`` table (one row
per message) and bumps ``totals.n`` per message, in the same transaction as the offsets.
``--die-after K --die-at WHERE`` makes it SIGKILL itself after K messages at one of the
points ``fetched`` (batch fetched, nothing written), ``mid`` (between two app writes),
``before-commit`` (all writes done, transaction open) or ``after-commit``. Exits 0 after
``--idle-exit`` seconds without messages.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import sqlalchemy as sa

from notify.client import ConsumerConfig, connect
from notify.offsets import TransactionalConsumer

POINTS = ("fetched", "mid", "before-commit", "after-commit")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--group", default="eo")
    ap.add_argument("--topic", default="test")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--max-size", type=int, default=2048)
    ap.add_argument("--die-after", type=int, default=-1)
    ap.add_argument("--die-at", choices=POINTS, default="mid")
    ap.add_argument("--idle-exit", type=float, default=1.0)
    args = ap.parse_args(argv)

    done = 0

    def maybe_die(point: str) -> None:
        if args.die_after >= 0 and done >= args.die_after and point == args.die_at:
            print(f"dying at {point} after {done}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    engine = sa.create_engine(args.url)
    insert = sa.text("INSERT INTO applied (part, off, msg_id, body) VALUES (:p, :o, :m, :b)")
    bump = sa.text("UPDATE totals SET n = n + 1 WHERE id = 1")
    cfg = ConsumerConfig(group=args.group, data_dir=Path(args.data_dir))
    print("ready", flush=True)
    with connect([args.broker]) as session:
        tc = TransactionalConsumer(session, cfg, engine, max_size=args.max_size)
        idle_since = time.monotonic()
        while True:
            with tc.transaction(engine, args.topic, max_wait_s=0.2) as batch:
                if len(batch):
                    maybe_die("fetched")
                for m in batch:
                    c = batch.connection
                    c.execute(
                        insert,
                        {"p": str(m.partition), "o": m.offset, "m": m.msg_id, "b": m.data.decode()},
                    )
                    done += 1
                    maybe_die("mid")
                    c.execute(bump)
                if len(batch):
                    maybe_die("before-commit")
            if len(batch):
                maybe_die("after-commit")
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= args.idle_exit:
                break
        tc.close()
    engine.dispose()
    print(f"idle exit after {done}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
