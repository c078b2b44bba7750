"""``notify queue``: queue groups on a running broker (README "Queues").

    notify queue dlq list TOPIC GROUP [--from N] [--limit N] [--json]
    notify queue dlq replay TOPIC GROUP (--all | -m PARTITION:OFFSET ...) [--json]
    notify queue delete TOPIC GROUP [--force] [--json]

They talk to the broker's wire port (``-s host:port``) with the ``qdlq`` and ``qdel``
verbs; when the broker sets ``adminSecret`` they need it (``--secret`` /
``NOTIFY_SECRET``). TLS options as for every command (:mod:`notify.cli_options`). Exit
codes: 0 ok, 1 runtime failure (broker unreachable, error reply), 2 usage error.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Final, NoReturn

import click
from rich.console import Console
from rich.table import Table

from notify.admin import request
from notify.cli_options import Security, security_options, server_option
from notify.errors import NotifyError
from notify.protocol.frames import encode_qdel, encode_qdlq, parse_dead_letters

EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2


def _fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    click.echo(f"notify: {message}", err=True)
    sys.exit(code)


@click.group()
def queue() -> None:
    """Queue groups (push delivery with per-message acknowledgement)."""


@queue.group()
def dlq() -> None:
    """A queue group's dead-letter queue on the broker (rejected messages, and messages
    returned queueMaxDeliveries times)."""


_SERVER = server_option  # -s/--server, env NOTIFY_SERVER, like every wire command
_JSON = click.option("--json", "as_json", is_flag=True, help="machine-readable output")


@dlq.command("list")
@click.argument("topic")
@click.argument("group")
@click.option("--from", "start", type=click.IntRange(min=0), default=0, show_default=True,
              help="skip this many entries (oldest first)")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="at most this many entries (the broker clamps to queueMaxDeadLetters)")
@_SERVER
@_JSON
@security_options
def dlq_list(
    topic: str, group: str, start: int, limit: int | None, server: str, as_json: bool,
    security: Security,
) -> None:
    """List GROUP's dead letters on TOPIC, oldest first."""
    body = b"" if start == 0 and limit is None else b"%d %d" % (start, limit or 2**31 - 1)
    try:
        reply = request(
            server, lambda o: encode_qdlq(topic, group, "list", body, o), security.transport()
        )
        total, dropped, letters = parse_dead_letters(reply.body)
    except NotifyError as e:
        _fail(str(e))
    if as_json:
        click.echo(json.dumps({
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
        }, indent=2))
        return
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


def _position(text: str) -> tuple[int, int]:
    try:
        p, o = text.split(":")
        pos = int(p), int(o)
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected PARTITION:OFFSET") from None
    if pos[0] < 0 or pos[1] < 0:
        raise click.BadParameter(f"{text!r}: partition and offset must be >= 0")
    return pos


@dlq.command("replay")
@click.argument("topic")
@click.argument("group")
@click.option("--all", "replay_all", is_flag=True, help="every dead letter of the group")
@click.option("-m", "--message", "messages", multiple=True, metavar="PARTITION:OFFSET",
              help="one dead letter (repeatable)")
@_SERVER
@_JSON
@security_options
def dlq_replay(
    topic: str, group: str, replay_all: bool, messages: tuple[str, ...], server: str,
    as_json: bool, security: Security,
) -> None:
    """Make dead letters available to GROUP's consumers again (delivery count from 0)."""
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
        return
    line = f"{topic}/{group}: replayed {done} dead letter(s)"
    if unknown:
        line += f"; {unknown} not in the dead-letter queue (or no longer in the store)"
    click.echo(line)
    if messages and done == 0:
        sys.exit(EXIT_FAILURE)


@queue.command("delete")
@click.argument("topic")
@click.argument("group")
@click.option("--force", is_flag=True,
              help="also when it has consumers (their connections are closed)")
@_SERVER
@_JSON
@security_options
def delete(
    topic: str, group: str, force: bool, server: str, as_json: bool, security: Security
) -> None:
    """Delete queue GROUP of TOPIC and its state (positions, dead letters): its messages
    stay in the topic; a later subscription creates the group anew."""
    try:
        request(server, lambda o: encode_qdel(topic, group, force, o), security.transport())
    except NotifyError as e:
        _fail(str(e))
    if as_json:
        click.echo(json.dumps({"topic": topic, "group": group, "deleted": True}))
        return
    click.echo(f"{topic}/{group}: deleted")
