"""``notify dlq``: dead letters, wherever they are kept.

    notify dlq list TOPIC GROUP [--from N] [--limit N] [--json]       (a queue group's)
    notify dlq replay TOPIC GROUP (--all | -m PARTITION:OFFSET ...)    (on the broker)
    notify dlq list --local [-d DIR] [-g GROUP] [--json]               (a consumer's,
    notify dlq replay --local [-d DIR] [-g GROUP] [--id ID ...]        on its disk)

A queue group's dead letters live on the broker (``-s host:port`` like every command, with
``adminSecret`` when the broker sets it); a pull consumer's live in its ``data_dir``
(``recover/<group>/dead/``): ``--local``, or ``-d DIR``, which implies it; the default
directory is the consumers' own default (``$NOTIFY_CLIENT_DIR``, else
``~/.local/state/notify-client``). The older spellings still work, hidden:
``notify dlq show`` (= ``list --local``) and ``notify queue dlq list|replay``. Exit codes: 0
ok, 1 runtime failure (broker unreachable, error reply, unknown id), 2 usage error.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, NoReturn, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from notify.cli.common import EXIT_FAILURE, EXIT_USAGE
from notify.cli.options import Security, security_options, server_option
from notify.cli.request import request
from notify.cli.tables import new_table, print_table
from notify.client import default_data_dir, list_dead_letters, replay_dead_letters
from notify.errors import NotifyError
from notify.protocol.frames import encode_qdlq, parse_dead_letters

F = TypeVar("F", bound=Callable[..., Any])

USAGE: Final = (
    "name the dead letters: TOPIC GROUP (a queue group's, on the broker) or --local / "
    "-d DIR (a consumer's recover store)"
)


def _fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    click.echo(f"notify: {message}", err=True)
    sys.exit(code)


def _emit_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2))


def _where(topic: str | None, group_arg: str | None, local: bool, data_dir: Path | None) -> bool:
    """True for the consumer's local store, False for the broker; exits 2 when unclear."""
    local = local or data_dir is not None
    if local and topic is not None:
        _fail("give either TOPIC GROUP (broker) or --local/-d DIR (consumer), not both",
              EXIT_USAGE)
    if not local and (topic is None or group_arg is None):
        _fail(USAGE, EXIT_USAGE)
    return local


# ---------------------------------------------------------------------- options

_LOCAL = click.option("--local", is_flag=True,
                      help="a consumer's local dead letters (its recover store), not the broker's")
_DATA_DIR = click.option(
    "-d",
    "--data-dir",
    "--dir",
    "data_dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="the consumer's data_dir (implies --local; default: the consumers' default, "
    "$NOTIFY_CLIENT_DIR or ~/.local/state/notify-client); --dir is an alias",
)
_GROUP = click.option("-g", "--group", "local_group", default=None,
                      help="with --local: one consumer group (default: all)")
_JSON = click.option("--json", "as_json", is_flag=True, help="machine-readable output")


def _broker_args(f: F) -> F:
    f = click.argument("group", required=False)(f)
    return click.argument("topic", required=False)(f)


@click.group()
def dlq() -> None:
    """Dead letters: a queue group's on the broker (TOPIC GROUP), or a consumer's in its
    local recover store (--local)."""


# ---------------------------------------------------------------------- list


@dlq.command("list")
@_broker_args
@click.option("--from", "start", type=click.IntRange(min=0), default=0, show_default=True,
              help="broker: skip this many entries (oldest first)")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="broker: at most this many entries (the broker clamps to queueMaxDeadLetters)")
@_LOCAL
@_DATA_DIR
@_GROUP
@server_option
@_JSON
@security_options
def dlq_list(
    topic: str | None, group: str | None, start: int, limit: int | None, local: bool,
    data_dir: Path | None, local_group: str | None, server: str, as_json: bool,
    security: Security,
) -> None:
    """List dead letters, oldest first: GROUP's on TOPIC (broker), or --local ones."""
    if _where(topic, group, local, data_dir):
        return _local_list(data_dir or default_data_dir(), local_group, as_json)
    assert topic is not None and group is not None
    _broker_list(topic, group, start, limit, server, as_json, security)


