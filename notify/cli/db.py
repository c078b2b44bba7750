"""``notify db`` (schema migrations) and ``notify offsets`` (consumer offsets) commands.

::

    notify db upgrade [REV] --url URL          # idempotent; REV defaults to head
    notify db downgrade REV --url URL          # REV "base" removes notify's tables
    notify db current --url URL [--check]      # --check: exit 1 unless up to date
    notify db history
    notify offsets show --url URL [--group G] [--topic T]
    notify offsets reset --url URL --group G --topic T [--partition P]... (--to N | --delete)
    notify offsets copy --from URL --to URL [--group G] [--topic T] [--dry-run]

``--url`` defaults to ``$NOTIFY_DB_URL`` (``offsets``: ``$NOTIFY_OFFSETS_URL``, then
``$NOTIFY_DB_URL``). Offset store URLs: ``file:///dir``, ``postgresql+psycopg://...``,
``mysql+pymysql://...``, ``sqlite:///path``, ``zookeeper://host:port/meta``. Output is a
table, or JSON with ``--json``. Errors are one line on stderr, exit 1 (2 for usage).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.table import Table

from notify.cli.tables import new_table, print_table
from notify.client.offsets import TopicPartitionOffset
from notify.errors import NotifyError
from notify.migrations import downgrade, history, status, upgrade
from notify.offsets.base import parse_partition
from notify.offsets.files import FileOffsets
from notify.offsets.sql import safe_url
from notify.offsets.url import display_url, open_offset_store

EXIT_FAILURE = 1
EXIT_USAGE = 2

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    click.echo(f"notify: {message}", err=True)
    sys.exit(code)


@contextmanager
def _errors() -> Iterator[None]:
    """Turn notify errors into one line on stderr and exit 1."""
    try:
        yield
    except NotifyError as e:
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except OSError as e:
        _fail(str(e))


def _print_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=False))


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    table = Table(title=title)
    for c in columns:
        table.add_column(c, overflow="fold")
    for r in rows:
        table.add_row(*("" if v is None else str(v) for v in r))
    Console().print(table)


def _json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="machine-readable output")(f)


def _db_url_option(f: F) -> F:
    return click.option(
        "--url",
        envvar="NOTIFY_DB_URL",
        required=True,
        help="SQLAlchemy URL of the database [env NOTIFY_DB_URL]",
    )(f)


def _store_url_option(f: F) -> F:
    return click.option(
        "--url",
        envvar=["NOTIFY_OFFSETS_URL", "NOTIFY_DB_URL"],
        required=True,
        help="offset store URL [env NOTIFY_OFFSETS_URL, NOTIFY_DB_URL]",
    )(f)


# ---------------------------------------------------------------------------- db


@click.group()
def db() -> None:
    """Schema migrations of notify's SQL tables (offsets)."""


def _rev(revs: Sequence[str]) -> str:
    return ",".join(revs) if revs else "(empty)"


def _report(url: str, verb: str, before: Any, after: Any, as_json: bool) -> None:
    if as_json:
        _print_json({"url": safe_url(url), "before": before.as_dict(), "after": after.as_dict()})
        return
    if before.current == after.current:
        click.echo(f"{safe_url(url)}: already at {_rev(after.current)} ({after.state})")
    else:
        click.echo(
            f"{safe_url(url)}: {verb} {_rev(before.current)} -> {_rev(after.current)} "
            f"({after.state})"
        )


@db.command("upgrade")
@click.argument("revision", default="head")
@_db_url_option
@_json_option
def db_upgrade(revision: str, url: str, as_json: bool) -> None:
    """Migrate the database up to REVISION (default: head). Safe to repeat."""

    with _errors():
        before, after = upgrade(url, revision)
    _report(url, "upgraded", before, after, as_json)


@db.command("downgrade")
@click.argument("revision")
@_db_url_option
@_json_option
def db_downgrade(revision: str, url: str, as_json: bool) -> None:
    """Migrate the database down to REVISION ("base": drop notify's tables)."""

    with _errors():
        before, after = downgrade(url, revision)
    _report(url, "downgraded", before, after, as_json)


@db.command("current")
@_db_url_option
@_json_option
@click.option("--check", is_flag=True, help="exit 1 unless the database is at head")
def db_current(url: str, as_json: bool, check: bool) -> None:
    """Show the database's schema revision and whether it is up to date."""

    with _errors():
        st = status(url)
    if as_json:
        _print_json({"url": safe_url(url), **st.as_dict()})
    else:
        hint = {
            "empty": "never migrated: run `notify db upgrade`",
            "behind": "behind: run `notify db upgrade`",
            "current": "up to date",
            "ahead": "AHEAD of this notify: upgrade notify",
        }[st.state]
        click.echo(f"{safe_url(url)}: {_rev(st.current)} (head {st.head}): {hint}")
    if check and st.state != "current":
        sys.exit(EXIT_FAILURE)


@db.command("history")
@_json_option
def db_history(as_json: bool) -> None:
    """List the migrations shipped with this notify, oldest first."""

    with _errors():
        revs = history()
    if as_json:
        _print_json(
            [
                {
                    "revision": r.revision,
                    "down_revision": r.down_revision,
                    "message": r.message,
                    "head": r.is_head,
                }
                for r in revs
            ]
        )
        return
    _table(
        "migrations",
        ["revision", "revises", "head", "description"],
        [(r.revision, r.down_revision or "", "*" if r.is_head else "", r.message) for r in revs],
    )


# ---------------------------------------------------------------------------- offsets


@click.group()
def offsets() -> None:
    """Show, reset and copy consumer offsets in any offset store."""
    # kazoo logs every reconnect attempt; the command reports the outcome in one line.
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)


