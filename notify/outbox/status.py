"""What an outbox holds and how fast it drains (``notify outbox status``)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from .sql import MISSING_TABLES, NOW_MS, OutboxTablesMissingError, dialect_name, is_missing_table


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """One shard: rows waiting (and the oldest one's age), delayed rows, dead rows, its
    leader, what it published."""

    shard: int
    backlog: int
    oldest_age_s: float | None
    delayed: int
    dead: int
    pending: bool
    leader: str | None
    epoch: int
    published: int
    leader_seen_s_ago: float


@dataclass(frozen=True, slots=True)
class OutboxStatus:
    """An outbox's status; ``rate`` is rows published per second over the sampling
    interval (None when taken once)."""

    shards: tuple[ShardStatus, ...]
    instances: int
    rate: float | None = None

    @property
    def backlog(self) -> int:
        return sum(s.backlog for s in self.shards)

    @property
    def oldest_age_s(self) -> float | None:
        ages = [s.oldest_age_s for s in self.shards if s.oldest_age_s is not None]
        return max(ages) if ages else None

    @property
    def published(self) -> int:
        return sum(s.published for s in self.shards)

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form."""
        return {
            "backlog": self.backlog,
            "oldest_age_s": self.oldest_age_s,
            "rate": self.rate,
            "published": self.published,
            "instances": self.instances,
            "shards": [asdict(s) for s in self.shards],
        }


def outbox_status(engine: Engine) -> OutboxStatus:
    """The status now (one read transaction)."""
    now = NOW_MS[dialect_name(engine.dialect)]
    try:
        with engine.connect() as c:
            now_ms = int(c.execute(sa.text(f"SELECT {now}")).scalar_one())
            counts = {
                int(r[0]): (int(r[1]), r[2])
                for r in c.execute(
                    sa.text(
                        "SELECT shard, count(*), min(created_ms) FROM notify_outbox GROUP BY shard"
                    )
                )
            }
            delayed = {
                int(r[0]): int(r[1])
                for r in c.execute(
                    sa.text("SELECT shard, count(*) FROM notify_outbox_delayed GROUP BY shard")
                )
            }
            dead = {
                int(r[0]): int(r[1])
                for r in c.execute(
                    sa.text("SELECT shard, count(*) FROM notify_outbox_dead GROUP BY shard")
                )
            }
            relays = c.execute(
                sa.text(
                    "SELECT shard, owner, epoch, published, updated_ms, pending IS NOT NULL "
                    "FROM notify_outbox_relay ORDER BY shard"
                )
            ).all()
            instances = int(
                c.execute(
                    sa.text(
                        "SELECT count(*) FROM notify_outbox_instances "
                        f"WHERE heartbeat_ms >= {now} - 10000"
                    )
                ).scalar_one()
            )
    except sa_exc.SQLAlchemyError as e:
        if is_missing_table(e):
            raise OutboxTablesMissingError(MISSING_TABLES) from e
        raise
    shards = []
    for shard, owner, epoch, published, updated_ms, pending in relays:
        n, oldest = counts.get(int(shard), (0, None))
        shards.append(
            ShardStatus(
                int(shard),
                n,
                None if oldest is None else max(0.0, (now_ms - int(oldest)) / 1000),
                delayed.get(int(shard), 0),
                dead.get(int(shard), 0),
                bool(pending),
                owner,
                int(epoch),
                int(published),
                max(0.0, (now_ms - int(updated_ms)) / 1000),
            )
        )
    return OutboxStatus(tuple(shards), instances)


def sampled_status(engine: Engine, interval_s: float) -> OutboxStatus:
    """The status with ``rate``: two reads ``interval_s`` apart."""
    first = outbox_status(engine)
    t0 = time.monotonic()
    time.sleep(interval_s)
    second = outbox_status(engine)
    dt = time.monotonic() - t0
    rate = (second.published - first.published) / dt if dt > 0 else None
    return OutboxStatus(second.shards, second.instances, rate)