@dlq.command("show", hidden=True)
@_DATA_DIR
@_GROUP
@_JSON
def dlq_show(data_dir: Path | None, local_group: str | None, as_json: bool) -> None:
    """Deprecated: ``notify dlq list --local``."""
    _local_list(data_dir or default_data_dir(), local_group, as_json)


def _broker_list(
    topic: str, group: str, start: int, limit: int | None, server: str, as_json: bool,
    security: Security,
) -> None:
    body = b"" if start == 0 and limit is None else b"%d %d" % (start, limit or 2**31 - 1)
    try:
        reply = request(
            server, lambda o: encode_qdlq(topic, group, "list", body, o), security.transport()
        )
        total, dropped, letters = parse_dead_letters(reply.body)
    except NotifyError as e:
        _fail(str(e))
    if as_json:
        return _emit_json({
            "topic": topic,
            "group": group,
            "total": total,
            "dropped": dropped,
            "dead_letters": [
                {"partition": d.partition, "offset": d.offset, "length": d.length,
                 "deliveries": d.deliveries, "reason": d.reason, "at_ms": d.at_ms,
                 "at": d.at_iso}
                for d in letters
            ],
        })
    if not letters:
        click.echo(f"{topic}/{group}: no dead letters" + (f" from {start}" if start else ""))
        return
    title = f"{topic}/{group}: {total} dead letter(s)"
    if dropped:
        title += f", {dropped} older ones dropped (queueMaxDeadLetters)"
    table = Table(title=title, title_justify="left", header_style="bold")
    for name in ("partition", "offset", "bytes", "deliveries", "reason", "at"):
        table.add_column(name, justify="left" if name in ("reason", "at") else "right")
    for d in letters:
        at = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.at_ms / 1000))
            if d.at_known
            else "unknown (recorded before times were kept)"
        )
        table.add_row(str(d.partition), str(d.offset), str(d.length), str(d.deliveries),
                      d.reason, at)
    Console().print(table)


def _preview(data: bytes, width: int = 24) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(data)} bytes binary>"
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def _local_list(data_dir: Path, group: str | None, as_json: bool) -> None:
    try:
        letters = list_dead_letters(data_dir, group)
    except NotifyError as e:
        _fail(str(e))
    if as_json:
        out = []
        for m in letters:
            try:
                text: str | None = m.data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            out.append({
                "id": m.id,
                "group": m.group,
                "topic": m.topic,
                "partition": m.partition,
                "offset": m.offset,
                "msg_id": str(m.msg_id),
                "attempts": m.attempts,
                "first_failed_at": m.first_failed_at,
                "last_failed_at": m.last_failed_at,
                "last_error": m.last_error,
                "attribute": m.attribute,
                "base64": base64.b64encode(m.data).decode(),
                "text": text,
            })
        return _emit_json(out)
    if not letters:
        click.echo(f"no dead letters under {data_dir}")
        return
    table = new_table(
        f"dead letters ({len(letters)})",
        [("id", "left"), ("group", "left"), ("tries", "right"), ("last failed", "left"),
         ("error", "left"), ("message", "left")],
        0,
    )
    for m in letters:
        table.add_row(
            m.id,
            m.group,
            str(m.attempts),
            time.strftime("%m-%d %H:%M:%S", time.localtime(m.last_failed_at)),
            m.last_error.splitlines()[0][:60] if m.last_error else "",
            _preview(m.data),
        )
    print_table(table, [m.id for m in letters], "ids", Console())


# ---------------------------------------------------------------------- replay


@dlq.command("replay")
@_broker_args
@click.option("--all", "replay_all", is_flag=True, help="every dead letter of the group")
@click.option("-m", "--message", "messages", multiple=True, metavar="PARTITION:OFFSET",
              help="broker: one dead letter (repeatable)")
@_LOCAL
@_DATA_DIR
@_GROUP
@click.option("--id", "ids", multiple=True,
              help="--local: only this dead letter (repeatable; default: all)")
