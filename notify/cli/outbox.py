"""``notify outbox``: run the transactional outbox's relay, show its status, set its shards.

::

    notify outbox relay --db URL -s HOST:PORT [--shard N]...   # until SIGTERM / SIGINT
    notify outbox status --db URL [--interval S] [--json]
    notify outbox shards --db URL [N]                          # show, or set the count

``--db`` defaults to ``$NOTIFY_DB_URL``. The tables come from ``notify db upgrade``.
Errors are one line on stderr, exit 1 (2 for usage).
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
import sqlalchemy as sa
from rich.console import Console
from rich.table import Table
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from notify.cli.common import EXIT_USAGE, fail, setup_logging
from notify.cli.options import Security, security_options, server_option
from notify.client import connect
from notify.dbengine import create_offset_engine, safe_url
from notify.errors import NotifyError
from notify.outbox import Limits, Outbox, OutboxStatus, RelayConfig
from notify.outbox.rows import MAX_SHARDS, producer_name


@click.group()
def outbox() -> None:
    """The transactional outbox: relay, status, shards."""


def _db_option(f: Any) -> Any:
    return click.option(
        "--db",
        "url",
        envvar="NOTIFY_DB_URL",
        required=True,
        help="SQLAlchemy URL of the application's database [env NOTIFY_DB_URL]",
    )(f)


@contextmanager
def _engine(url: str, pool_size: int = 5) -> Iterator[Engine]:
    try:
        engine = create_offset_engine(url, pool_size=pool_size, max_overflow=4)
    except NotifyError as e:
        fail(str(e), EXIT_USAGE)
    except TypeError:  # SQLite's pool takes no size
        engine = create_offset_engine(url)
    try:
        yield engine
    except NotifyError as e:
        fail(str(e).splitlines()[0])
    except sa_exc.SQLAlchemyError as e:
        orig = getattr(e, "orig", None) or e
        fail(f"{safe_url(url)}: {str(orig).strip().splitlines()[0]}")
    finally:
        engine.dispose()


@outbox.command("relay")
@_db_option
@server_option
@security_options
@click.option("--shard", "shards", type=int, multiple=True, help="lead only these shards")
@click.option("--max-rows", type=int, default=Limits().max_rows, show_default=True,
              help="rows per cycle")  # fmt: skip
@click.option("--heartbeat", type=float, default=RelayConfig().heartbeat_s, show_default=True,
              help="seconds between heartbeats (instances alive)")  # fmt: skip
@click.option("--instance-ttl", type=float, default=RelayConfig().instance_ttl_s,
              show_default=True,
              help="seconds without a heartbeat before an instance's shards move")  # fmt: skip
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
def relay_cmd(
    url: str,
    server: str,
    security: Security,
    shards: tuple[int, ...],
    max_rows: int,
    heartbeat: float,
    instance_ttl: float,
    log_level: str,
) -> None:
    """Publish the outbox of --db to the broker at -s, exactly once, until stopped.

    Several relays (on several machines) share the shards; one leads each shard at a
    time, another takes over when it dies."""
    setup_logging(log_level)
    try:
        config = RelayConfig(
            shards=shards or None,
            limits=Limits(max_rows=max_rows),
            heartbeat_s=heartbeat,
            instance_ttl_s=instance_ttl,
            standby_poll_s=min(RelayConfig().standby_poll_s, heartbeat),
        )
    except ValueError as e:
        fail(str(e), EXIT_USAGE)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with _engine(url, pool_size=2 * MAX_SHARDS_PER_PROCESS + 4) as engine:
        try:
            session = connect(
                [server],
                secret=security.secret,
                tls=security.uses_tls,
                tls_ca_file=security.tls_ca_file,
                tls_verify=security.tls_verify,
                tls_cert_file=security.tls_cert_file,
                tls_key_file=security.tls_key_file,
            )
        except NotifyError as e:
            fail(f"broker {server}: {e}")
        with session, Outbox(engine).relay(session, config) as r:
            click.echo(
                f"notify outbox relay: {safe_url(url)} -> {server} "
                f"(instance {r.instance[:8]}); SIGTERM or Ctrl-C stops it",
                err=True,
            )
            stop.wait()
        click.echo(f"notify outbox relay: stopped, {r.published} rows published", err=True)


#: Connections a relay process may keep: two per shard it runs (control, work).
MAX_SHARDS_PER_PROCESS = 16


def _print_status(st: OutboxStatus, url: str) -> None:
    t = Table(title=f"outbox of {safe_url(url)}")
    for col in ("shard", "backlog", "oldest", "delayed", "dead", "pending", "leader",
                "epoch", "published"):  # fmt: skip
        t.add_column(col, justify="left" if col == "leader" else "right")
    for s in st.shards:
        t.add_row(
            str(s.shard),
            f"{s.backlog:,}",
            "" if s.oldest_age_s is None else f"{s.oldest_age_s:.1f} s",
            f"{s.delayed:,}",
            f"{s.dead:,}",
            "yes" if s.pending else "",
            s.leader or "",
            str(s.epoch),
            f"{s.published:,}",
        )
    Console().print(t)
    oldest = "-" if st.oldest_age_s is None else f"{st.oldest_age_s:.1f} s"
    rate = "" if st.rate is None else f", {st.rate:,.0f} rows/s"
    click.echo(
        f"backlog {st.backlog:,} rows, oldest {oldest}{rate}; "
        f"{st.instances} relay instance(s) alive"
    )


@outbox.command("status")
@_db_option
@click.option("--interval", type=float, default=1.0, show_default=True,
              help="seconds between the two reads giving rows/s (0: one read)")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def status_cmd(url: str, interval: float, as_json: bool) -> None:
    """Backlog rows, the oldest row's age, rows/s, and each shard's leader."""
    if interval < 0:
        fail("--interval must be >= 0", EXIT_USAGE)
    with _engine(url) as engine:
        st = Outbox(engine).status(interval)
    if as_json:
        click.echo(json.dumps(st.as_dict(), indent=2))
    else:
        _print_status(st, url)


@outbox.command("shards")
@_db_option
@click.argument("count", type=int, required=False)
def shards_cmd(url: str, count: int | None) -> None:
    """Show the shard count, or set it to COUNT.

    Writers read the count at their first send: restart them after a change. A key's
    messages keep their order except across the change (its shard changes); shrinking
    needs the removed shards empty."""
    if count is not None and not 1 <= count <= MAX_SHARDS:
        fail(f"COUNT must be 1..{MAX_SHARDS}", EXIT_USAGE)
    with _engine(url) as engine, engine.begin() as c:
        rows = c.execute(
            sa.text(
                "SELECT shard, producer_name, producer_secret FROM notify_outbox_relay "
                "ORDER BY shard"
            )
        ).all()
        have = len(rows)
        if count is None or count == have:
            click.echo(f"{have} shard(s)")
            return
        if count > have:
            outbox_id = str(rows[0][1]).split("-")[1]
            for s in range(have, count):
                c.execute(
                    sa.text(
                        "INSERT INTO notify_outbox_relay (shard, producer_name, "
                        "producer_secret, seqs) VALUES (:s, :p, :k, '{}')"
                    ),
                    {"s": s, "p": producer_name(outbox_id, s), "k": rows[0][2]},
                )
        else:
            busy = c.execute(
                sa.text(
                    "SELECT (SELECT count(*) FROM notify_outbox WHERE shard >= :n) + "
                    "(SELECT count(*) FROM notify_outbox_delayed WHERE shard >= :n) + "
                    "(SELECT count(*) FROM notify_outbox_relay WHERE shard >= :n "
                    "AND pending IS NOT NULL)"
                ),
                {"n": count},
            ).scalar_one()
            if busy:
                fail(f"shards {count}..{have - 1} still hold {busy} row(s) or batches")
            c.execute(sa.text("DELETE FROM notify_outbox_relay WHERE shard >= :n"), {"n": count})
        click.echo(f"{have} -> {count} shard(s); restart the writers")