@contextmanager
def _store(url: str, must_exist: bool = False) -> Iterator[Any]:
    """The store ``url`` names; ``must_exist``: a file store's directory must be there
    (reading a directory that does not exist is a mistake, not an empty store)."""
    with _errors():
        store = open_offset_store(url)
    if must_exist and isinstance(store, FileOffsets) and not Path(store.directory).is_dir():
        store.close()
        _fail(f"{display_url(url)}: no such directory (nothing stored there)")
    try:
        yield store
    finally:
        store.close()


def _show(rows: Sequence[Any], title: str, as_json: bool) -> None:
    if as_json:
        _print_json([r.as_dict() for r in rows])
        return
    columns = [("group", "left"), ("topic", "left"), ("partition", "left"), ("offset", "right"),
               ("msg_id", "right"), ("updated_at", "left")]
    cells = [
        (
            str(r.group),
            str(r.topic),
            str(r.partition),
            str(r.offset),
            "" if r.msg_id is None else str(r.msg_id),
            "" if r.updated_at is None else r.updated_at.isoformat(timespec="seconds"),
        )
        for r in rows
    ]
    table = new_table(title, columns, key_column=None)
    for column in table.columns:
        column.overflow = "fold"
    for c in cells:
        table.add_row(*c)
    # a cell split over two lines cannot be pasted: then every row again, one per line
    ids = [v for c in cells for v in c[:5] if v]
    print_table(table, ids, "offsets as group topic partition offset msg_id",
                whole=[" ".join(c[:5]) for c in cells])


@offsets.command("show")
@_store_url_option
@click.option("-g", "--group", default=None, help="only this consumer group")
@click.option("-t", "--topic", default=None, help="only this topic")
@_json_option
def offsets_show(url: str, group: str | None, topic: str | None, as_json: bool) -> None:
    """List stored offsets."""

    with _store(url, must_exist=True) as store, _errors():
        rows = store.list_offsets(group, topic)
    _show(rows, f"offsets in {display_url(url)}", as_json)


@offsets.command("reset")
@_store_url_option
@click.option("-g", "--group", required=True, help="consumer group")
@click.option("-t", "--topic", required=True, help="topic")
@click.option(
    "-p",
    "--partition",
    "partitions",
    multiple=True,
    help="<brokerId>-<part> (repeatable; default: every stored partition of the topic)",
)
@click.option("--to", "to_offset", type=int, default=None, help="set this byte offset")
@click.option("--delete", is_flag=True, help="remove: the consumer restarts at initial_offset")
@_json_option
def offsets_reset(
    url: str,
    group: str,
    topic: str,
    partitions: tuple[str, ...],
    to_offset: int | None,
    delete: bool,
    as_json: bool,
) -> None:
    """Set (--to N) or remove (--delete) a group's offsets of a topic. Stop the group first."""

    if (to_offset is None) == (not delete):
        _fail("give exactly one of --to OFFSET or --delete", EXIT_USAGE)
    if to_offset is not None and to_offset < 0:
        _fail("--to must be >= 0", EXIT_USAGE)
    for p in partitions:
        try:
            parse_partition(p)
        except ValueError as e:
            _fail(str(e), EXIT_USAGE)
    with _store(url) as store, _errors():
        if delete:
            n = store.delete(group, topic, list(partitions) or None)
            result: dict[str, Any] = {"group": group, "topic": topic, "deleted": n}
        else:
            assert to_offset is not None
            parts = list(partitions) or [r.partition for r in store.list_offsets(group, topic)]
            if not parts:
                _fail(f"no stored offsets of group {group} in {topic}: give --partition")
            store.commit(group, [TopicPartitionOffset(topic, p, to_offset, -1) for p in parts])
            result = {"group": group, "topic": topic, "partitions": parts, "offset": to_offset}
        rows = store.list_offsets(group, topic)
    if as_json:
        _print_json({**result, "offsets": [r.as_dict() for r in rows]})
        return
    if delete:
        click.echo(f"deleted {result['deleted']} offset(s) of group {group} in {topic}")
    else:
        click.echo(f"set {len(result['partitions'])} offset(s) of group {group} in {topic}")
    _show(rows, f"{group} / {topic}", as_json=False)


@offsets.command("copy")
@click.option("--from", "src", required=True, help="source offset store URL")
@click.option("--to", "dst", required=True, help="target offset store URL")
@click.option("-g", "--group", default=None, help="only this consumer group")
@click.option("-t", "--topic", default=None, help="only this topic")
@click.option("--dry-run", is_flag=True, help="show what would be copied")
@_json_option
def offsets_copy(
    src: str, dst: str, group: str | None, topic: str | None, dry_run: bool, as_json: bool
) -> None:
    """Copy offsets between stores (e.g. ZooKeeper or files -> PostgreSQL).

    Each group is written to the target in one commit; offsets already in the target for
    the same group/topic/partition are overwritten.
    """

    with _store(src, must_exist=True) as source, _errors():
        rows = source.list_offsets(group, topic)
    by_group: dict[str, list[Any]] = {}
    for r in rows:
        by_group.setdefault(r.group, []).append(r)
    if not dry_run:
        with _store(dst) as target, _errors():
            for g, items in by_group.items():
                target.commit(g, [r.tpo for r in items])
    if as_json:
        _print_json(
            {
                "from": display_url(src),
                "to": display_url(dst),
                "copied": 0 if dry_run else len(rows),
                "dry_run": dry_run,
                "offsets": [r.as_dict() for r in rows],
            }
        )
        return
    verb = "would copy" if dry_run else "copied"
    click.echo(
        f"{verb} {len(rows)} offset(s) of {len(by_group)} group(s) "
        f"from {display_url(src)} to {display_url(dst)}"
    )
    if rows:
        _show(rows, "offsets", as_json=False)