@server_option
@_JSON
@security_options
def dlq_replay(
    topic: str | None, group: str | None, replay_all: bool, messages: tuple[str, ...],
    local: bool, data_dir: Path | None, local_group: str | None, ids: tuple[str, ...],
    server: str, as_json: bool, security: Security,
) -> None:
    """Deliver dead letters again: GROUP's on TOPIC (broker; --all or -m P:O, delivery count
    from 0), or --local ones (handed back to the group's listener on its next recover round)."""
    if _where(topic, group, local, data_dir):
        if messages:
            _fail("-m names a queue group's dead letter on the broker; --local takes --id",
                  EXIT_USAGE)
        return _local_replay(data_dir or default_data_dir(), local_group, ids, as_json)
    if ids:
        _fail("--id names a consumer's local dead letter (--local); the broker takes -m",
              EXIT_USAGE)
    assert topic is not None and group is not None
    _broker_replay(topic, group, replay_all, messages, server, as_json, security)


def _position(text: str) -> tuple[int, int]:
    try:
        p, o = text.split(":")
        pos = int(p), int(o)
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected PARTITION:OFFSET") from None
    if pos[0] < 0 or pos[1] < 0:
        raise click.BadParameter(f"{text!r}: partition and offset must be >= 0")
    return pos


def _broker_replay(
    topic: str, group: str, replay_all: bool, messages: tuple[str, ...], server: str,
    as_json: bool, security: Security,
) -> None:
    if replay_all == bool(messages):
        _fail("give either --all or one or more --message PARTITION:OFFSET", EXIT_USAGE)
    try:
        keys = [_position(m) for m in messages]
    except click.BadParameter as e:
        _fail(f"--message {e.message}", EXIT_USAGE)
    body = b"all" if replay_all else b"".join(b"%d %d\n" % k for k in keys)
    try:
        reply = request(
            server, lambda o: encode_qdlq(topic, group, "replay", body, o), security.transport()
        )
        done, unknown = (int(x) for x in reply.body.split())
    except NotifyError as e:
        _fail(str(e))
    except ValueError:
        _fail(f"unexpected reply {reply.body[:60]!r}")
    if as_json:
        click.echo(json.dumps({"replayed": done, "unknown": unknown}))
    else:
        line = f"{topic}/{group}: replayed {done} dead letter(s)"
        if unknown:
            line += f"; {unknown} not in the dead-letter queue (or no longer in the store)"
        click.echo(line)
    if messages and done == 0:
        sys.exit(EXIT_FAILURE)


def _local_replay(data_dir: Path, group: str | None, ids: tuple[str, ...], as_json: bool) -> None:
    try:
        letters = list_dead_letters(data_dir, group)
        if ids:
            missing = sorted(set(ids) - {m.id for m in letters})
            if missing:
                _fail(f"no dead letter with id {', '.join(missing)}")
            letters = [m for m in letters if m.id in set(ids)]
        by_group: dict[str, list[str]] = {}
        for m in letters:
            by_group.setdefault(m.group, []).append(m.id)
        total = len(letters)
        done = 0
        if total and not as_json:
            with Progress(
                TextColumn("replaying dead letters"),
                BarColumn(),
                MofNCompleteColumn(),
                console=Console(stderr=True),
                transient=False,
            ) as progress:
                task = progress.add_task("replay", total=total)
                for g, batch in _batches(by_group, total):
                    done += replay_dead_letters(data_dir, g, batch)
                    progress.update(task, completed=done)
        else:
            for g, batch in _batches(by_group, total):
                done += replay_dead_letters(data_dir, g, batch)
    except NotifyError as e:
        _fail(str(e))
    if as_json:
        return _emit_json({"replayed": done})
    click.echo(f"replayed {done} dead letter(s)" if done else "no dead letters to replay")


def _batches(by_group: dict[str, list[str]], total: int) -> list[tuple[str, list[str]]]:
    """Id batches per group: about 50 progress steps in all (each replay call rescans the
    group's dead letters, so one call per message would be quadratic)."""
    size = max(1, total // 50)
    out: list[tuple[str, list[str]]] = []
    for g, group_ids in by_group.items():
        for i in range(0, len(group_ids), size):
            out.append((g, group_ids[i : i + size]))
    return out
